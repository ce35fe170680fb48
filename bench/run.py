"""The benchmark: agentload against a raw aiohttp+uvloop closed loop, on the same fast server.

    python -m bench.run                 # the table (under 2 minutes)
    python -m bench.run --scale         # also 10,000 agents x 20 rounds in one process (minutes)
    python -m bench.run --workers 2     # also an agentload row with --workers 2
    python -m bench.run --install-peers # once: AIPerf, guidellm, inference-perf, locust in their own venvs
    python -m bench.run --peers         # also the side-by-side table with them (bench/peers.py)

What it does, for each row:
- starts `bench/server.py` (a minimal uvloop HTTP/1.1 SSE server: 50 ms to the first token, then
  32 token chunks, one write each 5 ms apart, or all at once in the `burst` rows), pinned with
  `taskset` to core 0 where `taskset` exists and the machine has 2+ cores;
- runs, each pinned to core 1, each for `concurrency x --rounds` requests on the same settings:
  the baseline `bench/baseline.py --parse json` (aiohttp + uvloop, `readany()`, events split and
  every chunk parsed with orjson: the least a client does that can tell a token from a role-only
  chunk), the floor `bench/baseline.py --parse none` (no parsing at all: aiohttp and the loop
  alone), then agentload (`bench/agentload_client.py`: scenario `bench/bench.toml`, scripted, tool
  latency 0, canaries off; every phase traced, every chunk parsed, one record written per request);
- prints requests/s and chunks/s (over the client's load window), the client's CPU % of one core
  (user + system over the same window), the same rates per fully used core (count / CPU
  seconds), peak RSS, the server's CPU %, and the ratio agentload / baseline of requests/s per
  core;
- timing error: for every request, the client's first-token stamp minus the server's own send
  stamp `mock_sent_ns` (both `time.perf_counter_ns()`, CLOCK_MONOTONIC on one host), p50/p99.

No speed threshold is asserted anywhere: the numbers are printed, docs/performance.md keeps a measured table.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from agentload.atomic import write_atomic
from bench.harness import Server, client, cpus, machine, pct, took


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Of several runs of one client, the one with the median requests per CPU-second (all its
    figures from that one run); its `reps_per_core` lists every run's figure."""
    per_core = [r["requests"] / max(r["cpu_s"], 1e-9) for r in runs]
    order = sorted(range(len(runs)), key=per_core.__getitem__)
    best = dict(runs[order[len(order) // 2]])
    if len(runs) > 1:
        best["reps_per_core"] = [round(x) for x in per_core]
    return best


@dataclass
class Row:
    mode: str
    concurrency: int
    res: dict[str, Any]

    @property
    def name(self) -> str:
        return self.res["client"]

    @property
    def rps(self) -> float:
        return self.res["requests"] / self.res["wall_s"]

    @property
    def cps(self) -> float:
        return self.res["chunks"] / self.res["wall_s"]

    @property
    def cpu(self) -> float:
        return self.res["cpu_s"] / self.res["wall_s"]

    @property
    def rps_core(self) -> float:
        return self.res["requests"] / max(self.res["cpu_s"], 1e-9)

    @property
    def cps_core(self) -> float:
        return self.res["chunks"] / max(self.res["cpu_s"], 1e-9)

    def err_ms(self, q: float) -> float | None:
        v = pct(self.res.get("errors_ns") or [], q)
        return None if v is None else v / 1e6

    def as_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in self.res.items() if k != "errors_ns"}
        d.update(mode=self.mode, concurrency=self.concurrency, req_s=self.rps, chunks_s=self.cps, cpu=self.cpu,
                 req_s_per_core=self.rps_core, chunks_s_per_core=self.cps_core,
                 err_p50_ms=self.err_ms(0.5), err_p99_ms=self.err_ms(0.99))
        return d


def _f(v: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if v is None else fmt.format(v)


def paired_ratio(r: Row, b: Row) -> float:
    """r's requests per CPU-second over the baseline's: with several runs each, the median of the
    ratios of the runs made one after the other (rep i of both), which a machine's drift over the
    row moves less than the ratio of two medians."""
    mine, theirs = r.res.get("reps_per_core"), b.res.get("reps_per_core")
    if mine and theirs and len(mine) == len(theirs):
        return statistics.median(x / max(y, 1e-9) for x, y in zip(mine, theirs))
    return r.rps_core / b.rps_core


def _per_request(res: dict[str, Any], key: str, scale: float) -> str:
    """A client's `key` per completed request ("-" from a client that does not measure it): the
    kernel's share of the CPU figure (system time, minor page faults), which instruction counts miss."""
    v = res.get(key)
    return "-" if v is None or not res["requests"] else f"{v * scale / res['requests']:.1f}"


def render(rows: list[Row]) -> str:
    head = ("mode", "conc", "client", "req/s", "chunks/s", "CPU %", "server CPU %", "req/s/core", "chunks/s/core",
            "sys us/req", "faults/req", "RSS MB", "ttft err p50/p99 ms", "ratio/core")
    lines = [head]
    base: dict[tuple[str, int], Row] = {}
    for r in rows:
        if r.name.split(" ")[0] == "baseline":
            base[(r.mode, r.concurrency)] = r
        b = base.get((r.mode, r.concurrency))
        ratio = f"{paired_ratio(r, b):.2f}" if (b is not None and r is not b) else ""
        lines.append((r.mode, str(r.concurrency), r.name, f"{r.rps:,.0f}", f"{r.cps:,.0f}", f"{100 * r.cpu:.0f}",
                      f"{100 * r.res.get('server_cpu', 0):.0f}",
                      f"{r.rps_core:,.0f}", f"{r.cps_core:,.0f}", _per_request(r.res, "sys_s", 1e6),
                      _per_request(r.res, "minflt", 1), f"{r.res['rss_kb'] / 1024:.0f}",
                      f"{_f(r.err_ms(0.5))} / {_f(r.err_ms(0.99))}", ratio))
    widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
    out = []
    for k, row in enumerate(lines):
        out.append("  ".join(c.rjust(w) if i not in (0, 2) else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))))
        if k == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.run", description="agentload vs a raw aiohttp+uvloop loop")
    ap.add_argument("--rounds", type=int, default=40, help="requests per agent / per baseline worker")
    ap.add_argument("--code", type=Path, default=None,
                    help="also an agentload row run with the agentload package in this folder (e.g. a git archive "
                         "of an earlier commit: mkdir /tmp/before && git archive REV agentload | tar -x -C /tmp/before)")
    ap.add_argument("--reps", type=int, default=1,
                    help="runs of each client per row, alternated; the table shows each client's median run")
    ap.add_argument("--paced", default="8,64,512", help="concurrencies of the paced rows (one write per chunk, 5 ms apart)")
    ap.add_argument("--burst", default="64,512", help="concurrencies of the burst rows (all chunks in one write); '' for none")
    ap.add_argument("--ttft-ms", type=float, default=50.0)
    ap.add_argument("--chunks", type=int, default=32)
    ap.add_argument("--interval-ms", type=float, default=5.0)
    ap.add_argument("--workers", type=int, default=0, help="also run agentload --workers N (rows marked so)")
    ap.add_argument("--apis", default="chat",
                    help="the APIs of the rows, comma list of chat, messages, responses: each API's rows are its own "
                         "baseline (the raw loop reading that API's stream to its terminal event) and agentload with "
                         "target.api set; the mode column names a non-chat API")
    ap.add_argument("--before", action="store_true",
                    help="also agentload with every performance change of issue 7 turned off (bench/ablate.py)")
    ap.add_argument("--only", choices=("baseline", "floor", "agentload"), default=None, help="run one client only")
    ap.add_argument("--scale", action="store_true", help="also the 10,000-agent run (minutes)")
    ap.add_argument("--scale-agents", type=int, default=10_000)
    ap.add_argument("--scale-rounds", type=int, default=20)
    ap.add_argument("--scale-rate", type=float, default=800.0, help="target requests/s of the scale run (sets the tool latency)")
    ap.add_argument("--scale-chunks", type=int, default=16, help="token chunks per response in the scale run")
    ap.add_argument("--scale-bound-ms", type=float, default=10.0, help="p99 timing error the scale run must stay under")
    ap.add_argument("--peers", action="store_true",
                    help="also the side-by-side table with AIPerf, guidellm, inference-perf and locust (bench/peers.py)")
    ap.add_argument("--peers-only", action="store_true", help="the side-by-side table alone (no main table)")
    ap.add_argument("--install-peers", nargs="?", const="all", default=None, metavar="NAMES",
                    help="make the peers' venvs under ~/.cache/agentload-bench (all, or a comma list), "
                         "then stop unless --peers/--peers-only is given too")
    ap.add_argument("--peer-conc", default="64", help="concurrencies of the side-by-side table (comma list)")
    ap.add_argument("--peer-reps", type=int, default=1, help="runs of each client in the side-by-side table (median)")
    ap.add_argument("--json", type=Path, default=None, help="write every figure to this file")
    a = ap.parse_args(argv)
    a.peers = a.peers or a.peers_only
    if a.install_peers:
        from bench.peers import install

        names = None if a.install_peers == "all" else [n.strip() for n in a.install_peers.split(",") if n.strip()]
        install(names)
        if not a.peers:
            return 0

    from bench.agentload_client import mean_body_bytes

    t_start = time.monotonic()
    srv_cpu, cli_cpu = cpus()
    print(f"machine: {machine()}", flush=True)
    print(f"server on CPU {srv_cpu or '(not pinned)'}, clients on CPU {cli_cpu or '(not pinned)'}; "
          f"{a.ttft_ms:g} ms to first token, {a.chunks} token chunks, "
          f"{'one write per chunk ' + format(a.interval_ms, 'g') + ' ms apart' if a.interval_ms else 'all at once'} "
          f"(paced rows) or all at once (burst rows); {a.rounds} requests per agent", flush=True)
    rows: list[Row] = []
    plan = [("paced", int(c), a.interval_ms) for c in a.paced.split(",") if c.strip()]
    plan += [("burst", int(c), 0.0) for c in a.burst.split(",") if c.strip()]
    if a.peers_only:
        plan = []
    apis = [x.strip() for x in a.apis.split(",") if x.strip()]
    plan = [(mode, conc, interval, api) for mode, conc, interval in plan for api in apis]
    for mode, conc, interval, api in plan:
        api_set = [] if api == "chat" else [f'target.api="{api}"']
        body = mean_body_bytes(conc, a.rounds, api_set)
        budget = 120 + 2 * a.rounds * conc * (a.ttft_ms + a.chunks * interval) / 1000.0
        if api != "chat":
            mode = f"{mode} {api}"
        with Server(srv_cpu, a.ttft_ms, a.chunks, interval) as srv:
            common = ["--url", srv.url, "--concurrency", str(conc), "--requests", str(a.rounds)]
            clients: list[tuple[str, list[str]]] = []
            for name, parse in (("baseline", "json"), ("floor", "none")):
                if a.only in (None, name):
                    clients.append(("bench.baseline", common + ["--body-bytes", str(body), "--parse", parse,
                                                                "--api", api]))
            api_args = [x for s in api_set for x in ("--set", s)]  # (every agentload client speaks the row's API)
            if a.only in (None, "agentload"):
                clients.append(("bench.agentload_client", common + api_args))
            if a.before:
                clients.append(("bench.agentload_client", common + api_args + ["--ablate", "all"]))
            if a.workers > 1:
                # the workers share the client CPUs (on a 2-core machine: one core, so no speed-up)
                clients.append(("bench.agentload_client", common + api_args + ["--workers", str(a.workers)]))
            codes = [None] * len(clients)
            if a.code is not None and a.only in (None, "agentload"):
                clients.append(("bench.agentload_client", common + api_args))
                codes.append(a.code)
            runs: list[list[dict[str, Any]]] = [[] for _ in clients]
            for rep in range(a.reps):  # alternated: drift on a shared machine hits every client alike
                # and rotated: each rep starts one client later, so no client always runs right after
                # the same one (two copies of the same agentload, run in the same order, differed by 5% in
                # callgrind's counts per request)
                for k in range(len(clients)):
                    i = (k + rep) % len(clients)
                    module, args = clients[i]
                    runs[i].append(client(module, args, cli_cpu, budget, srv, codes[i]))
                    if codes[i] is not None:
                        runs[i][-1]["client"] = "agentload (--code)"
                    if a.reps > 1:
                        print(f"  ({rep + 1}/{a.reps}) " + render([Row(mode, conc, runs[i][-1])]).splitlines()[-1],
                              flush=True)
            for i in range(len(clients)):
                rows.append(Row(mode, conc, median_run(runs[i])))
                print(render(rows[-1:]).splitlines()[-1], flush=True)
    if rows:
        print()
        print(render(rows))
    for r in rows:
        if r.res.get("failed"):
            print(f"warning: {r.mode} {r.concurrency} {r.name}: {r.res['failed']} request(s) failed")
        if r.res.get("verdict") not in (None, "healthy"):
            print(f"note: {r.mode} {r.concurrency} {r.name}: verdict {r.res['verdict']}: {r.res.get('verdict_summary')}")
    scale = None
    if a.scale:
        from bench.scale import run_scale

        scale = run_scale(a, srv_cpu, cli_cpu)
    peers = None
    if a.peers:
        from bench.peers import run_peers

        peers = run_peers(a, srv_cpu, cli_cpu)
    if a.json:
        write_atomic(a.json, orjson.dumps({"machine": machine(), "rows": [r.as_dict() for r in rows],
                                           "scale": scale, "peers": peers}, option=orjson.OPT_INDENT_2))
    print(f"\nbench: took {took(time.monotonic() - t_start)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
