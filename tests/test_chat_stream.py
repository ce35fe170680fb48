"""ChatStream: server quirks (vLLM, SGLang, routers) and a property test that randomly
fragmented tool calls reassemble exactly."""

from __future__ import annotations

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from agentload.run.chat_stream import (
    BAD_JSON,
    DONE,
    ERROR,
    FINISH,
    TOKEN,
    USAGE,
    ChatStream,
)
from agentload.run.sse import (
    DATA,
    ERROR_EVENT,
    SSEDecoder,
    encode_comment,
    encode_event,
)


def chunk(delta=None, finish=None, *, choices=None, **extra) -> bytes:
    obj = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": choices
        if choices is not None
        else [{"index": 0, "delta": delta or {}, "logprobs": None, "finish_reason": finish}],
    }
    obj.update(extra)
    return orjson.dumps(obj)


def usage_chunk(prompt=10, completion=3) -> bytes:
    return chunk(
        choices=[],
        usage={"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
    )


def tc(index, id=None, name=None, arguments=None, type=None, nulls=False) -> dict:
    """A tool-call fragment; nulls=True writes absent fields as explicit nulls (SGLang)."""
    f: dict = {"index": index}
    fn: dict = {}
    for k, v, d in (("id", id, f), ("type", type, f), ("name", name, fn), ("arguments", arguments, fn)):
        if v is not None or nulls:
            d[k] = v
    if fn or nulls:
        f["function"] = fn
    return f


# ----------------------------------------------------------------------------- content


def test_vllm_role_first_chunk_is_not_a_token():
    cs = ChatStream()
    assert cs.add(chunk({"role": "assistant", "content": ""})) == 0
    assert cs.add(chunk({"content": "Hel"})) == TOKEN
    assert cs.add(chunk({"content": "lo"})) == TOKEN
    assert cs.add(chunk({}, "stop")) == FINISH
    assert cs.add(usage_chunk()) == USAGE
    assert cs.add(b"[DONE]") == DONE
    assert cs.content == "Hello"
    assert cs.finish_reason == "stop"
    assert cs.usage["completion_tokens"] == 3 and cs.usage["prompt_tokens"] == 10
    assert cs.chunks == 6 and cs.token_chunks == 2
    assert cs.done and cs.id == "chatcmpl-1" and cs.model == "m"
    assert cs.assistant_message() == {"role": "assistant", "content": "Hello"}


def test_role_chunk_with_null_content_and_empty_delta():
    cs = ChatStream()
    assert cs.add(chunk({"role": "assistant", "content": None})) == 0
    assert cs.add(chunk({"content": None, "reasoning_content": None, "tool_calls": None})) == 0
    assert cs.add(chunk({"content": ""})) == 0
    assert cs.token_chunks == 0
    assert cs.assistant_message() == {"role": "assistant", "content": None}


def test_reasoning_is_a_token_and_kept_apart():
    cs = ChatStream()
    assert cs.add(chunk({"reasoning_content": "think"})) == TOKEN
    assert cs.add(chunk({"reasoning": "ing"})) == TOKEN  # newer vLLM field name
    assert cs.add(chunk({"content": "ok"}, "stop")) == TOKEN | FINISH
    assert cs.content == "ok" and cs.token_chunks == 3
    assert cs.assistant_message() == {"role": "assistant", "content": "ok"}


def test_sglang_finish_reason_in_own_chunk_then_usage():
    cs = ChatStream()
    cs.add(chunk({"role": "assistant", "content": ""}, usage=None))
    assert cs.add(chunk({"content": "x"}, usage=None)) == TOKEN
    assert cs.add(chunk({"content": None}, "length", usage=None)) == FINISH
    assert cs.add(usage_chunk(5, 1)) == USAGE
    assert cs.finish_reason == "length" and cs.usage["completion_tokens"] == 1


def test_missing_usage_when_stream_breaks():
    cs = ChatStream()
    cs.add(chunk({"content": "partial"}))
    assert cs.usage is None
    assert cs.finish_reason is None and not cs.done
    assert cs.assistant_message() == {"role": "assistant", "content": "partial"}


def test_usage_in_every_chunk_continuous_stats():
    cs = ChatStream()
    u = {"prompt_tokens": 4, "completion_tokens": 1, "total_tokens": 5}
    assert cs.add(chunk({"content": "a"}, usage=u)) == TOKEN | USAGE
    assert cs.usage == u


def test_only_choice_zero_is_accumulated():
    cs = ChatStream()
    flags = cs.add(
        chunk(
            choices=[
                {"index": 1, "delta": {"content": "other"}, "finish_reason": None},
                {"index": 0, "delta": {"content": "mine"}, "finish_reason": None},
            ]
        )
    )
    assert flags == TOKEN and cs.content == "mine"


def test_content_join_is_lazy_and_stable():
    cs = ChatStream()
    for p in ["a", "b", "c"]:
        cs.add(chunk({"content": p}))
    assert cs.content == "abc"
    cs.add(chunk({"content": "d"}))
    assert cs.content == "abcd" and cs.content == "abcd"


# ----------------------------------------------------------------------------- tool calls


def test_first_name_fragment_is_the_first_token_id_only_is_not():
    cs = ChatStream()
    assert cs.add(chunk({"role": "assistant", "content": ""})) == 0
    assert cs.add(chunk({"tool_calls": [tc(0, id="call_1", type="function")]})) == 0
    assert cs.add(chunk({"tool_calls": [tc(0, name="get_weather")]})) == TOKEN
    assert cs.add(chunk({"tool_calls": [tc(0, arguments="")]})) == 0
    assert cs.add(chunk({"tool_calls": [tc(0, arguments='{"city": ')]})) == TOKEN
    assert cs.add(chunk({"tool_calls": [tc(0, arguments='"Paris"}')]})) == TOKEN
    assert cs.add(chunk({}, "tool_calls")) == FINISH
    assert cs.assistant_message() == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
        ],
    }
    assert cs.token_chunks == 3


def test_sglang_explicit_nulls_in_fragments():
    cs = ChatStream()
    cs.add(chunk({"role": "assistant", "content": None, "reasoning_content": None, "tool_calls": None}))
    first = tc(0, id="call_a", name="search", arguments="", type="function", nulls=True)
    assert cs.add(chunk({"content": None, "tool_calls": [first]})) == TOKEN
    for piece in ['{"q"', ': "x"', "}"]:
        frag = tc(0, arguments=piece, nulls=True)  # "id": null, "type": null, "name": null
        assert cs.add(chunk({"content": None, "tool_calls": [frag]})) == TOKEN
    assert cs.add(chunk({"content": None, "tool_calls": [tc(0, nulls=True)]})) == 0  # all-null fragment
    assert cs.add(chunk({"content": None}, "tool_calls")) == FINISH
    (call,) = cs.tool_calls
    assert call == {"id": "call_a", "type": "function", "function": {"name": "search", "arguments": '{"q": "x"}'}}
    assert "None" not in call["function"]["arguments"]


def test_two_calls_interleaved_by_index():
    cs = ChatStream()
    frags = [
        tc(0, id="c0", type="function", name="a", arguments=""),
        tc(1, id="c1", type="function", name="b", arguments='{"y'),
        tc(0, arguments='{"x":'),
        tc(1, arguments='":2}'),
        tc(0, arguments="1}"),
    ]
    for f in frags:
        cs.add(chunk({"tool_calls": [f]}))
    # Both calls in one chunk too.
    cs.add(chunk({"tool_calls": [tc(1, arguments=""), tc(0, arguments="")]}))
    assert [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in cs.tool_calls] == [
        ("c0", "a", '{"x":1}'),
        ("c1", "b", '{"y":2}'),
    ]


def test_first_non_null_wins_and_invalid_arguments_kept_verbatim():
    cs = ChatStream()
    cs.add(chunk({"tool_calls": [tc(0, id="first", name="f")]}))
    cs.add(chunk({"tool_calls": [tc(0, id="second", name="g", arguments='{"a": ')]}))
    msg = cs.assistant_message()
    assert msg["tool_calls"][0]["id"] == "first"
    assert msg["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"a": '}


def test_tool_calls_and_content_together():
    cs = ChatStream()
    cs.add(chunk({"content": "Let me check. "}))
    cs.add(chunk({"tool_calls": [tc(0, id="i", type="function", name="n", arguments="{}")]}))
    msg = cs.assistant_message()
    assert msg["content"] == "Let me check. " and len(msg["tool_calls"]) == 1


def test_fragments_without_index():
    cs = ChatStream()
    cs.add(chunk({"tool_calls": [{"id": "a", "function": {"name": "f", "arguments": "{"}}]}))
    cs.add(chunk({"tool_calls": [{"function": {"arguments": "}"}}]}))
    cs.add(chunk({"tool_calls": [{"id": "b", "function": {"name": "g", "arguments": "[]"}}]}))
    assert [(c["id"], c["function"]["arguments"]) for c in cs.tool_calls] == [("a", "{}"), ("b", "[]")]


# ----------------------------------------------------------------------------- errors, DONE, bad JSON


def test_in_band_error_vllm_new_format():
    cs = ChatStream()
    cs.add(chunk({"content": "a"}))
    err = {"error": {"message": "KV cache\nexhausted", "type": "InternalServerError", "param": None, "code": 500}}
    assert cs.add(orjson.dumps(err)) == ERROR
    assert cs.error == "InternalServerError (500): KV cache exhausted"
    assert cs.errors == 1


def test_in_band_error_object_error_format():
    cs = ChatStream()
    body = {"object": "error", "message": "too long", "type": "BadRequestError", "param": None, "code": 400}
    assert cs.add(orjson.dumps(body)) == ERROR
    assert cs.error == "BadRequestError (400): too long"


def test_in_band_error_string_and_first_error_kept():
    cs = ChatStream()
    assert cs.add(b'{"error": "upstream closed"}') == ERROR
    assert cs.add(b'{"error": {"message": "second"}}') == ERROR
    assert cs.error == "upstream closed" and cs.errors == 2


def test_error_message_is_short():
    cs = ChatStream()
    cs.add(orjson.dumps({"error": {"message": "x" * 10_000}}))
    assert len(cs.error) <= 300


def test_error_event_from_sse_always_reports_error():
    cs = ChatStream()
    assert cs.add_error_event(b"backend gone") & ERROR  # not JSON
    assert cs.error == "backend gone"
    cs = ChatStream()
    assert cs.add_error_event(b'{"error": {"message": "m", "code": 503}}') == ERROR
    assert cs.error == "503: m" and cs.errors == 1


def test_done_and_bad_json_never_raise():
    cs = ChatStream()
    assert cs.add(b" [DONE] ") == DONE and cs.done and cs.dones == 1
    cs = ChatStream()
    assert cs.add(b"{not json") == BAD_JSON
    assert cs.add(b"") == BAD_JSON
    assert cs.add(b"[1, 2]") == BAD_JSON  # JSON but not an object
    assert cs.add(b"\xff\xfe") == BAD_JSON
    assert cs.add(b"[DONE]") == DONE
    assert cs.bad_json == 4 and cs.chunks == 5 and cs.done
    assert cs.dones == 1 and cs.first_bad == b"{not json"


def test_nothing_after_done_is_taken_only_counted():
    """[DONE] ends the answer (an SDK client stops there): tokens, a finish_reason, usage, errors and
    garbage after it are counted in after_done, never taken; a second [DONE] only in dones."""
    cs = ChatStream()
    assert cs.add_many([chunk({"content": "hi"}), b"[DONE]", chunk({"content": " more"})]) == TOKEN | DONE
    assert cs.add(chunk({}, "stop")) == 0
    assert cs.add(b"[DONE]") == 0
    assert cs.add(usage_chunk()) == 0
    assert cs.add(b"not json") == 0
    assert cs.add_error_event(b'{"error": "late"}') == 0
    assert cs.add_many([chunk({"content": " and"}), chunk({"content": " more"})]) == 0
    assert cs.content == "hi" and cs.token_chunks == 1 and cs.finish_reason is None and cs.usage is None
    assert cs.error is None and cs.bad_json == 0 and cs.chunks == 2 and cs.dones == 2
    assert cs.after_done == 7 and cs.after_done_tokens == 3
    assert cs.first_after_done == chunk({"content": " more"})[:120]


def test_error_event_payloads_are_errors_not_malformed_events():
    """`event: error` carries whatever the server puts there: a JSON object with or without an
    `error` key, plain text, nothing. Each is the error; none is a malformed event."""
    cs = ChatStream()
    assert cs.add(chunk({"role": "assistant", "content": ""})) == 0
    assert cs.add_error_event(b'{"message": "backend overloaded", "code": 503}') == ERROR
    assert cs.error == "503: backend overloaded" and cs.bad_json == 0 and cs.chunks == 2
    for payload, text in ((b"upstream reset", "upstream reset"), (b"", "error event"), (b"  ", "error event"),
                          (b"[1, 2]", "[1, 2]"), (b'{"detail": "x"}', '{"detail":"x"}')):
        cs = ChatStream()
        assert cs.add_error_event(payload) & ERROR
        assert cs.error == text and cs.errors == 1 and cs.bad_json == 0, payload
    # A second error event is counted; the first one's text is kept.
    cs = ChatStream()
    cs.add_error_event(b"first")
    cs.add_error_event(b'{"error": {"message": "second"}}')
    assert cs.error == "first" and cs.errors == 2


def test_usage_that_is_not_an_object_is_malformed_and_never_kept():
    cs = ChatStream()
    flags = cs.add(chunk({"content": "hi"}, usage="n/a"))
    assert flags & TOKEN and flags & BAD_JSON and not flags & USAGE  # the token is still a token
    assert cs.usage is None and cs.bad_json == 1 and cs.content == "hi"
    assert cs.add(chunk(choices=[], usage=[1])) == BAD_JSON
    assert cs.add(chunk(choices=[], usage=None)) == 0 and cs.add(chunk(choices=[], usage={})) == 0
    assert cs.add(usage_chunk()) == USAGE and cs.usage["completion_tokens"] == 3
    assert cs.add(chunk(choices=[], usage=7)) == BAD_JSON
    assert cs.usage["completion_tokens"] == 3 and cs.bad_json == 3  # a bad one never replaces a good one


def test_wrong_shapes_are_malformed_events_and_never_raise():
    cases = [
        {"choices": 5},
        {"choices": [{"index": 0, "delta": "text"}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": 5}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": "f"}]}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": 1}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": ["stop"]}]},
    ]
    cs = ChatStream()
    for obj in cases:
        assert cs.add(orjson.dumps(obj)) & BAD_JSON, obj
    assert cs.bad_json == len(cases) and cs.finish_reason is None and cs.token_chunks == 0
    assert cs.first_bad == b'{"choices":5}'
    # Harmless oddities are not malformed: strings iterate as non-dict choices, null fields.
    cs = ChatStream()
    for obj in ({"choices": "x"}, {"choices": [{"index": 0, "delta": None, "finish_reason": None}]},
                {"choices": [{"index": 0, "delta": {"content": 5}}]}):
        assert cs.add(orjson.dumps(obj)) == 0, obj
    assert cs.bad_json == 0


def test_first_malformed_event_is_sampled_short():
    cs = ChatStream()
    cs.add(b"<" * 1000)
    cs.add(b"second")
    assert cs.first_bad == b"<" * 120 and cs.bad_json == 2


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=4)
    | st.sampled_from(["stop", "assistant", "content", "n/a"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["choices", "delta", "message", "content", "index", "tool_calls", "function", "name",
                         "arguments", "id", "finish_reason", "usage", "error", "object", "reasoning", "x"]),
        inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=500)
@given(values=st.lists(json_values, max_size=6), error_event=st.booleans())
def test_any_json_never_raises_and_fields_keep_their_types(values, error_event):
    """Whatever JSON a server sends, add/add_error_event/from_response never raise, and what the
    rest of agentload reads keeps its type: usage a dict or None, finish_reason a str or None."""
    cs = ChatStream()
    for v in values:
        payload = orjson.dumps(v)
        flags = cs.add_error_event(payload) if error_event else cs.add(payload)
        if error_event:  # an error event is always an error
            assert flags & ERROR and cs.error is not None
        r = ChatStream.from_response(payload)
        for s in (cs, r):
            assert s.usage is None or type(s.usage) is dict
            assert s.finish_reason is None or type(s.finish_reason) is str
            s.assistant_message()
        assert (r.not_completion is None) or r.error is None
    assert cs.chunks == len(values)


# ----------------------------------------------------------------------------- non-streaming


def test_from_response_tool_calls():
    body = orjson.dumps(
        {
            "id": "chatcmpl-9",
            "object": "chat.completion",
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": None,
                        "reasoning_content": "hmm",
                        "tool_calls": [
                            {"id": "c1", "type": "function", "function": {"name": "a", "arguments": '{"k": 1}'}},
                            {"id": "c2", "type": "function", "function": {"name": "b", "arguments": "{bad"}},
                        ],
                    },
                    "finish_reason": "tool_calls",
                }
            ],
            "usage": {"prompt_tokens": 20, "completion_tokens": 7, "total_tokens": 27},
        }
    )
    cs = ChatStream.from_response(body)
    assert cs.id == "chatcmpl-9" and cs.finish_reason == "tool_calls"
    assert cs.usage["completion_tokens"] == 7
    assert cs.chunks == 1 and cs.token_chunks == 1
    assert cs.assistant_message() == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "a", "arguments": '{"k": 1}'}},
            {"id": "c2", "type": "function", "function": {"name": "b", "arguments": "{bad"}},
        ],
    }


def test_from_response_content_error_and_garbage():
    cs = ChatStream.from_response(
        b'{"object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},'
        b'"finish_reason":"stop"}]}'
    )
    assert cs.content == "hi" and cs.finish_reason == "stop" and cs.usage is None
    assert cs.assistant_message() == {"role": "assistant", "content": "hi"}
    cs = ChatStream.from_response(b'{"error": {"message": "no such model", "type": "NotFoundError", "code": 404}}')
    assert cs.error == "NotFoundError (404): no such model"
    cs = ChatStream.from_response(b"<html>502 Bad Gateway</html>")
    assert cs.bad_json == 1 and cs.error is None
    assert cs.not_completion == "not JSON" and cs.first_bad == b"<html>502 Bad Gateway</html>"


def test_from_response_says_why_a_body_is_not_a_completion():
    ok = {"choices": [{"index": 0, "message": {"role": "assistant", "content": ""}, "finish_reason": "stop"}]}
    assert ChatStream.from_response(orjson.dumps(ok)).not_completion is None  # empty, finished: a completion
    assert ChatStream.from_response(orjson.dumps({"error": "x"})).not_completion is None  # an error (cs.error)
    for body, why, bad in (
        (b"[1]", "a JSON list, not an object", 1),
        (b"null", "a JSON null, not an object", 1),
        (b'"hi"', "a JSON str, not an object", 1),
        (b"{}", "no choices", 0),
        (b'{"choices": []}', "no choices", 0),
        (b'{"choices": {"0": 1}}', "choices is not a list", 0),
        (b'{"choices": [{"index": 1, "message": {"content": "x"}}]}', "no choice 0 with a message", 0),
        (b'{"choices": [{"index": 0, "message": "hi"}]}', "choice 0 has no message object", 0),
    ):
        cs = ChatStream.from_response(body)
        assert (cs.not_completion, cs.bad_json, cs.error) == (why, bad, None), body
    cs = ChatStream.from_response(orjson.dumps({**ok, "usage": "n/a"}))
    assert cs.not_completion is None and cs.usage is None and cs.bad_json == 1
    weird = {"choices": [{"index": 0, "finish_reason": 5, "message": {
        "content": "hi", "tool_calls": [{"function": "f"}]}}]}
    cs = ChatStream.from_response(orjson.dumps(weird))
    assert cs.content == "hi" and cs.finish_reason is None and cs.bad_json == 2


# ----------------------------------------------------------------------------- properties

ids = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=12)
names = st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,15}", fullmatch=True)
args_text = st.text(max_size=60) | st.builds(
    lambda d: orjson.dumps(d).decode(),
    st.dictionaries(st.text(max_size=5), st.integers(-(2**53), 2**53) | st.text(max_size=8), max_size=4),
)


@st.composite
def fragmented_calls(draw):
    """Random tool calls, each cut into fragments at random points, interleaved by index,
    with the id and name on random fragments and optional explicit nulls elsewhere."""
    n = draw(st.integers(min_value=1, max_value=4))
    calls = [(draw(ids), draw(names), draw(args_text)) for _ in range(n)]
    per_call = []
    for index, (cid, name, args) in enumerate(calls):
        cut = sorted(draw(st.lists(st.integers(0, len(args)), max_size=6)))
        pieces = [args[a:b] for a, b in zip([0, *cut], [*cut, len(args)])]
        k = len(pieces)
        id_at = draw(st.integers(0, k - 1))
        name_at = draw(st.integers(0, k - 1))
        repeat = draw(st.booleans())  # some servers repeat id/name on later fragments
        frags = []
        for i, piece in enumerate(pieces):
            nulls = draw(st.booleans())
            frags.append(
                tc(
                    index,
                    id=cid if i == id_at or (repeat and i > id_at) else None,
                    type="function" if i == id_at else None,
                    name=name if i == name_at or (repeat and i > name_at) else None,
                    arguments=piece if piece or draw(st.booleans()) else None,
                    nulls=nulls,
                )
            )
        per_call.append(frags)
    # Interleave, keeping each call's fragment order.
    order = []
    queues = [list(f) for f in per_call]
    while any(queues):
        live = [i for i, q in enumerate(queues) if q]
        order.append(queues[draw(st.sampled_from(live))].pop(0))
    # Group consecutive fragments into chunks (several fragments may share a chunk).
    chunks, i = [], 0
    while i < len(order):
        size = draw(st.integers(1, 3))
        chunks.append(order[i : i + size])
        i += size
    return calls, chunks


def expected_calls(calls):
    return [{"id": c, "type": "function", "function": {"name": n, "arguments": a}} for c, n, a in calls]


@settings(max_examples=300)
@given(data=fragmented_calls())
def test_random_fragmented_tool_calls_reassemble(data):
    calls, chunks = data
    cs = ChatStream()
    cs.add(chunk({"role": "assistant", "content": ""}))
    for frags in chunks:
        flags = cs.add(chunk({"content": None, "tool_calls": frags}))
        carries = any(f.get("function", {}).get("name") or f.get("function", {}).get("arguments") for f in frags)
        assert bool(flags & TOKEN) == bool(carries)
    cs.add(chunk({}, "tool_calls"))
    msg = cs.assistant_message()
    assert msg["tool_calls"] == expected_calls(calls)
    assert msg["content"] is None
    assert cs.finish_reason == "tool_calls"


@settings(max_examples=200)
@given(
    data=fragmented_calls(),
    content=st.lists(st.text(min_size=1, max_size=5), max_size=5),
    cut=st.lists(st.integers(0, 5000), max_size=10),
    eol=st.sampled_from([b"\n", b"\r\n", b"\r"]),
    pings=st.booleans(),
)
def test_pipeline_sse_to_chat_stream(data, content, cut, eol, pings):
    """Bytes on the wire -> SSEDecoder (random read boundaries) -> ChatStream."""
    calls, chunks = data
    payloads = [chunk({"role": "assistant", "content": ""})]
    payloads += [chunk({"content": c}) for c in content]
    payloads += [chunk({"tool_calls": frags}) for frags in chunks]
    payloads += [chunk({}, "tool_calls"), usage_chunk(), b"[DONE]"]
    wire = b"".join(
        (encode_comment(b"ping", eol=eol) if pings else b"") + encode_event(p, eol=eol) for p in payloads
    )
    points = sorted(min(c, len(wire)) for c in cut)
    reads = [wire[a:b] for a, b in zip([0, *points], [*points, len(wire)])]
    dec, cs = SSEDecoder(), ChatStream()
    seen = 0
    for r in reads:
        for kind, payload in dec.feed(r):
            if kind == DATA:
                cs.add(payload)
            elif kind == ERROR_EVENT:
                cs.add_error_event(payload)
            seen += 1
    assert dec.flush() == []
    assert cs.chunks == len(payloads) and cs.done and cs.bad_json == 0
    assert seen == len(payloads) * (2 if pings else 1)
    assert cs.content == "".join(content)
    assert cs.assistant_message()["tool_calls"] == expected_calls(calls)
    assert cs.usage["completion_tokens"] == 3


# ----------------------------------------------------------------------------- learned chunk shapes

_MUTATIONS = [b'"', b'\\', b'","x":"', b'"},"y":{"z":"', b'\\"', b'\n', b'"]', b'\xff', b'{', b'}', b',']


def _state(cs: ChatStream) -> dict:
    """Everything a ChatStream tells its readers."""
    return {k: getattr(cs, k) for k in ("id", "model", "fingerprint", "finish_reason", "usage", "error", "errors",
                                        "chunks", "token_chunks", "bad_json", "first_bad", "done", "dones",
                                        "no_choices", "first_token_payload", "content", "tool_calls")}


@st.composite
def streams(draw):
    """A stream's payloads as a vLLM-like server sends them (token chunks that differ only in their
    text, tool-call argument fragments, role/finish/usage chunks, [DONE]), some of them corrupted
    byte-wise where a learned shape would look (inside, around or instead of the text), split into
    reads."""
    stamp = draw(st.booleans())
    out = [chunk({"role": "assistant", "content": ""})]
    for i in range(draw(st.integers(0, 12))):
        kind = draw(st.sampled_from(["content", "content", "args", "empty", "other"]))
        if kind == "content":
            extra = {"mock_sent_ns": 5} if stamp and i == 0 else {}
            p = chunk({"content": draw(st.text(max_size=6))}, **extra)
        elif kind == "args":
            p = chunk({"tool_calls": [tc(draw(st.integers(0, 1)), arguments=draw(st.text(max_size=6)))]})
        elif kind == "empty":
            p = chunk({"content": ""})
        else:
            p = draw(st.sampled_from([chunk({"reasoning_content": "r"}), chunk({}, "stop"), usage_chunk(),
                                      chunk({"tool_calls": [tc(0, id="c0", name="f")]}), b"[DONE]", b"not json"]))
        if draw(st.integers(0, 4)) == 0:  # corrupt it near its text
            at = p.find(b'"content":"') + 11 if b'"content":"' in p else p.find(b'"arguments":"') + 13
            at = max(at, 0) + draw(st.integers(-2, 3))
            m = draw(st.sampled_from(_MUTATIONS))
            cut = draw(st.integers(0, 2))
            p = p[:max(at, 0)] + m + p[max(at, 0) + cut:]
        out.append(p)
    sizes = draw(st.lists(st.integers(1, 6), min_size=len(out), max_size=len(out)))
    reads, i = [], 0
    for n in sizes:
        if i >= len(out):
            break
        reads.append(out[i:i + n])
        i += n
    return reads


@settings(max_examples=600, deadline=None)
@given(reads=streams())
def test_learned_shapes_take_exactly_what_parsing_every_chunk_takes(reads):
    """A payload that matches the stream's learned shape is not parsed as an object: the result
    must be the same as parsing every chunk, whatever the chunks and the reads' boundaries."""
    fast, slow = ChatStream(), ChatStream()
    slow._learned = 99  # never learns a shape: every chunk parsed
    for payloads in reads:
        got = fast.add_many(payloads)
        want = 0
        for p in payloads:
            want |= slow.add(p)
        assert got == want, payloads
    assert _state(fast) == _state(slow)


def test_a_learned_shape_skips_parsing_and_a_mismatch_is_parsed():
    """The bench's burst: the stamped first token, then 31 chunks of the same shape in one read."""
    cs = ChatStream()
    first = chunk({"content": "a"}, mock_sent_ns=7)
    rest = [chunk({"content": f" w{i}"}) for i in range(31)]
    assert cs.add_many([chunk({"role": "assistant", "content": ""}), first, *rest, chunk({}, "stop"),
                        usage_chunk()]) == TOKEN | FINISH | USAGE
    head, tail, call = cs._shape
    assert call is None and head.endswith(b'"content":"') and tail.startswith(b'"},"logprobs":null')
    assert cs.content == "a" + "".join(f" w{i}" for i in range(31))
    assert cs.token_chunks == 32 and cs.chunks == 35 and cs.first_token_payload == first
    # a chunk of that shape whose text is not one JSON string: parsed, so a malformed event here
    assert cs.add_many([head + b'x"y' + tail, head + b'ok' + tail]) == BAD_JSON | TOKEN
    assert cs.bad_json == 1 and cs.content.endswith(" w30ok")
    # ... and another key next to the text: parsed, so taken as any chunk with that delta
    assert cs.add_many([head + b'x","y":"' + tail]) == TOKEN and cs.content.endswith("okx")
    # after [DONE], a chunk of that shape is not taken either
    assert cs.add_many([b"[DONE]", head + b'late' + tail]) == DONE and cs.content.endswith("okx")
    assert cs.after_done == 1 and cs.after_done_tokens == 1


def test_no_shape_is_learned_where_the_key_could_be_another_one():
    """Another "content" in the chunk (a key elsewhere, the delta's spelt with a space): nothing is
    learned, every chunk is parsed, and the text is the delta's."""
    first = b'{"extra":{"content":"x"},"choices":[{"index":0,"delta":{"content" :"x"}}]}'
    second = b'{"extra":{"content":"y"},"choices":[{"index":0,"delta":{"content" :"x"}}]}'
    cs = ChatStream()
    assert cs.add_many([first]) == TOKEN and cs._shape is None
    assert cs.add_many([second]) == TOKEN and cs.content == "xx"


# ----------------------------------------------------------------------------- tool-call problems


def _problems(*payloads, expected=False, max_tokens=None):
    cs = ChatStream()
    cs.add_many(list(payloads))
    return cs.tool_call_problems(expected, max_tokens)


def test_whole_tool_calls_have_no_problems():
    assert _problems(chunk({"tool_calls": [tc(0, id="c0", name="f", arguments="")]}),
                     chunk({"tool_calls": [tc(0, arguments='{"q": 1}')]}),
                     chunk({"tool_calls": [tc(0, id="c0", arguments="")]}),  # the same id again: the same call
                     chunk({"tool_calls": [tc(1, id="c1", name="g", arguments="{}", nulls=True)]}),
                     chunk({"tool_calls": [tc(1, id=None, arguments="", nulls=True)]}),  # SGLang's nulls
                     chunk({}, "tool_calls")) is None
    assert _problems(chunk({"content": "hi"}), chunk({}, "length")) is None  # text cut, no call asked for
    assert _problems(chunk({"content": "hi"}), chunk({}, "stop"), expected=True) is None


def test_tool_call_problems_name_what_the_server_sent():
    got = _problems(chunk({"tool_calls": [tc(0, name="f", arguments='{"q": "ab')]}), chunk({}, "length"))
    assert got == ["truncated: finish_reason length after 1 token chunk(s): 1 tool call(s), the arguments of 1 cut "
                   "mid-JSON", "no_id: call 0 (f) came without an id (a tool result cannot name it)",
                   'bad_arguments: call 0 (f) arguments are not JSON (9 chars): "{\\"q\\": \\"ab"']
    got = _problems(chunk({"tool_calls": [tc(0, id="", name="f", arguments='[1]')]}), chunk({}, "tool_calls"))
    assert [p.split(":")[0] for p in got] == ["no_id", "bad_arguments"] and "a JSON array" in got[1]
    got = _problems(chunk({"tool_calls": [tc(0, id="a", arguments='{"q": 1}')]}),
                    chunk({"tool_calls": [tc(0, id="b", name="g", arguments='{"q": 2}')]}))
    assert [p.split(":")[0] for p in got] == ["bad_arguments", "ids_on_one_index"]
    assert 'index 0 carried the ids "a" and "b"' in got[1]
    got = _problems(chunk({"tool_calls": [{"index": 0, "id": "a", "function": {"name": "f", "arguments": {"q": 1}}}]}))
    assert got == ["bad_arguments: index 0 sent its arguments as a JSON object, not a string"]
    got = _problems(chunk({"tool_calls": [tc(0, id="a", arguments='{}')]}))
    assert got == ["no_name: call 0 came without a function name"]
    got = _problems(chunk({"content": "I will"}), chunk({}, "length"), expected=True)
    assert got == ["truncated: finish_reason length after 1 token chunk(s): no tool call, though one was asked for"]


def test_tool_call_problems_of_a_non_streamed_answer():
    body = orjson.dumps({"choices": [{"index": 0, "finish_reason": "length", "message": {
        "role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                                             "function": {"name": "f", "arguments": '{"q": '}}]}}]})
    got = ChatStream.from_response(body).tool_call_problems()
    assert [p.split(":")[0] for p in got] == ["truncated", "bad_arguments"]


def test_arguments_cut_at_max_tokens_are_truncated_whatever_finish_reason_says():
    """llama-cpp-python ends a named tool's stream with finish_reason tool_calls however it ended:
    arguments cut mid-JSON once the answer's tokens reached max_tokens were cut by max_tokens."""
    frags = [chunk({"tool_calls": [tc(0, id="c", name="f", arguments=p)]}) for p in ('{"q', '": "a', 'b')]
    got = _problems(*frags, chunk({}, "tool_calls"), max_tokens=3)
    assert got[0] == ("truncated: finish_reason tool_calls but 3 token chunk(s), max_tokens 3: 1 tool call(s), the "
                      "arguments of 1 cut mid-JSON") and got[1].startswith("bad_arguments"), got
    # usage's completion_tokens where the server sends it
    got = _problems(*frags, chunk({}, "tool_calls"), usage_chunk(completion=8), max_tokens=8)
    assert got[0].startswith("truncated: finish_reason tool_calls but 8 completion_tokens, max_tokens 8"), got
    # below max_tokens: the arguments are simply bad
    assert [p.split(":")[0] for p in _problems(*frags, chunk({}, "tool_calls"), max_tokens=4)] == ["bad_arguments"]
