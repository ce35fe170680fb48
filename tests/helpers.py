"""Shared test helpers: run agentload in-process or as a CLI subprocess, against the real mock."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TypeVar

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


K = TypeVar("K")


def run_cli_together(base: Path, runs: Mapping[K, list[str]], timeout: float) -> dict[K, Path]:
    """Run `agentload <args> --out base/<key>` for every key of `runs` at once, each the CLI in its own
    process (its stderr in base/<key>.stderr), for runs that mostly wait on their servers' timers, so
    the waits overlap. Waits for each at most `timeout` s and asserts it ended 0 (the message: its
    stderr's tail); any run still going when this returns or raises is killed (an embedded mock dies
    with its run: PR_SET_PDEATHSIG). Returns {key: its run folder}."""
    procs: dict[K, subprocess.Popen] = {}
    try:
        for key, args in runs.items():
            cmd = [sys.executable, "-m", "agentload.cli", *args, "--out", str(base / f"{key}")]
            with open(base / f"{key}.stderr", "wb") as err:  # (its own group: the kill below ends what it started)
                procs[key] = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=err,
                                              start_new_session=True)
        for key, proc in procs.items():
            try:
                how = f"exit {proc.wait(timeout=timeout)}"
            except subprocess.TimeoutExpired:
                how = f"no end within {timeout:g} s"  # killed below
            assert how == "exit 0", f"{key}: {how}\n" + (base / f"{key}.stderr").read_text(errors="replace")[-3000:]
        return {key: base / f"{key}" for key in runs}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


def hung_probes(records, hang_tokens: int) -> list:
    """The stall probes (agentload.run.probes) that resent a body of at least `hang_tokens` and got no
    answer: on a backend that hangs above that size, each is one more hung request there."""
    from agentload.records import PROBE_KINDS

    return [r for r in records if r.kind in PROBE_KINDS and r.outcome != "ok" and r.prompt_tokens >= hang_tokens]
