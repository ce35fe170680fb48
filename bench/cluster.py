"""What a sharded run costs: one process vs `--workers 2` vs `--ray local --shards 2`, on this machine.

    python -m bench.cluster              # re-runs itself inside `unshare -n` (loopback only; root)
    python -m bench.cluster --agents 128 --rounds 40

For each way it runs the same agentload workload (bench/bench.toml, paced answers from
bench/server.py) and prints requests per client CPU-second (CPU of the `agentload run` process and
every process under it, sampled from /proc every 50 ms, each process's last utime+stime summed:
workers, Ray's GCS, raylet and actors included, also those killed without being reaped; the server
is not counted), the
Ray driver's own CPU per shard per second (run.json `driver`), and how many records a second the
driver can move onto its clock (`shift_lines`, measured alone on one core). Median of --repeat.
Nothing is asserted; the numbers go to docs/sharded-runs.md with this command.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import orjson

from bench.harness import REPO, cpu_s, descendants


def _tree_cpu_sampler(pid: int, seen: dict[int, float], stop: "threading.Event") -> None:
    """Every 50 ms: utime+stime of pid and each descendant, the last value per pid kept."""
    while not stop.is_set():
        for p in descendants(pid):
            try:
                seen[p] = cpu_s(p)
            except (OSError, IndexError, ValueError):
                pass
        stop.wait(0.05)


def run_way(way: list[str], endpoint: str, agents: int, rounds: int, out: Path) -> dict:
    cmd = [sys.executable, "-m", "agentload", "run", str(REPO / "bench" / "bench.toml"), "--endpoint", endpoint,
           "--set", f"agents.count={agents}", "--set", f"agents.rounds={rounds}", "--set", f"client.limit={agents}",
           "--set", "canary.every_s=0", "--no-live", "--fail-on", "never", "--out", str(out), *way]
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}


    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    seen: dict[int, float] = {}
    stop = threading.Event()
    sampler = threading.Thread(target=_tree_cpu_sampler, args=(proc.pid, seen, stop), daemon=True)
    sampler.start()
    _, err = proc.communicate(timeout=900)
    stop.set()
    sampler.join()
    cpu, wall = sum(seen.values()), time.monotonic() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(way) or 'one process'} failed: {err[-2000:]}")
    summary = orjson.loads((out / "summary.json").read_bytes())
    meta = orjson.loads((out / "run.json").read_bytes())
    n = summary["totals"]["requests"]
    return {"requests": n, "cpu_s": cpu, "wall_s": wall, "req_per_cpu_s": n / cpu,
            "verdict": summary["verdict"]["kind"], "driver": meta.get("driver")}


def shift_rate(lines: int = 200_000) -> float:
    """Records a second `shift_lines` moves onto the driver's clock, one core."""
    from agentload.cluster.shards import shift_lines, shift_record

    rec = {"v": 1, "run": "r", "kind": "agent", "agent": 1, "round": 3, "call": 0, "request_id": "r-a1-r3-c0",
           "messages": 7, "prompt_bytes": 9000, "prompt_tokens": 2200, "server_prompt_tokens": 2200,
           "output_tokens": 32, "status": 200, "outcome": "ok", "error": None, "error_msg": None,
           "stalled_phase": None, "reused": True, "finish_reason": "stop", "tool_calls": 0, "chunks": 35,
           "token_chunks": 32, "comments": 0, "max_gap_ns": 5_100_000, "max_gap_at": 10**13,
           "t": {k: 10**13 + i * 1000 for i, k in enumerate(("start", "pool", "conn", "sent", "headers",
                                                             "first_byte", "first_token", "end"))},
           "server_first_token_ns": 10**13, "bad_events": 0, "id_sent": "0f8c", "backend": None,
           "cached_tokens": None, "conversation": 0, "shard": None}
    data = b"\n".join([orjson.dumps(rec)] * lines) + b"\n"
    t = time.process_time()
    shift_lines(data, shift_record, -12345, 1)
    return lines / (time.process_time() - t)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.cluster", description=__doc__.split("\n")[0])
    ap.add_argument("--agents", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--in-netns", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if not a.in_netns:  # Ray binds to the machine's interface otherwise: loopback-only namespace
        if shutil.which("unshare") is None:
            sys.exit("bench.cluster: needs unshare (util-linux) and root, for a loopback-only network namespace")
        return subprocess.call(["unshare", "-n", sys.executable, "-m", "bench.cluster", "--in-netns",
                                *(argv if argv is not None else sys.argv[1:])], cwd=REPO)
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    sys.path.insert(0, str(REPO))
    from agentload.process import ChildProcess

    server = ChildProcess.start([sys.executable, "-m", "bench.server", "--port", "0", "--ttft-ms", "50",
                                 "--chunks", "32", "--interval-ms", "5"], name="bench server", cwd=REPO,
                                lifeline=True, stderr=subprocess.DEVNULL)
    port = int(server.wait_line("BENCH_SERVER_LISTENING port=", 15).split("port=")[1].split()[0])
    endpoint = f"http://127.0.0.1:{port}/v1"
    ways = {"one process": [], "--workers 2": ["--workers", "2"], "--ray local --shards 2": ["--ray", "local", "--shards", "2"]}
    rows = {}
    tmp = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    try:
        for name, way in ways.items():
            runs = [run_way(way, endpoint, a.agents, a.rounds, tmp / f"{name.replace(' ', '_')}-{k}")
                    for k in range(a.repeat)]
            rows[name] = runs
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    base = statistics.median(r["req_per_cpu_s"] for r in rows["one process"])
    print(f"bench.cluster: {a.agents} agents x {a.rounds} rounds against bench/server.py (50 ms to first token, "
          f"32 chunks 5 ms apart), median of {a.repeat}")
    print(f"{'way':<24} {'requests':>8} {'client CPU s':>12} {'req/CPU-s':>10} {'vs one':>7} {'wall s':>7}  verdict")
    for name, runs in rows.items():
        med = sorted(runs, key=lambda r: r["req_per_cpu_s"])[len(runs) // 2]
        print(f"{name:<24} {med['requests']:>8} {med['cpu_s']:>12.2f} {med['req_per_cpu_s']:>10.0f} "
              f"{med['req_per_cpu_s'] / base:>7.2f} {med['wall_s']:>7.1f}  {med['verdict']}")
    drivers = [r["driver"] for r in rows["--ray local --shards 2"] if r.get("driver")]
    if drivers:
        d = sorted(drivers, key=lambda x: x["cpu_per_shard_per_s"])[len(drivers) // 2]
        print(f"ray driver: {d['cpu_s']:.2f} CPU-s over {d['wall_s']:.1f} s for {d['records']} records = "
              f"{d['cpu_per_shard_per_s'] * 100:.1f}% of a core per shard")
    print(f"records moved onto the driver's clock: {shift_rate():,.0f} records/s on one core (shift_lines alone)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
