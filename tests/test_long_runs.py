"""Hours of load in bounded memory: open-loop arrivals, duration, signals, the interval log,
agentload's own health in samples.jsonl and its Prometheus exporter (--metrics-port)."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agentload.analysis.intervals import interval_table, load_intervals, window
from agentload.mock.config import MockConfig
from agentload.mock.process import MockProcess
from agentload.process import free_port, http_get
from agentload.records import load_records, phase_ns
from agentload.run.executor import prepare
from agentload.run.runner import InProcess
from agentload.run.scenario import load_scenario
from helpers import REPO, cli, run_scenario

pytestmark = pytest.mark.slow  # signals, durations and exporters: real runs of seconds each

WAIT_S = 60  # upper bound of any wait below (a guard against hanging, never a measured threshold)


@pytest.fixture(scope="module")
def mock():
    m = MockProcess.start(MockConfig(decode_tokens_per_s=0))
    yield m
    m.stop()


def _lines(path: Path) -> list[dict]:
    return [orjson.loads(l) for l in path.read_bytes().splitlines() if l.strip()]


@pytest.mark.parametrize("dist", ["constant", "poisson"])
def test_open_loop_stamps_intended_starts_on_schedule_and_e2e_counts_from_them(tmp_path, mock, dist):
    rate, n, seed = 40.0, 24, 5
    res = run_scenario("demo", tmp_path, [f'target.endpoint="{mock.url}"', 'agents.arrival="open"',
                                          f"agents.rate_per_s={rate}", f'agents.rate_dist="{dist}"',
                                          f"agents.count={n}", "agents.rounds=3", f"agents.seed={seed}",
                                          "canary.every_s=0"])
    recs = [r for r in load_records(tmp_path / "records.jsonl").records if r.kind == "agent"]
    firsts = sorted((r for r in recs if r.round == 1 and r.call == 0), key=lambda r: r.agent)
    assert [r.agent for r in firsts] == list(range(n))
    # only a conversation's first request has an intended start; later rounds follow their answer
    assert all("intended" in r.t for r in firsts)
    assert not any("intended" in r.t for r in recs if r.round > 1)
    # the schedule is the seeded arrival process, whatever the server did
    rng = random.Random(seed)
    want = [int((rng.expovariate(rate) if dist == "poisson" else 1.0 / rate) * 1e9) for _ in range(n)]
    got = [b.t["intended"] - a.t["intended"] for a, b in zip(firsts, firsts[1:])]
    assert got == want[1:]
    # latency runs from the intended start (a late start is counted), and every report says so
    for r in firsts:
        assert r.t["start"] >= r.t["intended"]
        assert phase_ns(r.t, "e2e") == r.t["end"] - r.t["intended"]
    run = res.summary["run"]
    assert run["latency_from"].startswith("intended start")
    assert run["start_late_ms"]["n"] == n
    assert "latency measured from intended start" in res.text
    assert res.summary["verdict"]["kind"] == "healthy"


def test_open_loop_forgets_ended_conversations(tmp_path, mock):
    """Memory stays flat: an ended conversation leaves only a count behind, its lines are on disk."""
    sc = load_scenario("demo", [f'target.endpoint="{mock.url}"', 'agents.arrival="open"', "agents.rate_per_s=100",
                                "agents.count=150", "agents.rounds=1", "canary.every_s=0"])
    holder = {}

    def grab(ctx, sampler):  # the live-view hook: called every second with the run's context
        holder["ctx"] = ctx

    asyncio.run(InProcess(on_tick=grab).run(prepare(sc, tmp_path, mock.url, embedded_mock=False, install_signals=False)))
    ctx = holder.get("ctx")
    recs = [r for r in load_records(tmp_path / "records.jsonl").records if r.kind == "agent"]
    assert len(recs) == 150 and all(r.outcome == "ok" for r in recs)
    if ctx is not None:  # the run lasted at least one tick
        assert len(ctx.agent_states) == 0 and ctx.finished == {"done": 150}


def test_duration_ends_a_run_by_itself_with_a_full_report(tmp_path, mock):
    res = run_scenario("demo", tmp_path, [f'target.endpoint="{mock.url}"', "agents.count=4", "agents.rounds=100000",
                                          "agents.duration_s=1.5", "canary.every_s=0"])
    meta = orjson.loads((tmp_path / "run.json").read_bytes())
    # an end at duration_s is how this run was meant to end: nothing was cut (issue 10, case 11)
    assert meta["ended"] and meta["stop_reason"] == "duration reached" and not meta["cut_short"]
    assert meta["ended_by"] == "duration" and meta["ended_normally"] and meta["crashes"] == []
    assert not res.summary["run"]["cut_short"]
    assert all(a["outcome"] == "duration_reached" for a in res.summary["agents"])
    # in-flight requests were given their time: nothing that was answering got cut
    recs = load_records(tmp_path / "records.jsonl").records
    assert all(r.outcome == "ok" for r in recs)
    assert (tmp_path / "summary.json").exists() and (tmp_path / "report.txt").exists()


def test_samples_report_own_health_and_intervals_log_every_request(tmp_path, mock):
    run_scenario("demo", tmp_path, [f'target.endpoint="{mock.url}"', "agents.count=6", "agents.rounds=4",
                                    "canary.every_s=0", "mock.decode_tokens_per_s=400"])
    samples = _lines(tmp_path / "samples.jsonl")
    proc = samples[-1]["proc"]
    assert proc["rss_mb"] > 0 and proc["fds"] > 0 and proc["threads"] >= 1
    assert isinstance(proc.get("sockets", {}), dict)
    ok = [r for r in load_records(tmp_path / "records.jsonl").records if r.kind == "agent" and r.outcome == "ok"]
    ivs = load_intervals(tmp_path)
    assert {iv.tag for iv in ivs} == {"e2e", "ttft"}
    assert window(ivs, "e2e").get_total_count() == len(ok) == window(ivs, "ttft").get_total_count()
    assert sum(row["n"] for row in interval_table(ivs, "e2e")) == len(ok)
    meta = orjson.loads((tmp_path / "run.json").read_bytes())
    assert meta["intervals"]["file"] == "intervals.hlog"
    # the standard reader reads it too
    from hdrh.histogram import HdrHistogram
    from hdrh.log import HistogramLogReader

    reader = HistogramLogReader(str(tmp_path / "intervals.hlog"), HdrHistogram(1, 3_600_000_000, 3))
    total = 0
    while (h := reader.get_next_interval_histogram()) is not None:
        total += h.get_total_count()
    assert total == 2 * len(ok)


def _metrics(port: int) -> dict[tuple[str, tuple], float]:
    status, body = http_get(f"http://127.0.0.1:{port}/metrics")
    assert status == 200
    out = {}
    for fam in text_string_to_metric_families(body.decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _wait_for(pred, what: str):
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError(f"not within {WAIT_S} s: {what}")


def _stalled_in_samples(path: Path, n: int) -> bool:
    if not path.exists():
        return False
    for line in path.read_bytes().splitlines():
        try:
            if orjson.loads(line).get("stalled", 0) >= n:
                return True
        except orjson.JSONDecodeError:
            pass
    return False


def test_exporter_then_second_sigint_stops_at_once_and_still_writes_the_report(tmp_path):
    """Every agent hangs before headers (give_up_s = 600): after one SIGINT the run would wait up
    to 600 s for them; the second SIGINT ends it now, with their records and a full report."""
    out, port, n = tmp_path / "run", free_port(), 4
    err_path = tmp_path / "stderr.txt"
    cmd = [sys.executable, "-m", "agentload.cli", "run", "demo", "--no-live", "--out", str(out),
           "--metrics-port", str(port), "--set", f"agents.count={n}", "--set", "mock.hang_above_tokens=0",
           "--set", "stall.after_s=0.5", "--set", "stall.give_up_s=600", "--set", "canary.every_s=0"]
    with open(err_path, "wb") as err:
        p = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=err, start_new_session=True)
    try:
        _wait_for(lambda: _stalled_in_samples(out / "samples.jsonl", n), f"{n} stalled requests")
        m = _metrics(port)
        assert m[("agentload_requests_stalled", (("phase", "ttfb"), ("round", "1")))] == n
        assert m[("agentload_agents", (("phase", "ttfb"), ("round", "1")))] == n
        assert m[("agentload_requests_in_flight", (("phase", "ttfb"),))] == n
        assert ("agentload_requests_total", (("outcome", "ok"),)) in m
        assert m[("agentload_pool_connections", (("state", "in_use"),))] == n
        assert m[("process_resident_memory_bytes", ())] > 0
        p.send_signal(signal.SIGINT)
        _wait_for(lambda: b"no new rounds" in err_path.read_bytes(), "the first signal's message")
        assert p.poll() is None  # still waiting for the hung requests
        p.send_signal(signal.SIGINT)
        stdout, _ = p.communicate(timeout=WAIT_S)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)
    stderr = err_path.read_text()
    assert "stopping now" in stderr
    assert p.returncode == 1, stderr  # a problem was found: every agent stalled
    text = stdout.decode()
    assert text.startswith("VERDICT [server_stall]") and "cut short" in text
    meta = orjson.loads((out / "run.json").read_bytes())
    assert meta["ended"] and meta["cut_short"] and "SIGINT" in meta["stop_reason"]
    recs = [r for r in load_records(out / "records.jsonl").records if r.kind == "agent"]
    assert len(recs) == n and all(r.outcome == "cut_short" and r.stalled_phase == "ttfb" for r in recs)
    summary = orjson.loads((out / "summary.json").read_bytes())
    assert summary["run"]["cut_short"] and all(a["outcome"] == "stalled" for a in summary["agents"])
    assert (out / "report.txt").exists() and (out / "intervals.hlog").exists()


def test_sigterm_lets_in_flight_requests_finish_then_reports(tmp_path):
    out = tmp_path / "run"
    err_path = tmp_path / "stderr.txt"
    cmd = [sys.executable, "-m", "agentload.cli", "run", "demo", "--no-live", "--out", str(out),
           "--set", "agents.count=6", "--set", "agents.rounds=100000", "--set", "mock.decode_tokens_per_s=300",
           "--set", "conversation.tool_latency_ms=0"]
    with open(err_path, "wb") as err:
        p = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=err, start_new_session=True)
    try:
        _wait_for(lambda: (out / "records.jsonl").exists() and (out / "records.jsonl").read_bytes().count(b"\n") >= 12,
                  "12 records")
        p.send_signal(signal.SIGTERM)
        stdout, _ = p.communicate(timeout=WAIT_S)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)
    assert p.returncode == 130, err_path.read_text()  # healthy, but interrupted
    meta = orjson.loads((out / "run.json").read_bytes())
    assert meta["ended"] and meta["cut_short"] and "SIGTERM" in meta["stop_reason"]
    # the requests in flight at the signal were answered, none was cut
    recs = load_records(out / "records.jsonl").records
    assert recs and all(r.outcome == "ok" for r in recs)
    assert stdout.decode().startswith("VERDICT [healthy]")


def test_metrics_port_in_use_is_a_usage_error(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        r = cli("run", "demo", "--no-live", "--out", str(tmp_path / "run"), "--metrics-port", str(port))
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith(f"agentload: error: --metrics-port {port}:")
