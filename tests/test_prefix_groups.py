"""Prefix groups, session hints and trace context: what a router's policy sees of a fleet of agents."""

from __future__ import annotations

import re

import orjson
import pytest

from agentload.run.conversation import Conversation, agent_rng, tool_schemas
from agentload.run.scenario import load_scenario
from helpers import run_scenario


def _conv(sc, agent):
    return Conversation(sc.conversation, "m", agent_rng(sc.agents.seed, agent), agent, tool_schemas(sc.conversation.tools))


def test_agents_of_a_group_share_its_system_prompt_and_tools_and_only_those():
    sc = load_scenario("demo", ["conversation.prefix_groups=3", "conversation.shared_system_tokens=500",
                                "conversation.system_tokens=50"])
    convs = [_conv(sc, a) for a in range(30)]
    groups = {c.group for c in convs}
    assert groups == {0, 1, 2}
    heads = {}
    for c in convs:
        sys_text = c.messages[0]["content"]
        shared = " ".join(sys_text.split(" ")[:500])
        assert heads.setdefault(c.group, (shared, orjson.dumps(c.tools))) == (shared, orjson.dumps(c.tools))
        assert len(sys_text.split(" ")) == 550  # the group's 500 tokens, then the agent's own 50
    assert len({h for h, _ in heads.values()}) == 3 and len({t for _, t in heads.values()}) == 3
    # the same seed, the same groups; without groups, as before
    assert [c.group for c in convs] == [_conv(sc, a).group for a in range(30)]
    plain = load_scenario("demo")
    assert _conv(plain, 0).group is None and _conv(plain, 0).messages == Conversation(
        plain.conversation, "m", agent_rng(plain.agents.seed, 0), 0, tool_schemas(plain.conversation.tools)).messages


def test_group_weights_must_match_the_groups():
    from agentload.errors import UserError
    with pytest.raises(UserError, match="group_weights: expected one weight per group"):
        load_scenario("demo", ["conversation.prefix_groups=2", "conversation.group_weights=[1.0]"])


@pytest.mark.slow
def test_a_run_with_groups_reports_each_groups_cache_hit_rate_and_sends_trace_and_session_headers(tmp_path):
    log = tmp_path / "mock.log"
    out = tmp_path / "run"
    launched = run_scenario("demo", out, [
        "agents.count=12", "agents.rounds=3", "conversation.prefix_groups=2", "conversation.shared_system_tokens=800",
        "conversation.system_tokens=20", "mock.prefix_cache_tokens=200000", "mock.prefix_block_tokens=16",
        f'mock.request_log="{log}"', 'target.session_header="x-session-affinity"', "canary.every_s=0"])
    s = launched.summary
    assert set(s["groups"]) == {"0", "1"} and sum(g["agents"] for g in s["groups"].values()) == 12
    # agents after a group's first share its prompt: most of each group's prompt tokens come from the cache
    assert all(g["cache_hit_rate"] > 0.5 for g in s["groups"].values()), s["groups"]
    assert "prefix group 0:" in launched.text and "cache hit rate" in launched.text
    recs = [orjson.loads(x) for x in (out / "records.jsonl").read_bytes().splitlines()]
    agents = [r for r in recs if r["kind"] == "agent"]
    tp = re.compile(r"^00-[0-9a-f]{32}-[0-9a-f]{16}-01$")
    assert all(tp.match(r["traceparent"]) for r in agents)
    by_conv = {}
    for r in agents:  # one trace per conversation, one span per request
        by_conv.setdefault(r["agent"], set()).add(r["traceparent"].split("-")[1])
    assert all(len(v) == 1 for v in by_conv.values()) and len({next(iter(v)) for v in by_conv.values()}) == 12
    assert len({r["traceparent"] for r in agents}) == len(agents)
    assert {r["group"] for r in agents} == {0, 1}
    # the mock logged each request's trace context as it arrived: every record joins its line by it
    logged = {orjson.loads(x)["traceparent"] for x in log.read_bytes().splitlines()}
    assert {r["traceparent"] for r in agents} <= logged
