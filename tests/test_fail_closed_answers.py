"""Issue 27, items 1, 2 and 13: answers that complete but cannot be used as they came, read over
real HTTP against `fakeserver.FakeServer` on 127.0.0.1.

- 1: a tool call agentload would have to invent or repair (no id, arguments that are not JSON or
  cut mid-JSON, two calls on one index) is recorded (`tool_call_problems`) and, in mode model,
  ends the conversation: never sent back. The same in each API (chat, Messages, Responses: issue 29).

- 2: `[DONE]` ends the answer: events after it are not counted, and a body held open after it is
  ended there (its connection closed); both are protocol findings, never a stall.
- 13: a stream sent with `Content-Encoding: gzip` (though agentload asks for identity) is
  decompressed; an encoding agentload cannot decode is named in the error, never "no event".
"""

from __future__ import annotations

import asyncio
import zlib

import orjson
import pytest
from aiohttp import web

from agentload.records import load_records
from agentload.run import direct, transport
from fakeserver import DONE, FakeServer, chunk, sse_response
from helpers import run_scenario

USAGE = {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}


def _usage_chunk(usage=USAGE) -> str:
    obj = {"id": "fake-1", "object": "chat.completion.chunk", "model": "fake", "choices": [], "usage": usage}
    return "data: " + orjson.dumps(obj).decode() + "\n\n"


GOOD = [chunk({"role": "assistant", "content": ""}), chunk({"content": "hel"}), chunk({"content": "lo"}),
        chunk({}, "stop"), _usage_chunk(), DONE]


class Recs(list):
    """The run's agent records, with the run's summary beside them."""

    summary: dict
    verdict: dict
    requests: list


PATHS = {"chat": "/v1/chat/completions", "messages": "/v1/messages", "responses": "/v1/responses"}


def _run(tmp_path, handler, *extra: str, api: str = "chat") -> Recs:
    """2 agents x 2 rounds, no canaries, no retries of errors, speaking `api`."""
    with FakeServer(handler, path=PATHS[api]) as srv:
        res = run_scenario("demo", tmp_path, [f'target.endpoint="{srv.url}"', f'target.api="{api}"', "agents.count=2",
                                              "agents.rounds=2", "canary.every_s=0", "agents.error_retries=0",
                                              "conversation.tool_latency_ms=0", *extra])
        assert srv.requests, "the fake server got no request"
    loaded = load_records(tmp_path / "records.jsonl")
    assert loaded.torn_lines == 0
    recs = Recs(r for r in loaded.records if r.kind == "agent")
    assert recs and res.summary is not None
    recs.summary = res.summary
    recs.verdict = res.summary["verdict"]
    recs.requests = srv.requests
    return recs


def _sse(events: list[str]):
    async def handler(request: web.Request) -> web.StreamResponse:
        return await sse_response(request, events)
    return handler


# ----------------------------------------------------------------------------- 13. gzip


def _compressed(events: list[str], encoding: str = "gzip", wbits: int = 31):
    """Each event compressed and flushed on its own (Z_SYNC_FLUSH, as a streaming proxy does), so
    the stream arrives event by event, compressed."""
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Content-Encoding": encoding})
        await resp.prepare(request)
        z = zlib.compressobj(wbits=wbits)
        for ev in events:
            await resp.write(z.compress(ev.encode()) + z.flush(zlib.Z_SYNC_FLUSH))
        await resp.write(z.flush())
        await resp.write_eof()
        return resp
    return handler


@pytest.fixture(params=["direct", "session.post"])
def request_path(request, monkeypatch):
    """Both ways a request goes out: the direct path, and session.post (as without its hooks)."""
    if request.param == "session.post":
        monkeypatch.setattr(direct, "_missing", ["ResponseHandler.read()"])
        monkeypatch.setattr(transport, "_warned", set())
    return request.param


def test_a_gzip_stream_is_decompressed(tmp_path, request_path):
    recs = _run(tmp_path, _compressed(GOOD))
    assert len(recs) == 4 and all(r.outcome == "ok" and r.error is None for r in recs), \
        [(r.outcome, r.error, r.error_msg) for r in recs]
    assert all(r.token_chunks == 2 and r.finish_reason == "stop" and r.output_tokens == 3 for r in recs)
    assert all(r.phase_ns("ttft") is not None for r in recs)
    assert recs.verdict["kind"] == "healthy", recs.verdict


def test_a_deflate_stream_is_decompressed(tmp_path, request_path):
    recs = _run(tmp_path, _compressed(GOOD, "deflate", 15))
    assert len(recs) == 4 and all(r.outcome == "ok" and r.token_chunks == 2 for r in recs), \
        [(r.outcome, r.error, r.error_msg) for r in recs]
    assert recs.verdict["kind"] == "healthy", recs.verdict


def test_an_encoding_agentload_cannot_decode_is_named(tmp_path, request_path):
    # x-snappy: not one aiohttp knows; br: known, but refused without the Brotli package
    for enc in ("x-snappy", "br"):
        out = tmp_path / enc
        recs = _run(out, _compressed(GOOD, enc))
        assert len(recs) == 2 and all(r.outcome == "error" for r in recs), [(r.error, r.error_msg) for r in recs]
        for r in recs:
            assert f"Content-Encoding: {enc}" in r.error_msg, (r.error, r.error_msg)
            assert "no event" not in r.error_msg
        v = recs.verdict
        assert v["kind"] == "bad_responses", v
        assert any(f"Content-Encoding: {enc}" in e for e in v["evidence"]), v


# ----------------------------------------------------------------------------- 2. [DONE] ends the answer


def test_tokens_after_done_are_not_counted_and_are_a_protocol_finding(tmp_path, request_path):
    after = [chunk({"content": " and"}), chunk({"content": " more"}), chunk({}, "stop"), DONE]
    recs = _run(tmp_path, _sse(GOOD + after))
    assert len(recs) == 4 and all(r.outcome == "ok" and r.error is None for r in recs), \
        [(r.outcome, r.error, r.error_msg) for r in recs]
    for r in recs:  # the answer is what came before [DONE]: 2 token chunks, 6 events and the [DONE]
        assert r.token_chunks == 2 and r.chunks == 6, (r.token_chunks, r.chunks)
        [note] = r.protocol
        assert note.startswith("events_after_done: 3 data event(s) after [DONE], 2 with tokens"), note
    v = recs.verdict
    assert v["kind"] == "protocol" and v["agents_stopped"] == 0, v
    assert "after [DONE]" in v["summary"] and "4 of 4" in v["summary"], v["summary"]
    assert any("2 with tokens" in e for e in v["evidence"]), v["evidence"]


def _held_open(events: list[str], hold_s: float = 30.0):
    """The answer, [DONE], then the body held open (no end of the chunked body) for `hold_s`, or
    until the client closes the connection."""
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for ev in events:
            await resp.write(ev.encode())
        loop = asyncio.get_running_loop()
        end = loop.time() + hold_s
        while loop.time() < end and request.transport is not None and not request.transport.is_closing():
            await asyncio.sleep(0.05)
        return resp
    return handler


def test_a_body_held_open_after_done_is_a_protocol_finding_not_a_stall(tmp_path, request_path):
    # stall.after_s = 2: agentload waits 1 s past [DONE] for the body's end, then ends the read
    recs = _run(tmp_path, _held_open(GOOD), "stall.after_s=2", "stall.give_up_s=4")
    assert len(recs) == 4, [(r.outcome, r.error, r.error_msg) for r in recs]
    for r in recs:
        assert r.outcome == "ok" and r.error is None and r.stalled_phase is None, (r.outcome, r.error, r.stalled_phase)
        assert r.token_chunks == 2 and r.finish_reason == "stop" and r.output_tokens == 3
        [note] = r.protocol
        assert note.startswith("held_open_after_done: the body was still open 1 s after [DONE]"), note
    # the connection was closed, never handed back to the pool with the rest of a body on it
    assert [r.reused for r in sorted(recs, key=lambda r: r.round)][2:] == [False, False]
    v = recs.verdict
    assert v["kind"] == "protocol" and v["agents_stopped"] == 0, v
    assert "held the body open" in v["summary"], v["summary"]
    assert "stall" not in v["summary"]


# ----------------------------------------------------------------------------- 1. tool calls that cannot be sent back

MODEL = ['conversation.mode="model"', "agents.rounds=3"]


def _call(index=0, id="call_1", name="tool_1", arguments="", **kw) -> dict:
    frag: dict = {"index": index, "type": "function", "function": {"name": name, "arguments": arguments}}
    if id is not None:
        frag["id"] = id
    frag.update(kw)
    return frag


def _args(index: int, piece: str) -> str:
    return chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})


def _answer(*events: str, finish: str = "tool_calls") -> list[str]:
    return [chunk({"role": "assistant", "content": None}), *events, chunk({}, finish), _usage_chunk(), DONE]


WHOLE = _answer(chunk({"tool_calls": [_call()]}), _args(0, '{"query": "ab'), _args(0, 'c", "limit": 2}'))


def _sent_back(requests: list[dict]) -> list[dict]:
    """The assistant turns with tool calls that agentload sent back, over every request."""
    return [m for body in requests for m in body.get("messages", []) if m.get("role") == "assistant"
            and m.get("tool_calls")]


def _assert_stopped(recs: Recs, kind: str, codes: set[str]) -> None:
    """Each of the 2 agents ended its conversation on its round-1 answer, sending nothing back."""
    assert sorted((r.agent, r.round, r.outcome) for r in recs) == [(0, 1, "ok"), (1, 1, "ok")], \
        [(r.agent, r.round, r.outcome, r.error) for r in recs]
    for r in recs:
        assert {p.split(":")[0] for p in r.tool_call_problems} == codes, r.tool_call_problems
    assert len(recs.requests) == 2 and _sent_back(recs.requests) == []
    v = recs.verdict
    assert v["kind"] == kind and v["agents_stopped"] == 2 and v["first_round"] == 1, v
    assert "2 of 2 agents ended there" in v["summary"], v["summary"]
    assert [(a["outcome"], a["bad_tool_calls_round"]) for a in recs.summary["agents"]] == [("bad_tool_calls", 1)] * 2


def test_an_answer_cut_mid_arguments_is_truncated_and_never_sent_back(tmp_path):
    cut = _answer(chunk({"tool_calls": [_call()]}), _args(0, '{"query": "ab'), finish="length")
    recs = _run(tmp_path, _sse(cut), *MODEL)
    _assert_stopped(recs, "truncated", {"truncated", "bad_arguments"})
    assert all(r.finish_reason == "length" for r in recs)
    v = recs.verdict
    assert "finish_reason length" in v["summary"] and "cut mid-JSON in 2" in v["summary"], v["summary"]
    assert any('"{\\"query\\": \\"ab"' in e for e in v["evidence"]), v["evidence"]  # what the server sent
    assert any("conversation.max_tokens = 64" in e for e in v["evidence"]), v["evidence"]


def test_arguments_that_are_not_json_are_malformed_tool_calls(tmp_path):
    recs = _run(tmp_path, _sse(_answer(chunk({"tool_calls": [_call(arguments="query=abc&limit=2")]}))), *MODEL)
    _assert_stopped(recs, "malformed_tool_calls", {"bad_arguments"})
    v = recs.verdict
    assert "bad_arguments x2" in v["summary"], v["summary"]
    assert any("not JSON" in e and "query=abc&limit=2" in e for e in v["evidence"]), v["evidence"]


def test_a_tool_call_without_an_id_is_malformed_and_never_sent_back(tmp_path):
    recs = _run(tmp_path, _sse(_answer(chunk({"tool_calls": [_call(id=None, arguments='{"query": "x"}')]}))), *MODEL)
    _assert_stopped(recs, "malformed_tool_calls", {"no_id"})
    assert not any(m.get("role") == "tool" for body in recs.requests for m in body["messages"])


def test_two_calls_on_one_index_are_malformed_not_merged(tmp_path):
    two = _answer(chunk({"tool_calls": [_call(id="call_a", arguments='{"query": "a"}')]}),
                  chunk({"tool_calls": [_call(id="call_b", name="tool_2", arguments='{"query": "b"}')]}))
    recs = _run(tmp_path, _sse(two), *MODEL)
    _assert_stopped(recs, "malformed_tool_calls", {"ids_on_one_index", "bad_arguments"})
    v = recs.verdict
    assert any('"call_a"' in e and '"call_b"' in e for e in v["evidence"]), v["evidence"]


def test_whole_tool_calls_go_on_and_are_healthy(tmp_path):
    # the near miss: the same stream with its arguments whole, and an id on every fragment (vLLM repeats none,
    # some servers repeat the same one: not a second call)
    same = _answer(chunk({"tool_calls": [_call()]}), _args(0, '{"query": "ab'),
                   chunk({"tool_calls": [{"index": 0, "id": "call_1", "function": {"arguments": 'c"}'}}]}))
    for name, events in (("whole", WHOLE), ("same-id", same)):
        recs = _run(tmp_path / name, _sse(events), *MODEL)
        assert sorted((r.agent, r.round) for r in recs) == [(a, n) for a in (0, 1) for n in (1, 2, 3)]
        assert all(r.outcome == "ok" and r.tool_call_problems is None for r in recs)
        assert recs.verdict["kind"] == "healthy", recs.verdict
        back = _sent_back(recs.requests)
        assert back and all(m["tool_calls"][0]["id"] == "call_1" for m in back)


def test_cut_after_whole_tool_calls_goes_on_but_is_truncated(tmp_path):
    recs = _run(tmp_path, _sse(WHOLE[:-3] + [chunk({}, "length"), _usage_chunk(), DONE]), *MODEL)
    assert sorted((r.agent, r.round) for r in recs) == [(a, n) for a in (0, 1) for n in (1, 2, 3)]
    assert all(r.tool_call_problems == ["truncated: finish_reason length after 3 token chunk(s): 1 tool call(s) "
                                        "with whole arguments"] for r in recs), recs[0].tool_call_problems
    v = recs.verdict
    assert v["kind"] == "truncated" and v["agents_stopped"] == 0, v
    assert all(m["tool_calls"][0]["function"]["arguments"] == '{"query": "abc", "limit": 2}'
               for m in _sent_back(recs.requests))


def test_truncation_counts_in_scripted_mode_when_a_tool_call_was_expected(tmp_path):
    cut = _answer(chunk({"tool_calls": [_call()]}), _args(0, '{"query": "ab'), finish="length")
    text_cut = [chunk({"role": "assistant", "content": ""}), chunk({"content": "I think"}), chunk({}, "length"),
                _usage_chunk(), DONE]
    for name, events, extra, expected in (
            ("cut-call", cut, [], "truncated"),  # it carried a tool call
            ("text-required", text_cut, ['conversation.tool_choice="required"'], "truncated"),  # one was asked for
            ("text-auto", text_cut, [], "healthy")):  # neither: max_tokens capping a text answer is the user's choice
        recs = _run(tmp_path / name, _sse(events), *extra)
        assert len(recs) == 4 and all(r.outcome == "ok" for r in recs)  # scripted agents go on
        v = recs.verdict
        assert v["kind"] == expected and v["agents_stopped"] == 0, (name, v)
        if expected == "truncated":
            assert all(r.tool_call_problems[0].startswith("truncated: finish_reason length") for r in recs)
            assert "4 of 4 answers" in v["summary"], v["summary"]


# ----------------------------------------------------------------------------- 1, in every API (issue 29)


def _ev(name: str, obj: dict) -> str:
    return f"event: {name}\ndata: {orjson.dumps(obj).decode()}\n\n"


def _tool_answer(api: str, cid: str | None, pieces: list[str], cut: bool = False) -> list[str]:
    """One answer with one tool call (`tool_1`, id `cid`, its arguments in `pieces`) in `api`'s stream,
    ended by the tool call, or (`cut`) by max_tokens."""
    if api == "chat":
        return _answer(chunk({"tool_calls": [_call(id=cid)]}), *[_args(0, p) for p in pieces],
                       finish="length" if cut else "tool_calls")
    if api == "messages":
        block = {"type": "tool_use", "name": "tool_1", "input": {}, **({"id": cid} if cid else {})}
        return [_ev("message_start", {"type": "message_start", "message": {
                    "id": "msg_1", "type": "message", "role": "assistant", "content": [], "model": "m",
                    "usage": {"input_tokens": 10, "output_tokens": 1}}}),
                _ev("content_block_start", {"type": "content_block_start", "index": 0, "content_block": block}),
                *[_ev("content_block_delta", {"type": "content_block_delta", "index": 0,
                                              "delta": {"type": "input_json_delta", "partial_json": p}})
                  for p in pieces],
                _ev("content_block_stop", {"type": "content_block_stop", "index": 0}),
                _ev("message_delta", {"type": "message_delta", "delta": {"stop_reason": "max_tokens" if cut else
                                                                         "tool_use"}, "usage": {"output_tokens": 3}}),
                _ev("message_stop", {"type": "message_stop"})]
    item = {"type": "function_call", "id": "fc_1", "name": "tool_1", "arguments": "", **({"call_id": cid} if cid else {})}
    usage = {"input_tokens": 10, "output_tokens": 3}
    end = (_ev("response.incomplete", {"type": "response.incomplete", "response": {
               "id": "resp_1", "object": "response", "status": "incomplete", "usage": usage,
               "incomplete_details": {"reason": "max_output_tokens"}}}) if cut else
           _ev("response.completed", {"type": "response.completed", "response": {
               "id": "resp_1", "object": "response", "status": "completed", "usage": usage}}))
    return [_ev("response.created", {"type": "response.created", "response": {
                "id": "resp_1", "object": "response", "status": "in_progress", "output": []}}),
            _ev("response.output_item.added", {"type": "response.output_item.added", "output_index": 0, "item": item}),
            *[_ev("response.function_call_arguments.delta", {"type": "response.function_call_arguments.delta",
                                                             "output_index": 0, "item_id": "fc_1", "delta": p})
              for p in pieces],
            end]


APIS = ("chat", "messages", "responses")


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("case,cid,pieces,cut,kind,codes", [
    ("not-json", "call_1", ["query=abc", "&limit=2"], False, "malformed_tool_calls", {"bad_arguments"}),
    ("no-id", None, ['{"query": ', '"x"}'], False, "malformed_tool_calls", {"no_id"}),
    ("cut-mid-json", "call_1", ['{"query": ', '"ab'], True, "truncated", {"truncated", "bad_arguments"}),
])
def test_a_tool_call_that_cannot_be_sent_back_ends_the_conversation_in_every_api(tmp_path, api, case, cid, pieces,
                                                                                  cut, kind, codes):
    """The chat behaviour in each API: the answer is ok, its record names the problems, the
    conversation ends there (nothing sent back), and the verdict says which kind."""
    recs = _run(tmp_path, _sse(_tool_answer(api, cid, pieces, cut)), *MODEL, api=api)
    _assert_stopped(recs, kind, codes)
    assert all(r.error is None and r.tool_calls == 1 and r.finish_reason == ("length" if cut else "tool_calls")
               for r in recs), [(r.error, r.tool_calls, r.finish_reason) for r in recs]
    joined = "".join(pieces)
    assert any(orjson.dumps(joined[:20]).decode()[1:-1] in e for e in recs.verdict["evidence"]) or case == "no-id", \
        recs.verdict["evidence"]


@pytest.mark.parametrize("api", APIS)
def test_whole_tool_calls_go_on_in_every_api(tmp_path, api):
    """The near miss of the test above: the same answer with whole arguments is sent back, round after round."""
    recs = _run(tmp_path, _sse(_tool_answer(api, "call_1", ['{"query": ', '"x"}'])), *MODEL, api=api)
    assert sorted((r.agent, r.round) for r in recs) == [(a, n) for a in (0, 1) for n in (1, 2, 3)]
    assert all(r.outcome == "ok" and r.tool_call_problems is None for r in recs)
    assert recs.verdict["kind"] == "healthy", recs.verdict


@pytest.mark.parametrize("api", APIS)
def test_scripted_agents_go_on_past_a_malformed_tool_call_in_every_api(tmp_path, api):
    recs = _run(tmp_path, _sse(_tool_answer(api, "call_1", ["query=abc"])), api=api)
    assert len(recs) == 4 and all(r.outcome == "ok" and r.error is None for r in recs)
    assert all([p.split(":")[0] for p in r.tool_call_problems] == ["bad_arguments"] for r in recs)
    v = recs.verdict
    assert v["kind"] == "malformed_tool_calls" and v["agents_stopped"] == 0, v
