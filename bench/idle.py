"""agentload's own background CPU: what a run costs per second when its agents are doing nothing.

8 agents send one request each to bench/server.py, then sit in a 25 s tool call; the CPU time of
the whole agentload process (every thread) is read from /proc/PID/task/*/schedstat 7 s and 22 s
after it started, so the 15 s in between hold only the run's background work (watchdog, lag probe, sampler,
stall-dump watcher, the run loop's own wait). Each wake-up of an idle event loop costs CPU too
(~0.15 ms on a KVM guest), so the figure counts wake-ups as well as work. `--code DIR` measures
another copy of the agentload package the same way, alternated with this one.

    python -m bench.idle --reps 3 [--code /tmp/before]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.harness import REPO, Server, bench_env, cpus, pinned

WINDOW = (7.0, 22.0)  # seconds after start: after the first requests, before the tool call ends (25 s)


def _cpu_s(pid: int) -> float:
    """CPU time of every thread of `pid`, in ns resolution (/proc/PID/task/*/schedstat: time on a
    CPU; /proc/PID/stat counts in 10 ms ticks, too coarse for ~1 ms a second over 15 s)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):  # a thread that ended meanwhile
            continue
    return total / 1e9


def one(url: str, cpu: str | None, code: Path | None = None) -> float:
    """ms of CPU a second over the idle window of one run."""
    with tempfile.TemporaryDirectory(prefix="agentload-idle-") as tmp:
        cmd = pinned([sys.executable, "-m", "agentload", "run", str(REPO / "bench" / "bench.toml"),
                       "--endpoint", url, "--no-live", "--out", str(Path(tmp) / "run"),
                       "--set", "agents.count=8", "--set", "agents.rounds=2",
                       "--set", "conversation.tool_latency_ms=25000"], cpu)
        p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             env=bench_env(code), cwd=code or REPO)
        try:
            t0 = time.monotonic()
            time.sleep(WINDOW[0])
            a = _cpu_s(p.pid)
            time.sleep(WINDOW[1] - (time.monotonic() - t0))
            b = _cpu_s(p.pid)
            took = time.monotonic() - t0
            if p.poll() is not None or took > WINDOW[1] + 1.0:
                raise RuntimeError(f"the run ended or was not measured in its idle window ({took:.1f} s)")
            return 1000.0 * (b - a) / (WINDOW[1] - WINDOW[0])
        finally:
            p.kill()
            p.wait(10)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.idle")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--code", type=Path, default=None, help="also measure the agentload package in this folder")
    a = ap.parse_args(argv)
    srv_cpu, cli_cpu = cpus()
    rows: dict[str, list[float]] = {"agentload": []}
    if a.code:
        rows["agentload (--code)"] = []
    with Server(srv_cpu, 50.0, 32, 0.0) as srv:
        for i in range(a.reps):
            for label in rows:
                ms = one(srv.url, cli_cpu, a.code if label.endswith("(--code)") else None)
                rows[label].append(ms)
                print(f"  ({i + 1}/{a.reps}) {label}: {ms:.2f} ms of CPU a second", flush=True)
    for label, v in rows.items():
        print(f"{label}: median {statistics.median(v):.2f} ms of CPU a second (runs: "
              f"{', '.join(f'{x:.2f}' for x in v)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
