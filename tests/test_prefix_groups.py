"""Prefix groups, session hints and trace context: what a router's policy sees of a fleet of agents."""

from __future__ import annotations

import dataclasses
import re

import orjson
import pytest

from agentload.report.build import write_reports
from agentload.run.conversation import Conversation, agent_rng, tool_schemas
from agentload.run.scenario import load_scenario
from helpers import run_scenario
from records_factory import RunBuilder


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


def _two_groups(run_dir):
    """Two groups of two agents: group 0's second rounds served half from the cache, group 1's not
    reported."""
    run = RunBuilder(agents=4, rounds=2)
    for a in range(4):
        for rnd in (1, 2):
            cached = (100 * rnd // 2 if rnd == 2 else 0) if a < 2 else None
            rec = run.ok(a, rnd, cached_tokens=cached, ttft_ms=20.0 + 10 * a)
            run.records[-1] = dataclasses.replace(rec, group=0 if a < 2 else 1)
    run.write(run_dir)
    return write_reports(run_dir)


def test_report_html_draws_each_groups_cache_hit_rate_and_time_to_first_token(tmp_path):
    """report.html gets the groups' table and figure (a run without groups has neither:
    test_router_analysis's run without a fleet)."""
    summary, text = _two_groups(tmp_path)
    g = summary["groups"]
    assert (g["0"]["agents"], g["0"]["requests"], g["0"]["cache_hit_rate"]) == (2, 4, pytest.approx(200 / 600, abs=1e-4))
    assert g["1"]["cache_hit_rate"] is None
    html = (tmp_path / "report.html").read_text()
    assert "<h2>Prefix groups</h2>" in html and "id=\"fig-groups\"" in html
    assert "Prefix-cache hit rate and time to first token by prefix group" in html
    assert "<tr><th>0</th><td>2</td><td>4 / 4</td><td>33%</td>" in html
    assert "<tr><th>1</th><td>2</td><td>4 / 4</td><td>not reported</td>" in html
    assert "data-figures='5'" in html


@pytest.mark.slow
def test_the_groups_figure_renders_in_headless_chromium(tmp_path):
    from devtools import check_page_sync, find_chromium

    chromium = find_chromium()
    if chromium is None:
        pytest.skip("chromium is not installed (apt-get install chromium; .ci/run installs it)")
    _two_groups(tmp_path)
    res = check_page_sync(tmp_path / "report.html", chromium=chromium, timeout=60)
    assert res.ok, res.problems()
    assert res.ids == ["fig-timeline", "fig-rounds", "fig-groups", "fig-prompt", "fig-over-time"]


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
    html = (out / "report.html").read_text()
    assert "<h2>Prefix groups</h2>" in html and "id=\"fig-groups\"" in html
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


def test_the_trace_id_is_the_conversations_hash_whether_cached_or_not(monkeypatch):
    """Each conversation's trace id is hashed once and kept (a bounded cache, cleared when full): every
    request's traceparent is still the W3C id derived from (run, agent, conversation), its span id from
    the request id sent, also once the cache has let a conversation go."""
    from hashlib import blake2b

    import agentload.run.agent as agent_mod
    from agentload.records import Trace
    from agentload.run.request import sent_request_id

    monkeypatch.setattr(agent_mod, "_TRACE_IDS_MAX", 5)
    monkeypatch.setattr(agent_mod, "_TRACE_IDS", {})
    for run in ("run-1", "run-2"):
        for rnd in (1, 2, 3):
            for agent in range(4):
                for conv in (0, 1):
                    rid = f"{run}-a{agent}-k{conv}-r{rnd}-c0"
                    tr = Trace("agent", agent, rnd, 0, rid, 2, 10, 5, conversation=conv)
                    tr.id_sent = sent_request_id(rid) if agent % 2 else None
                    tid = blake2b(f"{run}-a{agent}-k{conv}".encode(), digest_size=16).hexdigest()
                    sid = (tr.id_sent.replace("-", "")[:16] if tr.id_sent
                           else blake2b(rid.encode(), digest_size=8).hexdigest())
                    assert agent_mod.traceparent(run, tr) == f"00-{tid}-{sid}-01"
                    assert len(agent_mod._TRACE_IDS) <= 5
