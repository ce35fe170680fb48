"""The fast paths of the Messages and Responses readers take exactly what the slow ones take.

Two shortcuts skip work on the events of a named-event stream (Anthropic's Messages, OpenAI's
Responses): the read loop splits a read of whole `event:` + `data:` events itself, without the SSE
decoder (`sse_body`, `EventReader.add_events`), and the reader takes a token event that is byte for byte its
stream's learned shape around one JSON string without parsing it as an object (`AnswerReader`'s
`add_many`), also by the text shape an earlier stream of the same API learnt
(`EventReader._text_shapes`). Each is checked against the path without it, on random streams with
corrupted events, `event: error`, comments and any split into reads: the same answer, the same
counts, the same flags.
"""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentload.records import Trace
from agentload.run.apis import reader as reader_module
from agentload.run.apis.messages import MessagesStream
from agentload.run.apis.reader import BAD_JSON, DONE, TOKEN, whole_read
from agentload.run.apis.responses import ResponsesStream
from agentload.run.chat_stream import ChatStream
from agentload.run.sse import DATA, ERROR_EVENT, SSEDecoder
from agentload.run.sse_body import SSEBody

# bytes a corruption puts near an event's text: a quote, an escape, another key, a line break, ...
_MUTATIONS = [b'"', b'\\', b'","x":"', b'"},"y":{"z":"', b'\\"', b'\n', b'"]', b'\xff', b'{', b'}', b',', b'\\u00e9']

_FIELDS = ("id", "model", "fingerprint", "finish_reason", "usage", "error", "errors", "chunks", "token_chunks",
           "bad_json", "first_bad", "done", "dones", "no_choices", "first_token_payload", "first_kind", "content")


@pytest.fixture(autouse=True)
def _no_shape_from_other_tests(monkeypatch):
    """Each test starts with no text shape learnt by another test's streams, and no short event of
    no effect remembered (`_quiet`) (a test's own examples may leave them to the next: the readers
    must take the same either way)."""
    for cls in (MessagesStream, ResponsesStream):
        monkeypatch.setattr(cls, "_text_shapes", None)
    monkeypatch.setattr(MessagesStream, "_quiet", set())


def _parsed_only(cls):
    """A reader that takes every event by its parse: it learns no shape and starts with none."""
    r = cls()
    r._learned = 99
    r._shape = r._event_shape = None
    return r


def _state(r) -> dict:
    """Everything a reader tells its readers (its tool calls as assembled, before any join)."""
    out = {k: getattr(r, k) for k in _FIELDS}
    out["calls"] = {i: [c[0], c[1], c[2], "".join(c[3]), c[4]] for i, c in r.calls.calls.items()}
    out["odd"] = r.calls.odd_lines
    out["tool_call_problems"] = r.tool_call_problems()
    return out


def ev(obj: dict) -> bytes:
    return orjson.dumps(obj)


def messages_event(kind: str, text: str, index: int) -> bytes:
    if kind == "text":
        return ev({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}})
    if kind == "args":
        return ev({"type": "content_block_delta", "index": index,
                   "delta": {"type": "input_json_delta", "partial_json": text}})
    if kind == "tool":
        return ev({"type": "content_block_start", "index": index,
                   "content_block": {"type": "tool_use", "id": f"toolu_{index}", "name": "f", "input": {}}})
    if kind == "think":
        return ev({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": text}})
    if kind == "stop":
        return ev({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 3}})
    if kind == "end":
        return ev({"type": "message_stop"})
    if kind == "ping":
        return ev({"type": "ping"})
    if kind == "error":
        return ev({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
    return b"not json"


def responses_event(kind: str, text: str, index: int) -> bytes:
    if kind == "text":
        return ev({"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 0,
                   "content_index": 0, "delta": text})
    if kind == "args":
        return ev({"type": "response.function_call_arguments.delta", "item_id": f"fc_{index}",
                   "output_index": index, "delta": text})
    if kind == "args_by_item":  # no output_index: the call is found by its item id
        return ev({"type": "response.function_call_arguments.delta", "item_id": f"fc_{index}", "delta": text})
    if kind == "tool":
        return ev({"type": "response.output_item.added", "output_index": index,
                   "item": {"type": "function_call", "id": f"fc_{index}", "call_id": f"call_{index}", "name": "f",
                            "arguments": ""}})
    if kind == "think":
        return ev({"type": "response.reasoning_summary_text.delta", "delta": text})
    if kind == "stop":
        return ev({"type": "response.output_text.done", "item_id": "msg_1", "output_index": 0, "text": text})
    if kind == "end":
        return ev({"type": "response.completed", "response": {"id": "resp_1", "status": "completed",
                                                              "usage": {"input_tokens": 4, "output_tokens": 2}}})
    if kind == "ping":
        return ev({"type": "response.in_progress", "response": {"id": "resp_1", "model": "m"}})
    if kind == "error":
        return ev({"type": "response.failed", "response": {"status": "failed", "error": {"message": "boom"}}})
    return b"not json"


_START = {"messages": ev({"type": "message_start", "message": {"id": "msg_1", "model": "m",
                                                               "usage": {"input_tokens": 5, "output_tokens": 1}}}),
          "responses": ev({"type": "response.created", "response": {"id": "resp_1", "model": "m"}})}
_MAKE = {"messages": messages_event, "responses": responses_event}
_KINDS = {"messages": ["text", "text", "text", "args", "tool", "think", "stop", "end", "ping", "error", "bad"],
          "responses": ["text", "text", "text", "args", "args_by_item", "tool", "think", "stop", "end", "ping",
                        "error", "bad"]}


@st.composite
def event_streams(draw, api: str):
    """A named-event stream's payloads as a server sends them (text deltas that differ only in their
    text, tool calls and their argument deltas, the rest), some corrupted byte-wise near their text."""
    out = [_START[api]]
    for _ in range(draw(st.integers(0, 14))):
        kind = draw(st.sampled_from(_KINDS[api]))
        p = _MAKE[api](kind, draw(st.text(max_size=6)), draw(st.integers(0, 1)))
        if draw(st.integers(0, 4)) == 0:  # corrupt it near its text
            at = max(p.rfind(b'":"'), 0) + 3 + draw(st.integers(-3, 3))
            p = p[:max(at, 0)] + draw(st.sampled_from(_MUTATIONS)) + p[max(at, 0) + draw(st.integers(0, 2)):]
        out.append(p)
    return out


def _split(draw, items: list) -> list[list]:
    sizes = draw(st.lists(st.integers(1, 6), min_size=len(items), max_size=len(items)))
    reads, i = [], 0
    for n in sizes:
        if i >= len(items):
            break
        reads.append(items[i:i + n])
        i += n
    return reads


@settings(max_examples=400, deadline=None)
@given(data=st.data(), api=st.sampled_from(["messages", "responses"]))
def test_learned_shapes_take_exactly_what_parsing_every_event_takes(data, api):
    """A payload that matches the stream's learned shape is not parsed: the result must be what
    parsing every event gives, whatever the events and the reads' boundaries."""
    cls = MessagesStream if api == "messages" else ResponsesStream
    reads = _split(data.draw, data.draw(event_streams(api)))
    fast, slow = cls(), _parsed_only(cls)
    for payloads in reads:
        want = 0
        for p in payloads:
            want |= slow.add(p)
        assert fast.add_many(payloads) == want, payloads
    assert _state(fast) == _state(slow)


def test_the_bench_burst_learns_the_token_shape_and_a_mismatch_is_parsed():
    """Messages' burst: 32 text deltas in one read are taken by their shape; a delta of that shape
    whose text is not one JSON string is parsed (a malformed event), another key next to the text too."""
    cs = MessagesStream()
    deltas = [messages_event("text", f" w{i}", 0) for i in range(32)]
    assert cs.add_many([_START["messages"], *deltas, messages_event("stop", "", 0),
                        messages_event("end", "", 0)]) & (TOKEN | DONE) == TOKEN | DONE
    head, tail, call = cs._shape
    assert call is None and head.endswith(b'"text":"') and tail == b'"}}'
    assert cs.content == "".join(f" w{i}" for i in range(32)) and cs.token_chunks == 32 and cs.chunks == 35
    assert cs.first_token_payload == deltas[0] and cs.first_kind == "text"
    assert cs.add_many([head + b'x"y' + tail, head + b'ok' + tail]) == BAD_JSON | TOKEN
    assert cs.bad_json == 1 and cs.content.endswith(" w31ok")
    assert cs.add_many([head + b'x","y":"' + tail]) == TOKEN and cs.content.endswith("okx")


def test_arguments_named_only_by_item_id_learn_no_shape():
    """A Responses arguments delta without output_index finds its call by item id, which a later
    item may take over: no shape is learned from it, every such delta is parsed."""
    cs = ResponsesStream()
    cs.add_many([responses_event("tool", "", 0), responses_event("args_by_item", '{"a"', 0)])
    assert cs._shape is None and cs._learned == 0
    cs.add_many([responses_event("args", ":1}", 0)])
    assert cs._shape is not None and cs._shape[2] == 0 and cs.tool_calls[0]["function"]["arguments"] == '{"a":1}'


# ----------------------------------------------------------------------------- the read loop's split


def _sse(payload: bytes, rng_pick: int) -> bytes:
    """One named event as servers write it, or (rng_pick) in a form the read loop must leave to the
    SSE decoder: `event: error`, a comment before it, data without the space, two data lines (also
    split inside a token event's text, so the first starts as the learned shape and the second ends
    as it), an `id:` line before or after the data, CRLF line ends, an event without a data line
    before it (plain or `event: error`), an extra blank line after it, `event:` without its space."""
    try:
        name = str(orjson.loads(payload)["type"]).encode()
    except (orjson.JSONDecodeError, TypeError, KeyError):
        name = b"x"
    if rng_pick == 1:
        return b"event: error\ndata: " + payload + b"\n\n"
    if rng_pick == 2:
        return b": ping\n\nevent: " + name + b"\ndata: " + payload + b"\n\n"
    if rng_pick == 3:
        return b"event: " + name + b"\ndata:" + payload + b"\n\n"
    if rng_pick == 4:
        return b"event: " + name + b"\ndata: " + payload[:3] + b"\ndata: " + payload[3:] + b"\n\n"
    if rng_pick == 5:
        return b"event: " + name + b"\nid: 7\ndata: " + payload + b"\n\n"
    if rng_pick == 6:
        return b"event: " + name + b"\r\ndata: " + payload + b"\r\n\r\n"
    if rng_pick == 7:  # two data lines, the break inside the text (just after its opening quote)
        at = payload.rfind(b'":"') + 3 if payload.rfind(b'":"') >= 0 else len(payload) // 2
        return b"event: " + name + b"\ndata: " + payload[:at] + b"\ndata: " + payload[at:] + b"\n\n"
    if rng_pick == 8:
        return b"event: " + name + b"\ndata: " + payload + b"\nid: 7\n\n"
    if rng_pick == 9:
        return b"event: " + name + b"\n\nevent: " + name + b"\ndata: " + payload + b"\n\n"
    if rng_pick == 10:
        return b"event: error\n\nevent: " + name + b"\ndata: " + payload + b"\n\n"
    if rng_pick == 11:
        return b"event: " + name + b"\ndata: " + payload + b"\n\n\n"
    if rng_pick == 12:
        return b"event:" + name + b"\ndata: " + payload + b"\n\n"
    return b"event: " + name + b"\ndata: " + payload + b"\n\n"


def _decoded(cls, body: bytes):
    """The reader fed event by event by the SSE decoder alone, every event parsed (the slow path),
    and the comments the decoder saw."""
    cs = _parsed_only(cls)
    dec = SSEDecoder()
    for kind, payload in dec.feed(body) + dec.flush():
        if kind == DATA:
            cs.add(payload)
        elif kind == ERROR_EVENT:
            cs.add_error_event(payload)
    return cs, dec.comments


@settings(max_examples=300, deadline=None)
@given(data=st.data(), api=st.sampled_from(["messages", "responses"]))
def test_the_read_loop_splits_named_events_as_the_decoder_does(data, api):
    """Whole `event:` + `data:` events in a read are split by the read loop itself; anything else
    goes to the SSE decoder. Whatever the events and the reads' boundaries, the answer is the one
    the decoder alone gives."""
    cls = MessagesStream if api == "messages" else ResponsesStream
    payloads = [p for p in data.draw(event_streams(api)) if b"\n" not in p and b"\r" not in p]
    events = [_sse(p, data.draw(st.sampled_from([0] * 12 + list(range(1, 13))))) for p in payloads]
    body = b"".join(events)
    if data.draw(st.booleans()):  # an event a read (a paced stream)
        reads = events
    else:
        cuts = sorted(data.draw(st.lists(st.integers(1, max(1, len(body) - 1)), max_size=8, unique=True)))
        reads = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)]) if body[a:b]]
    trace = Trace("agent", 0, 1, 0, "r", 2, 0, 0)
    reader = SSEBody(trace, cls)
    for i, r in enumerate(reads):
        reader.feed(r, 1000 + i)
    got = reader.finish()
    want, comments = _decoded(cls, body)
    assert _state(got) == _state(want)
    assert trace.token_chunks == want.token_chunks and trace.bad_events == want.bad_json
    assert ("first_token" in trace.t) == (want.token_chunks > 0)
    assert trace.comments == comments


def _read(cls, body: bytes, reads: list[bytes]) -> tuple[Trace, object]:
    trace = Trace("agent", 0, 1, 0, "r", 2, 0, 0)
    reader = SSEBody(trace, cls)
    for i, r in enumerate(reads):
        reader.feed(r, 1000 + i)
    return trace, reader.finish()


@settings(max_examples=300, deadline=None)
@given(data=st.data(), api=st.sampled_from(["messages", "responses"]))
def test_a_stream_taken_by_the_text_shape_another_stream_learnt_takes_what_parsing_takes(data, api):
    """A stream starts with the text shape the last stream of its API learnt (a text event's effect
    is its string, whatever came before it; a tool call's piece is not shared: its call may not be
    open in the next stream): whatever the first stream taught, the next one's answer is what parsing
    its every event gives, read by the read loop (burst or paced) and by `add_many`."""
    cls = MessagesStream if api == "messages" else ResponsesStream
    for teach in (data.draw(event_streams(api)), data.draw(event_streams(api))):
        body = b"".join(b"event: x\ndata: " + p + b"\n\n" for p in teach if b"\n" not in p and b"\r" not in p)
        _read(cls, body, [body])
    assert cls._text_shapes is None or cls._text_shapes[0][2] is None
    payloads = [p for p in data.draw(event_streams(api)) if b"\n" not in p and b"\r" not in p]
    events = [b"event: x\ndata: " + p + b"\n\n" for p in payloads]
    body = b"".join(events)
    want, _ = _decoded(cls, body)
    trace, got = _read(cls, body, events if data.draw(st.booleans()) else [body])
    assert _state(got) == _state(want)
    assert trace.token_chunks == want.token_chunks and trace.bad_events == want.bad_json
    fast, slow = cls(), _parsed_only(cls)
    assert fast.add_many(payloads) == slow.add_many(payloads) and _state(fast) == _state(slow)


@pytest.mark.parametrize("api", ["messages", "responses"])
def test_a_tool_calls_shape_is_not_the_next_streams(api):
    """A stream whose last learnt shape is a tool call's arguments leaves none to the next stream:
    there, the same event with no call opened is malformed (what its parse says), not a piece."""
    cls = MessagesStream if api == "messages" else ResponsesStream
    make = _MAKE[api]
    teach = [_START[api], make("tool", "", 0), make("args", '{"a"', 0), make("args", ":1}", 0)]
    trace, got = _read(cls, b"", [b"".join(b"event: x\ndata: " + p + b"\n\n" for p in teach)])
    assert got._shape is not None and got._shape[2] == 0 and cls._text_shapes is None
    body = b"event: x\ndata: " + _START[api] + b"\n\nevent: x\ndata: " + make("args", "{", 0) + b"\n\n"
    trace, nxt = _read(cls, body, [body])
    want, _ = _decoded(cls, body)
    assert nxt.bad_json == want.bad_json == 1 and _state(nxt) == _state(want)


def test_the_next_stream_starts_with_the_text_shape_and_its_server_stamp_teaches_none(monkeypatch):
    """The bench server's burst twice: the first answer's first token carries the server's send
    stamp and teaches no shape, its second does; the next answer starts with that shape, so only
    its stamped first token is parsed; the stamp is read from the first token's payload either way."""
    first = (b'{"mock_sent_ns":123,"type":"content_block_delta","index":0,'
             b'"delta":{"type":"text_delta","text":" a"}}')
    body = b"".join(b"event: " + name + b"\ndata: " + p + b"\n\n" for name, p in [
        (b"message_start", _START["messages"]), (b"content_block_delta", first),
        *[(b"content_block_delta", messages_event("text", f" w{i}", 0)) for i in range(4)],
        (b"message_stop", messages_event("end", "", 0))])
    assert MessagesStream._text_shapes is None
    trace, got = _read(MessagesStream, body, [body])
    assert got._learned == 1 and trace.server_first_token_ns == 123 and got.first_token_payload == first
    assert MessagesStream._text_shapes == (got._shape, got._event_shape, got._read)
    nxt = MessagesStream()
    assert (nxt._shape, nxt._event_shape, nxt._read) == MessagesStream._text_shapes and nxt._learned == 0
    parsed = []
    loads = reader_module._loads

    def spy(p: bytes) -> object:  # every parse of an event as an object (an array: a run of shaped strings)
        if p[:1] != b"[":
            parsed.append(p)
        return loads(p)

    monkeypatch.setattr(reader_module, "_loads", spy)
    trace = Trace("agent", 0, 1, 0, "r", 2, 0, 0)
    reader = SSEBody(trace, MessagesStream)
    reader.cs = nxt
    reader.feed(body, 1000)
    reader.finish()
    assert parsed == [_START["messages"], first, messages_event("end", "", 0)]
    assert nxt.content == " a w0 w1 w2 w3" and nxt.token_chunks == 5 and trace.server_first_token_ns == 123
    assert _state(nxt) == _state(got)


def test_a_read_of_named_events_is_taken_up_to_the_first_that_is_not_one_event():
    """Messages' burst in one read: the read loop takes the events by their shape once learnt; an
    event whose text would run into its tail (the head's closing quote read as the tail's) is
    malformed, not an empty text; an event of two data lines stops the read loop there and that
    event and the rest go to the SSE decoder: the answer is the decoder's alone."""
    deltas = [b"event: content_block_delta\ndata: " + messages_event("text", f" w{i}", 0) + b"\n\n"
              for i in range(6)]
    head = messages_event("text", "", 0)[:-3]  # ... "text":"
    overlap = b"event: content_block_delta\ndata: " + head + b'}}\n\n'
    two_lines = b"event: content_block_delta\ndata: " + head + b'a\ndata: b"}}\n\n'
    body = (b"event: message_start\ndata: " + _START["messages"] + b"\n\n" + b"".join(deltas[:3]) + overlap
            + deltas[3] + b"event: ping\ndata: " + messages_event("ping", "", 0) + b"\n\n" + deltas[4] + two_lines
            + deltas[5]
            + b"event: message_stop\ndata: " + messages_event("end", "", 0) + b"\n\n")
    trace = Trace("agent", 0, 1, 0, "r", 2, 0, 0)
    reader = SSEBody(trace, MessagesStream)
    reader.feed(body, 1000)
    got = reader.finish()
    want, _ = _decoded(MessagesStream, body)
    assert _state(got) == _state(want)
    assert got.bad_json == 2 and got.content == "".join(f" w{i}" for i in range(6)) and got.done
    assert got._event_shape is not None and reader.dec is not None  # both paths were taken


# ----------------------------------------------------------------------------- a read of one whole event

def _chat(delta: dict, finish=None) -> bytes:
    return ev({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
               "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]})


def _named(payload: bytes) -> bytes:
    return b"event: " + orjson.loads(payload)["type"].encode() + b"\ndata: " + payload + b"\n\n"


# each API's paced stream, one event a read: its reader, its first event, a text read, a tool call
# (index 1) opened, a read of its arguments, its end
_PACED = {
    "messages": (MessagesStream, _named(_START["messages"]), lambda t: _named(messages_event("text", t, 0)),
                 _named(messages_event("tool", "", 1)), lambda t: _named(messages_event("args", t, 1)),
                 _named(messages_event("end", "", 0))),
    "responses": (ResponsesStream, _named(_START["responses"]), lambda t: _named(responses_event("text", t, 0)),
                  _named(responses_event("tool", "", 1)), lambda t: _named(responses_event("args", t, 1)),
                  _named(responses_event("end", "", 0))),
    "chat": (ChatStream, b"data: " + _chat({"role": "assistant", "content": ""}) + b"\n\n",
             lambda t: b"data: " + _chat({"content": t}) + b"\n\n",
             b"data: " + _chat({"tool_calls": [{"index": 1, "id": "c1", "type": "function",
                                                "function": {"name": "f", "arguments": ""}}]}) + b"\n\n",
             lambda t: b"data: " + _chat({"tool_calls": [{"index": 1, "function": {"arguments": t}}]}) + b"\n\n",
             b"data: [DONE]\n\n"),
}

# what a read that starts and ends as the learnt shape's may hold and not be one event carrying one
# non-empty JSON string: a quote, an escape, another key, line breaks (also a second event, an
# `event: error`), a CR, bytes that are not UTF-8 or a control character, an empty string
_NOT_ONE_EVENT = [b'x"y', b'x\\', b'x","y":"z', b"", b"a\nb", b"a\rb", b"a\r\nb", b"\xff", b'a"}}\n\n', b"a\n\nb", b"\x01", b'a\n\nevent: error\ndata: {"type":"error"}\n\nb', b'a"\n\ndata: "b', b"a\tb"]


def _around(read: bytes, text: bytes) -> tuple[bytes, bytes]:
    """The bytes of a one-event read before and after its text."""
    at = read.rindex(text)
    return read[:at], read[at + len(text):]


@pytest.mark.parametrize("api", ["messages", "responses", "chat"])
def test_a_read_of_one_event_of_the_learnt_shape_is_taken_whole_and_nothing_else_is(api, monkeypatch):
    """A paced stream's token read (one event, the learnt shape around one JSON string) is taken by
    `take_read`, without the event split or a parse; a read that starts and ends as that shape but is
    anything else is not taken there (the reader is left as it was), nor one after the answer's end;
    the read loop's answer over them all is the SSE decoder's with every event parsed."""
    cls, start, text, tool, args, end = _PACED[api]
    head, tail = _around(text("ZZ"), b"ZZ")
    trace, cs = _read(cls, b"", [start, text("a"), text("b")])  # (chat's read shape is made at its next read)
    assert cs._read[:2] == (head, tail)
    before = _state(cs)
    for mid in _NOT_ONE_EVENT:
        assert cs.take_read(head + mid + tail) == -1, mid
        assert _state(cs) == before, mid
    # ... nor one that is not the shape's before or after the string (a byte other than the shape's)
    for read in (b" " + head + b"c" + tail, head + b"c" + tail + b"\n", head + b"c" + tail[:1] + b"]" + tail[2:],
                 head[:-3] + b"X" + head[-2:] + b"c" + tail, b"X" + head[1:] + b"c" + tail):
        assert cs.take_read(read) == -1 and _state(cs) == before, read
    assert cs.take_read(head + b'\\u00e9 \\"q\\"' + tail) == TOKEN and cs.content.endswith('é "q"')
    assert cs.take_read(head + b'\\"' + tail) == TOKEN and cs.content.endswith('é "q""')  # (the tail's quote ends it)
    assert cs.chunks == before["chunks"] + 2 and cs.token_chunks == before["token_chunks"] + 2
    # the same through the read loop, a read each (a paced stream), against the decoder alone: text
    # around the reads above, then a tool call's arguments (each stream learns its shapes anew)
    good = [text(t) for t in ("b", "c", "d", "e")]
    texts = [start, text("a"), *good[:2], *(head + mid + tail for mid in _NOT_ONE_EVENT), *good[2:], end, text("late")]
    calls = [start, tool, args('{"a"'), args(":"), args(" 1}"), end, args("late")]
    taken: list[bytes] = []
    take = cls.take_read

    def spy(self, data: bytes) -> int:
        flags = take(self, data)
        if flags >= 0:
            taken.append(data)
        return flags

    monkeypatch.setattr(cls, "take_read", spy)
    for reads in (texts, calls):
        if cls is not ChatStream:
            monkeypatch.setattr(cls, "_text_shapes", None)
        del taken[:]
        trace, got = _read(cls, b"", reads)
        want, _ = _decoded(cls, b"".join(reads))
        assert _state(got) == _state(want)
        assert trace.token_chunks == want.token_chunks and trace.bad_events == want.bad_json
        assert trace.token_reads == sum(1 for i in range(len(reads)) if _decoded(cls, b"".join(reads[:i + 1]))[
            0].token_chunks > _decoded(cls, b"".join(reads[:i]))[0].token_chunks)
        if reads is texts:  # (a text of another key after it teaches a shape of its own: not all are taken)
            assert taken[:2] == good[:2] and set(taken) <= set(good)
        else:
            assert taken == [args(":"), args(" 1}")]


@settings(max_examples=300, deadline=None)
@given(data=st.data(), api=st.sampled_from(["messages", "responses", "chat"]))
def test_paced_reads_around_the_learnt_shape_read_as_the_decoder_reads_them(data, api):
    """Reads that start and end as a paced stream's learnt shape, whatever bytes are between (a
    token's text, or anything that would break the event: quotes, escapes, line breaks, CRs, other
    events, bytes that are not UTF-8), and whole events of any kind between them: the read loop's
    answer, counts and token reads are the SSE decoder's with every event parsed."""
    cls, start, text, tool, args, end = _PACED[api]
    head, tail = _around(text("ZZ"), b"ZZ")
    bits = st.sampled_from([b"a", b"\xc3\xa9", b'"', b"\\", b'\\"', b"\\u00e9", b"\\n", b"\n", b"\r", b"\n\n",
                            b"\t", b"\xff", b'","x":"', b"data: ", b"\n\nevent: error\ndata: {}\n\n", tail, head])
    others = st.sampled_from([text("x"), text(""), tool, args('{"b"'), args("1"), end, b": ping\n\n",
                              b"event: error\ndata: {}\n\n"])
    # the shape's head and tail, or one of them a byte off (another byte, or one more or less)
    heads = st.sampled_from([head] * 6 + [head[:-3] + b"X" + head[-2:], head[:-1] + b"'", head + b"'", head[1:]])
    tails = st.sampled_from([tail] * 6 + [tail[:1] + b"]" + tail[2:], tail[:-3] + tail[-2:], tail + b"x\n\n",
                                          tail[:-2] + b" \n\n"])
    reads = [start, text("a")]
    for _ in range(data.draw(st.integers(1, 12))):
        if data.draw(st.integers(0, 3)):
            reads.append(data.draw(heads) + b"".join(data.draw(st.lists(bits, max_size=4))) + data.draw(tails))
        else:
            reads.append(data.draw(others))
    trace, got = _read(cls, b"", reads)
    want, comments = _decoded(cls, b"".join(reads))
    assert _state(got) == _state(want)
    assert trace.token_chunks == want.token_chunks and trace.bad_events == want.bad_json
    assert trace.comments == comments


def test_a_read_shape_is_one_event_of_one_data_line_or_none():
    """`whole_read` gives a read shape only where the shape's bytes hold the event's line breaks
    and no other: a chunk learnt from the decoder whose payload spans lines, a CR, another field, an
    `event: error` or a head and tail without the string's quotes give none (their reads go the
    usual way)."""
    assert whole_read(b'data: {"c":"', b'"}\n\n', None) == (b'data: {"c":"', b'"}\n\n', 12, 3, 6, None)
    assert whole_read(b'event: x\ndata: {"c":"', b'"}\n\n', 2) == (b'event: x\ndata: {"c":"', b'"}\n\n', 21, 3, 15, 2)
    for head, tail in [(b'data: {\n"c":"', b'"}\n\n'), (b'data: {"c":"', b'"\n}\n\n'), (b'data: {"c":"', b'"}\r\n\r\n'),
                       (b'event: x\r\ndata: {"c":"', b'"}\n\n'), (b'event: x\nid: 1\ndata: {"c":"', b'"}\n\n'),
                       (b'event: error\ndata: {"c":"', b'"}\n\n'), (b'data:{"c":"', b'"}\n\n'), (b'id: 1\ndata: {"c":"', b'"}\n\n'),
                       (b'data: {"c":', b'"}\n\n'), (b'data: {"c":"', b'}\n\n'), (b'data: {"c":"', b'"}\n')]:
        assert whole_read(head, tail, None) is None, (head, tail)



# (a payload, whether Messages' and Responses' parse counts it malformed)
_NOT_EVENTS = [(b"not json", 1, 1), (b"[1,2]", 1, 1), (b'"message_stop"', 1, 1), (b"null", 1, 1), (b"7", 1, 1),
               (b"{}", 1, 1), (b'{"type":null}', 1, 1), (b'{"type":7}', 1, 1), (b'{"type":["message_stop"]}', 1, 1),
               (b'{"type":{"a":1}}', 1, 1), (b'{"type":"message_stop"', 1, 1), (b'{"type":"x"}x', 1, 1),
               (b'{"type":"ping"} {"type":"ping"}', 1, 1), (b'{"type":"response.content_part.done","part":', 1, 1),
               (b'{"type":"message_start","message":[1]}', 1, 0), (b'{"type":"response.created","response":"r"}', 0, 1),
               (b'{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":7}}', 1, 0),
               (b'{"type":"response.output_text.delta","delta":null}', 0, 1),
               (b'{"type":"content_block_stop","index":0}', 0, 0), (b'{"type":"unknown.to.both"}', 0, 0)]


@pytest.mark.parametrize("api", ["messages", "responses"])
@pytest.mark.parametrize("payload,bad_messages,bad_responses", _NOT_EVENTS)
def test_a_named_event_taken_by_the_read_loop_is_counted_as_its_parse_counts_it(api, payload, bad_messages,
                                                                                bad_responses):
    """Each of a burst's events that is not of the learnt shape is parsed by the read loop itself
    (`_add_event`): whatever it holds (not JSON, not an object, a type that is not a string, one no
    handler knows, a handler's wrong shape, bytes after the object), the answer is the decoder's,
    its every event parsed; a malformed one is counted (twice in the stream, twice counted), and
    the answer without its terminal event is not done."""
    cls = MessagesStream if api == "messages" else ResponsesStream
    make = _MAKE[api]
    payloads = [_START[api], make("text", " a", 0), payload, make("text", " b", 0), payload]
    body = b"".join(b"event: x\ndata: " + p + b"\n\n" for p in payloads)
    trace, got = _read(cls, body, [body])
    want, _ = _decoded(cls, body)
    assert _state(got) == _state(want) and trace.bad_events == want.bad_json
    assert got.bad_json == 2 * (bad_messages if api == "messages" else bad_responses)
    assert not got.done and got.content == " a b" and got.chunks == 5


def test_a_short_event_of_no_effect_seen_before_is_not_parsed_and_anything_else_is(monkeypatch):
    """Messages' `ping` and `content_block_stop` are the same bytes in every answer: the second time
    an event is byte for byte one parsed before whose type no handler takes, it is counted without a
    parse (`EventReader._quiet`). A byte off (malformed, another index, another name line, `event:
    error`) is parsed as ever: a malformed ping is counted malformed, an error is an error."""
    ping, stop = messages_event("ping", "", 0), b'{"type":"content_block_stop","index":0}'
    parts = [(b"message_start", _START["messages"]), (b"ping", ping), (b"content_block_delta", messages_event("text", " a", 0)),
             (b"content_block_stop", stop), (b"message_stop", messages_event("end", "", 0))]
    body = b"".join(b"event: " + n + b"\ndata: " + p + b"\n\n" for n, p in parts)
    first_trace, first = _read(MessagesStream, body, [body])
    assert MessagesStream._quiet == {b"ping\ndata: " + ping, b"content_block_stop\ndata: " + stop}
    parsed = []
    loads = reader_module._loads

    def spy(p: bytes) -> object:
        parsed.append(p)
        return loads(p)

    monkeypatch.setattr(reader_module, "_loads", spy)
    trace, got = _read(MessagesStream, body, [body])
    assert ping not in parsed and stop not in parsed and _START["messages"] in parsed
    assert _state(got) == _state(first) == _state(_decoded(MessagesStream, body)[0]) and got.chunks == 5
    assert got.done and got.bad_json == 0 and got.no_choices == 4
    for name, payload, bad, error in [(b"ping", b'{"type":"ping"', 1, 0), (b"ping", b'{"type":"ping"}}', 1, 0),
                                      (b"ping", b'{"type":"ping"} ', 0, 0), (b"ping", b'{"type":"pong"}', 0, 0),
                                      (b"content_block_stop", b'{"type":"content_block_stop","index":1}', 0, 0),
                                      (b"pings", ping, 0, 0), (b"error", ping, 0, 1), (b"ping", b"[DONE]", 0, 0)]:
        parsed.clear()
        one = b"event: " + name + b"\ndata: " + payload + b"\n\n"
        trace, got = _read(MessagesStream, body + one, [body + one])
        want, _ = _decoded(MessagesStream, body + one)
        assert payload in parsed, one
        assert _state(got) == _state(want) and got.bad_json == bad and got.errors == error and got.chunks == 6, one
        assert trace.bad_events == bad


def test_short_events_of_no_effect_that_differ_every_time_stop_being_remembered():
    """A server whose short events of no effect differ every time (an id, a count in them) fills
    `_quiet` to QUIET_MAX, and then it is dropped: no more look-ups, every event parsed, the same
    answer. Responses' are never looked up (each of its names the item it is about)."""
    def answer(i: int) -> bytes:
        return b"".join(b"event: " + n + b"\ndata: " + p + b"\n\n" for n, p in [
            (b"message_start", _START["messages"]), (b"content_block_delta", messages_event("text", " a", 0)),
            (b"ping", b'{"type":"ping","n":%d}' % i), (b"message_stop", messages_event("end", "", 0))])
    for i in range(reader_module.QUIET_MAX + 3):
        body = answer(i)
        trace, got = _read(MessagesStream, body, [body])
        assert _state(got) == _state(_decoded(MessagesStream, body)[0]) and got.done and got.chunks == 4
        if i < reader_module.QUIET_MAX:
            assert len(MessagesStream._quiet) == i + 1
    assert MessagesStream._quiet is None
    body = answer(0)
    assert _state(_read(MessagesStream, body, [body])[1]) == _state(_decoded(MessagesStream, body)[0])
    body = b"".join(b"event: x\ndata: " + p + b"\n\n" for p in [
        _START["responses"], b'{"type":"response.content_part.added"}', responses_event("end", "", 0)])
    _read(ResponsesStream, body, [body])
    assert ResponsesStream._quiet is None
