"""`agentload run --shard I/N` in separate processes (as a Kubernetes Indexed Job or a Slurm array
would run them) and `agentload merge`: one report, clocks aligned by the wall-clock anchors.

One shard's folder is moved onto another monotonic clock on purpose (every stamp and its t0_ns
+1,000 s, as a host booted at another time would have it): the merge must put its requests back
where they happened, within the uncertainty it states.
"""

from __future__ import annotations

import subprocess
import sys

import orjson
import pytest

from agentload.mock.process import MockProcess
from agentload.records import load_records
from helpers import cli

pytestmark = pytest.mark.slow

SHIFT_NS = 1_000 * 10**9


def _shift_folder(d, delta):
    meta = orjson.loads((d / "run.json").read_bytes())
    for k in ("t0_ns", "t_end_ns"):
        if meta.get(k):
            meta[k] += delta
    (d / "run.json").write_bytes(orjson.dumps(meta))
    lines = []
    for line in (d / "records.jsonl").read_bytes().splitlines():
        r = orjson.loads(line)
        r["t"] = {k: v + delta for k, v in r["t"].items()}
        if r.get("max_gap_at"):
            r["max_gap_at"] += delta
        if r.get("server_first_token_ns"):
            r["server_first_token_ns"] += delta
        lines.append(orjson.dumps(r))
    (d / "records.jsonl").write_bytes(b"\n".join(lines) + b"\n")


def test_shards_run_apart_merge_into_one_run_on_one_clock(tmp_path):
    with MockProcess.start() as mock:
        procs = [subprocess.Popen([sys.executable, "-m", "agentload", "run", "demo", "--endpoint", mock.url,
                                   "--shard", f"{i}/2", "--no-live", "--out", str(tmp_path / f"s{i}")],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for i in range(2)]
        for p in procs:
            _, err = p.communicate(timeout=120)
            assert p.returncode == 0, err.decode()[-2000:]
    for i in range(2):
        meta = orjson.loads((tmp_path / f"s{i}" / "run.json").read_bytes())
        assert meta["shard"] == [i, 2]
        recs = load_records(tmp_path / f"s{i}" / "records.jsonl").records
        assert {r.agent % 2 for r in recs if r.kind == "agent"} == {i}
    truth = {r.request_id: r.t["start"] for r in load_records(tmp_path / "s1" / "records.jsonl").records}
    _shift_folder(tmp_path / "s1", SHIFT_NS)

    out = tmp_path / "merged"
    res = cli("merge", str(tmp_path / "s0"), str(tmp_path / "s1"), "--out", str(out))
    assert res.returncode == 0, res.stderr
    assert "wall-clock" in res.stderr and "+/- 5.0 ms" in res.stderr
    meta = orjson.loads((out / "run.json").read_bytes())
    assert [s["shard"] for s in meta["shards"]] == [0, 1]
    assert abs(meta["shards"][1]["offset_ns"] - SHIFT_NS) < meta["shards"][1]["uncertainty_ns"]
    merged = {r.request_id: r for r in load_records(out / "records-w1.jsonl").records}
    assert set(merged) == set(truth)
    bound = meta["shards"][1]["uncertainty_ns"]
    assert all(abs(merged[k].t["start"] - truth[k]) <= bound for k in truth)
    assert all(r.shard == 1 and r.run == meta["run"] for r in merged.values())
    summary = orjson.loads((out / "summary.json").read_bytes())
    assert summary["verdict"]["kind"] == "healthy"
    assert summary["totals"]["requests"] == 40  # 8 agents x 5 rounds, from both shards


def test_merge_refuses_what_is_not_a_set_of_shards(tmp_path):
    res = cli("merge", str(tmp_path / "nope1"), str(tmp_path / "nope2"), "--out", str(tmp_path / "m"))
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "not a run folder" in res.stderr
