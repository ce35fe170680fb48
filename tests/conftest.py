"""Shared pytest options and fixtures (add to this file with small edits; several suites use it)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

import pytest
from hypothesis import HealthCheck, settings

from helpers import run_cli_together

# The machines are shared: generating examples can be slow there without any test being wrong.
# No deadline and no too-slow health check (each property still runs all its examples).
settings.register_profile("shared-machine", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("shared-machine")

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


@pytest.fixture(scope="session")
def packaged_runs(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """packaged_runs(name, api, together=(api,)) -> the run folder of packaged scenario `name` in `api`
    on its embedded mock (the CLI, `--fail-on never`). The first ask for (name, api) runs every API of
    `together` not run yet at once, each the CLI in its own process with its own mock: these runs
    mostly wait on their mock's timers (a stall, a queue, tool time), so the waits overlap instead of
    adding up. Shared by tests/test_verdicts.py (chat) and tests/test_apis.py (the other APIs), so a
    scenario's chat run goes with the others'."""
    done: dict[tuple[str, str], Path] = {}

    def get(name: str, api: str, together: tuple[str, ...] = ()) -> Path:
        if (name, api) not in done:
            runs = {a: ["run", name, "--no-live", "--fail-on", "never", "--set", f'target.api="{a}"']
                    for a in dict.fromkeys((api, *together)) if (name, a) not in done}
            # bounded: every packaged scenario ends itself
            for a, out in run_cli_together(tmp_path_factory.mktemp(name), runs, timeout=600).items():
                done[(name, a)] = out
        return done[(name, api)]

    return get
