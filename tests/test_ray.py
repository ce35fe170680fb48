"""agentload over a real Ray cluster: two Ray nodes on this machine, inside a network namespace that
has only loopback (`unshare -n`; Ray binds some of its processes to the machine's interface address
otherwise), two shards, one report (tests/ray_netns.py does the work inside the namespace).

Ray comes with the `ray` extra; .ci/run installs it. Without Ray or without the right to make a
namespace (root) the tests skip, unless CI is set: there they must run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import orjson
import pytest

from agentload.records import load_records
from agentload.records.rundir import load_run
from helpers import REPO

pytestmark = [pytest.mark.slow, pytest.mark.ray]


def _why_not() -> str | None:
    try:
        import ray  # noqa: F401
    except ImportError:
        return "Ray is not installed (pip install -e '.[ray]')"
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "unshare / ip (util-linux, iproute2) missing"
    probe = subprocess.run(["unshare", "-n", "true"], capture_output=True)
    if probe.returncode != 0:
        return f"cannot make a network namespace here ({probe.stderr.decode().strip()[:100]})"
    return None


@pytest.fixture(scope="module")
def cluster_runs(tmp_path_factory):
    why = _why_not()
    if why is not None:
        if os.environ.get("CI"):
            pytest.fail(f"the Ray tier must run in CI: {why}")
        pytest.skip(why)
    out = tmp_path_factory.mktemp("ray")
    proc = subprocess.run(["unshare", "-n", sys.executable, str(REPO / "tests" / "ray_netns.py"), str(out)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads((out / "result.json").read_text())
    assert [s[1] for s in result["steps"]] == [0, 0], result["steps"]  # both `ray start` worked
    return out, result


def _summary(d):
    return orjson.loads((d / "summary.json").read_bytes())


def _meta(d):
    return orjson.loads((d / "run.json").read_bytes())


@pytest.mark.parametrize("case", ["healthy", "hang"])
def test_two_shards_on_two_nodes_give_the_one_process_verdict(cluster_runs, case):
    out, result = cluster_runs
    ray_dir, one_dir = out / f"{case}-ray", out / f"{case}-one"
    assert result[f"{case}-ray"]["rc"] == 0, result[f"{case}-ray"]["stderr"]
    meta = _meta(ray_dir)
    assert meta["engine"] == "ray" and meta["workers"] == 2
    assert meta["metrics_port"] > 0 and "live metrics at http://127.0.0.1:" in result[f"{case}-ray"]["stderr"]
    assert len({s["node"] for s in meta["shards"]}) == 2, "the shards did not spread over the two nodes"
    for s in meta["shards"]:  # offsets by round trips, each with its uncertainty
        assert s["method"] == "round-trip" and 0 < s["uncertainty_ns"] < 1_000_000_000
    v_ray, v_one = _summary(ray_dir)["verdict"], _summary(one_dir)["verdict"]
    assert (v_ray["kind"], v_ray.get("phase"), v_ray.get("first_round")) == \
        (v_one["kind"], v_one.get("phase"), v_one.get("first_round"))
    assert v_ray["kind"] == ("healthy" if case == "healthy" else "server_stall")
    # totals add up; request ids unique; every record says its shard
    recs = [r for f in sorted(ray_dir.glob("records-w*.jsonl")) for r in load_records(f).records]
    one = load_records(one_dir / "records.jsonl").records
    assert len([r for r in recs if r.kind == "agent"]) == len([r for r in one if r.kind == "agent"])
    assert len({r.request_id for r in recs}) == len(recs)
    assert {r.shard for r in recs if r.kind == "agent"} == {0, 1}
    assert all(r.agent % 2 == r.shard for r in recs if r.kind == "agent")
    # merged percentiles are those of all records
    data = load_run(ray_dir)
    e2e = sorted(r.t["end"] - r.t["start"] for r in data.iter_records() if r.kind == "agent" and r.outcome == "ok")
    got = _summary(ray_dir)["totals"]
    assert got["requests"] == len([r for r in recs if r.kind == "agent"])
    if e2e:
        assert got["completed"] == len(e2e)


def test_a_killed_shard_is_named_and_its_agents_cut_short(cluster_runs):
    out, result = cluster_runs
    d = out / "kill"
    meta = _meta(d)
    assert [x["shard"] for x in meta["lost_shards"]] == [1]
    assert meta["cut_short"] and not meta["ended_normally"]
    summary = _summary(d)
    assert summary["verdict"]["kind"] != "healthy"
    agents = {a["agent"]: a for a in summary["agents"]}
    assert all(agents[a]["outcome"] == "cut_short" and "shard 1 lost" in agents[a]["reason"]
               for a in agents if a % 2 == 1)
    assert all(agents[a]["outcome"] in ("duration_reached", "done") for a in agents if a % 2 == 0)
    # shard 0 went on after shard 1 died: records after the kill; shard 1's records up to it are kept
    recs0 = load_records(d / "records-w0.jsonl").records
    recs1 = load_records(d / "records-w1.jsonl").records
    assert recs1 and max(r.t["end"] for r in recs0) > max(r.t["end"] for r in recs1)
    # shard 0's event loop was frozen 7 s: the driver noticed
    assert any(s["shard"] == 0 and s.get("what") == "event loop" for s in meta["shard_stalls"]), meta["shard_stalls"]
