"""Issue 10, the read path: a response is `ok` only if it is what was asked for.

Each case runs agentload end to end (in-process, `run_scenario`) over real HTTP against
`fakeserver.FakeServer` on 127.0.0.1, which answers what the mock never does: an HTML page or a
JSON object where a stream was asked for, a stream of garbage, a role-only stream, an
`event: error`, a non-streamed body that is not a chat.completion, a `usage` that is not an
object. The assertions are on the records (outcome, error class, message, `bad_events`, stamps)
and on the verdict, which is never `healthy` when an answer was not what was asked for.
"""

from __future__ import annotations

import orjson
import pytest
from aiohttp import web

from agentload.records import load_records
from fakeserver import DONE, FakeServer, chunk, sse_response
from helpers import run_scenario

USAGE = {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}
HTML = "<html><body><h1>Sign in to continue</h1><form action='/login'></form></body></html>"


def _usage_chunk(usage=USAGE) -> str:
    obj = {"id": "fake-1", "object": "chat.completion.chunk", "model": "fake", "choices": [], "usage": usage}
    return "data: " + orjson.dumps(obj).decode() + "\n\n"


GOOD = [chunk({"role": "assistant", "content": ""}), chunk({"content": "hel"}), chunk({"content": "lo"}),
        chunk({}, "stop"), _usage_chunk(), DONE]


class Recs(list):
    """The run's agent records, with the run's verdict beside them."""

    verdict: dict


def _run(tmp_path, handler, *extra: str) -> Recs:
    """2 agents x 2 rounds, no canaries, no retries of errors: one record per failed agent."""
    with FakeServer(handler) as srv:
        res = run_scenario("demo", tmp_path, [f'target.endpoint="{srv.url}"', "agents.count=2", "agents.rounds=2",
                                              "canary.every_s=0", "agents.error_retries=0", *extra])
        assert srv.requests, "the fake server got no request"
    loaded = load_records(tmp_path / "records.jsonl")
    assert loaded.torn_lines == 0
    recs = Recs(r for r in loaded.records if r.kind == "agent")
    assert recs and res.summary is not None
    recs.verdict = res.summary["verdict"]
    return recs


def _sse(events: list[str]):
    async def handler(request: web.Request) -> web.StreamResponse:
        return await sse_response(request, events)
    return handler


def _assert_failed(recs, error: str) -> None:
    assert len(recs) == 2, [(r.agent, r.round, r.outcome, r.error) for r in recs]  # each agent stops in round 1
    for r in recs:
        assert r.outcome == "error" and r.error == error, (r.outcome, r.error, r.error_msg)
        assert r.status == 200
        assert "first_token" not in r.t, r.t  # no token came: no ttft, never a 0
        assert r.phase_ns("ttft") is None and r.phase_ns("stream") is None
        assert "\n" not in r.error_msg
    expected = "server_errors" if error == "inband_error" else "bad_responses"
    assert recs.verdict["kind"] == expected and recs.verdict["agents_stopped"] == 2, recs.verdict


def _assert_ok(recs) -> None:
    assert len(recs) == 4 and all(r.outcome == "ok" and r.error is None for r in recs), \
        [(r.outcome, r.error, r.error_msg) for r in recs]
    # malformed events in answers that otherwise completed still keep the verdict from healthy
    expected = "bad_responses" if any(r.bad_events for r in recs) else "healthy"
    assert recs.verdict["kind"] == expected, recs.verdict


# ----------------------------------------------------------------------------- 2. a 200 that is not a stream


def test_html_200_while_streaming_is_not_a_stream(tmp_path):
    async def handler(request):
        return web.Response(text=HTML, content_type="text/html")

    recs = _run(tmp_path, handler)
    _assert_failed(recs, "not_a_stream")
    for r in recs:
        assert r.error_msg.startswith("HTTP 200 text/html; charset=utf-8, not an event stream: <html><body>"), r.error_msg
        assert "Sign in to continue" in r.error_msg
        assert r.output_tokens is None and "first_byte" in r.t


def test_json_200_while_streaming_is_not_a_stream(tmp_path):
    completion = {"id": "x", "object": "chat.completion", "model": "fake", "usage": USAGE,
                  "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}]}

    async def handler(request):
        return web.json_response(completion)

    recs = _run(tmp_path, handler)
    _assert_failed(recs, "not_a_stream")
    for r in recs:
        assert r.error_msg.startswith('HTTP 200 application/json; charset=utf-8, not an event stream: {"id": "x"'), \
            r.error_msg


def test_plain_bytes_while_streaming_is_not_a_stream(tmp_path):
    async def handler(request):
        return web.Response(body=b"OK")  # aiohttp labels it application/octet-stream

    recs = _run(tmp_path, handler)
    _assert_failed(recs, "not_a_stream")
    assert recs[0].error_msg == "HTTP 200 application/octet-stream, not an event stream: OK"


# ----------------------------------------------------------------------------- 3. garbage, empty, empty answers


def test_stream_of_garbage_then_done_is_malformed_stream(tmp_path):
    events = ["data: {not json\n\n", "data: <html>oops</html>\n\n", "data: [1, 2]\n\n", DONE]
    recs = _run(tmp_path, _sse(events))
    _assert_failed(recs, "malformed_stream")
    for r in recs:
        assert r.bad_events == 3 and r.token_chunks == 0
        assert "3 malformed event(s)" in r.error_msg and "[DONE]" in r.error_msg
        assert "no token" in r.error_msg and "first malformed event: {not json" in r.error_msg


def test_garbage_among_real_tokens_is_ok_and_counted(tmp_path):
    events = [GOOD[0], "data: {garbage\n\n", *GOOD[1:3], "data: 42\n\n", *GOOD[3:]]
    recs = _run(tmp_path, _sse(events))
    _assert_ok(recs)
    for r in recs:
        assert r.bad_events == 2 and r.token_chunks == 2 and r.finish_reason == "stop"
        assert "first_token" in r.t and r.output_tokens == 3


def test_role_only_chunk_then_done_is_empty_stream(tmp_path):
    recs = _run(tmp_path, _sse([chunk({"role": "assistant", "content": ""}), DONE]))
    _assert_failed(recs, "empty_stream")
    for r in recs:
        assert r.bad_events == 0
        assert r.error_msg == "stream ended with [DONE] after 1 role-only/empty chunk(s): no token, no finish_reason"


def test_nothing_then_eof_is_empty_stream(tmp_path):
    recs = _run(tmp_path, _sse([]))
    _assert_failed(recs, "empty_stream")
    assert recs[0].error_msg == "stream ended at EOF with an empty body: no token, no finish_reason"


def test_empty_answer_with_finish_reason_is_ok(tmp_path):
    events = [chunk({"role": "assistant", "content": ""}), chunk({}, "stop"),
              _usage_chunk({"prompt_tokens": 10, "completion_tokens": 0, "total_tokens": 10}), DONE]
    recs = _run(tmp_path, _sse(events))
    _assert_ok(recs)
    for r in recs:
        assert r.finish_reason == "stop" and r.output_tokens == 0 and r.token_chunks == 0 and r.bad_events == 0
        assert "first_token" not in r.t and r.phase_ns("ttft") is None  # the phase never happened


# ----------------------------------------------------------------------------- 4. event: error


def test_event_error_is_an_inband_error(tmp_path):
    events = [chunk({"role": "assistant", "content": ""}),
              'event: error\ndata: {"message": "backend overloaded", "code": 503}\n\n', DONE]
    recs = _run(tmp_path, _sse(events))
    _assert_failed(recs, "inband_error")
    for r in recs:
        assert r.error_msg == "503: backend overloaded" and r.bad_events == 0


def test_event_error_with_text_after_tokens(tmp_path):
    events = [*GOOD[:3], "event: error\ndata: upstream reset\n\n", DONE]
    recs = _run(tmp_path, _sse(events))
    assert len(recs) == 2 and all(r.outcome == "error" and r.error == "inband_error" for r in recs)
    for r in recs:
        assert r.error_msg == "upstream reset" and r.bad_events == 0
        assert "first_token" in r.t  # the tokens did come


# ----------------------------------------------------------------------------- usage that is not an object


def test_usage_that_is_not_an_object_is_counted_not_kept(tmp_path):
    events = [*GOOD[:4], _usage_chunk("n/a"), DONE]
    recs = _run(tmp_path, _sse(events))
    _assert_ok(recs)
    for r in recs:
        assert r.bad_events == 1 and r.output_tokens is None and r.server_prompt_tokens is None


def test_usage_that_is_not_an_object_non_streamed(tmp_path):
    body = {"id": "x", "object": "chat.completion", "model": "fake", "usage": "n/a",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}]}

    async def handler(request):
        return web.json_response(body)

    recs = _run(tmp_path, handler, "conversation.stream=false")
    _assert_ok(recs)
    assert all(r.bad_events == 1 and r.output_tokens is None and "first_token" in r.t for r in recs)


# ----------------------------------------------------------------------------- non-streamed mode


@pytest.mark.parametrize("body,ctype,why", [
    (HTML, "text/html", "not JSON"),
    ("{not json at all", "application/json", "not JSON"),
    ('{"id": "x", "object": "something.else", "model": "fake"}', "application/json", "no choices"),
    ('[{"choices": []}]', "application/json", "a JSON list, not an object"),
    ('{"choices": [{"index": 0, "message": "hi"}]}', "application/json", "choice 0 has no message object"),
])
def test_non_streamed_body_that_is_not_a_completion_is_bad_response(tmp_path, body, ctype, why):
    async def handler(request):
        return web.Response(text=body, content_type=ctype)

    recs = _run(tmp_path, handler, "conversation.stream=false")
    _assert_failed(recs, "bad_response")
    for r in recs:
        assert r.error_msg.startswith(f"HTTP 200 {ctype}; charset=utf-8, not a chat.completion object ({why}): "), \
            r.error_msg
        assert r.error_msg.endswith(body[:120])
        assert r.bad_events == (1 if why.startswith(("not JSON", "a JSON")) else 0)


def test_non_streamed_empty_answer_is_ok(tmp_path):
    body = {"id": "x", "object": "chat.completion", "model": "fake", "usage": USAGE,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": ""}, "finish_reason": "stop"}]}

    async def handler(request):
        return web.json_response(body)

    recs = _run(tmp_path, handler, "conversation.stream=false")
    _assert_ok(recs)
    assert all("first_token" not in r.t and r.bad_events == 0 for r in recs)


def test_wants_stream_reads_the_top_level_key():
    from agentload.run.request_body import wants_stream

    assert wants_stream(b'{"model":"m","max_tokens":8,"stream":true,"messages":[]}')
    assert wants_stream(b'{"model": "m", "stream": true}')
    assert not wants_stream(b'{"model":"m","stream":false,"tools":[{"stream":true}]}')
    assert not wants_stream(b'{"model":"m","messages":[]}')
    assert not wants_stream(b'{"model":"\\"stream\\":true","stream":false}')


def test_first_bytes_is_one_short_line():
    from agentload.run.answer import first_bytes

    assert first_bytes(b"") == "(empty body)"
    assert first_bytes(b"<html>\r\n<body>\tx") == "<html>  <body> x"
    assert first_bytes(b"a" * 200) == "a" * 120 + "..."
    assert first_bytes("é".encode() * 100).startswith("é" * 60)  # cut mid-character: replaced, never raises


def test_tokens_then_done_without_finish_reason_is_not_ok(tmp_path):
    # llama-cpp-python's interrupt_requests cuts a running answer this way: tokens, then [DONE]
    recs = _run(tmp_path, _sse([chunk({"role": "assistant", "content": ""}), chunk({"content": "hel"}), DONE]))
    assert len(recs) == 2 and all(r.outcome == "error" and r.error == "no_finish_reason" for r in recs), \
        [(r.outcome, r.error) for r in recs]
    assert "no finish_reason" in recs[0].error_msg and "first_token" in recs[0].t
    assert recs.verdict["kind"] == "bad_responses"
