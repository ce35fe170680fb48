"""agentload as the benchmark's client: the scenario `bench/bench.toml`, run in this process.

It calls the same `execute()` that `agentload run` calls (uvloop, every phase traced, one record
written per request, watchdog, sampler and stall dumps running), measuring wall and CPU time
(the whole process: the sampler's thread too) over its load window, as the baseline does: from the
first agent's start to the last agent's end (`_load_window`); the run's set-up and teardown and the
reports are outside it. With `--workers N` it runs `agentload run --workers N`'s code path instead
and counts the CPU of the worker processes over the whole run.

Writes its result like bench/baseline.py (to the `--result` file, else one line on stdout), plus
the verdict of the run.

    python -m bench.agentload_client --url http://127.0.0.1:PORT/v1 --concurrency 64 --requests 20
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import sys
import tempfile
import time
from pathlib import Path

from bench.ablate import ABLATIONS, ablate
from bench.baseline import write_result

HERE = Path(__file__).resolve().parent
SCENARIO = HERE / "bench.toml"


def scenario_overrides(url: str | None, concurrency: int, rounds: int, extra: list[str]) -> list[str]:
    sets = [f"agents.count={concurrency}", f"agents.rounds={rounds}", f"client.limit={max(concurrency, 1)}"]
    if url:
        sets.append(f'target.endpoint="{url}"')
    return sets + list(extra)


def mean_body_bytes(concurrency: int, rounds: int, extra: list[str], first_round: int = 1) -> int:
    """The mean request body agentload will send in rounds first_round..rounds (its conversations
    grow), for the baseline."""
    from agentload.run.agent import agent_rng
    from agentload.run.conversation import Conversation
    from agentload.run.scenario import load_scenario

    sc = load_scenario(str(SCENARIO), scenario_overrides(None, concurrency, rounds, extra))
    sizes = []
    for agent in range(min(concurrency, 8)):
        conv = Conversation(sc.conversation, sc.target.model, agent_rng(sc.agents.seed, agent), agent, api=sc.target.api)
        for rnd in range(1, rounds + 1):
            if rnd >= first_round:
                sizes.append(len(conv.body()))
            assistant = conv.scripted_assistant(rnd)
            conv.append(assistant)
            for m in conv.tool_results(assistant):
                conv.append(m)
            conv.next_user_turn()
    return int(sum(sizes) / len(sizes))


def _usage() -> tuple[float, float, int]:
    """CPU seconds, of them system (kernel) seconds, and minor page faults so far, of this process
    and its workers (the kernel's share is what instruction counts, callgrind's, do not see)."""
    s = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime, s.ru_stime + c.ru_stime,
            s.ru_minflt + c.ru_minflt)


def _load_window() -> dict[str, float]:
    """The run's load window, as the baseline's: from the first agent's start (its first request)
    to the end of the last agent (its last completion), CPU and wall clock at each end; the run's
    set-up before it and its teardown after it (run folder, run.json, sampler, closing files) are
    left out, as the baseline leaves out making its session. The agents all start at once here."""
    import agentload.run.arrivals as arrivals

    window: dict[str, float] = {}
    agent = arrivals.run_agent

    async def timed(*args, **kwargs):
        if "cpu0" not in window:
            (window["cpu0"], window["sys0"], window["flt0"]), window["t0"] = _usage(), time.perf_counter()
        try:
            return await agent(*args, **kwargs)
        finally:
            (window["cpu1"], window["sys1"], window["flt1"]), window["t1"] = _usage(), time.perf_counter()

    arrivals.run_agent = timed
    return window


def bench_scenario(url: str, concurrency: int, rounds: int, extra: list[str]):
    """bench.toml with the row's settings, and uvloop as the run's loop."""
    from agentload.run.runner import use_uvloop
    from agentload.run.scenario import load_scenario

    sc = load_scenario(str(SCENARIO), scenario_overrides(url, concurrency, rounds, extra))
    use_uvloop()
    return sc


def run(url: str, concurrency: int, rounds: int, out: Path, extra: list[str], workers: int = 1,
        live: bool = False, label: str = "agentload") -> dict:
    from agentload.analysis.summary import build_summary
    from agentload.records.rundir import load_run
    from agentload.run.executor import prepare
    from agentload.run.runner import InProcess

    sc = bench_scenario(url, concurrency, rounds, extra)
    cpu0, sys0, flt0 = _usage()
    t0 = time.perf_counter()
    if workers > 1:
        from agentload.cluster.processes import Processes

        Processes(workers).execute(prepare(sc, out, url, embedded_mock=False, install_signals=False))
        cpu1, sys1, flt1 = _usage()
        window = {"cpu0": cpu0, "sys0": sys0, "flt0": flt0, "t0": t0,  # (the whole run)
                  "cpu1": cpu1, "sys1": sys1, "flt1": flt1, "t1": time.perf_counter()}
    else:
        window = _load_window()
        asyncio.run(InProcess().run(prepare(sc, out, url, embedded_mock=False, install_signals=False)))
    wall = window["t1"] - window["t0"]
    cpu = window["cpu1"] - window["cpu0"]
    rss_run = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                  resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    data = load_run(out)
    recs = [r for r in data.records if r.kind == "agent"]
    summary = build_summary(data)
    errors_ns = [r.t["first_token"] - r.server_first_token_ns for r in recs
                 if r.server_first_token_ns is not None and "first_token" in r.t]
    ok = [r for r in recs if r.outcome == "ok"]
    return {"client": label + (f" --workers {workers}" if workers > 1 else ""),
            "requests": len(ok), "chunks": sum(r.chunks for r in ok), "wall_s": wall, "cpu_s": cpu,
            "sys_s": window["sys1"] - window["sys0"], "minflt": int(window["flt1"] - window["flt0"]),
            "rss_kb": rss_run, "rss_after_report_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
            "errors_ns": errors_ns, "failed": len(recs) - len(ok),
            "verdict": summary["verdict"]["kind"], "verdict_summary": summary["verdict"]["summary"],
            "max_loop_lag_ms": data.meta.get("max_loop_lag_ms"), "warnings": summary.get("warnings", []),
            "run_dir": str(out)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.agentload_client")
    ap.add_argument("--url", required=True)
    ap.add_argument("--concurrency", type=int, default=64, help="agents")
    ap.add_argument("--requests", type=int, default=20, help="rounds per agent")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None, help="run folder (default: a temporary one)")
    ap.add_argument("--set", dest="sets", action="append", default=[], help="extra scenario override")
    ap.add_argument("--ablate", action="append", default=[],
                    help="turn an optimisation off (bench/ablate.py): " + ", ".join(ABLATIONS) + ", or all")
    ap.add_argument("--result", type=Path, default=None, help="write the result (JSON) to this file, not to stdout")
    a = ap.parse_args(argv)
    ablate(a.ablate)
    label = "agentload" + (" (before: " + "+".join(a.ablate) + " off)" if a.ablate else "")
    api = next((s.split("=", 1)[1].strip('"') for s in a.sets if s.startswith("target.api=")), "chat")
    if api != "chat":
        label += f" {api}"
    if a.out is None:
        with tempfile.TemporaryDirectory(prefix="agentload-bench-") as d:
            res = run(a.url, a.concurrency, a.requests, Path(d) / "run", a.sets, a.workers, label=label)
    else:
        res = run(a.url, a.concurrency, a.requests, a.out, a.sets, a.workers, label=label)
    write_result(res, a.result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
