"""Request bodies parked while they wait for a pool connection (`client.park_queued_bodies_mb`).

- A parked conversation gives back the very same body bytes, and goes on growing as before.
- Over real HTTP against the mock, on a pool of one: the requests that waited were parked past the
  limit (the first, which never waited, was not), each was sent whole (the server answered it and
  counted the same prompt tokens the conversation did, streamed or not), the pool's state shows
  how many were parked and that no queued bytes are left counted; below the limit none is parked.
- A whole run with every queued body parked completes like any other, and run.json keeps the limit.
"""

from __future__ import annotations

import asyncio

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

import agentload.run.request as rq
from agentload.mock import MockConfig, MockProcess
from agentload.records import Trace, load_records
from agentload.run.conversation import Conversation, agent_rng
from agentload.run.dist import const
from agentload.run.request_body import ConversationBody
from agentload.run.scenario import ClientConfig, ConversationConfig, TargetConfig
from agentload.run.transport import Transport
from helpers import run_scenario

text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=200)


@given(texts=st.lists(text, max_size=8), seed=st.integers(0, 1000), park_at=st.integers(0, 8))
@settings(max_examples=60, deadline=None)
def test_a_parked_body_comes_back_byte_for_byte(texts, seed, park_at):
    cfg = ConversationConfig(tools=2, system_tokens=const(50), user_tokens=const(8))
    conv = Conversation(cfg, "m", agent_rng(seed, 0), 0)
    twin = Conversation(cfg, "m", agent_rng(seed, 0), 0)
    for i, t in enumerate(texts):
        if i == park_at:
            before = conv.body()
            assert conv.park() > 0 or len(before) < 64  # (zlib cannot shrink a tiny body)
            assert conv.parked and conv.park() == 0  # parked once
            assert conv.body() == before and not conv.parked
        for c in (conv, twin):
            c.append({"role": "tool", "tool_call_id": str(i), "content": t})
    assert conv.park() == 0 or not conv._pending  # a body with messages not joined in yet stays as it is
    assert conv.body() == twin.body()
    assert conv.messages == twin.messages


def _conversations(n: int, stream: bool) -> list[Conversation]:
    cfg = ConversationConfig(tools=2, stream=stream, system_tokens=const(400), user_tokens=const(20))
    return [Conversation(cfg, "mock-model", agent_rng(7, a), a) for a in range(n)]


async def _send_all(url: str, convs: list[Conversation], park_mb: float) -> tuple[list, list[Trace], dict]:
    tr = Transport(ClientConfig(limit=1, park_queued_bodies_mb=park_mb, read_timeout_s=10, total_timeout_s=20),
                   TargetConfig(), url)
    session = tr.session_for(0)
    traces = []
    try:
        sends = []
        for i, conv in enumerate(convs):
            body = ConversationBody(conv)
            trace = Trace("agent", i, 1, 0, f"park-a{i}-r1-c0", conv.n_messages, body.size, conv.tokens)
            traces.append(trace)
            sends.append(rq.send(session, tr.url, body, trace))
        results = await asyncio.wait_for(asyncio.gather(*sends), 30)
        return results, traces, tr.pool_state()
    finally:
        await tr.close()


async def test_queued_bodies_past_the_limit_are_parked_and_sent_whole():
    with MockProcess.start(MockConfig(base_latency_ms=30, decode_tokens_per_s=0, output_tokens=4)) as m:
        for stream in (True, False):
            convs = _conversations(4, stream)
            sizes = [len(c.body()) for c in convs]
            results, traces, pool = await _send_all(m.url, convs, park_mb=0)
            assert [r.error for r in results] == [None] * 4, results
            waited = [t for t in traces if "queued_start" in t.t]
            assert len(waited) == 3  # one connection: the first took it, the others waited
            assert pool["parked"] == 3 and pool["queued_body_mb"] == 0.0
            for conv, res, size, trace in zip(convs, results, sizes, traces):
                assert not conv.parked and len(conv.body()) == size == trace.prompt_bytes
                # the server read the whole conversation: the same prompt tokens, counted by its side
                assert res.stream.usage["prompt_tokens"] == conv.tokens, stream
                assert orjson.loads(conv.body())["messages"] == conv.messages

        # a limit of 1.5 bodies: the first to wait stays whole, the next two (past it) are parked
        convs = _conversations(4, True)
        limit_mb = 1.5 * max(len(c.body()) for c in convs) / 1e6
        results, traces, pool = await _send_all(m.url, convs, park_mb=limit_mb)
        assert [r.error for r in results] == [None] * 4
        assert pool["parked"] == 2

        # far below the limit: nothing parked, and the pool's state says nothing of it
        results, traces, pool = await _send_all(m.url, _conversations(4, True), park_mb=256)
        assert [r.error for r in results] == [None] * 4
        assert "parked" not in pool and "queued_body_mb" not in pool


def test_a_run_that_parks_every_queued_body_completes(tmp_path):
    with MockProcess.start(MockConfig(base_latency_ms=5, decode_tokens_per_s=0, output_tokens=4)) as mock:
        run_scenario("demo", tmp_path, [f'target.endpoint="{mock.url}"', 'conversation.mode="scripted"',
                                        "agents.count=12", "agents.rounds=3",
                                        "canary.every_s=0", "client.limit=2", "client.park_queued_bodies_mb=0"])
    run = orjson.loads((tmp_path / "run.json").read_bytes())
    assert run["scenario"]["client"]["park_queued_bodies_mb"] == 0
    recs = load_records(tmp_path / "records.jsonl").records
    assert len(recs) == 36 and all(r.outcome == "ok" for r in recs)
    assert all(r.server_prompt_tokens == r.prompt_tokens for r in recs)  # each sent whole
    waited = sum(1 for r in recs if "queued_start" in r.t)
    assert 0 < run["parked_bodies"] <= waited
    samples = [orjson.loads(line) for line in (tmp_path / "samples.jsonl").read_bytes().splitlines()]
    assert samples[-1]["pool"]["parked"] == run["parked_bodies"]
