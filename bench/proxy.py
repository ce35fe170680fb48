"""What `agentload proxy` adds: latency per request and CPU per proxied request.

One bench server (bench/server.py), then per repetition two runs of agentload's benchmark client
(bench/agentload_client.py, bench.toml's workload at `--streams` concurrent streams), back to back:

- direct: the client against the server;
- proxied: the same client against `agentload proxy` in front of the same server.

Figures, measured in the same repetition:

- the client's time to first token (sent -> first token), direct and through the proxy, p50/p99,
  and their difference, the added latency (below);
- the proxy's own part of it, from its records (both legs on one clock): `in`, from the harness's
  request arriving to it leaving upstream (`start - down_start`), and `out`, from the first token
  read upstream to it written downstream (`down_first_token - first_token`);
- CPU per request: the proxy process's (utime + stime from /proc over the client's run, divided by
  the requests it recorded), against the client's own CPU per request in the direct run (what
  agentload spends to make a request, the issue's yardstick);
- the floor under any proxy that passes each block on as it arrives: the same client through
  `bench/relay.py` (a TCP relay that forwards every read at once and understands nothing), its CPU
  per request against the client's; and the proxy's CPU split into user and system (kernel) time;
- the proxy's own event-loop lag (its one-second samples while requests were in flight, as its
  report has them): a proxy that cannot keep up says so there;
- the machine's load average around each repetition (the three processes share its cores with
  whatever else runs: a busy machine preempts the proxy mid-request, which shows in the p99).

Added latency is what issue 30 defines it as: the client's time to first token through the proxy
minus direct (p50 minus p50, p99 minus p99), in the same repetition. The same figure is printed for
the two floors, which add next to nothing of their own: what they show is what the measure itself
moves on this machine. The proxy's own part is printed beside it, from its records on this host's
one clock: how long a request waited between the client sending it and the proxy's handler taking
it up (its loop busy with the other streams' blocks), `in` and `out` as above.

The streams start spread over one answer's length (`--stagger-ms`, default ttft + chunks x
interval): started at once, with no tool time and a server that answers every stream alike, their
rounds stay in lockstep, and every round's requests reach the proxy within a millisecond, so the
wait measures the queue of 64 simultaneous arrivals (half of them wait for the other half's
handling), which no real harness's agents make. `--stagger-ms 0` keeps the lockstep.

Where the processes run (`--cores`): by default (`shared`) nothing is pinned and the three share
the machine's CPUs; `own` gives the proxy (and each floor in its place) the CPUs but the first,
which the server and the client share. Measured on the 2-CPU VM: with `own` even the TCP relay added
0.3-2.8 ms p50 (every block crosses to the other CPU and wakes it), with `shared` -0.1-0.0 ms.

Last, the goals of issue 30 (added p50 <= 0.3 ms, p99 <= 2 ms, CPU <= 1.5x the client's), each
judged on the median over the repetitions, one line each: met, or FAILED with the figures.

    python -m bench.proxy --streams 64 --rounds 20 --reps 3
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

import orjson

from agentload.process import ChildProcess
from bench.harness import REPO, TICK, bench_env, cpu_s, cpus, pct, pinned


def placement(cores: str) -> tuple[str | None, str | None]:
    """(CPUs of the server and the client, CPUs of the proxy) for `--cores`: `own` gives the proxy (and
    the floors measured in its place) the machine's CPUs but the first, which the server and the client
    share, so nothing the bench runs preempts the proxy mid-request; `shared` (or a machine where
    pinning is not possible) pins nothing and the three compete for every CPU."""
    first, rest = cpus()
    if cores == "shared" or first is None:
        return None, None
    return first, rest


def _client(url: str, streams: int, rounds: int, out: Path, cpu: str | None = None, stagger_s: float = 0.0) -> dict:
    res = out.with_suffix(".json")
    subprocess.run(pinned([sys.executable, "-m", "bench.agentload_client", "--url", url, "--concurrency", str(streams),
                           "--requests", str(rounds), "--out", str(out), "--result", str(res)]
                          + (["--set", f"agents.start={stagger_s}"] if stagger_s else []), cpu),
                   check=True, cwd=REPO, env=bench_env(), timeout=600, stdout=subprocess.DEVNULL)
    return orjson.loads(res.read_bytes())


def _records(run_dir: Path) -> list[dict]:
    return [d for d in (orjson.loads(x) for x in (run_dir / "records.jsonl").read_bytes().splitlines() if x.strip())
            if d.get("kind") == "agent"]


def _ttft_ms(run_dir: Path) -> list[float]:
    return [(r["t"]["first_token"] - r["t"]["sent"]) / 1e6 for r in _records(run_dir)
            if r["outcome"] == "ok" and "first_token" in r["t"] and "sent" in r["t"]]


def _ttft(run_dir: Path) -> tuple[float | None, float | None]:
    """The client's time to first token, p50 and p99 (ms)."""
    v = _ttft_ms(run_dir)
    return pct(v, 0.50), pct(v, 0.99)


def _minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def _waits_ms(client: list[dict], proxied: list[dict]) -> list[float]:
    """How long each request waited between the client sending it and the proxy's handler taking it
    up (the proxy's loop busy with others; not in its own records' `in`). Both are stamped on this
    host's monotonic clock; a request is matched within its round by order (the n-th sent, the n-th
    taken up: the proxy takes them up in the order they came)."""
    sent: dict[int, list[int]] = {}
    taken: dict[int, list[int]] = {}
    for r in client:
        if r["outcome"] == "ok" and "sent" in r["t"]:
            sent.setdefault(r["round"], []).append(r["t"]["sent"])
    for r in proxied:
        taken.setdefault(r["round"], []).append(r["t"]["down_start"])
    out = []
    for rnd, ts in taken.items():
        out += [(b - a) / 1e6 for a, b in zip(sorted(sent.get(rnd, ())), sorted(ts))]
    return out


GOAL_ADDED_P50_MS = 0.3
GOAL_ADDED_P99_MS = 2.0
GOAL_CPU_RATIO = 1.5


def _busy_lags_ms(run_dir: Path) -> list[float]:
    """The proxy's loop lag in its one-second samples taken while requests were in flight."""
    out = []
    for line in (run_dir / "samples.jsonl").read_bytes().splitlines():
        if line.strip():
            s = orjson.loads(line)
            if s.get("inflight"):
                out.append(float(s.get("loop_lag_ms") or 0.0))
    return out


def _user_sys_s(pid: int) -> tuple[float, float]:
    with open(f"/proc/{pid}/stat", "rb") as f:
        rest = f.read().rsplit(b")", 1)[1].split()
    return int(rest[11]) / TICK, int(rest[12]) / TICK


def _relay_cpu_us(server_url: str, streams: int, rounds: int, out: Path, http: bool = False,
                  cores: tuple[str | None, str | None] = (None, None), stagger_s: float = 0.0) -> float:
    """CPU per request of bench/relay.py (a TCP relay, or with `http` a plain aiohttp proxy) carrying
    the client's run to the server (placed as the proxy is: `cores`)."""
    upstream = urlsplit(server_url).netloc
    relay = ChildProcess.start(pinned([sys.executable, "-m", "bench.relay", "--upstream", upstream] + ["--http"] * http,
                                      cores[1]),
                               name="bench relay", env=bench_env(), cwd=REPO)
    try:
        port = int(relay.wait_line("BENCH_RELAY_LISTENING", 30).split("port=", 1)[1].split()[0])
        cpu0 = cpu_s(relay.pid)
        res = _client(f"http://127.0.0.1:{port}/v1", streams, rounds, out, cores[0], stagger_s)
        cpu1 = cpu_s(relay.pid)
    finally:
        relay.stop()
    if res["failed"]:
        raise SystemExit(f"bench.proxy: {res['failed']} request(s) through the relay failed")
    return (cpu1 - cpu0) / max(1, res["requests"]) * 1e6


def one_rep(server_url: str, streams: int, rounds: int, tmp: Path, rep: int,
            cores: tuple[str | None, str | None] = (None, None), stagger_s: float = 0.0) -> dict:
    load0 = os.getloadavg()[0]
    direct = _client(server_url, streams, rounds, tmp / f"direct-{rep}", cores[0], stagger_s)
    proxy_dir = tmp / f"proxy-{rep}"
    cmd = [sys.executable, "-m", "agentload.cli", "proxy", "--upstream", server_url, "--port", "0",
           "--out", str(proxy_dir), "--no-live", "--fail-on", "never", "bench/bench.toml",
           "--set", f"client.limit={streams}"]
    proxy = ChildProcess.start(pinned(cmd, cores[1]), name="agentload proxy", env=bench_env(), cwd=REPO,
                               stderr=subprocess.STDOUT)
    try:
        line = proxy.wait_line("agentload proxy: listening on", 60)
        port = int(line.split("http://127.0.0.1:", 1)[1].split()[0])
        user0, sys0 = _user_sys_s(proxy.pid)
        through = _client(f"http://127.0.0.1:{port}/v1", streams, rounds, tmp / f"through-{rep}", cores[0], stagger_s)
        user1, sys1 = _user_sys_s(proxy.pid)
    finally:
        proxy.send_signal(signal.SIGINT)
        proxy.wait_exit(120)
        proxy.stop()
    relay_us = _relay_cpu_us(server_url, streams, rounds, tmp / f"relay-{rep}", cores=cores, stagger_s=stagger_s)
    http_us = _relay_cpu_us(server_url, streams, rounds, tmp / f"http-{rep}", http=True, cores=cores,
                            stagger_s=stagger_s)
    recs = [r for r in _records(proxy_dir) if r["outcome"] == "ok" and "down_first_token" in r["t"]]
    ins = [(r["t"]["start"] - r["t"]["down_start"]) / 1e6 for r in recs]
    outs = [(r["t"]["down_first_token"] - r["t"]["first_token"]) / 1e6 for r in recs]
    own = [a + b for a, b in zip(ins, outs)]
    waits = _waits_ms(_records(tmp / f"through-{rep}"), recs)
    lags = _busy_lags_ms(proxy_dir)
    ttft_direct, ttft_through = _ttft(tmp / f"direct-{rep}"), _ttft(tmp / f"through-{rep}")
    return {
        "requests": len(recs),
        "added_p50_ms": _minus(ttft_through[0], ttft_direct[0]), "added_p99_ms": _minus(ttft_through[1], ttft_direct[1]),
        "own_p50_ms": pct(own, 0.50), "own_p99_ms": pct(own, 0.99),
        "wait_ms": (pct(waits, 0.50), pct(waits, 0.99)),
        "in_ms": (pct(ins, 0.50), pct(ins, 0.99)), "out_ms": (pct(outs, 0.50), pct(outs, 0.99)),
        "lag_ms": (pct(lags, 0.50), max(lags, default=None)),
        "load": (load0, os.getloadavg()[0]),
        "ttft_direct": ttft_direct, "ttft_through": ttft_through,
        "ttft_relay": _ttft(tmp / f"relay-{rep}"), "ttft_http": _ttft(tmp / f"http-{rep}"),
        "proxy_cpu_us": (user1 - user0 + sys1 - sys0) / max(1, len(recs)) * 1e6,
        "proxy_sys_us": (sys1 - sys0) / max(1, len(recs)) * 1e6,
        "relay_cpu_us": relay_us, "http_cpu_us": http_us,
        "client_cpu_us": direct["cpu_s"] / max(1, direct["requests"]) * 1e6,
        "through_failed": through["failed"],
    }


def _f(v: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if v is None else fmt.format(v)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--ttft-ms", type=float, default=20.0)
    ap.add_argument("--chunks", type=int, default=32)
    ap.add_argument("--interval-ms", type=float, default=5.0)
    ap.add_argument("--cores", choices=("own", "shared"), default="shared",
                    help="shared: nothing pinned, all three compete for every CPU; own: the proxy on CPUs of its "
                         "own, the server and the client sharing the first (where taskset and 2+ CPUs allow)")
    ap.add_argument("--stagger-ms", type=float, default=None,
                    help="start the streams over this many ms (default: one answer's length, ttft + chunks x "
                         "interval, so their rounds do not arrive together); 0: all at once, in lockstep")
    a = ap.parse_args(argv)
    cores = placement(a.cores)
    stagger_s = (a.ttft_ms + a.chunks * a.interval_ms if a.stagger_ms is None else a.stagger_ms) / 1000
    server = ChildProcess.start(pinned([sys.executable, "-m", "bench.server", "--port", "0", "--ttft-ms",
                                        str(a.ttft_ms), "--chunks", str(a.chunks), "--interval-ms",
                                        str(a.interval_ms)], cores[0]),
                                name="bench server", env=bench_env(), cwd=REPO)
    rows = []
    try:
        port = int(server.wait_line("BENCH_SERVER_LISTENING", 30).split("port=", 1)[1].split()[0])
        url = f"http://127.0.0.1:{port}/v1"
        with tempfile.TemporaryDirectory(prefix="agentload-bench-proxy-") as tmp:
            for rep in range(a.reps):
                t0 = time.monotonic()
                rows.append(r := one_rep(url, a.streams, a.rounds, Path(tmp), rep, cores, stagger_s))
                print(f"rep {rep + 1}/{a.reps} ({time.monotonic() - t0:.0f} s): {r['requests']} requests proxied",
                      file=sys.stderr, flush=True)
    finally:
        server.stop()
    print(f"agentload proxy at {a.streams} streams x {a.rounds} rounds (bench server: ttft {a.ttft_ms:g} ms, "
          f"{a.chunks} chunks {a.interval_ms:g} ms apart)")
    if cores[0] is None:
        print(f"cores: nothing pinned: the server, the client and the proxy share the machine's {os.cpu_count()} "
              f"CPUs (a proxy preempted mid-request by the other two shows in its p99)")
    else:
        print(f"cores: the server and the client on CPU {cores[0]}, the proxy (and each floor in its place) on "
              f"CPU {cores[1]} (--cores shared: nothing pinned)")
    print("rep  added p50 ms  added p99 ms  ttft direct p50/p99 ms  ttft through p50/p99 ms  proxy CPU us/req  "
          "client CPU us/req  ratio")
    for i, r in enumerate(rows, 1):
        r["ratio"] = r["proxy_cpu_us"] / r["client_cpu_us"] if r["client_cpu_us"] else None
        r["relay_ratio"] = r["relay_cpu_us"] / r["client_cpu_us"] if r["client_cpu_us"] else None
        r["http_ratio"] = r["http_cpu_us"] / r["client_cpu_us"] if r["client_cpu_us"] else None
        print(f"{i:>3}  {_f(r['added_p50_ms']):>12}  {_f(r['added_p99_ms']):>12}  "
              f"{_f(r['ttft_direct'][0]):>9} / {_f(r['ttft_direct'][1]):<9}  "
              f"{_f(r['ttft_through'][0]):>10} / {_f(r['ttft_through'][1]):<10}  "
              f"{_f(r['proxy_cpu_us'], '{:.0f}'):>16}  {_f(r['client_cpu_us'], '{:.0f}'):>17}  {_f(r['ratio'])}")
        print(f"     added = client ttft through the proxy - direct (p50 - p50, p99 - p99); the proxy's own part "
              f"(its records, p50/p99): waiting to be taken up {_f(r['wait_ms'][0])} / {_f(r['wait_ms'][1])} ms "
              f"(client sent -> handler ran), in {_f(r['in_ms'][0])} / {_f(r['in_ms'][1])} ms (-> sent upstream), "
              f"out {_f(r['out_ms'][0])} / {_f(r['out_ms'][1])} ms (first token read -> written on); "
              f"proxy loop lag p50 {_f(r['lag_ms'][0], '{:.0f}')} ms, max {_f(r['lag_ms'][1], '{:.0f}')} ms; "
              f"load average {r['load'][0]:.2f} -> {r['load'][1]:.2f} on {os.cpu_count()} CPUs")
        print(f"     proxy CPU {_f(r['proxy_cpu_us'] - r['proxy_sys_us'], '{:.0f}')} user + "
              f"{_f(r['proxy_sys_us'], '{:.0f}')} system us/req; floor: a TCP relay passing each read on "
              f"(bench/relay.py) {_f(r['relay_cpu_us'], '{:.0f}')} us/req ({_f(r['relay_ratio'])}x the client's), "
              f"a plain aiohttp proxy (--http) {_f(r['http_cpu_us'], '{:.0f}')} us/req ({_f(r['http_ratio'])}x)")
        r["relay_added"] = (_minus(r["ttft_relay"][0], r["ttft_direct"][0]), _minus(r["ttft_relay"][1], r["ttft_direct"][1]))
        r["http_added"] = (_minus(r["ttft_http"][0], r["ttft_direct"][0]), _minus(r["ttft_http"][1], r["ttft_direct"][1]))
        print(f"     client ttft p50/p99 through the floors: the TCP relay {_f(r['ttft_relay'][0])} / "
              f"{_f(r['ttft_relay'][1])} ms (added {_f(r['relay_added'][0])} / {_f(r['relay_added'][1])}), the plain "
              f"aiohttp proxy {_f(r['ttft_http'][0])} / {_f(r['ttft_http'][1])} ms (added {_f(r['http_added'][0])} / "
              f"{_f(r['http_added'][1])})")
        if r["through_failed"]:
            print(f"     {r['through_failed']} request(s) through the proxy failed")
    _goals(rows)  # (a report, not a gate: the exit status says only that the bench ran)
    return 0


def _goals(rows: list[dict]) -> bool:
    """One line per goal of issue 30, judged on the median over the repetitions; True if all were met."""
    def median(key: str) -> float | None:
        vals = [r[key] for r in rows if r[key] is not None]
        return statistics.median(vals) if vals else None

    all_met = True
    for name, key, goal, unit in (("added latency p50", "added_p50_ms", GOAL_ADDED_P50_MS, " ms"),
                                  ("added latency p99", "added_p99_ms", GOAL_ADDED_P99_MS, " ms"),
                                  ("proxy CPU / client CPU per request", "ratio", GOAL_CPU_RATIO, "x")):
        m = median(key)
        each = ", ".join(_f(r[key]) for r in rows)
        if m is not None and m <= goal:
            print(f"goal {name} <= {goal:g}{unit}: met ({_f(m)}{unit}, median of {each})")
            continue
        all_met = False
        print(f"goal {name} <= {goal:g}{unit}: FAILED ({_f(m)}{unit}, median of {each})")
    def median_of(key: str, i: int) -> float | None:
        vals = [r[key][i] for r in rows if r[key][i] is not None]
        return statistics.median(vals) if vals else None

    print(f"     (added latency is the client's time to first token through the proxy minus direct, as issue 30 "
          f"defines it; the same figure through the floors, which add next to nothing of their own, is what the "
          f"measure itself moves: the TCP relay {_f(median_of('relay_added', 0))} / {_f(median_of('relay_added', 1))} ms, "
          f"the plain aiohttp proxy {_f(median_of('http_added', 0))} / {_f(median_of('http_added', 1))} ms (p50 / p99, "
          f"medians); the proxy's own part in its records, waiting + in + out: in + out "
          f"{_f(median('own_p50_ms'))} / {_f(median('own_p99_ms'))} ms, waiting {_f(median_of('wait_ms', 0))} / "
          f"{_f(median_of('wait_ms', 1))} ms)")
    floor, http = median("relay_ratio"), median("http_ratio")
    if floor is not None and http is not None:
        print(f"     floors: a TCP relay that only passes each read on costs {_f(floor)}x the client's CPU per "
              f"request, a plain aiohttp proxy {_f(http)}x (medians); a proxy that forwards each block as it "
              f"arrives pays at least the first, one on aiohttp the second, which leaves "
              f"{_f(GOAL_CPU_RATIO - http)}x of the CPU goal for reading, timing and recording")
    if not all_met:
        lag = max((r["lag_ms"][1] for r in rows if r["lag_ms"][1] is not None), default=None)
        print(f"     (the proxy's own loop lag reached {_f(lag, '{:.0f}')} ms; load average up to "
              f"{max(max(r['load']) for r in rows):.2f} on {os.cpu_count()} CPUs: a late 'in' or 'out' above is "
              f"the proxy waiting for its loop or its CPU)")
    return all_met


if __name__ == "__main__":
    sys.exit(main())
