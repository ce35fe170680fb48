"""The request body is built from cached message bytes; it must equal a full serialisation."""

from __future__ import annotations

import random

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from agentload.run.conversation import Conversation, agent_rng, synthetic_text
from agentload.run.scenario import ConversationConfig, Dist, const
from agentload.tokens import prompt_tokens, text_tokens
from agentload.tokens import synthetic_text as synthetic_text_random

text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=50)
tool_msg = st.builds(lambda c, i: {"role": "tool", "tool_call_id": i, "content": c}, text, text)
asst_msg = st.builds(
    lambda c, calls: {"role": "assistant", "content": c or None,
                      **({"tool_calls": [{"id": i, "type": "function", "function": {"name": n, "arguments": a}}
                                         for i, n, a in calls]} if calls else {})},
    text, st.lists(st.tuples(text, text, text), max_size=3))


@given(msgs=st.lists(st.one_of(tool_msg, asst_msg), max_size=8), tools=st.integers(0, 3),
       stream=st.booleans(), seed=st.integers(0, 1000))
@settings(max_examples=60, deadline=None)
def test_body_equals_full_serialisation_and_tokens_match(msgs, tools, stream, seed):
    cfg = ConversationConfig(tools=tools, stream=stream, system_tokens=const(5), user_tokens=const(3))
    conv = Conversation(cfg, "m", agent_rng(seed, 0), 0)
    for m in msgs:
        conv.append(m)
    body = orjson.loads(conv.body())
    assert body["messages"] == conv.messages
    assert body["model"] == "m" and body["stream"] == stream
    assert ("tools" in body) == (tools > 0)
    # The mock counts with the same function over the request it receives.
    assert conv.tokens == prompt_tokens(body["messages"], body.get("tools"))


@given(n=st.integers(0, 3000), seed=st.integers(0, 10**6))
@settings(max_examples=60, deadline=None)
def test_synthetic_text_has_exactly_n_tokens(n, seed):
    text = synthetic_text(agent_rng(seed, 1), n)
    assert text_tokens(text) == n and (n == 0 or len(text.split(" ")) == n)
    assert text_tokens(synthetic_text_random(random.Random(seed), n)) == n  # the mock's side


def _play(conv: Conversation, rounds: int = 3) -> bytes:
    for r in range(1, rounds + 1):
        asst = conv.scripted_assistant(r)
        conv.append(asst)
        for m in conv.tool_results(asst):
            conv.append(m)
        conv.tool_latency_s()
    return conv.body()


def test_same_seed_same_bytes():
    cfg = ConversationConfig(tool_result_tokens=Dist(kind="lognormal", mean=300, sigma=0.5),
                             tool_calls_per_round=Dist(kind="uniform", min=1, max=3))
    a = _play(Conversation(cfg, "m", agent_rng(5, 3), 3))
    assert a == _play(Conversation(cfg, "m", agent_rng(5, 3), 3))
    assert a != _play(Conversation(cfg, "m", agent_rng(5, 4), 4))
    assert a != _play(Conversation(cfg, "m", agent_rng(6, 3), 3))
    # a random.Random (the runner's canaries) seeds a Generator: still deterministic
    assert _play(Conversation(cfg, "m", random.Random(9), -1)) == _play(Conversation(cfg, "m", random.Random(9), -1))
