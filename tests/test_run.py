"""End-to-end runs over real HTTP against the real mock server process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import defaultdict

import orjson
import pytest

from agentload.mock.config import MockConfig
from agentload.mock.process import MockProcess
from agentload.records import load_records
from helpers import REPO, cli, run_scenario


@pytest.fixture(scope="module")
def mock():
    # tool_call_rounds=3: in model mode the mock stops calling tools after round 3.
    m = MockProcess.start(MockConfig(decode_tokens_per_s=0, tool_call_rounds=3, tool_calls_per_response=2))
    yield m
    m.stop()


def _by_agent(recs):
    per = defaultdict(list)
    for r in recs:
        if r.kind == "agent":
            per[r.agent].append(r)
    for v in per.values():
        v.sort(key=lambda r: (r.round, r.call))
    return per


@pytest.mark.parametrize("mode", ["scripted", "model"])
def test_multi_round_run_grows_conversations_and_answers_every_tool_call(tmp_path, mock, mode):
    before = mock.stats()
    # model mode: round 4's answer has no tool call, so 4 rounds (more would end early: no_tool_calls)
    rounds = 6 if mode == "scripted" else 4
    res = run_scenario("demo", tmp_path, [f'target.endpoint="{mock.url}"', f'conversation.mode="{mode}"',
                                          "agents.count=5", f"agents.rounds={rounds}", "canary.every_s=0"])
    loaded = load_records(tmp_path / "records.jsonl")
    assert loaded.torn_lines == 0
    recs = loaded.records
    per = _by_agent(recs)
    assert sorted(per) == list(range(5))
    for agent, rs in per.items():
        assert [r.round for r in rs] == list(range(1, rounds + 1)), (agent, [r.round for r in rs])
        assert all(r.outcome == "ok" for r in rs)
        sizes = [r.prompt_tokens for r in rs]
        assert sizes == sorted(sizes) and sizes[0] < sizes[-1], sizes
        assert all(b.messages > a.messages for a, b in zip(rs, rs[1:]))
        # the mock counts tokens the same way agentload estimates them
        assert all(r.server_prompt_tokens == r.prompt_tokens for r in rs)
    if mode == "model":
        assert all(r.tool_calls == 2 for rs in per.values() for r in rs[:-1])
    ids = [r.request_id for r in recs]
    assert len(ids) == len(set(ids))
    after = mock.stats()
    assert after["protocol_violations"] == before["protocol_violations"]
    assert after["requests_total"] - before["requests_total"] == len(recs)
    # the mock logs the X-Request-ID it received: each record's id_sent (a UUID by default)
    assert set(r.id_sent for r in recs) <= set(after["last_request_ids"]) or len(ids) > 100
    assert res.summary["verdict"]["kind"] == "healthy"
    assert res.summary["totals"]["requests"] == len(recs)


def test_phases_are_stamped_and_ordered(tmp_path, mock):
    run_scenario("demo", tmp_path, [f'target.endpoint="{mock.url}"', "agents.count=3", "agents.rounds=3",
                                    "canary.every_s=0"])
    recs = load_records(tmp_path / "records.jsonl").records
    order = ["start", "sent", "headers", "first_byte", "first_token", "end"]
    for r in recs:
        ts = [r.t[k] for k in order]
        assert ts == sorted(ts), r.t
        assert r.token_chunks >= 1 and r.chunks > r.token_chunks  # role chunk, usage, [DONE] are not tokens
    # first request of each agent opened a connection; later ones reused it (keep-alive)
    assert any(r.reused is False and "conn_start" in r.t for r in recs)
    assert any(r.reused is True for r in recs)


def test_per_agent_sessions_and_force_close_open_more_connections(tmp_path, mock):
    run_scenario("demo", tmp_path / "fc", [f'target.endpoint="{mock.url}"', "agents.count=3", "agents.rounds=3",
                                           "canary.every_s=0", "client.force_close=true"])
    recs = load_records(tmp_path / "fc" / "records.jsonl").records
    assert all(r.reused is False for r in recs)
    run_scenario("demo", tmp_path / "pa", [f'target.endpoint="{mock.url}"', "agents.count=3", "agents.rounds=3",
                                           "canary.every_s=0", 'client.session="per_agent"'])
    recs = load_records(tmp_path / "pa" / "records.jsonl").records
    assert sum(1 for r in recs if r.reused is False) == 3


def test_api_key_is_sent_but_never_written(tmp_path, mock):
    secret = "sk-test-SECRET-123456"
    r = cli("run", "demo", "--no-live", "--endpoint", mock.url, "--out", str(tmp_path / "run"),
            "--set", 'target.api_key_env="AGENTLOAD_TEST_KEY"', "--set", "agents.count=2", "--set", "agents.rounds=2",
            env={"AGENTLOAD_TEST_KEY": secret})
    assert r.returncode == 0, r.stderr
    for p in (tmp_path / "run").iterdir():
        assert secret not in p.read_text(errors="replace"), p
    assert secret not in r.stdout + r.stderr


def test_cli_run_embedded_mock_prints_verdict_first_and_exits_0(tmp_path):
    r = cli("run", "--no-live", "--out", str(tmp_path / "run"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("VERDICT [healthy]")
    summary = orjson.loads((tmp_path / "run" / "summary.json").read_bytes())
    assert summary["totals"]["requests"] == summary["totals"]["completed"] > 0
    for rnd in summary["rounds"]:
        for ph in ("pool_wait", "connect", "ttfb", "ttft", "stream", "e2e"):
            assert set(rnd["phases"][ph]) >= {"p50_ms", "p90_ms", "p99_ms", "max_ms"}
    meta = orjson.loads((tmp_path / "run" / "run.json").read_bytes())
    assert meta["ended_normally"] and meta["scenario"]["client"]["limit"] == 100


def _wait_for_records(path, n, timeout_s=30):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and path.read_bytes().count(b"\n") >= n:
            return
        time.sleep(0.1)
    raise AssertionError(f"fewer than {n} records after {timeout_s}s")


def _slow_run_cmd(out):
    return [sys.executable, "-m", "agentload.cli", "run", "demo", "--no-live", "--out", str(out),
            "--set", "agents.count=20", "--set", "agents.rounds=50", "--set", "mock.decode_tokens_per_s=200"]


def test_sigkill_leaves_parseable_records_and_report_says_cut_short(tmp_path):
    out = tmp_path / "run"
    p = subprocess.Popen(_slow_run_cmd(out), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    try:
        _wait_for_records(out / "records.jsonl", 30)
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(10)
    raw = (out / "records.jsonl").read_bytes()
    lines = raw.splitlines()
    assert all(orjson.loads(l)["v"] == 1 for l in lines)  # one write(2) per line: none torn
    r = cli("report", str(out))
    assert r.returncode == 0, r.stderr
    assert "cut short" in r.stdout and "killed" in r.stdout
    summary = orjson.loads((out / "summary.json").read_bytes())
    assert summary["run"]["cut_short"] and summary["totals"]["requests"] == len(lines) - summary["totals"]["canaries"]


def test_sigint_stops_and_still_writes_full_report(tmp_path):
    out = tmp_path / "run"
    p = subprocess.Popen(_slow_run_cmd(out), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True)
    try:
        _wait_for_records(out / "records.jsonl", 20)
        p.send_signal(signal.SIGINT)
        stdout, stderr = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode in (130, 1), stderr
    assert stdout.startswith("VERDICT")
    meta = orjson.loads((out / "run.json").read_bytes())
    assert meta["ended"] and meta["cut_short"] and "SIGINT" in meta["stop_reason"]
    assert (out / "summary.json").exists() and "cut short" in stdout


def test_non_streaming_run(tmp_path, mock):
    res = run_scenario("demo", tmp_path, [f'target.endpoint="{mock.url}"', "conversation.stream=false",
                                          "agents.count=3", "agents.rounds=3", "canary.every_s=0"])
    recs = load_records(tmp_path / "records.jsonl").records
    assert len(recs) == 9 and all(r.outcome == "ok" and r.chunks == 1 for r in recs)
    assert all(r.server_prompt_tokens == r.prompt_tokens for r in recs)
    assert res.summary["verdict"]["kind"] == "healthy"
