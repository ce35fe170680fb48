"""User-facing errors: one line, naming the file, the field and what was expected."""

from __future__ import annotations


class UserError(Exception):
    """A mistake in the user's input. The CLI prints str(err) on one line and exits 2."""


class ScenarioError(UserError):
    def __init__(self, source: str, key: str, expected: str):
        self.source = source
        self.key = key
        self.expected = expected
        super().__init__(f"{source}: {key}: {expected}")
