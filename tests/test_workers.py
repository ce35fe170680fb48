"""`--workers N`: N processes, every agent run once, one merged report.

Correctness only (a 2-core machine shows no speed-up; the benchmark measures that): the split
is deterministic and complete, totals add up, the merged percentiles are those of all records,
per-worker histograms add up to the same, samples merge into one series, and a worker sends the
same bytes as a single-process run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter

import orjson
import pytest

from agentload.analysis.stats import PhaseStats, by_round, summarize
from agentload.cluster.shards import merge_meta, split
from agentload.mock.config import MockConfig
from agentload.mock.process import MockProcess
from agentload.records import load_records
from agentload.records.rundir import load_run, merge_worker_samples, worker_files
from helpers import REPO, run_scenario

pytestmark = pytest.mark.slow  # real runs of several seconds each: not in the fast tier

AGENTS = 7
ROUNDS = 3


@pytest.fixture(scope="module")
def mock():
    m = MockProcess.start(MockConfig(decode_tokens_per_s=2000, output_tokens=12))
    yield m
    m.stop()


def _sets(mock, extra=()):
    return [f'target.endpoint="{mock.url}"', f"agents.count={AGENTS}", f"agents.rounds={ROUNDS}",
            "canary.every_s=0.2", "conversation.tool_latency_ms=5", *extra]


@pytest.fixture(scope="module")
def two(mock, tmp_path_factory):
    out = tmp_path_factory.mktemp("workers") / "run"
    from agentload.launch import run_to_dir
    from agentload.run.scenario import load_scenario

    launched = run_to_dir(load_scenario("demo", _sets(mock)), out, live=False, install_signals=False,
                          log=lambda m: None, workers=2)
    return out, launched


def test_split_is_deterministic_and_complete():
    for agents, workers in [(7, 2), (10, 3), (3, 4), (1, 1), (10_000, 8)]:
        parts = split(agents, workers)
        assert len(parts) == workers
        flat = sorted(a for p in parts for a in p)
        assert flat == list(range(agents))
        assert split(agents, workers) == parts
        assert max(map(len, parts)) - min(map(len, parts)) <= 1


def test_every_agent_runs_once_in_its_own_worker(two):
    out, launched = two
    files = worker_files(out, "records", ".jsonl")
    assert [f.name for f in files] == ["records-w0.jsonl", "records-w1.jsonl"]
    assert not (out / "records.jsonl").exists()
    seen = Counter()
    for w, f in enumerate(files):
        loaded = load_records(f)
        assert loaded.torn_lines == 0
        agents = [r for r in loaded.records if r.kind == "agent"]
        assert agents and all(r.agent % 2 == w for r in agents)  # the deterministic split
        canaries = [r for r in loaded.records if r.kind == "canary"]
        assert bool(canaries) == (w == 0)  # canaries only in worker 0
        seen.update((r.agent, r.round) for r in agents if r.outcome == "ok")
    assert sorted(seen) == [(a, r) for a in range(AGENTS) for r in range(1, ROUNDS + 1)]
    assert set(seen.values()) == {1}
    ids = [r.request_id for r in load_run(out).records]
    assert len(ids) == len(set(ids))  # request ids (run, agent, round, call) stay unique
    assert len({r.run for r in load_run(out).records}) == 1  # one run id for all workers


def test_totals_add_up_and_run_json_is_merged(two):
    out, launched = two
    s = launched.summary
    assert s["verdict"]["kind"] == "healthy"
    assert s["run"]["workers"] == 2
    tot = s["totals"]
    assert tot["agents"] == AGENTS
    assert tot["requests"] == tot["completed"] == AGENTS * ROUNDS
    assert tot["rounds_completed"] == AGENTS * ROUNDS
    meta = orjson.loads((out / "run.json").read_bytes())
    lines = sum(len(load_records(f).records) for f in worker_files(out, "records", ".jsonl"))
    assert meta["records"] == lines == tot["requests"] + tot["canaries"]
    assert meta["ended"] and meta["ended_normally"] and not meta["cut_short"]
    assert [w["exit"] for w in meta["worker_runs"]] == [0, 0]
    assert meta["agents_per_worker"] == [4, 3]
    assert "per worker process, 2 workers" in launched.text  # the pool settings apply per process


def test_merged_percentiles_are_those_of_all_records(two):
    out, launched = two
    s = launched.summary
    every = []
    per_worker = []
    for f in worker_files(out, "records", ".jsonl"):
        recs = load_records(f).records
        every.extend(recs)
        per_worker.append(by_round(recs)[0])
    overall, rounds = by_round(every)
    assert s["phases"] == overall.phases()
    assert [r["phases"] for r in s["rounds"]] == [rounds[k].phases() for k in sorted(rounds)]
    # and the per-worker histograms added together give the same percentiles
    merged = PhaseStats()
    for ps in per_worker:
        for p, h in ps.hists.items():
            merged.hists[p].add(h)
    assert {p: summarize(h) for p, h in merged.hists.items()} == s["phases"]


def test_samples_merge_into_one_series(two):
    out, _ = two
    data = load_run(out)
    assert data.samples and max(x.get("workers", 1) for x in data.samples) == 2
    ts = [x["t"] for x in data.samples]
    assert ts == sorted(ts)
    last = data.samples[-1]["counts"]
    assert last["requests"] == AGENTS * ROUNDS  # each worker's final count, added up


def test_merge_worker_samples_adds_and_takes_max():
    t0 = 1_000_000_000
    w0 = [{"t": t0 + 1_100_000_000, "pool": {"in_use": 2, "limit": 10}, "loop_lag_ms": 3.0, "stalled": 1,
           "inflight": {"ttft": 2}}]
    w1 = [{"t": t0 + 1_300_000_000, "pool": {"in_use": 5, "limit": 10}, "loop_lag_ms": 7.5, "stalled": 0,
           "inflight": {"ttft": 1, "stream": 4}},
          {"t": t0 + 2_200_000_000, "pool": {"in_use": 1, "limit": 10}, "loop_lag_ms": 0.5, "stalled": 0}]
    m = merge_worker_samples([w0, w1], t0)
    assert len(m) == 2
    assert m[0] == {"t": t0 + 1_300_000_000, "pool": {"in_use": 7, "limit": 20}, "loop_lag_ms": 7.5, "stalled": 1,
                    "inflight": {"ttft": 3, "stream": 4}, "workers": 2}
    assert m[1]["workers"] == 1 and m[1]["pool"]["in_use"] == 1


def test_merge_meta_reports_a_worker_that_failed():
    meta = {"run": "x", "workers": 2}
    m0 = {"ended": True, "ended_normally": True, "cut_short": False, "stop_reason": "all agents finished",
          "records": 5, "t_end_ns": 10, "max_loop_lag_ms": 1.0}
    out = merge_meta(meta, [m0, None], [0, -9], interrupted=False)
    assert out["cut_short"] and not out["ended_normally"]
    assert "worker 1 did not end its run" in out["stop_reason"]
    assert out["records"] == 5
    assert "agents_started" not in out  # worker 1's count is unknown: no count rather than a wrong one


def test_merge_meta_sums_the_agents_each_worker_started():
    counts = [dict(agents_asked=3, agents_started=3, agents_due_unstarted=0),
              dict(agents_asked=2, agents_started=1, agents_due_unstarted=1)]
    metas = [{"ended": True, "ended_normally": True, "cut_short": False, "records": 1, **c} for c in counts]
    out = merge_meta({"run": "x"}, metas, [0, 0], interrupted=False)
    assert (out["agents_asked"], out["agents_started"], out["agents_due_unstarted"]) == (5, 4, 1)


def test_a_worker_sends_the_same_bytes_as_a_single_process(mock, two, tmp_path):
    out, _ = two
    run_scenario("demo", tmp_path, _sets(mock))
    one = {(r.agent, r.round): (r.prompt_bytes, r.prompt_tokens)
           for r in load_records(tmp_path / "records.jsonl").records if r.kind == "agent"}
    many = {(r.agent, r.round): (r.prompt_bytes, r.prompt_tokens) for r in load_run(out).records if r.kind == "agent"}
    assert one == many


def test_cli_workers_and_report_rebuild(mock, tmp_path):
    out = tmp_path / "cli"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    p = subprocess.run([sys.executable, "-m", "agentload.cli", "run", "demo", "--no-live", "--workers", "2",
                        "--out", str(out), "--set", f'target.endpoint="{mock.url}"', "--set", "agents.count=3",
                        "--set", "agents.rounds=2", "--set", "canary.every_s=0"],
                       capture_output=True, text=True, timeout=120, cwd=REPO, env=env)
    assert p.returncode == 0, p.stderr
    assert "VERDICT [healthy]" in p.stdout and "requests 6" in p.stdout
    assert "records-w*.jsonl" in p.stderr
    r = subprocess.run([sys.executable, "-m", "agentload.cli", "report", str(out)], capture_output=True, text=True,
                       timeout=120, cwd=REPO, env=env)
    assert r.returncode == 0 and "requests 6" in r.stdout
    bad = subprocess.run([sys.executable, "-m", "agentload.cli", "run", "--workers", "0", "--no-live"],
                         capture_output=True, text=True, timeout=60, cwd=REPO, env=env)
    assert bad.returncode == 2 and "--workers" in bad.stderr


def test_sigint_stops_every_worker_and_keeps_their_records(mock, tmp_path):
    out = tmp_path / "int"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    p = subprocess.Popen([sys.executable, "-m", "agentload.cli", "run", "demo", "--no-live", "--workers", "2",
                          "--out", str(out), "--set", f'target.endpoint="{mock.url}"', "--set", "agents.count=4",
                          "--set", "agents.rounds=500", "--set", "canary.every_s=0",
                          "--set", "conversation.tool_latency_ms=50"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            files = worker_files(out, "records", ".jsonl") if out.exists() else []
            if len(files) == 2 and all(f.stat().st_size > 0 for f in files):
                break
            time.sleep(0.1)
        else:
            pytest.fail("no records from both workers")
        p.send_signal(signal.SIGINT)
        stdout, stderr = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode in (130, 1), stderr
    meta = orjson.loads((out / "run.json").read_bytes())
    assert meta["ended"] and meta["cut_short"] and not meta["ended_normally"]
    assert [w["exit"] for w in meta["worker_runs"]] == [0, 0]
    data = load_run(out)
    assert data.torn_lines == 0
    assert {r.agent for r in data.records if r.kind == "agent"} == set(range(4))
    assert "VERDICT" in stdout


def test_one_metrics_port_for_all_workers_with_a_shard_label(tmp_path):
    """--metrics-port with --workers: one exporter in the parent, every worker's latest sample with
    its `shard` label (every agent hangs before headers, so each worker's stalled count is known)."""
    from prometheus_client.parser import text_string_to_metric_families

    from agentload.process import free_port, http_get

    out, port = tmp_path / "run", free_port()
    cmd = [sys.executable, "-m", "agentload.cli", "run", "demo", "--no-live", "--out", str(out), "--workers", "2",
           "--metrics-port", str(port), "--set", "agents.count=4", "--set", "mock.hang_above_tokens=0",
           "--set", "stall.after_s=0.5", "--set", "stall.give_up_s=3", "--set", "canary.every_s=0"]
    p = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline, got = time.monotonic() + 30, {}
        while time.monotonic() < deadline:
            time.sleep(0.3)
            try:
                status, body = http_get(f"http://127.0.0.1:{port}/metrics")
            except OSError:
                continue
            got = {(s.name, tuple(sorted(s.labels.items()))): s.value
                   for fam in text_string_to_metric_families(body.decode()) for s in fam.samples}
            if all(got.get(("agentload_requests_stalled", (("shard", str(w)),))) == 2 for w in range(2)):
                break
        assert all(got.get(("agentload_shard_up", (("shard", str(w)),))) == 1 for w in range(2)), got
        assert all(got.get(("agentload_requests_stalled", (("shard", str(w)),))) == 2 for w in range(2)), got
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)
    assert b"live metrics at http://127.0.0.1:" in err
    assert orjson.loads((out / "run.json").read_bytes())["metrics_port"] == port
