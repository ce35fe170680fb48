"""The scale run: 10,000 agents x 20 rounds in one agentload process against the bench server.

    python -m bench.run --scale                      # after the table
    python -m bench.scale                            # alone
    python -m bench.scale --agents 2000 --rounds 5   # a quicker look

Agents think between rounds (tool latency, lognormal around `agents / rate` seconds) so that the
offered load is about `--rate` requests/s while all 10,000 conversations stay open (their
histories, tasks and states live in memory the whole time). Reports agentload's peak RSS
during the run, the timing error of every request (first-token stamp - server send stamp), and
whether it stayed within `--bound-ms` at p99, or else whether agentload said so itself with the
`client_saturated` verdict.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from bench.harness import Server, client, cpus, machine, pct


def scale_overrides(agents: int, rounds: int, rate: float, request_s: float) -> tuple[list[str], float]:
    think = max(0.1, agents / rate - request_s)
    sets = [f"agents.start={think:.3f}",  # ramp over one think time: arrivals spread evenly
            f'conversation.tool_latency_ms={{ dist = "lognormal", mean = {think * 1000:.0f}, sigma = 0.3 }}',
            "client.limit=0", "stall.after_s=30", "stall.give_up_s=120"]
    return sets, think


def run_scale(a: Any, srv_cpu: str | None, cli_cpu: str | None) -> dict[str, Any]:
    chunks = a.scale_chunks
    request_s = (a.ttft_ms + chunks * a.interval_ms) / 1000.0
    sets, think = scale_overrides(a.scale_agents, a.scale_rounds, a.scale_rate, request_s)
    expect_s = a.scale_rounds * (think + request_s) + think
    print(f"\nscale: {a.scale_agents:,} agents x {a.scale_rounds} rounds in one process, about "
          f"{a.scale_rate:g} requests/s offered (think time ~{think:.1f} s), {chunks} chunks {a.interval_ms:g} ms apart; "
          f"expect ~{expect_s / 60:.1f} min", flush=True)
    with Server(srv_cpu, a.ttft_ms, chunks, a.interval_ms) as srv:
        args = ["--url", srv.url, "--concurrency", str(a.scale_agents), "--requests", str(a.scale_rounds)]
        for s in sets:
            args += ["--set", s]
        res = client("bench.agentload_client", args, cli_cpu, 600 + 3 * expect_s, srv)
    errs = res.get("errors_ns") or []
    p50, p99 = pct(errs, 0.5), pct(errs, 0.99)
    out = {k: v for k, v in res.items() if k != "errors_ns"}
    out.update(agents=a.scale_agents, rounds=a.scale_rounds, expected_requests=a.scale_agents * a.scale_rounds,
               err_p50_ms=None if p50 is None else p50 / 1e6, err_p99_ms=None if p99 is None else p99 / 1e6,
               err_max_ms=max(errs) / 1e6 if errs else None, bound_ms=a.scale_bound_ms,
               within_bound=p99 is not None and p99 / 1e6 <= a.scale_bound_ms)
    said = out.get("verdict") == "client_saturated"
    lag_warned = [w for w in out.get("warnings") or [] if "event loop lagged" in w]
    print(f"scale: {out['requests']:,} of {out['expected_requests']:,} requests completed ({out['failed']} failed) "
          f"in {out['wall_s']:.0f} s, {out['requests'] / out['wall_s']:,.0f} req/s, "
          f"CPU {100 * out['cpu_s'] / out['wall_s']:.0f}% of a core, peak RSS {out['rss_kb'] / 1024:,.0f} MB during the run "
          f"({out['rss_after_report_kb'] / 1024:,.0f} MB after loading every record for the report)")
    print(f"scale: timing error p50 {out['err_p50_ms']:.2f} ms, p99 {out['err_p99_ms']:.2f} ms, max {out['err_max_ms']:.1f} ms; "
          f"max event-loop lag {out.get('max_loop_lag_ms')} ms; verdict {out.get('verdict')}")
    if out["within_bound"]:
        print(f"scale: timing error within bounds (p99 <= {a.scale_bound_ms:g} ms)")
    else:
        print(f"scale: timing error p99 above {a.scale_bound_ms:g} ms; agentload "
              + ("said so itself: verdict client_saturated" if said else "did NOT flag it as client_saturated"))
    for w in lag_warned:
        print(f"scale: the report warned: {w}")
    out["lag_warned"] = bool(lag_warned)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.scale")
    ap.add_argument("--agents", dest="scale_agents", type=int, default=10_000)
    ap.add_argument("--rounds", dest="scale_rounds", type=int, default=20)
    ap.add_argument("--rate", dest="scale_rate", type=float, default=800.0)
    ap.add_argument("--chunks", dest="scale_chunks", type=int, default=16)
    ap.add_argument("--bound-ms", dest="scale_bound_ms", type=float, default=10.0)
    ap.add_argument("--ttft-ms", type=float, default=50.0)
    ap.add_argument("--interval-ms", type=float, default=5.0)
    a = ap.parse_args(argv)
    print(f"machine: {machine()}")
    srv, cli = cpus()
    run_scale(a, srv, cli)
    return 0


if __name__ == "__main__":
    sys.exit(main())
