"""Conformance against a real llama.cpp server: llama-cpp-python 0.3.36's OpenAI server
(`python -m llama_cpp.server`, the `llamacpp` extra, installed by .ci/run) with Gemma 3 270M on
loopback. Each test is a real agentload run over real HTTP; prompts stay small (the server
evaluates ~180 prompt tokens/s on this 2-core machine and serves one request at a time).

What this server does that the tests rely on (measured, see docs/routers.md "llama.cpp's server"):
- one request at a time; a queued request gets its response headers at once (the SSE response
  starts before the model lock is taken), so its wait shows as `ttft`, not `ttfb`;
- `--interrupt_requests true` (its default) ends a running stream with `[DONE]` after the next
  chunk when another request is waiting: right after the role chunk if it was already queued;
- a prompt of n_ctx tokens or more: 200 and an empty event stream when streaming (the error is
  raised after the headers), 400 `context_length_exceeded` otherwise;
- with `--chat_format chatml-function-calling`: a tool call is streamed only for a named
  tool_choice (`"auto"` and `"required"` end the stream empty after a 200); tool results are
  left out of the prompt (its template has no branch for `role: tool`), so a conversation that
  must grow past n_ctx grows through user and assistant text here;
- an `X-Request-ID` that is not a UUID: 400 with an empty body; `"content": null` in an
  assistant turn: 500 (validation error).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agentload.launch import run_to_dir
from agentload.records import load_records
from agentload.run.scenario import load_scenario
from llamacppproc import Servers, model_path, need_llamacpp
from serverprocs import paused_after_round

pytestmark = [pytest.mark.llamacpp, pytest.mark.slow]

# Small scripted agents; every test narrows or changes what it needs with --set style overrides.
BASE = """
description = "llama.cpp conformance (tests/test_llamacpp.py)"

[target]
model = "gemma3-270m"

[agents]
count = 2
rounds = 2
start = "all"
seed = 7
error_retries = 0

[conversation]
mode = "scripted"
system_tokens = 40
user_tokens = 20
tools = 1
tool_calls_per_round = 1
tool_result_tokens = 20
tool_latency_ms = 10
max_tokens = 8

[client]
limit = 10
pool_timeout_s = 10.0
connect_timeout_s = 5.0
read_timeout_s = 60.0
total_timeout_s = 120.0

[stall]
after_s = 30.0  # above the queue wait of a loaded 2-core machine (two agents, one request at a time)
give_up_s = 60.0
on_give_up = "stop_agent"

[canary]
every_s = 0
"""


@pytest.fixture(scope="module")
def llamacpp(tmp_path_factory):
    """servers(n_ctx=2048, interrupt_requests=False, tag="") -> a running LlamaServer, one per
    setting (a tag: a server of the test's own), started on first use (about 2 s) and killed when
    the module ends."""
    need_llamacpp()
    servers = Servers(model_path(), tmp_path_factory.mktemp("llamacpp-logs"))
    yield servers
    servers.stop_all()


def run(server, tmp_path: Path, overrides: list[str], name: str = "run"):
    """One agentload run against `server`; returns (summary, text, records)."""
    base = tmp_path / "llamacpp.toml"
    base.write_text(BASE)
    sc = load_scenario(str(base), [f'target.endpoint="{server.url}"', *overrides])
    out = tmp_path / name
    res = run_to_dir(sc, out, live=False, install_signals=False, log=lambda m: None)
    recs = load_records(out / "records.jsonl").records
    return res.summary, res.text + "\n--- server log ---\n" + server.log_tail(1500), recs


def test_scripted_run_is_healthy(llamacpp, tmp_path):
    """Scripted agents (their tool calls are agentload's own). tool_choice names the one tool:
    the server's grammar then makes the model write a call every time, so every answer has
    tokens (left free, this model ends ~40% of answers to synthetic text at once: ok, but no token).
    max_tokens leaves the call room for its whole arguments: this server ends a named tool's stream
    with finish_reason tool_calls however it ended, and arguments cut at max_tokens are `truncated`."""
    srv = llamacpp()
    summary, text, recs = run(srv, tmp_path, ['conversation.tool_choice="tool_0"', "conversation.max_tokens=64"])
    assert summary["verdict"]["kind"] == "healthy", text
    agent = [r for r in recs if r.kind == "agent"]
    assert len(agent) == 4 and all(r.outcome == "ok" and r.status == 200 for r in agent), text
    assert sorted((r.agent, r.round) for r in agent) == [(0, 1), (0, 2), (1, 1), (1, 2)]
    for r in agent:
        # tokens counted (llama-cpp-python sends no usage chunk, include_usage or not: chunks count)
        assert r.token_chunks >= 1 and r.finish_reason == "tool_calls" and r.tool_calls == 1, r
        assert r.bad_events == 0 and r.stalled_phase is None and r.tool_call_problems is None, r
        # the role-only first chunk is not a token: the first token comes after the headers
        assert r.t["headers"] < r.t["first_token"] <= r.t["end"], r.t
    # one request at a time: of the two round-1 requests sent together, the second's first
    # token came after the first had ended, yet its headers came before that (its queue is ttft)
    first, second = sorted((r for r in agent if r.round == 1), key=lambda r: r.t["first_token"])
    assert second.t["first_token"] >= first.t["end"], (first.t, second.t)
    assert second.t["headers"] < first.t["end"], (first.t, second.t)
    assert all(a["outcome"] == "done" and a["rounds_completed"] == 2 for a in summary["agents"]), summary["agents"]


def test_server_paused_with_sigstop_is_a_stall_in_ttfb_at_the_right_round(llamacpp, tmp_path):
    """SIGSTOP in the agent's tool time after round 1: the kernel still accepts the connection and
    buffers the request, but the stopped process writes nothing, not even response headers (the
    queue of a running server shows as ttft; a stopped one shows as ttfb): round 2 stalls in ttfb.

    One agent: with two, the second's round 1 ends a whole request later than the first's, and on
    a loaded machine the first can be in round 2 by then."""
    srv = llamacpp(tag="sigstop")
    try:
        with paused_after_round(srv.child, tmp_path / "run" / "records.jsonl", 1) as stopped:
            # after_s above any single answer's ttft on a loaded 2-core machine; tool time 2 s: the
            # watcher (20 ms polls) stops the server long before round 2 is sent
            summary, text, recs = run(srv, tmp_path, [
                "agents.count=1", "agents.rounds=3", "conversation.system_tokens=10", "conversation.user_tokens=10",
                "conversation.tool_latency_ms=2000", "stall.after_s=5.0", "stall.give_up_s=7.0"])
    finally:
        llamacpp.stop(srv)  # it would still work through the abandoned request
    assert stopped.is_set(), text
    v = summary["verdict"]
    assert (v["kind"], v["phase"], v["first_round"]) == ("server_stall", "ttfb", 2), text
    r1, r2 = [r for r in recs if r.kind == "agent"]
    assert (r1.round, r1.outcome, r1.stalled_phase) == (1, "ok", None), text
    assert (r2.round, r2.outcome, r2.stalled_phase, r2.error) == (2, "stalled", "ttfb", "stall_give_up"), text
    assert "sent" in r2.t and "headers" not in r2.t  # sent, and not even headers came back
    assert summary["agents"][0]["outcome"] == "stalled" and summary["agents"][0]["rounds_completed"] == 1
    assert "stalled requests by round and phase: round 2 ttfb: 1" in v["evidence"], v["evidence"]


N_CTX_SMALL = 512
# tools = 0: the conversation grows by a user turn (150) and an assistant text (8) a round, since
# this server leaves tool results out of the prompt. agentload's estimates: round 1 218, round 2
# 384, round 3 550 tokens; the server counts a few more per message: round 3 is the first past 512.
OVERFLOW = ["agents.rounds=4", "conversation.tools=0", "conversation.system_tokens=60",
            "conversation.user_tokens=150", "conversation.max_tokens=4"]


def test_context_overflow_streaming_is_an_empty_stream_at_the_round_that_crossed_n_ctx(llamacpp, tmp_path):
    srv = llamacpp(n_ctx=N_CTX_SMALL)
    summary, text, recs = run(srv, tmp_path, OVERFLOW)
    v = summary["verdict"]
    assert (v["kind"], v["first_round"]) == ("bad_responses", 3), text
    agent = [r for r in recs if r.kind == "agent"]
    failed = [r for r in agent if r.outcome == "error"]
    assert len(failed) == 2 and all(r.round == 3 and r.error == "empty_stream" and r.status == 200 for r in failed), text
    # the error is raised after the headers: the stream is empty, not even [DONE]
    assert all("with an empty body" in (r.error_msg or "") for r in failed), [r.error_msg for r in failed]
    assert all(r.outcome == "ok" for r in agent if r.round < 3)
    lo = min(r.prompt_tokens for r in failed)
    below = max(r.prompt_tokens for r in agent if r.outcome == "ok")
    ev = "\n".join(v["evidence"])
    assert f"every request at or above {lo:,} prompt tokens failed (2), none below (largest that completed: {below:,} tokens)" in ev, ev
    assert "empty_stream" in v["summary"], v["summary"]


def test_context_overflow_not_streaming_is_a_400_context_length_exceeded(llamacpp, tmp_path):
    srv = llamacpp(n_ctx=N_CTX_SMALL)
    summary, text, recs = run(srv, tmp_path, [*OVERFLOW, "agents.count=1", "conversation.stream=false"])
    v = summary["verdict"]
    assert (v["kind"], v["first_round"]) == ("server_errors", 3), text
    failed = [r for r in recs if r.kind == "agent" and r.outcome == "error"]
    assert len(failed) == 1 and failed[0].round == 3 and failed[0].error == "http_400", text
    assert "context_length_exceeded" in (failed[0].error_msg or ""), failed[0].error_msg
    ev = "\n".join(v["evidence"])
    assert f"every request at or above {failed[0].prompt_tokens:,} prompt tokens failed (1), none below" in ev, ev


def test_interrupted_stream_is_an_empty_stream_not_a_stall(llamacpp, tmp_path):
    """interrupt_requests=true (the server's default): the first agent's stream is cut to [DONE]
    right after its role chunk because the second agent's request is waiting."""
    srv = llamacpp(interrupt_requests=True)
    # stall.after_s well above the other request's prompt time on a busy machine (7.5 s seen with
    # another job on both cores): a slow CPU must not read as a stall here
    summary, text, recs = run(srv, tmp_path, ["agents.rounds=1", "stall.after_s=20.0", "stall.give_up_s=60.0"])
    agent = [r for r in recs if r.kind == "agent"]
    assert len(agent) == 2, text
    cut = [r for r in agent if r.outcome == "error"]
    ok = [r for r in agent if r.outcome == "ok"]
    assert len(cut) == 1 and len(ok) == 1, text
    c = cut[0]
    assert c.error == "empty_stream" and c.status == 200 and c.token_chunks == 0 and c.stalled_phase is None, c
    # role chunk, [DONE], then the server drops the connection without the chunked body's last
    # chunk: the answer is judged (empty), not the transport's complaint about the cut
    assert c.error_msg.startswith("stream ended with [DONE] after 1 role-only/empty chunk(s): no token, "
                                  "no finish_reason"), c.error_msg
    assert c.chunks == 2, c
    assert ok[0].finish_reason in ("stop", "length"), ok[0]  # (with or without a token: the model may end at once)
    v = summary["verdict"]
    assert v["kind"] == "bad_responses" and "empty_stream" in v["summary"], text
    assert not [r for r in agent if r.stalled_phase], text
    assert "server_stall" not in {s["kind"] for s in v.get("secondary", [])}, text


def test_model_mode_follows_the_models_own_tool_calls_for_3_rounds(llamacpp, tmp_path):
    """mode = "model": each round's tool calls are the model's own, parsed from the stream and sent
    back with their ids. llama-cpp-python streams a tool call only for a named tool_choice."""
    srv = llamacpp()
    summary, text, recs = run(srv, tmp_path, [
        "agents.count=1", "agents.rounds=3", 'conversation.mode="model"', 'conversation.tool_choice="tool_0"',
        "conversation.tools=2", "conversation.max_tokens=64"])
    assert summary["verdict"]["kind"] == "healthy", text
    agent = [r for r in recs if r.kind == "agent"]
    assert [r.round for r in agent] == [1, 2, 3], text
    for r in agent:
        assert r.outcome == "ok" and r.finish_reason == "tool_calls" and r.tool_calls == 1, r
        assert r.token_chunks >= 2 and r.bad_events == 0 and r.tool_call_problems is None, r
    # the model's call and its tool result went back into the conversation each round
    assert [r.messages for r in agent] == [2, 4, 6], [r.messages for r in agent]
    assert summary["agents"][0]["rounds_completed"] == 3, summary["agents"]


def test_tool_choice_required_is_not_streamed_by_this_server(llamacpp, tmp_path):
    """A server limit agentload must name, not hide: llama-cpp-python 0.3.36 answers a streamed
    tool_choice "required" with 200 and an empty event stream (its handler raises after the
    headers): empty_stream in round 1, every agent stopped."""
    srv = llamacpp()
    summary, text, recs = run(srv, tmp_path, [
        "agents.count=1", "agents.rounds=1", 'conversation.mode="model"', 'conversation.tool_choice="required"'])
    v = summary["verdict"]
    assert (v["kind"], v["first_round"]) == ("bad_responses", 1), text
    (r,) = [r for r in recs if r.kind == "agent"]
    assert r.status == 200 and r.error == "empty_stream" and "with an empty body" in r.error_msg, r
