"""Conversations and rounds inferred from a harness's own requests (agentload.proxy.conversations)."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from agentload.proxy.conversations import Conversations, conversation_items


def _sys(i: int) -> dict:
    return {"role": "system", "content": f"agent {i}"}


def test_a_request_that_extends_an_earlier_one_is_its_next_round():
    c = Conversations()
    m1 = [_sys(0), {"role": "user", "content": "go"}]
    p = c.place(m1)
    assert (p.conversation, p.round, p.call, p.how) == (0, 1, 0, "new")
    c.answered(0, True)
    m2 = m1 + [{"role": "assistant", "tool_calls": [{"id": "c1"}]}, {"role": "tool", "tool_call_id": "c1", "content": "x"}]
    p = c.place(m2)
    assert (p.conversation, p.round, p.how) == (0, 2, "continued")


def test_a_failed_request_sent_again_is_its_retry_and_a_new_first_message_a_new_conversation():
    c = Conversations()
    m1 = [_sys(0), {"role": "user", "content": "go"}]
    c.place(m1)
    c.answered(0, False)
    p = c.place(m1)
    assert (p.conversation, p.round, p.call, p.how) == (0, 1, 1, "retry")
    c.answered(0, True)
    p = c.place([_sys(1), {"role": "user", "content": "go"}])
    assert (p.conversation, p.round, p.how) == (1, 1, "new")


def test_identical_conversations_side_by_side_stay_apart():
    """Two agents of one product send the very same first request: each continuation goes to one of them."""
    c = Conversations()
    m1 = [_sys(0), {"role": "user", "content": "go"}]
    a, b = c.place(m1), c.place(m1)  # the second while the first is in flight: another conversation
    assert a.conversation != b.conversation
    c.answered(a.conversation, True)
    c.answered(b.conversation, True)
    m2 = m1 + [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}]
    x, y = c.place(m2), c.place(m2)
    assert {x.conversation, y.conversation} == {a.conversation, b.conversation}
    assert x.round == y.round == 2


def test_cache_control_marks_moving_between_rounds_do_not_break_the_conversation():
    c = Conversations()
    body1 = {"system": [{"type": "text", "text": "s", "cache_control": {"type": "ephemeral"}}],
             "messages": [{"role": "user", "content": [{"type": "text", "text": "go", "cache_control": {"type": "ephemeral"}}]}]}
    c.place(conversation_items(body1))
    c.answered(0, True)
    body2 = {"system": [{"type": "text", "text": "s", "cache_control": {"type": "ephemeral"}}],
             "messages": [{"role": "user", "content": [{"type": "text", "text": "go"}]},
                          {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
                          {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "r",
                                                        "cache_control": {"type": "ephemeral"}}]}]}
    p = c.place(conversation_items(body2))
    assert (p.conversation, p.round) == (0, 2)


def test_the_session_header_wins_over_the_messages():
    c = Conversations()
    m = [_sys(0), {"role": "user", "content": "go"}]
    assert c.place(m, "s-1").conversation == 0
    c.answered(0, True)
    p = c.place(m, "s-2")  # the same messages, another session: another conversation
    assert (p.conversation, p.round) == (1, 1)
    c.answered(1, True)
    p = c.place([{"role": "user", "content": "unrelated"}], "s-1")
    assert (p.conversation, p.round) == (0, 2)


def test_items_of_each_api():
    assert conversation_items({"messages": [{"role": "user", "content": "x"}]}) == [{"role": "user", "content": "x"}]
    assert conversation_items({"system": "s", "messages": []}) == [{"system": "s"}]
    assert conversation_items({"instructions": "i", "input": "hi"}) == [{"system": "i"}, {"role": "user", "content": "hi"}]
    assert conversation_items({"prompt": "x"}) is None


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=6), min_size=1, max_size=8), st.integers(0, 2**32 - 1))
def test_interleaved_conversations_are_recovered(rounds_per_conv, seed):
    """Any number of conversations, their rounds interleaved in any order: each request is placed in its
    own conversation (a one-to-one naming) and round."""
    rng = random.Random(seed)
    convs = [[_sys(i), {"role": "user", "content": f"task {rng.random()}"}] for i in range(len(rounds_per_conv))]
    done = [0] * len(convs)
    c = Conversations()
    naming: dict[int, int] = {}
    while True:
        live = [i for i in range(len(convs)) if done[i] < rounds_per_conv[i]]
        if not live:
            break
        i = rng.choice(live)
        p = c.place(list(convs[i]))
        assert naming.setdefault(i, p.conversation) == p.conversation
        assert p.round == done[i] + 1 and p.call == 0
        c.answered(p.conversation, True)
        done[i] += 1
        convs[i] += [{"role": "assistant", "content": None, "tool_calls": [{"id": f"c{done[i]}"}]},
                     {"role": "tool", "tool_call_id": f"c{done[i]}", "content": "r" * rng.randint(0, 5)}]
    assert len(set(naming.values())) == len(convs)


class _Tap:
    """A tap that notes what it was told, in order (`fail`: its write raises, as for a harness that left)."""

    def __init__(self, fail: bool = False):
        self.calls: list[str] = []
        self.fail = fail

    def write(self, block: bytes) -> None:
        self.calls.append(f"write {block.decode()}")
        if self.fail:
            raise ConnectionResetError("the harness closed its connection")

    def wrote_first_token(self) -> None:
        self.calls.append("first token")


def test_each_read_goes_on_to_the_harness_before_agentload_reads_it():
    """The proxy's tee (`request._tee`): the write first, so reading a block never delays it; the tap is told
    after the read that carried the first token, once; a write that fails still has its read counted."""
    import pytest

    from agentload.run.request import _tee

    t: dict[str, int] = {}
    tap = _Tap()

    def feed(data: bytes, now: int = 0) -> None:
        tap.calls.append(f"read {data.decode()}")
        if data == b"token":
            t.setdefault("first_token", now)

    both = _tee(feed, tap, t)  # type: ignore[arg-type]
    for block in (b"role", b"token", b"token"):
        both(block, 1)
    assert tap.calls == ["write role", "read role", "write token", "read token", "first token",
                         "write token", "read token"]
    t.clear()
    gone = _Tap(fail=True)
    both = _tee(lambda data, now=0: (gone.calls.append("read"), t.setdefault("first_token", now)), gone, t)  # type: ignore[arg-type]
    with pytest.raises(ConnectionResetError):
        both(b"token", 5)
    assert gone.calls == ["write token", "read"] and t == {"first_token": 5}
