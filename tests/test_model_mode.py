"""`mode = "model"` must not end silently (issue 12): a model that answers without a tool call ends
its agent's conversation, and the verdict says so (`no_tool_calls`), over real HTTP against the
mock playing such a model (`[mock] tool_call_rate = 0`); `conversation.tool_choice` is sent and
the mock honours it as servers do."""

from __future__ import annotations

import random

import orjson

from agentload.mock.config import MockConfig
from agentload.mock.plan import plan_answer
from agentload.records import load_records
from agentload.run.conversation import tool_schemas
from helpers import cli, run_scenario

# 3 agents x 3 rounds in mode model against a mock that never calls a tool; its 32-token answer is
# cut by max_tokens = 16: finish_reason length, as a small model's rambling answer is
NO_TOOLS = ["conversation.mode=\"model\"", "agents.count=3", "agents.rounds=3", "canary.every_s=0",
            "conversation.tool_latency_ms=0", "conversation.max_tokens=16", "mock.tool_call_rate=0",
            "mock.output_tokens=32", "mock.decode_tokens_per_s=0"]


def test_a_model_that_calls_no_tool_is_no_tool_calls_and_exit_1(tmp_path):
    out = tmp_path / "run"
    args = [a for s in NO_TOOLS for a in ("--set", s)]
    r = cli("run", "demo", "--no-live", "--out", str(out), *args)
    assert r.returncode == 1, (r.stdout, r.stderr)
    first = r.stdout.splitlines()[0]
    assert first == ("VERDICT [no_tool_calls] 3 of 3 agents ended early: the model answered without a tool call "
                     "in round 1 (finish_reason length x3); the conversation could not go on"), r.stdout
    summary = orjson.loads((out / "summary.json").read_bytes())
    assert summary["verdict"]["agents_stopped"] == 3
    assert [(a["outcome"], a["no_tool_call_round"], a["finish_reason"], a["rounds_completed"])
            for a in summary["agents"]] == [("no_tool_call", 1, "length", 1)] * 3
    recs = load_records(out / "records.jsonl").records
    agents = [x for x in recs if x.kind == "agent"]
    assert [(x.round, x.outcome, x.tool_calls, x.finish_reason) for x in agents] == [(1, "ok", 0, "length")] * 3


def test_tool_choice_required_keeps_the_same_model_calling_tools(tmp_path):
    res = run_scenario("demo", tmp_path, [*NO_TOOLS, 'conversation.tool_choice="required"'])
    assert res.summary["verdict"]["kind"] == "healthy", res.summary["verdict"]
    assert {a["outcome"] for a in res.summary["agents"]} == {"done"}
    recs = [x for x in load_records(tmp_path / "records.jsonl").records if x.kind == "agent"]
    assert sorted((x.agent, x.round) for x in recs) == [(a, r) for a in range(3) for r in (1, 2, 3)]
    assert all(x.outcome == "ok" and x.tool_calls >= 1 and x.finish_reason == "tool_calls" for x in recs)


def test_the_mock_tool_call_rate_and_tool_choice():
    tools = tool_schemas(4)

    def calls(cfg: MockConfig, seed: int, choice=None) -> int:
        body = {"tools": tools, "max_tokens": 64, **({"tool_choice": choice} if choice is not None else {})}
        return len(plan_answer(cfg, body, 1, random.Random(seed), True).message.get("tool_calls") or [])

    never, half, always = MockConfig(tool_call_rate=0), MockConfig(tool_call_rate=0.5), MockConfig()
    assert not any(calls(never, s) for s in range(50))
    assert 60 <= sum(bool(calls(half, s)) for s in range(200)) <= 140
    assert all(calls(always, s) for s in range(50))
    # tool_choice decides before the rate, as a server's would
    assert all(calls(never, s, "required") for s in range(20))
    assert all(calls(never, s, {"type": "function", "function": {"name": "tool_2"}}) for s in range(20))
    assert not any(calls(always, s, "none") for s in range(20))
    # the same request (same seed) gets the same answer
    assert [calls(half, s) for s in range(30)] == [calls(half, s) for s in range(30)]
