"""`agentload run --workers N`: the agents of one run in N processes, one report.

Each worker is a process of its own (`python -m agentload.cluster.processes`), with its own event loop
and its own client pool: the `[client]` pool settings (limit, limit_per_host, ...) apply per
process, so N workers may hold N x limit connections, and the report says so. Agents are split
deterministically: worker w runs the agents i with i % N == w (ids stay those of a single-process
run, so every agent sends the same bytes either way; an open-loop schedule is drawn whole by
every worker, which starts its own arrivals). Canaries run in worker 0 only; the embedded mock
server is the parent's, one for all workers.

The parent writes run.json (the run id and clock anchor every worker uses), starts the workers,
waits until all are ready and tells them when to start (the same moment for all), forwards
SIGINT/SIGTERM (each worker then stops as a single run does), prints a merged live line, and at
the end merges the workers' run-wI.json into run.json. Each worker writes records-wI.jsonl,
samples-wI.jsonl and intervals-wI.hlog; `report.rundir.load_run` reads them all, so the report,
the histograms and the verdict cover the whole run. run.json's `crashes` holds every worker's
crash entries with a `worker` key, plus one (where "worker") for a worker process that exited
with an error status; `ended_by` is the worst of the workers' (crashed, interrupted, duration,
finished).

A worker's stdin is its lifeline: the line `GO <perf_counter_ns>` starts its agents, EOF (the
parent is gone) stops it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import signal
import sys
import time
from pathlib import Path
from typing import Any, Callable

import orjson

from agentload.errors import UserError
from agentload.cluster.shards import last_line, live_line, merge_meta, split
from agentload.process import ChildProcess, NotReady, wait_lines
from agentload.run.context import WorkerSpec

READY = "AGENTLOAD_WORKER_READY"
_PKG_PARENT = str(Path(__file__).resolve().parents[2])  # the folder that holds the agentload package
READY_TIMEOUT_S = 60.0


# ---------------------------------------------------------------- the parent


def _worker_cmd(spec: dict[str, Any]) -> list[str]:
    return [sys.executable, "-m", "agentload.cluster.processes", "--spec-json", orjson.dumps(spec).decode()]


def _wait_ready(procs: list[ChildProcess], timeout_s: float) -> None:
    try:
        wait_lines(procs, READY, timeout_s)
    except NotReady as e:
        if e.exited:
            raise RuntimeError(f"worker pid {e.child.pid} exited with status {e.returncode} before it was ready") from None
        raise RuntimeError(f"{e.pending} worker(s) not ready within {timeout_s:g} s") from None


def run_workers(sc: Any, run_dir: Path, base_url: str, n: int, *, embedded_mock: bool,
                install_signals: bool = True, live: bool = False,
                log: Callable[[str], None] = lambda msg: print(msg, file=sys.stderr),
                exporter: Any = None) -> Any:
    """Run the scenario in `n` worker processes into run_dir; returns a runner.RunOutcome.
    `exporter(latest)`: makes and starts the --metrics-port exporter over the workers' latest samples
    (agentload.cluster.exporter; passed in, the run layer does not import it)."""
    from agentload.run.runner import RunOutcome, run_metadata, write_run_json

    if n < 1:
        raise UserError(f"--workers: expected a whole number >= 1, got {n}")
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    run_id = secrets.token_hex(4)
    meta = run_metadata(sc, run_id, base_url, embedded_mock)
    meta["workers"] = n
    meta["agents_per_worker"] = [len(a) for a in split(sc.agents.count, n)]
    procs: list[ChildProcess] = []
    served = None
    if exporter is not None:  # first: a port in use fails before any worker starts
        served = exporter(lambda: [(w, last_line(run_dir / f"samples-w{w}.jsonl"),
                                    w < len(procs) and procs[w].poll() is None) for w in range(n)])
        meta["metrics_port"] = served.port
    write_run_json(run_dir / "run.json", meta)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_PKG_PARENT, env.get("PYTHONPATH")) if p)
    interrupts = 0
    old: dict[int, Any] = {}

    def forward(signum: int, frame: Any) -> None:
        nonlocal interrupts
        interrupts += 1
        for p in procs:
            if p.poll() is None:
                try:
                    p.send_signal(signum)
                except OSError:
                    pass

    try:
        if install_signals:
            for sig in (signal.SIGINT, signal.SIGTERM):
                old[sig] = signal.signal(sig, forward)
        for w in range(n):
            spec = {"scenario": sc.to_dict(), "source": sc.source, "base_url": base_url, "out_dir": str(run_dir),
                    "embedded_mock": embedded_mock, "index": w, "count": n, "run_id": run_id,
                    "t0_ns": meta["t0_ns"], "t0_unix": meta["t0_unix"]}
            # Own session: a Ctrl-C reaches the parent only, which forwards it once to each worker.
            procs.append(ChildProcess.start(_worker_cmd(spec), name=f"worker {w}", env=env, lifeline=True))
        _wait_ready(procs, READY_TIMEOUT_S)
        start = time.perf_counter_ns()
        for p in procs:
            assert p.stdin is not None
            p.stdin.write(f"GO {start}\n".encode())
            p.stdin.flush()
        t0 = time.monotonic()
        next_live = t0 + 1.0
        while any(p.poll() is None for p in procs):
            time.sleep(0.05)
            if live and time.monotonic() >= next_live:
                next_live += 1.0
                log(live_line(run_dir, n, time.monotonic() - t0))
    except BaseException:
        for p in procs:
            p.kill()
        raise
    finally:
        for p in procs:  # a worker ends by itself; one that does not within 30 s is stopped
            p.wait_exit(30)
            p.stop(grace_s=5)
        if served is not None:
            served.stop()
        for sig, h in old.items():
            signal.signal(sig, h)
    metas: list[dict[str, Any] | None] = []
    for w in range(n):
        try:
            metas.append(orjson.loads((run_dir / f"run-w{w}.json").read_bytes()))
        except (OSError, orjson.JSONDecodeError):
            metas.append(None)
    merge_meta(meta, metas, [p.returncode for p in procs], interrupts > 0)
    write_run_json(run_dir / "run.json", meta)
    return RunOutcome(run_dir, run_id, bool(meta["cut_short"]), meta.get("stop_reason"), interrupts > 0,
                      meta["ended_by"])


# ---------------------------------------------------------------- a worker


async def _worker(spec: dict[str, Any]) -> int:
    from agentload.run.runner import execute
    from agentload.run.scenario import parse_scenario

    sc = parse_scenario(spec["scenario"], spec["source"])
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)

    async def lifeline() -> None:
        await reader.read()  # EOF: the parent is gone; stop as on SIGTERM (twice: now)
        for _ in range(2):
            os.kill(os.getpid(), signal.SIGTERM)
            await asyncio.sleep(1.0)

    watcher: asyncio.Task | None = None

    async def gate() -> int:
        nonlocal watcher
        sys.stdout.write(READY + "\n")
        sys.stdout.flush()
        line = await reader.readline()
        if not line.startswith(b"GO "):
            raise SystemExit(3)  # the parent went away before the start
        watcher = asyncio.create_task(lifeline())
        return int(line.split()[1])

    ws = WorkerSpec(spec["index"], spec["count"], spec["run_id"], spec["t0_ns"], spec["t0_unix"], gate)
    try:
        await execute(sc, Path(spec["out_dir"]), spec["base_url"], embedded_mock=spec["embedded_mock"],
                      install_signals=True, worker=ws)
    finally:
        if watcher is not None:
            watcher.cancel()
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m agentload.cluster.processes", description="one worker of agentload run --workers N")
    ap.add_argument("--spec-json", required=True)
    a = ap.parse_args(argv)
    spec = orjson.loads(a.spec_json)
    from agentload.run.runner import use_uvloop

    use_uvloop()
    return asyncio.run(_worker(spec))


if __name__ == "__main__":
    sys.exit(main())
