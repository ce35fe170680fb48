"""The mock server over real HTTP, in its own process: protocol, tool calls, usage, request ids,
the latency model, and the official openai client's acceptance of every answer shape."""

from __future__ import annotations

import json
import random
import time

import aiohttp
import openai
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentload.mock import MockConfig, MockProcess
from agentload.mock.handler import protocol_violation
from agentload.mock.schema_values import gen_value
from agentload.tokens import prompt_tokens, synthetic_text

TIMEOUT = aiohttp.ClientTimeout(total=10, sock_connect=5)

TOOLS = [
    {"type": "function", "function": {
        "name": "search_docs", "description": "search",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string", "minLength": 2},
            "limit": {"type": "integer", "minimum": 1, "maximum": 20},
            "score": {"type": "number", "minimum": 0, "maximum": 1},
            "exact": {"type": "boolean"},
            "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3},
            "mode": {"type": "string", "enum": ["fast", "deep"]},
        }, "required": ["query", "limit", "tags"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "read_file",
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string"},
            "lines": {"type": "array", "items": {"type": "integer"}},
            "opts": {"type": "object", "properties": {"follow": {"type": "boolean"}}, "required": ["follow"]},
        }, "required": ["path", "opts"]}}},
]


def validate(value, schema, where="$"):
    """A small JSON-schema check covering what tool definitions use."""
    if "enum" in schema:
        assert value in schema["enum"], where
        return
    t = schema.get("type")
    if t == "object":
        assert isinstance(value, dict), where
        props = schema.get("properties", {})
        for name in schema.get("required", []):
            assert name in value, f"{where}.{name} missing"
        for name, v in value.items():
            if schema.get("additionalProperties") is False:
                assert name in props, f"{where}.{name} not allowed"
            if name in props:
                validate(v, props[name], f"{where}.{name}")
    elif t == "array":
        assert isinstance(value, list), where
        assert len(value) >= schema.get("minItems", 0), where
        assert len(value) <= schema.get("maxItems", 10**9), where
        for i, v in enumerate(value):
            validate(v, schema.get("items", {}), f"{where}[{i}]")
    elif t == "string":
        assert isinstance(value, str), where
        assert len(value) >= schema.get("minLength", 0), where
        assert len(value) <= schema.get("maxLength", 10**9), where
    elif t in ("integer", "number"):
        assert isinstance(value, int if t == "integer" else (int, float)) and not isinstance(value, bool), where
        assert schema.get("minimum", -1e18) <= value <= schema.get("maximum", 1e18), where
    elif t == "boolean":
        assert isinstance(value, bool), where


def schema_of(name):
    return next(t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == name)


@pytest.fixture(scope="module")
def vllm():
    cfg = MockConfig(base_latency_ms=1, decode_tokens_per_s=0, output_tokens=16, tool_calls_per_response=2,
                     models=("mock-model", "other-model"))
    with MockProcess.start(cfg) as m:
        yield m


@pytest.fixture(scope="module")
def sglang():
    cfg = MockConfig(style="sglang", base_latency_ms=1, decode_tokens_per_s=0, output_tokens=10,
                     chunk_tokens=3, tool_calls_per_response=2, tool_call_rounds=2)
    with MockProcess.start(cfg) as m:
        yield m


@pytest.fixture(scope="module")
def slow():
    cfg = MockConfig(base_latency_ms=1, prefill_tokens_per_s=10000, decode_tokens_per_s=200, output_tokens=30)
    with MockProcess.start(cfg) as m:
        yield m


def user(tokens, rng=None):
    return [{"role": "user", "content": synthetic_text(rng or random.Random(1), tokens)}]


async def post(mock, body, headers=None):
    """POST and read the whole answer: (status, headers, [(t, line)]) with one receive time per SSE line."""
    async with aiohttp.ClientSession(timeout=TIMEOUT) as s:
        t0 = time.perf_counter()
        async with s.post(mock.url + "/chat/completions", json=body, headers=headers or {}) as resp:
            if not body.get("stream") or resp.status != 200:
                return resp.status, resp.headers, await resp.read(), t0
            lines = []
            async for raw in resp.content:
                line = raw.decode().rstrip("\n")
                if line:
                    lines.append((time.perf_counter(), line))
            return resp.status, resp.headers, lines, t0


def data_chunks(lines):
    out = []
    for _, line in lines:
        if line.startswith("data: ") and line != "data: [DONE]":
            out.append(json.loads(line[6:]))
    return out


def join_tool_calls(chunks):
    calls: dict[int, dict] = {}
    for c in chunks:
        for ch in c["choices"]:
            for frag in (ch["delta"].get("tool_calls") or []):
                call = calls.setdefault(frag["index"], {"id": None, "name": None, "arguments": ""})
                if frag.get("id"):
                    call["id"] = frag["id"]
                fn = frag.get("function") or {}
                if fn.get("name"):
                    call["name"] = fn["name"]
                call["arguments"] += fn.get("arguments") or ""
    return [calls[i] for i in sorted(calls)]


# ------------------------------------------------------------------ text answers


async def test_stream_text_with_usage_and_ids(vllm):
    messages = user(40)
    body = {"model": "anything", "messages": messages, "stream": True, "stream_options": {"include_usage": True}}
    status, headers, lines, _ = await post(vllm, body, {"X-Request-ID": "run1-a3-r1-c0"})
    assert status == 200
    assert headers["X-Request-ID"] == "run1-a3-r1-c0"
    assert headers["Content-Type"].startswith("text/event-stream")
    recv_ns = int(headers["x-mock-recv-ns"])
    assert lines[-1][1] == "data: [DONE]"
    chunks = data_chunks(lines)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "mock_sent_ns" not in chunks[0]
    # the first token chunk carries the send stamp, and only it
    assert chunks[1]["mock_sent_ns"] >= recv_ns
    assert all("mock_sent_ns" not in c for c in chunks[2:])
    content = [c for c in chunks if c["choices"]]
    assert content[-1]["choices"][0]["finish_reason"] == "stop"
    assert all(c["choices"][0]["finish_reason"] is None for c in content[:-1])
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in content)
    assert len(text.split()) == 16
    usage_chunk = chunks[-1]
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"] == {"prompt_tokens": prompt_tokens(messages), "completion_tokens": 16,
                                    "total_tokens": prompt_tokens(messages) + 16}
    assert all(c["model"] == "anything" and c["object"] == "chat.completion.chunk" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1


async def test_stream_without_usage_and_max_tokens_cap(vllm):
    body = {"model": "m", "messages": user(5), "stream": True, "max_tokens": 4}
    _, _, lines, _ = await post(vllm, body)
    chunks = data_chunks(lines)
    assert all(c["choices"] for c in chunks), "no usage chunk unless asked"
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert sum(1 for c in chunks[1:] if c["choices"][0]["delta"].get("content")) == 4


async def test_non_stream_text(vllm):
    messages = [{"role": "system", "content": "be brief"}] + user(100)
    status, headers, raw, _ = await post(vllm, {"model": "m", "messages": messages, "max_completion_tokens": 7})
    assert status == 200
    out = orjson.loads(raw)
    assert out["object"] == "chat.completion"
    assert out["choices"][0]["finish_reason"] == "length"
    assert len(out["choices"][0]["message"]["content"].split()) == 7
    assert out["usage"]["prompt_tokens"] == prompt_tokens(messages)
    assert out["usage"]["completion_tokens"] == 7


# ------------------------------------------------------------------ tool calls


async def test_stream_tool_calls_are_valid_json_for_the_schema(vllm):
    seen_ids = set()
    for i in range(6):
        messages = user(20, random.Random(i))
        body = {"model": "m", "messages": messages, "tools": TOOLS, "stream": True,
                "stream_options": {"include_usage": True}}
        _, _, lines, _ = await post(vllm, body, {"X-Request-ID": f"tools-{i}"})
        chunks = data_chunks(lines)
        calls = join_tool_calls(chunks)
        assert len(calls) == 2
        for call in calls:
            assert call["id"].startswith("call_") and call["id"] not in seen_ids
            seen_ids.add(call["id"])
            validate(json.loads(call["arguments"]), schema_of(call["name"]))
        # first fragment of each call: index, id, type, name; later ones: index and arguments only
        frags = [f for c in chunks if c["choices"] for f in (c["choices"][0]["delta"].get("tool_calls") or [])]
        firsts = [f for f in frags if "id" in f]
        assert [f["index"] for f in firsts] == [0, 1]
        assert all(f["type"] == "function" and f["function"]["name"] for f in firsts)
        assert all(set(f) == {"index", "function"} and set(f["function"]) == {"arguments"}
                   for f in frags if "id" not in f)
        finals = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
        assert finals[-1] == "tool_calls"
        assert chunks[-1]["usage"]["prompt_tokens"] == prompt_tokens(messages, TOOLS)


async def test_non_stream_tool_calls(vllm):
    messages = user(20)
    _, _, raw, _ = await post(vllm, {"model": "m", "messages": messages, "tools": TOOLS})
    out = orjson.loads(raw)
    msg = out["choices"][0]["message"]
    assert out["choices"][0]["finish_reason"] == "tool_calls"
    assert len(msg["tool_calls"]) == 2
    for call in msg["tool_calls"]:
        assert call["type"] == "function"
        validate(json.loads(call["function"]["arguments"]), schema_of(call["function"]["name"]))
    assert out["usage"]["prompt_tokens"] == prompt_tokens(messages, TOOLS)


async def test_tool_choice_none_and_named(vllm):
    _, _, raw, _ = await post(vllm, {"model": "m", "messages": user(5), "tools": TOOLS, "tool_choice": "none"})
    assert orjson.loads(raw)["choices"][0]["finish_reason"] == "stop"
    named = {"type": "function", "function": {"name": "read_file"}}
    _, _, raw, _ = await post(vllm, {"model": "m", "messages": user(5), "tools": TOOLS, "tool_choice": named})
    calls = orjson.loads(raw)["choices"][0]["message"]["tool_calls"]
    assert {c["function"]["name"] for c in calls} == {"read_file"}


def conversation(rounds, tool_reply=True):
    """Messages of a conversation about to make request number `rounds`."""
    msgs = user(10)
    for r in range(1, rounds):
        cid = f"call_{r}"
        msgs.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": cid, "type": "function", "function": {"name": "read_file", "arguments": "{}"}}]})
        if tool_reply:
            msgs.append({"role": "tool", "tool_call_id": cid, "content": "ok"})
    return msgs


async def test_sglang_quirks_and_tool_call_rounds(sglang):
    sglang.reset_stats()
    body = {"model": "m", "messages": conversation(2), "tools": TOOLS, "stream": True,
            "stream_options": {"include_usage": True}}
    _, _, lines, _ = await post(sglang, body)
    chunks = data_chunks(lines)
    with_choices = [c for c in chunks if c["choices"]]
    # finish_reason comes in a chunk of its own, with no content
    last = with_choices[-1]["choices"][0]
    assert last["finish_reason"] == "tool_calls"
    assert not last["delta"].get("content") and not last["delta"].get("tool_calls")
    assert all(c["choices"][0]["finish_reason"] is None for c in with_choices[:-1])
    frags = [f for c in with_choices for f in (c["choices"][0]["delta"].get("tool_calls") or [])]
    continuation = [f for f in frags if f["id"] is None]
    assert continuation and all(f["type"] is None and f["function"]["name"] is None for f in continuation)
    calls = join_tool_calls(chunks)
    assert len(calls) == 2
    for call in calls:
        validate(json.loads(call["arguments"]), schema_of(call["name"]))

    # round 3 > tool_call_rounds = 2: a plain answer ends the conversation
    body["messages"] = conversation(3)
    _, _, lines, _ = await post(sglang, body)
    chunks = data_chunks(lines)
    assert not join_tool_calls(chunks)
    assert [c for c in chunks if c["choices"]][-1]["choices"][0]["finish_reason"] == "stop"
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert len(text.split()) == 10
    # chunk_tokens = 3: 10 tokens in 4 content chunks
    assert sum(1 for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")) == 4
    assert sglang.stats()["rounds_seen"] == {"2": 1, "3": 1}


# ------------------------------------------------------------------ the official client


@pytest.mark.parametrize("which", ["vllm", "sglang"])
async def test_openai_client_accepts_everything(which, request):
    mock = request.getfixturevalue(which)
    client = openai.AsyncOpenAI(base_url=mock.url, api_key="x", max_retries=0, timeout=10)
    try:
        messages = conversation(1)
        stream = await client.chat.completions.create(
            model="mock-model", messages=messages, tools=TOOLS, stream=True,
            stream_options={"include_usage": True})
        calls: dict[int, dict] = {}
        usage = finish = None
        async for chunk in stream:
            if chunk.usage:
                usage = chunk.usage
            for ch in chunk.choices:
                finish = ch.finish_reason or finish
                for tc in ch.delta.tool_calls or []:
                    call = calls.setdefault(tc.index, {"id": None, "name": None, "arguments": ""})
                    call["id"] = tc.id or call["id"]
                    if tc.function:
                        call["name"] = tc.function.name or call["name"]
                        call["arguments"] += tc.function.arguments or ""
        assert finish == "tool_calls"
        assert len(calls) == 2
        for call in calls.values():
            assert call["id"].startswith("call_")
            validate(json.loads(call["arguments"]), schema_of(call["name"]))
        assert usage.prompt_tokens == prompt_tokens(messages, TOOLS)

        resp = await client.chat.completions.create(model="mock-model", messages=messages, tools=TOOLS)
        assert resp.choices[0].finish_reason == "tool_calls"
        for tc in resp.choices[0].message.tool_calls:
            validate(json.loads(tc.function.arguments), schema_of(tc.function.name))

        # next round, appending the answer exactly as received: no protocol violation
        messages.append(resp.choices[0].message.model_dump(exclude_none=True))
        for tc in resp.choices[0].message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": tc.id, "content": "result"})
        mock.reset_stats()
        text = await client.chat.completions.create(model="mock-model", messages=messages, stream=True)
        pieces = [c.choices[0].delta.content async for c in text if c.choices and c.choices[0].delta.content]
        assert pieces
        assert mock.stats()["protocol_violations"] == 0

        models = await client.models.list()
        assert "mock-model" in [m.id for m in models.data]
    finally:
        await client.close()


# ------------------------------------------------------------------ request ids, routes, stats


async def test_request_id_sources_and_stats(vllm):
    vllm.reset_stats()
    _, h1, _, _ = await post(vllm, {"model": "m", "messages": user(3), "user": "from-user"})
    _, h2, _, _ = await post(vllm, {"model": "m", "messages": user(3), "metadata": {"request_id": "from-meta"}})
    _, h3, _, _ = await post(vllm, {"model": "m", "messages": user(3), "user": "u"}, {"X-Request-ID": "from-header"})
    _, h4, _, _ = await post(vllm, {"model": "m", "messages": user(3)})
    assert [h1["X-Request-ID"], h2["X-Request-ID"], h3["X-Request-ID"]] == ["from-user", "from-meta", "from-header"]
    assert h4["X-Request-ID"]  # generated when the client sent none
    stats = vllm.stats()
    assert stats["last_request_ids"] == ["from-user", "from-meta", "from-header", h4["X-Request-ID"]]
    assert stats["requests_total"] == stats["completed"] == 4
    assert stats["by_status"] == {"200": 4}
    assert stats["in_flight"] == 0 and stats["max_in_flight"] == 1
    assert stats["max_prompt_tokens"] == prompt_tokens(user(3))


async def test_routes_and_bad_requests(vllm):
    async with aiohttp.ClientSession(timeout=TIMEOUT) as s:
        async with s.get(vllm.base + "/health") as r:
            assert r.status == 200
        async with s.get(vllm.url + "/models") as r:
            assert [m["id"] for m in (await r.json())["data"]] == ["mock-model", "other-model"]
        async with s.post(vllm.url + "/chat/completions", data=b"{not json") as r:
            assert r.status == 400
            assert "message" in (await r.json())["error"]
        async with s.post(vllm.url + "/chat/completions", json={"model": "m"}) as r:
            assert r.status == 400


async def test_protocol_violations_counted(vllm):
    vllm.reset_stats()
    await post(vllm, {"model": "m", "messages": conversation(3)})  # well-formed
    assert vllm.stats()["protocol_violations"] == 0
    await post(vllm, {"model": "m", "messages": conversation(3, tool_reply=False)})  # unanswered ids
    bad = conversation(2) + [{"role": "tool", "tool_call_id": "call_nobody", "content": "?"}]
    await post(vllm, {"model": "m", "messages": bad})  # answers an unknown id
    stats = vllm.stats()
    assert stats["protocol_violations"] == 2
    assert stats["by_status"] == {"200": 3}  # counted, not rejected (reject_protocol_violations=false)


def test_protocol_violation_rule():
    assert not protocol_violation(conversation(4))
    assert protocol_violation(conversation(2, tool_reply=False))
    # the answer must come after the call, not before
    early = user(1) + [{"role": "tool", "tool_call_id": "x", "content": ""},
                       {"role": "assistant", "tool_calls": [{"id": "x", "type": "function",
                                                             "function": {"name": "f", "arguments": "{}"}}]}]
    assert protocol_violation(early)


# ------------------------------------------------------------------ latency model


async def test_latency_model(slow):
    small = {"model": "m", "messages": user(10), "stream": True}
    big = {"model": "m", "messages": user(4000), "stream": True}  # 4000 / 10000 tok/s = 0.4 s prefill

    def first_token_at(lines):
        for t, line in lines:
            if line.startswith("data: {") and '"mock_sent_ns"' in line:
                return t
        raise AssertionError("no token")

    _, _, small_lines, t_small = await post(slow, small)
    _, _, big_lines, t_big = await post(slow, big)
    ttft_small = first_token_at(small_lines) - t_small
    ttft_big = first_token_at(big_lines) - t_big
    assert ttft_big > ttft_small
    assert ttft_big >= 0.38  # the mock cannot answer before its own schedule
    # decode: 30 tokens, one chunk each, at 200 tok/s: at least 29 gaps of 5 ms
    token_times = [t for t, line in small_lines if '"content":"' in line and '"content":""' not in line]
    assert len(token_times) == 30
    assert token_times[-1] - token_times[0] >= 0.13


# ------------------------------------------------------------------ schema values (pure)


_leaf = st.sampled_from([
    {"type": "string"}, {"type": "integer"}, {"type": "number"}, {"type": "boolean"},
    {"type": "string", "enum": ["a", "b"]}, {"type": "integer", "minimum": 5, "maximum": 9},
    {"type": "number", "minimum": -1.5, "maximum": 2.5}, {"type": "string", "minLength": 10, "maxLength": 12},
])
_schema = st.recursive(
    _leaf,
    lambda inner: st.one_of(
        st.builds(lambda items, lo: {"type": "array", "items": items, "minItems": lo, "maxItems": lo + 2},
                  inner, st.integers(0, 2)),
        st.dictionaries(st.text("abcdefgh", min_size=1, max_size=5), inner, max_size=4).flatmap(
            lambda props: st.builds(
                lambda req: {"type": "object", "properties": props, "required": req},
                st.lists(st.sampled_from(sorted(props)) if props else st.nothing(), unique=True)))),
    max_leaves=12)


@settings(max_examples=200, deadline=None)
@given(schema=_schema, seed=st.integers(0, 2**32))
def test_gen_value_matches_schema(schema, seed):
    value = gen_value(schema, random.Random(seed))
    validate(value, schema)
    assert orjson.loads(orjson.dumps(value)) == value
