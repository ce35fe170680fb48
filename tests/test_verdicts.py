"""One run per fault class against the real mock over HTTP: the verdict names kind, phase, round."""

from __future__ import annotations

import subprocess
import sys
import time

import orjson
import pytest

from helpers import REPO, cli, run_cli_together, run_scenario

pytestmark = pytest.mark.slow  # real runs of several seconds each: not in the fast tier

CASES = [
    # scenario, kind, phase, first_round
    ("healthy", "healthy", None, None),
    ("long-context-hang", "server_stall", "ttfb", 4),
    ("stall-after-headers", "server_stall", "ttft", 3),
    ("mid-stream-stall", "server_stall", "stream", 3),
    ("pool-starvation", "client_pool", "pool_wait", 1),
    ("server-errors", "server_errors", "ttfb", 3),
    ("disconnects", "disconnects", "stream", None),
    ("server-queue", "server_queue", "ttfb", 1),
    ("server-gives-up", "server_stall", "ttfb", 3),
]


@pytest.mark.parametrize("name,kind,phase,first_round", CASES, ids=[c[0] for c in CASES])
def test_verdict_per_fault_class(packaged_runs, name, kind, phase, first_round):
    summary = orjson.loads((packaged_runs(name, "chat") / "summary.json").read_bytes())
    v = summary["verdict"]
    assert v["kind"] == kind, v
    assert v["phase"] == phase, v
    if first_round is not None:
        assert v["first_round"] == first_round, v
    assert v["summary"] and "\n" not in v["summary"]
    if kind != "healthy":
        assert v["agents_affected"] > 0 and v["evidence"]
    if kind == "server_stall":
        # every agent that stalled is reported with its round and phase
        stalled = [a for a in summary["agents"] if a["outcome"] == "stalled"]
        assert stalled and all(a["stalled_round"] == first_round and a["stalled_phase"] == phase for a in stalled)
        # the pool is never blamed: it had free slots; canaries got through
        assert any("canaries" in e and "succeeded" in e for e in v["evidence"]), v["evidence"]
        if name != "server-gives-up":  # there agents retry after the disconnect: sizes overlap
            assert any("none below" in e for e in v["evidence"]), v["evidence"]
    if name == "mid-stream-stall":
        assert any("ping" in e for e in v["evidence"])


def test_stall_is_recorded_even_when_the_request_finishes_later(tmp_path):
    # The stream pauses 3 s (> stall.after_s = 1) but < give_up_s: the request completes, flagged stalled.
    res = run_scenario("mid-stream-stall", tmp_path, ["mock.stall_mid_stream={ after_tokens = 2, for_s = 3, above_tokens = 3000 }",
                                                     "stall.after_s=1", "stall.give_up_s=20", "agents.rounds=3"])
    from agentload.records import load_records

    recs = load_records(tmp_path / "records.jsonl").records
    late = [r for r in recs if r.kind == "agent" and r.stalled_phase == "stream" and r.outcome == "ok"]
    assert late, "a 3 s gap in the stream should be recorded as a stall even though it finished"
    assert all(r.max_gap_ns >= 2.5e9 for r in late)
    # every stalled request finished in the end: slow, not hung
    assert res.summary["verdict"]["kind"] == "server_slow"


@pytest.mark.parametrize("policy,expect_calls", [("retry", True), ("next_round", False)])
def test_on_give_up_policies(tmp_path, policy, expect_calls):
    res = run_scenario("long-context-hang", tmp_path, [f'stall.on_give_up="{policy}"', "agents.count=3",
                                                       "agents.rounds=5", "stall.after_s=0.5", "stall.give_up_s=1"])
    from agentload.records import load_records

    recs = [r for r in load_records(tmp_path / "records.jsonl").records if r.kind == "agent"]
    if policy == "retry":
        # the same round is tried again with a new request id until the run ends
        assert any(r.call > 0 and r.round == 4 for r in recs)
    else:
        # the agent moves on: round 5 is attempted after round 4 stalled
        assert any(r.round == 5 for r in recs)
    assert res.summary["verdict"]["kind"] == "server_stall"


def test_run_never_waits_forever_on_a_server_that_hangs_forever(tmp_path):
    """The mock hangs forever (no hang_s); the run ends by itself with a full report."""
    out = tmp_path / "run"
    t0 = time.monotonic()
    r = cli("run", "long-context-hang", "--no-live", "--out", str(out), "--set", "stall.on_give_up=\"retry\"",
            "--set", "agents.duration_s=3", "--set", "stall.after_s=1", "--set", "stall.give_up_s=2", timeout=120)
    elapsed = time.monotonic() - t0
    assert r.returncode == 1, r.stderr  # a problem was found
    assert r.stdout.startswith("VERDICT [server_stall]")
    summary = orjson.loads((out / "summary.json").read_bytes())
    assert summary["verdict"]["first_round"] == 4
    # bounded by duration + give_up + grace, far below the client's 600 s total timeout
    assert elapsed < 90, elapsed
    r2 = cli("run", "long-context-hang", "--no-live", "--out", str(tmp_path / "r2"), "--fail-on", "never",
             "--set", "agents.count=2", "--set", "stall.give_up_s=2", "--set", "stall.after_s=1")
    assert r2.returncode == 0


def test_server_hang_behind_a_small_pool_is_still_a_server_stall(tmp_path):
    """Hung requests hold all 3 connections, so the other agents queue in pool_wait: the
    verdict must still name the server, never the pool."""
    res = run_scenario("long-context-hang", tmp_path, ["client.limit=3", "agents.count=9", "stall.after_s=1",
                                                       "stall.give_up_s=3"])
    v = res.summary["verdict"]
    assert v["kind"] == "server_stall" and v["phase"] == "ttfb" and v["first_round"] == 4, v
    from agentload.records import load_records

    recs = load_records(tmp_path / "records.jsonl").records
    assert any(r.stalled_phase == "pool_wait" for r in recs), "agents should have queued behind the hung requests"
    assert any("pool_wait behind them" in e for e in v["evidence"]), v["evidence"]


def test_killed_while_hung_still_names_round_and_phase(tmp_path):
    """SIGKILL while every agent hangs: no record of the hung requests exists, the samples say where."""
    import os
    import signal

    out = tmp_path / "run"
    p = subprocess.Popen([sys.executable, "-m", "agentload.cli", "run", "long-context-hang", "--no-live",
                          "--out", str(out), "--set", "stall.after_s=1", "--set", "stall.give_up_s=60"],
                         cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            s = out / "samples.jsonl"
            if s.exists() and any(orjson.loads(l).get("stalled", 0) >= 12 for l in s.read_bytes().splitlines() if l):
                break
            time.sleep(0.2)
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(10)
    cli("report", str(out))
    v = orjson.loads((out / "summary.json").read_bytes())["verdict"]
    assert v["kind"] == "server_stall" and v["phase"] == "ttfb" and v["first_round"] == 4, v
    assert "killed" in v["summary"]


SLOW_FOR_EVERYONE = ["mock.decode_tokens_per_s=1", "mock.output_tokens=4", "agents.count=3", "agents.rounds=1",
                     "canary.every_s=1", "canary.timeout_s=3", "canary.max_tokens=8"]


SLOW_AFTER_S = (5.0, 0.5)


@pytest.fixture(scope="module")
def slow_for_everyone_runs(tmp_path_factory):
    """{after_s: (summary, report text)}: the two runs of SLOW_FOR_EVERYONE at once, each the CLI in its
    own process with its own mock; at a token a second each run is seconds of waiting, which overlap."""
    runs = {}
    for after_s in SLOW_AFTER_S:
        runs[after_s] = ["run", "healthy", "--no-live", "--fail-on", "never"]
        for o in (*SLOW_FOR_EVERYONE, f"stall.after_s={after_s}"):
            runs[after_s] += ["--set", o]
    outs = run_cli_together(tmp_path_factory.mktemp("slow-for-everyone"), runs, timeout=120)
    return {after_s: (orjson.loads((out / "summary.json").read_bytes()), (out / "report.txt").read_text())
            for after_s, out in outs.items()}


@pytest.mark.parametrize("after_s", SLOW_AFTER_S)
def test_a_server_slow_for_everyone_is_server_slow_with_the_canaries_as_its_evidence(slow_for_everyone_runs, after_s):
    """A token a second for everyone: an agent's answer takes seconds, a canary's 8 tokens outlast its
    canary.timeout_s (3 s). The canaries timed out behind the same slowness: the verdict says the server
    is slow for everyone, never `canary_failures`, and never that it is "not answering anyone". With
    stall.after_s = 5 no gap is a stall; with 0.5 every gap is one, and every request finished."""
    summary, text = slow_for_everyone_runs[after_s]
    v = summary["verdict"]
    assert v["kind"] == "server_slow", text
    kinds = [v["kind"]] + [s["kind"] for s in v["secondary"]]
    assert "canary_failures" not in kinds, text
    ev = "\n".join(v["evidence"])
    assert "not answering anyone" not in ev and "0 request(s) of that size or larger completed" not in ev, ev
    assert "timed out at canary.timeout_s = 3 s while their tokens were still arriving" in ev, ev
    if after_s == 5.0:
        assert "slow for everyone" in v["summary"] and v["agents_stopped"] == 0, v
    else:
        assert "but all finished" in v["summary"] and "the server is slow for everyone" in ev, ev
