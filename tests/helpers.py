"""Shared test helpers: run agentload in-process or as a CLI subprocess, against the real mock."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from agentload.launch import run_to_dir
from agentload.run.scenario import load_scenario

REPO = Path(__file__).resolve().parents[1]


def run_scenario(name: str, out: Path, overrides: list[str] | None = None, live: bool = False):
    sc = load_scenario(name, overrides or [])
    return run_to_dir(sc, out, live=live, install_signals=False, log=lambda m: None)


def cli(*args: str, timeout: float = 120, cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "agentload.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd or REPO, env=e)


def hung_probes(records, hang_tokens: int) -> list:
    """The stall probes (agentload.run.probes) that resent a body of at least `hang_tokens` and got no
    answer: on a backend that hangs above that size, each is one more hung request there."""
    from agentload.records import PROBE_KINDS

    return [r for r in records if r.kind in PROBE_KINDS and r.outcome != "ok" and r.prompt_tokens >= hang_tokens]
