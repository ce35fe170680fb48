"""Shared pytest options and fixtures (add to this file with small edits; several suites use it)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# development tooling (the DevTools client for the HTML render tests) lives in tools/, not in the package
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))


def pytest_sessionstart(session: pytest.Session) -> None:
    """Compile the project's modules into their __pycache__ folders (git-ignored) once per session.
    Where PYTHONDONTWRITEBYTECODE is set (as in this project's CI machine), no Python writes them, and
    every one of the suite's child processes (agentload CLIs, mock servers, benches, valgrind's
    runs) would compile the package from source again at its start; with them it only reads them."""
    import compileall

    root = Path(__file__).resolve().parents[1]
    for d in ("agentload", "bench", "tests", "tools"):
        compileall.compile_dir(root / d, quiet=1)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--regen-golden", action="store_true", default=False,
                     help="rewrite the golden files under tests/golden/ from the fixtures instead of comparing")


@pytest.fixture
def regen_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--regen-golden"))
