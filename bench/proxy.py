"""What `agentload proxy` adds: latency per request and CPU per proxied request.

One bench server (bench/server.py), then per repetition two runs of agentload's benchmark client
(bench/agentload_client.py, bench.toml's workload at `--streams` concurrent streams), back to back:

- direct: the client against the server;
- proxied: the same client against `agentload proxy` in front of the same server.

Figures, measured in the same repetition:

- the proxy's added latency per request, from its own records (both legs on one clock): the time
  from the harness's request arriving to it leaving upstream (`start - down_start`) plus the time
  from the first token read upstream to it written downstream (`down_first_token - first_token`);
- the client's time to first token (sent -> first token), direct and through the proxy, p50/p99;
- CPU per request: the proxy process's (utime + stime from /proc over the client's run, divided by
  the requests it recorded), against the client's own CPU per request in the direct run (what
  agentload spends to make a request, the issue's yardstick).

    python -m bench.proxy --streams 64 --rounds 20 --reps 3
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

from agentload.process import ChildProcess
from bench.harness import REPO, bench_env, cpu_s, pct


def _client(url: str, streams: int, rounds: int, out: Path) -> dict:
    res = out.with_suffix(".json")
    subprocess.run([sys.executable, "-m", "bench.agentload_client", "--url", url, "--concurrency", str(streams),
                    "--requests", str(rounds), "--out", str(out), "--result", str(res)],
                   check=True, cwd=REPO, env=bench_env(), timeout=600, stdout=subprocess.DEVNULL)
    return orjson.loads(res.read_bytes())


def _records(run_dir: Path) -> list[dict]:
    return [d for d in (orjson.loads(x) for x in (run_dir / "records.jsonl").read_bytes().splitlines() if x.strip())
            if d.get("kind") == "agent"]


def _ttft_ms(run_dir: Path) -> list[float]:
    return [(r["t"]["first_token"] - r["t"]["sent"]) / 1e6 for r in _records(run_dir)
            if r["outcome"] == "ok" and "first_token" in r["t"] and "sent" in r["t"]]


def one_rep(server_url: str, streams: int, rounds: int, tmp: Path, rep: int) -> dict:
    direct = _client(server_url, streams, rounds, tmp / f"direct-{rep}")
    proxy_dir = tmp / f"proxy-{rep}"
    cmd = [sys.executable, "-m", "agentload.cli", "proxy", "--upstream", server_url, "--port", "0",
           "--out", str(proxy_dir), "--no-live", "--fail-on", "never", "bench/bench.toml",
           "--set", f"client.limit={streams}"]
    proxy = ChildProcess.start(cmd, name="agentload proxy", env=bench_env(), cwd=REPO, stderr=subprocess.STDOUT)
    try:
        line = proxy.wait_line("agentload proxy: listening on", 60)
        port = int(line.split("http://127.0.0.1:", 1)[1].split()[0])
        cpu0 = cpu_s(proxy.pid)
        through = _client(f"http://127.0.0.1:{port}/v1", streams, rounds, tmp / f"through-{rep}")
        cpu1 = cpu_s(proxy.pid)
    finally:
        proxy.send_signal(signal.SIGINT)
        proxy.wait_exit(120)
        proxy.stop()
    recs = [r for r in _records(proxy_dir) if r["outcome"] == "ok"]
    added = [((r["t"]["start"] - r["t"]["down_start"]) + (r["t"]["down_first_token"] - r["t"]["first_token"])) / 1e6
             for r in recs if "down_first_token" in r["t"]]
    return {
        "requests": len(recs),
        "added_p50_ms": pct(added, 0.50), "added_p99_ms": pct(added, 0.99),
        "ttft_direct": (pct(_ttft_ms(tmp / f"direct-{rep}"), 0.50), pct(_ttft_ms(tmp / f"direct-{rep}"), 0.99)),
        "ttft_through": (pct(_ttft_ms(tmp / f"through-{rep}"), 0.50), pct(_ttft_ms(tmp / f"through-{rep}"), 0.99)),
        "proxy_cpu_us": (cpu1 - cpu0) / max(1, len(recs)) * 1e6,
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
    a = ap.parse_args(argv)
    server = ChildProcess.start([sys.executable, "-m", "bench.server", "--port", "0", "--ttft-ms", str(a.ttft_ms),
                                 "--chunks", str(a.chunks), "--interval-ms", str(a.interval_ms)],
                                name="bench server", env=bench_env(), cwd=REPO)
    rows = []
    try:
        port = int(server.wait_line("BENCH_SERVER_LISTENING", 30).split("port=", 1)[1].split()[0])
        url = f"http://127.0.0.1:{port}/v1"
        with tempfile.TemporaryDirectory(prefix="agentload-bench-proxy-") as tmp:
            for rep in range(a.reps):
                t0 = time.monotonic()
                rows.append(r := one_rep(url, a.streams, a.rounds, Path(tmp), rep))
                print(f"rep {rep + 1}/{a.reps} ({time.monotonic() - t0:.0f} s): {r['requests']} requests proxied",
                      file=sys.stderr, flush=True)
    finally:
        server.stop()
    print(f"agentload proxy at {a.streams} streams x {a.rounds} rounds (bench server: ttft {a.ttft_ms:g} ms, "
          f"{a.chunks} chunks {a.interval_ms:g} ms apart)")
    print("rep  added p50 ms  added p99 ms  ttft direct p50/p99 ms  ttft through p50/p99 ms  proxy CPU us/req  "
          "client CPU us/req  ratio")
    for i, r in enumerate(rows, 1):
        ratio = r["proxy_cpu_us"] / r["client_cpu_us"] if r["client_cpu_us"] else None
        print(f"{i:>3}  {_f(r['added_p50_ms']):>12}  {_f(r['added_p99_ms']):>12}  "
              f"{_f(r['ttft_direct'][0]):>9} / {_f(r['ttft_direct'][1]):<9}  "
              f"{_f(r['ttft_through'][0]):>10} / {_f(r['ttft_through'][1]):<10}  "
              f"{_f(r['proxy_cpu_us'], '{:.0f}'):>16}  {_f(r['client_cpu_us'], '{:.0f}'):>17}  {_f(ratio)}")
        if r["through_failed"]:
            print(f"     {r['through_failed']} request(s) through the proxy failed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
