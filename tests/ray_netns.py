"""Runs inside a network namespace that has only loopback (tests/test_ray.py starts it with
`unshare -n`): a real Ray cluster of two nodes on 127.0.0.1 and agentload runs through it.

    python3 tests/ray_netns.py OUT_DIR

Writes OUT_DIR/<case>/ run folders and OUT_DIR/result.json; every process it starts is stopped.
Nothing here can reach another address: the namespace has no other interface.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# a cluster of this namespace only, for this test: Ray's token auth would need one token shared by
# `ray start` and every driver; nothing outside the namespace can reach it anyway
os.environ["RAY_AUTH_MODE"] = "disabled"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))


# (case, its mock, its scenario): each run once through the cluster and once in one process
CASES = (("healthy", "healthy", "demo"), ("hang", "hang", "long-context-hang"))


def sh(*args: str, timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env)


def agentload(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return sh(sys.executable, "-m", "agentload", *args, timeout=timeout)


def main() -> int:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    assert sh("ip", "link", "set", "lo", "up").returncode == 0
    ray_bin = str(Path(sys.executable).parent / "ray") if (Path(sys.executable).parent / "ray").exists() else "ray"
    result: dict = {"steps": []}
    from agentload.mock.config import MockConfig
    from agentload.mock.process import MockProcess
    from agentload.process import free_port
    from agentload.run.scenario import load_scenario

    cfgs = {"healthy": MockConfig(), "hang": load_scenario("long-context-hang").mock}
    mocks = {name: MockProcess.start(cfg) for name, cfg in cfgs.items()}
    port = free_port()
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    tmp_a, tmp_b = out / "ray-head", out / "ray-node2"
    # the one-process runs need no cluster: they go while Ray starts and the Ray runs go (each run
    # mostly waits on its mock), each against a mock of its own, and are read at the end
    alone: dict[str, subprocess.Popen] = {}
    try:
        for case, mock, scen in CASES:
            own = mocks[f"{mock}-one"] = MockProcess.start(cfgs[mock])
            with open(out / f"{case}-one.stderr", "wb") as err:
                alone[case] = subprocess.Popen([sys.executable, "-m", "agentload", "run", scen, "--endpoint", own.url,
                                                "--no-live", "--out", str(out / f"{case}-one"), "--fail-on", "never"],
                                               stdout=subprocess.DEVNULL, stderr=err)
        head = sh(ray_bin, "start", "--head", "--port", str(port), "--node-ip-address", "127.0.0.1",
                  "--num-cpus", "2", "--include-dashboard", "false", "--temp-dir", str(tmp_a),
                  "--disable-usage-stats", timeout=120, env=env)
        result["steps"].append(["ray start --head", head.returncode, head.stderr[-800:]])
        node2 = sh(ray_bin, "start", "--address", f"127.0.0.1:{port}", "--node-ip-address", "127.0.0.1",
                   "--num-cpus", "2", "--temp-dir", str(tmp_b), "--disable-usage-stats", timeout=120, env=env)
        result["steps"].append(["ray start --address", node2.returncode, node2.stderr[-800:]])
        addr = f"127.0.0.1:{port}"
        for case, mock, scen in CASES:
            ep = mocks[mock].url
            # the healthy run names the cluster on the command line, the hang in the scenario's [cluster]
            how = (["--ray", addr, "--shards", "2"] if case == "healthy" else
                   ["--set", 'cluster.engine="ray"', "--set", f'cluster.address="{addr}"', "--set", "cluster.shards=2"])
            r = agentload("run", scen, "--endpoint", ep, *how, "--no-live",
                          "--out", str(out / f"{case}-ray"), "--fail-on", "never", "--metrics-port", "0")
            result[f"{case}-ray"] = {"rc": r.returncode, "stderr": r.stderr[-3000:]}
        # a shard killed mid-run, and a shard whose event loop freezes: through the Python API
        result["kill"] = kill_and_freeze(addr, mocks["healthy"].url, out / "kill")
        import ray

        result["nodes"] = sorted({n["NodeManagerAddress"] for n in ray.nodes() if n.get("Alive")}) if ray.is_initialized() else None
        ray.shutdown()  # this driver leaves before `ray stop` takes the cluster away under it
        for case, p in alone.items():
            result[f"{case}-one"] = {"rc": p.wait(timeout=180),
                                     "stderr": (out / f"{case}-one.stderr").read_text(errors="replace")[-3000:]}
    finally:
        for p in alone.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        for m in mocks.values():
            m.stop()
        sh(ray_bin, "stop", "--force", timeout=60, env=env)
        for d in (tmp_a, tmp_b):
            shutil.rmtree(d, ignore_errors=True)
    (out / "result.json").write_text(json.dumps(result, indent=1))
    return 0


def kill_and_freeze(addr: str, endpoint: str, run_dir: Path) -> dict:
    import ray

    from agentload.cluster.ray import RayShards
    from agentload.report.build import write_reports
    from agentload.run.scenario import load_scenario

    sc = load_scenario("demo", [f'target.endpoint="{endpoint}"', "agents.count=8", "agents.rounds=200",
                                "agents.duration_s=12", "canary.every_s=1.0"])
    run_dir.mkdir(parents=True)
    seen: dict = {}

    def on_shards(actors) -> None:
        def later() -> None:
            time.sleep(2.0)
            ray.get(actors[0].block_loop.remote(7.0))  # shard 0's loop frozen 7 s: the driver must notice
            time.sleep(1.0)
            ray.kill(actors[1])  # shard 1 dies mid-run
            seen["killed_at"] = time.time()

        threading.Thread(target=later, daemon=True).start()

    from agentload.run.executor import prepare

    run = prepare(sc, run_dir, endpoint, embedded_mock=False, install_signals=False, log=lambda m: None)
    outcome = RayShards(addr, 2, on_shards=on_shards).execute(run)
    write_reports(run_dir)
    return {"cut_short": outcome.cut_short, "stop_reason": outcome.stop_reason, **seen}


if __name__ == "__main__":
    sys.exit(main())
