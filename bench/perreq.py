"""The per-request work outside the network and the read path, timed natively: agentload's agents
(`agent.run_agent`: the round loop, `attempt`, `send`, the record, its line, the interval log, the
next turn of the growing conversation) with the exchange itself replaced by a stand-in that stamps
the trace as a request does and hands back one answer of the bench server's stream, read once
beforehand by that copy's own reader; several copies of the agentload package, alternated in one
process.

What it leaves out is what the raw loop does too, or what `bench.readpath` times: the connection,
the request's head and its write, the response's head, the reads. What it keeps is what agentload
does per request beyond them; a change of a microsecond or two there is judged here, where whole
runs on a shared machine move by 10-20%: the best and median of `--reps` rounds, every copy timed in
turn within each round.

    python -m bench.perreq                               # this copy, each API
    python -m bench.perreq --code /tmp/before            # + another copy (a git archive)
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from bench.agentload_client import SCENARIO, scenario_overrides
from bench.readpath import answer_reads
from bench.server import Settings

_MODULES = ("agent", "context", "request", "scenario", "sse_body", "answer", "apis", "conversation")


def load_copy(where: Path | None) -> dict[str, Any]:
    """The modules of the agentload package in `where` (None: this one), imported while that copy is
    the one on the path."""
    for name in [m for m in sys.modules if m == "agentload" or m.startswith("agentload.")]:
        del sys.modules[name]
    if where is not None:
        sys.path.insert(0, str(where))
    try:
        mods = {m: importlib.import_module(f"agentload.run.{m}") for m in _MODULES}
        mods["records"] = importlib.import_module("agentload.records")
        mods["interval_log"] = importlib.import_module("agentload.records.interval_log")
        for api in mods["apis"].API_NAMES:
            mods["apis"].get(api)
    finally:
        if where is not None:
            sys.path.remove(str(where))
    # what the copy imports as it runs (`apis.get`: from sys.modules) must be its own: put back by `_use`
    mods["_modules"] = {m: v for m, v in sys.modules.items() if m == "agentload" or m.startswith("agentload.")}
    return mods


def _use(mods: dict[str, Any]) -> None:
    for name in [m for m in sys.modules if m == "agentload" or m.startswith("agentload.")]:
        del sys.modules[name]
    sys.modules.update(mods["_modules"])


class _Session:
    connector = None  # no gate, no direct path: `send` goes to `_exchange`, replaced below


class _Transport:
    def session_for(self, agent: int) -> _Session:
        return _Session()


def _answer(mods: dict[str, Any], api: str, reads: list[bytes]) -> Any:
    """One answer of `api`'s stream, read by this copy's reader, and its verdict."""
    trace = mods["records"].Trace("agent", 0, 1, 0, "r", 2, 0, 0)
    stream_cls = mods["apis"].get(api).Stream
    body = mods["sse_body"].SSEBody(trace, stream_cls)
    for i, r in enumerate(reads):
        body.feed(r, 1000 + i)
    cs = body.finish()
    error, msg = mods["answer"].stream_verdict(cs, trace)
    assert error is None, msg
    return mods["answer"].Result(200, cs, None, None), trace


def one_run(mods: dict[str, Any], api: str, reads: list[bytes], agents: int, rounds: int, out: Path,
            sets: "list[str] | tuple[str, ...]" = ()) -> float:
    """`agents` agents of bench.toml (with `sets`) for `rounds` rounds each through this copy; seconds
    of CPU per request."""
    _use(mods)
    sc = mods["scenario"].load_scenario(str(SCENARIO), scenario_overrides("http://127.0.0.1:9/v1", agents, rounds,
                                                                          [f'target.api="{api}"', *sets]))
    result, read = _answer(mods, api, reads)
    now = time.perf_counter_ns

    async def exchange(session: Any, url: str, body: Any, trace: Any, headers: Any, *rest: Any) -> Any:
        t = trace.t
        raw = body if body.__class__ is bytes else body.raw()
        assert raw
        t["sent"] = t["headers"] = now()
        trace.reused = True
        await asyncio.sleep(0)  # the answer comes in a later loop step, as in a run
        t["first_byte"] = t["first_token"] = trace.last_token = now()
        trace.chunks, trace.token_chunks, trace.token_reads = read.chunks, read.token_chunks, read.token_reads
        trace.server_first_token_ns = t["first_token"] - 1000
        trace.first_output = read.first_output
        t["end"] = now()
        return result

    request = mods["request"]
    request._exchange = exchange

    async def go() -> float:
        loop = asyncio.get_running_loop()
        writer = mods["records"].RecordWriter(out / "records.jsonl", loop=loop)
        ctx = mods["context"].RunContext(sc, "20261203-000000-bench", sc.target.endpoint, _Transport(), writer,
                                         mods["conversation"].tool_schemas(sc.conversation.tools))
        ilog = mods["interval_log"].IntervalLog(out / "intervals.hlog", now(), time.time())
        ctx.listeners.append(ilog.add)
        t0 = time.thread_time()  # CPU time: what a moment without a core on a shared machine does not count
        await asyncio.gather(*(mods["agent"].run_agent(ctx, a) for a in range(agents)))
        took = time.thread_time() - t0
        writer.close()
        ilog.close()
        n = ctx.counts["ok"]
        assert n == agents * rounds, ctx.counts
        return took / n

    import uvloop

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(go())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.perreq")
    ap.add_argument("--apis", default="chat,messages,responses")
    ap.add_argument("--code", type=Path, action="append", default=[],
                    help="another copy of the agentload package (a folder holding agentload/), timed beside this one")
    ap.add_argument("--paced", action="store_true", help="the answer one event a read (default: the burst's)")
    ap.add_argument("--agents", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--set", dest="sets", action="append", default=[],
                    help="a scenario override for every copy (e.g. target.traceparent=false: its price)")
    ap.add_argument("--verbose", action="store_true", help="every timing")
    a = ap.parse_args(argv)
    settings = Settings(50.0, 32, 5.0 if a.paced else 0.0)
    apis = [x.strip() for x in a.apis.split(",") if x.strip()]
    names = ["agentload"] + [f"agentload ({c})" for c in a.code]
    where: list[Path | None] = [None, *a.code]
    print(f"us per request outside the network and the read path, {a.agents} agents x {a.rounds} rounds: "
          f"best / median of {a.reps}")
    for api in apis:
        reads = answer_reads(getattr(settings, api), a.paced)
        times: dict[str, list[float]] = {n: [] for n in names}
        runs: list[Callable[[Path], float]] = []
        for w in where:
            mods = load_copy(w)
            runs.append(lambda out, mods=mods, api=api, reads=reads: one_run(mods, api, reads, a.agents, a.rounds,
                                                                             out, a.sets))
        for _ in range(a.reps):
            for name, fn in zip(names, runs):
                with tempfile.TemporaryDirectory(prefix="agentload-perreq-") as d:
                    gc.collect()
                    gc.disable()
                    try:
                        times[name].append(fn(Path(d)) * 1e6)
                    finally:
                        gc.enable()
        print(f"{api:9s} " + "   ".join(f"{n} {min(v):.1f} / {statistics.median(v):.1f}" for n, v in times.items()), times if a.verbose else "",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
