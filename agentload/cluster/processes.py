"""`agentload run --workers N`: the agents of one run in N processes, one report.

Each worker is a process of its own (`python -m agentload.cluster.processes`), with its own event loop
and its own client pool: the `[client]` pool settings (limit, limit_per_host, ...) apply per
process, so N workers may hold N x limit connections, and the report says so. Agents are split
deterministically: worker w runs the agents i with i % N == w (ids stay those of a single-process
run, so every agent sends the same bytes either way; an open-loop schedule is drawn whole by
every worker, which starts its own arrivals). Canaries run in worker 0 only; the embedded mock
server is the parent's, one for all workers.

The parent (`Processes`, an executor) writes run.json (the run id and clock anchor every worker
uses; each worker rebuilds its part from `PreparedRun.part_spec`), starts the workers,
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
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from agentload.cluster.shards import (
    Interrupts,
    last_line,
    live_line,
    merge_meta,
    read_part_metas,
    split,
)
from agentload.errors import UserError
from agentload.process import ChildProcess, NotReady, wait_lines
from agentload.run.executor import PreparedRun, RunOutcome, part_of

READY = "AGENTLOAD_WORKER_READY"
_PKG_PARENT = str(Path(__file__).resolve().parents[2])  # the folder that holds the agentload package
READY_TIMEOUT_S = 60.0
EXIT_WAIT_S = 30.0  # a worker ends by itself; one that does not within this long is stopped


# ---------------------------------------------------------------- the parent


@dataclass
class Processes:
    """The executor of `run --workers N`: N worker processes on this machine, each running its part
    of the run in-process; one run.json merged from theirs."""

    count: int
    ready_timeout_s: float = READY_TIMEOUT_S

    def execute(self, run: PreparedRun) -> RunOutcome:
        n = self.count
        if n < 1:
            raise UserError(f"--workers: expected a whole number >= 1, got {n}")
        run.meta["workers"] = n
        run.meta["agents_per_worker"] = [len(a) for a in split(run.scenario.agents.count, n)]
        procs: list[ChildProcess] = []
        served = _exporter(run, procs, n)  # first: a port in use fails before any worker starts
        run.write_meta()
        with Interrupts(lambda signum, _count: _signal_all(procs, signum), run.install_signals) as interrupts:
            try:
                _start_workers(run, n, procs)
                _wait_ready(procs, self.ready_timeout_s)
                _go(procs)
                _wait_all(run, procs)
            except BaseException:
                for p in procs:
                    p.kill()
                raise
            finally:
                for p in procs:
                    p.wait_exit(EXIT_WAIT_S)
                    p.stop(grace_s=5)
                if served is not None:
                    served.stop()
        merge_meta(run.meta, read_part_metas(run.run_dir, n), [p.returncode for p in procs], interrupts.count > 0)
        run.write_meta()
        return run.outcome(interrupts.count > 0)


def _exporter(run: PreparedRun, procs: list[ChildProcess], n: int) -> Any:
    """The --metrics-port exporter over the workers' latest samples (one series per worker, `shard` label)."""
    if run.metrics_port is None:
        return None
    from agentload.cluster.exporter import ShardsExporter

    exp = ShardsExporter(run.metrics_port, lambda: [(w, last_line(run.run_dir / f"samples-w{w}.jsonl"),
                                                     w < len(procs) and procs[w].poll() is None) for w in range(n)])
    run.meta["metrics_port"] = exp.start()
    run.log(f"agentload: live metrics at http://127.0.0.1:{exp.port}/metrics (a shard label per worker)")
    return exp


def _signal_all(procs: list[ChildProcess], signum: int) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                p.send_signal(signum)
            except OSError:
                pass


def _start_workers(run: PreparedRun, n: int, procs: list[ChildProcess]) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_PKG_PARENT, env.get("PYTHONPATH")) if p)
    for w in range(n):
        cmd = [sys.executable, "-m", "agentload.cluster.processes", "--spec-json",
               orjson.dumps(run.part_spec(w, n)).decode()]
        # Own session: a Ctrl-C reaches the parent only, which forwards it once to each worker.
        procs.append(ChildProcess.start(cmd, name=f"worker {w}", env=env, lifeline=True))


def _wait_ready(procs: list[ChildProcess], timeout_s: float) -> None:
    try:
        wait_lines(procs, READY, timeout_s)
    except NotReady as e:
        if e.exited:
            raise RuntimeError(f"worker pid {e.child.pid} exited with status {e.returncode} before it was ready") from None
        raise RuntimeError(f"{e.pending} worker(s) not ready within {timeout_s:g} s") from None


def _go(procs: list[ChildProcess]) -> None:
    """Every worker's agents start at one moment of this host's clock."""
    start = time.perf_counter_ns()
    for p in procs:
        assert p.stdin is not None
        p.stdin.write(f"GO {start}\n".encode())
        p.stdin.flush()


def _wait_all(run: PreparedRun, procs: list[ChildProcess]) -> None:
    t0 = time.monotonic()
    next_live = t0 + 1.0
    while any(p.poll() is None for p in procs):
        time.sleep(0.05)
        if run.live and time.monotonic() >= next_live:
            next_live += 1.0
            run.log(live_line(run.run_dir, len(procs), time.monotonic() - t0))


# ---------------------------------------------------------------- a worker


class _Lifeline:
    """A worker's stdin: the line `GO <perf_counter_ns>` starts its agents (`gate`), EOF (the parent
    is gone) stops it as SIGTERM does (twice: now)."""

    def __init__(self) -> None:
        self.reader = asyncio.StreamReader()
        self.watcher: asyncio.Task | None = None

    async def open(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(self.reader), sys.stdin)

    async def gate(self) -> int:
        sys.stdout.write(READY + "\n")
        sys.stdout.flush()
        line = await self.reader.readline()
        if not line.startswith(b"GO "):
            raise SystemExit(3)  # the parent went away before the start
        self.watcher = asyncio.create_task(self.watch())
        return int(line.split()[1])

    async def watch(self) -> None:
        await self.reader.read()
        for _ in range(2):
            os.kill(os.getpid(), signal.SIGTERM)
            await asyncio.sleep(1.0)

    def close(self) -> None:
        if self.watcher is not None:
            self.watcher.cancel()


async def _worker(spec: dict[str, Any]) -> int:
    from agentload.run.runner import InProcess

    run = part_of(spec)
    lifeline = _Lifeline()
    await lifeline.open()
    try:
        await InProcess(gate=lifeline.gate).run(run)
    finally:
        lifeline.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m agentload.cluster.processes",
                                 description="one worker of agentload run --workers N")
    ap.add_argument("--spec-json", required=True)
    a = ap.parse_args(argv)
    spec = orjson.loads(a.spec_json)
    from agentload.run.runner import use_uvloop

    use_uvloop()
    return asyncio.run(_worker(spec))


if __name__ == "__main__":
    sys.exit(main())
