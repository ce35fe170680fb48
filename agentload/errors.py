"""User-facing errors: one line, naming the file, the field and what was expected; and letting go
of a caught exception's tracebacks once it has been read (`drop_tracebacks`)."""

from __future__ import annotations


class UserError(Exception):
    """A mistake in the user's input. The CLI prints str(err) on one line and exits 2."""


class ScenarioError(UserError):
    def __init__(self, source: str, key: str, expected: str):
        self.source = source
        self.key = key
        self.expected = expected
        super().__init__(f"{source}: {key}: {expected}")


def drop_tracebacks(exc: BaseException | None) -> None:
    """Let go of a caught exception's tracebacks (its own and its causes'), once it has been read.
    A traceback holds the frames it went through and, through them, whatever they held (for a
    request: its trace, stream reader and body), and aiohttp's readers hold the exception back: a
    reference cycle. Once the run's collector has frozen the older of those objects
    (`agentload.run.runner.pace_collector`), no collection frees such a cycle before the run's end (a
    soak of 12,000 agents with 20% of answers cut kept ~2 KB per failed request, 0.7 MB a second)."""
    seen = 0
    while exc is not None and seen < 16:
        exc.__traceback__ = None
        nxt = exc.__cause__ or exc.__context__
        exc.__context__ = exc.__cause__ = None
        exc, seen = nxt, seen + 1
