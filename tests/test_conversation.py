"""The request body is built from cached message bytes; it must equal a full serialisation."""

from __future__ import annotations

import random

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from agentload.run.apis.reader import assistant_turn
from agentload.run.chat_stream import ChatStream
from agentload.run.conversation import Conversation, agent_rng, synthetic_text
from agentload.run.dist import Dist, const
from agentload.run.scenario import ConversationConfig
from agentload.tokens import prompt_tokens, text_tokens
from agentload.tokens import synthetic_text as synthetic_text_random

text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=50)
tool_msg = st.builds(lambda c, i: {"role": "tool", "tool_call_id": i, "content": c}, text, text)
CONTENT_MODES = ("empty", "null", "omit")
# (text, tool calls): an assistant turn before the conversation's assistant_content shapes it
asst_parts = st.tuples(text, st.lists(st.tuples(text, text, text), max_size=3))


def _calls(calls):
    return [{"id": i, "type": "function", "function": {"name": n, "arguments": a}} for i, n, a in calls]


@given(msgs=st.lists(st.one_of(tool_msg, asst_parts), max_size=8), tools=st.integers(0, 3),
       stream=st.booleans(), seed=st.integers(0, 1000), content=st.sampled_from(CONTENT_MODES),
       choice=st.sampled_from([None, "auto", "required", "none", "tool_0"]))
@settings(max_examples=80, deadline=None)
def test_body_equals_full_serialisation_and_tokens_match(msgs, tools, stream, seed, content, choice):
    choice = choice if tools else None  # validation refuses a tool_choice without tools
    cfg = ConversationConfig(tools=tools, stream=stream, system_tokens=const(5), user_tokens=const(3),
                             assistant_content=content, tool_choice=choice)
    conv = Conversation(cfg, "m", agent_rng(seed, 0), 0)
    sent = []
    for m in msgs:
        if isinstance(m, tuple):  # an assistant turn, shaped as the conversation's setting says
            m = assistant_turn(m[0], _calls(m[1]), content)
        conv.append(m)
        sent.append(m)
    body = orjson.loads(conv.body())
    assert body["messages"] == conv.messages
    assert body["messages"][2:] == sent
    assert body["model"] == "m" and body["stream"] == stream
    assert ("tools" in body) == (tools > 0)
    assert body.get("tool_choice") == ({"type": "function", "function": {"name": "tool_0"}}
                                       if choice == "tool_0" else choice)
    for m in body["messages"]:
        if m["role"] == "assistant" and not m.get("content"):  # a turn without text
            assert m.get("content", "omitted") == {"empty": "", "null": None, "omit": "omitted"}[content], m
    # The mock counts with the same function over the request it receives.
    assert conv.tokens == prompt_tokens(body["messages"], body.get("tools"))
    # wants_stream reads the first "stream": key: tool_choice must not come before it
    assert conv.body().index(b'"stream":') < conv.body().index(b'"messages":')


@given(texts=st.lists(st.tuples(text, st.booleans()), max_size=10), seed=st.integers(0, 1000))
@settings(max_examples=60, deadline=None)
def test_the_body_asked_for_at_any_point_is_the_history_so_far(texts, seed):
    # appended messages are joined into the body only when it is asked for: the same bytes whenever that is
    cfg = ConversationConfig(tools=1, system_tokens=const(5), user_tokens=const(3))
    conv = Conversation(cfg, "m", agent_rng(seed, 0), 0)
    sent = []
    for content, ask in texts:
        conv.append({"role": "user", "content": content})
        sent.append({"role": "user", "content": content})
        if ask:
            body = conv.body()
            assert orjson.loads(body)["messages"][2:] == sent
            assert conv.body() is body  # nothing appended since: the same object
    assert orjson.loads(conv.body())["messages"][2:] == sent == conv.messages[2:]
    assert conv.n_messages == 2 + len(sent)


def test_tool_call_turns_carry_the_configured_content_scripted_and_from_the_model():
    from agentload.run.request_body import wants_stream

    calls_chunk = (b'{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c1","type":"function",'
                   b'"function":{"name":"tool_1","arguments":"{}"}}]},"finish_reason":"tool_calls"}]}')
    for content, want in (("empty", {"content": ""}), ("null", {"content": None}), ("omit", {})):
        cfg = ConversationConfig(assistant_content=content, tool_choice="required")
        conv = Conversation(cfg, "m", agent_rng(1, 0), 0)
        scripted = conv.scripted_assistant(1)
        assert scripted["tool_calls"] and {k: v for k, v in scripted.items() if k == "content"} == want
        cs = ChatStream()
        cs.add(calls_chunk)
        model = cs.assistant_message(content)
        assert {k: v for k, v in model.items() if k == "content"} == want and model["tool_calls"][0]["id"] == "c1"
        assert wants_stream(conv.body()) and orjson.loads(conv.body())["tool_choice"] == "required"
    # a turn with text keeps it, whatever the setting; scripted turns without tools are text
    cs = ChatStream()
    cs.add(b'{"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":"stop"}]}')
    assert cs.assistant_message("omit") == {"role": "assistant", "content": "hi"}
    conv = Conversation(ConversationConfig(tools=0, assistant_content="omit"), "m", agent_rng(1, 0), 0)
    assert conv.scripted_assistant(1)["content"]


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


def test_the_token_count_kept_by_the_scripted_rounds_is_the_whole_conversations():
    """The user turns a scripted agent adds are counted from the tokens drawn (not counted again from
    their text): the count must still be what the mock counts over the body, round after round."""
    for user in (const(7), Dist(kind="uniform", min=1, max=90)):
        cfg = ConversationConfig(tools=2, system_tokens=const(30), user_tokens=user,
                                 tool_calls_per_round=Dist(kind="uniform", min=1, max=2))
        conv = Conversation(cfg, "m", agent_rng(3, 1), 1)
        for rnd in range(1, 9):
            assistant = conv.scripted_assistant(rnd)
            conv.append(assistant)
            for m in conv.tool_results(assistant):
                conv.append(m)
            conv.next_user_turn()
            body = orjson.loads(conv.body())
            assert body["messages"][-1]["role"] == "user"
            assert conv.tokens == prompt_tokens(body["messages"], body.get("tools")), rnd
