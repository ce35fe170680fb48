"""Before/after of each performance change: agentload with one change turned off (bench/ablate.py)
against agentload as it is, alternated on the same server, the median of `--reps` runs each.

    python -m bench.ab                                   # paced 256 and burst 64, every change
    python -m bench.ab --rows paced:256 --reps 5 --only sink,idle
    python -m bench.ab --scale 5000,10,800 --only convbuf,sleep,gc   # memory, GC pauses at scale
    python -m bench.ab --rows burst:64 --only writestep --api messages   # one change, one API

CPU per request (us of user+system CPU per completed request) is the figure that matters on a
shared machine: it does not count time the process waited for a core. Peak RSS and the timing
error are reported too.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from typing import Any

from bench.ablate import ABLATIONS
from bench.harness import Server, client, cpus, machine, pct


def _one(url: str, conc: int, rounds: int, ablate: list[str], extra: list[str], cpu: str | None, srv: Any) -> dict:
    args = ["--url", url, "--concurrency", str(conc), "--requests", str(rounds)]
    for a in ablate:
        args += ["--ablate", a]
    for s in extra:
        args += ["--set", s]
    return client("bench.agentload_client", args, cpu, 3600, srv)


def _summ(runs: list[dict]) -> dict[str, float]:
    us = [1e6 * r["cpu_s"] / max(r["requests"], 1) for r in runs]
    p99 = [(pct(r["errors_ns"], 0.99) or 0) / 1e6 for r in runs]
    p50 = [(pct(r["errors_ns"], 0.5) or 0) / 1e6 for r in runs]
    return {"us_per_req": statistics.median(us), "rss_mb": statistics.median(r["rss_kb"] / 1024 for r in runs),
            "err_p50_ms": statistics.median(p50), "err_p99_ms": statistics.median(p99),
            "lag_ms": statistics.median((r.get("max_loop_lag_ms") or 0) for r in runs)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.ab")
    ap.add_argument("--rows", default="paced:256,burst:64", help="mode:concurrency,...")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--only", default="", help="comma-separated changes (default: all); 'all' = all off together")
    ap.add_argument("--scale", default="", help="agents,rounds,rate: a thinking-agents run (as bench.scale) instead of --rows")
    ap.add_argument("--ttft-ms", type=float, default=50.0)
    ap.add_argument("--chunks", type=int, default=32)
    ap.add_argument("--interval-ms", type=float, default=5.0)
    ap.add_argument("--api", choices=("chat", "messages", "responses"), default="chat",
                    help="the API the agents speak (the bench server answers all three)")
    a = ap.parse_args(argv)
    api_sets = [] if a.api == "chat" else [f'target.api="{a.api}"']
    names = [n for n in a.only.split(",") if n] or [n for n in ABLATIONS if not n.startswith("probe-")] + ["all"]
    srv_cpu, cli_cpu = cpus()
    print(f"machine: {machine()}")
    if a.scale:
        from bench.scale import scale_overrides

        agents, rounds, rate = a.scale.split(",")
        chunks = 16
        sets, _ = scale_overrides(int(agents), int(rounds), float(rate), (a.ttft_ms + chunks * a.interval_ms) / 1000)
        plan = [("scale", int(agents), int(rounds), a.interval_ms, chunks, sets)]
    else:
        plan = []
        for row in a.rows.split(","):
            mode, conc = row.split(":")
            plan.append((mode, int(conc), a.rounds, a.interval_ms if mode == "paced" else 0.0, a.chunks, []))
    plan = [(mode, conc, rounds, interval, chunks, sets + api_sets)
            for mode, conc, rounds, interval, chunks, sets in plan]
    print(f"{'row':12s} {'change turned off':18s} {'us/req off':>10s} {'us/req on':>10s} {'CPU':>7s} "
          f"{'RSS MB off/on':>14s} {'ttft err p99 ms off/on':>23s} {'max lag ms off/on':>18s}")
    for mode, conc, rounds, interval, chunks, sets in plan:
        with Server(srv_cpu, a.ttft_ms, chunks, interval) as srv:
            for name in names:
                on_runs, off_runs = [], []
                for _ in range(a.reps):  # alternate, so drift on a shared machine hits both alike
                    on_runs.append(_one(srv.url, conc, rounds, [], sets, cli_cpu, srv))
                    off_runs.append(_one(srv.url, conc, rounds, [name], sets, cli_cpu, srv))
                on, off = _summ(on_runs), _summ(off_runs)
                change = 100.0 * (on["us_per_req"] - off["us_per_req"]) / off["us_per_req"]
                print(f"{mode + ' ' + str(conc):12s} {name:18s} {off['us_per_req']:10.0f} {on['us_per_req']:10.0f} "
                      f"{change:+6.0f}% {off['rss_mb']:6.0f} / {on['rss_mb']:<6.0f} "
                      f"{off['err_p99_ms']:10.2f} / {on['err_p99_ms']:<10.2f} {off['lag_ms']:8.0f} / {on['lag_ms']:<8.0f}",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
