"""The direct request path (agentload.run.direct): a request sent on aiohttp's pool without
ClientSession's per-request layers, over real HTTP on loopback.

- It sends the headers `session.post` sends (the session's, Host, the request id, Content-Length,
  `Connection: close` with force_close) and the same body, and gives the same result.
- The connection goes back to the pool when the body has ended and is reused by the next request;
  one whose body was not read to the end (a request given up) is closed, never pooled.
- A redirect is an answer (judged as any 3xx), not followed: agents POST to an API.
- A secret header whose environment value holds a line break is refused up front, in one line.
"""

from __future__ import annotations

import asyncio

import aiohttp
import orjson
import pytest
from aiohttp import web

import agentload.run.request as rq
from agentload.errors import UserError
from agentload.records import Trace
from agentload.run.scenario import ClientConfig, TargetConfig
from agentload.run.transport import Transport
from fakeserver import DONE, FakeServer, chunk, sse_response

BODY = orjson.dumps({"model": "fake", "stream": True, "max_tokens": 4,
                     "messages": [{"role": "user", "content": "hello " * 40}]})


async def _answer(request: web.Request) -> web.StreamResponse:
    return await sse_response(request, [chunk({"role": "assistant", "content": ""}), chunk({"content": "hi"}),
                                        chunk({}, finish_reason="stop"), DONE])


async def _one(tr: Transport, rid: str) -> tuple[rq.Result, Trace]:
    trace = Trace("agent", 0, 1, 0, rid, 1, len(BODY), 10)
    trace.id_sent = rq.sent_request_id(rid)
    res = await asyncio.wait_for(rq.send(tr.session_for(0), tr.url, BODY, trace), 10)
    return res, trace


@pytest.mark.parametrize("force_close", [False, True])
async def test_the_direct_path_sends_what_session_post_sends(monkeypatch, force_close):
    monkeypatch.setenv("AGENTLOAD_TEST_KEY", "sk-direct-test")
    monkeypatch.setenv("AGENTLOAD_TEST_TEAM", "team-7")
    # (a static X-Request-ID too: the request's own id replaces it, on both paths)
    target = TargetConfig(headers={"X-Route": "blue", "x-request-id": "static"}, api_key_env="AGENTLOAD_TEST_KEY",
                          headers_env={"X-Team-Token": "AGENTLOAD_TEST_TEAM"})
    client = ClientConfig(force_close=force_close, read_timeout_s=5, total_timeout_s=10)
    results = []
    with FakeServer(_answer) as srv:
        for direct in (True, False):
            tr = Transport(client, target, srv.url)
            assert tr.direct  # this aiohttp has what the direct path needs
            tr.direct = direct
            try:
                results.append(await _one(tr, "t-same-request"))
            finally:
                await tr.close()
        sent = [{k.lower(): v for k, v in h.items()} for h in srv.headers]
        bodies = srv.requests
    assert sent[0] == sent[1], sent
    assert bodies[0] == bodies[1] == orjson.loads(BODY)
    h = sent[0]
    assert h["authorization"] == "Bearer sk-direct-test" and h["x-team-token"] == "team-7"
    assert h["x-route"] == "blue" and h["content-length"] == str(len(BODY))
    assert h["x-request-id"] == rq.sent_request_id("t-same-request")
    assert h["host"] == srv.url.split("//")[1].split("/")[0]
    assert (h.get("connection") == "close") == force_close
    (direct, dt), (post, pt) = results
    assert (direct.status, direct.error, direct.stream.token_chunks) == (post.status, post.error, 1) == (200, None, 1)
    for t in (dt, pt):  # every phase stamped, in order, on both paths
        assert t.t["start"] <= t.t["conn_start"] <= t.t["conn_end"] <= t.t["sent"] <= t.t["headers"] \
            <= t.t["first_token"] <= t.t["end"]
        assert t.reused is False


async def test_the_connection_is_pooled_after_the_body_and_closed_when_it_was_not_read_to_the_end():
    async def handler(request: web.Request) -> web.StreamResponse:
        if request.headers["X-Request-ID"] != rq.sent_request_id("t-hang"):
            return await _answer(request)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(chunk({"content": "first"}).encode())
        await asyncio.sleep(30)  # (the client gives up long before)
        return resp

    with FakeServer(handler) as srv:
        tr = Transport(ClientConfig(read_timeout_s=10, total_timeout_s=20), TargetConfig(), srv.url)
        try:
            assert tr.direct
            _, first = await _one(tr, "t-first")
            assert tr.pool_state()["idle"] == 1 and tr.pool_state()["in_use"] == 0
            _, second = await _one(tr, "t-second")
            assert (first.reused, second.reused) == (False, True)  # the same connection, back from the pool
            assert "conn_start" not in second.t
            task = asyncio.ensure_future(_one(tr, "t-hang"))
            for _ in range(200):  # until the first token is in
                await asyncio.sleep(0.01)
                if tr.pool_state()["in_use"] == 1 and len(srv.headers) == 3:
                    break
            await asyncio.sleep(0.2)
            task.cancel()  # as the watchdog's give-up does
            with pytest.raises(asyncio.CancelledError):
                await task
            state = tr.pool_state()
            assert state["in_use"] == 0 and state["idle"] == 0, state  # closed, not handed back half-read
        finally:
            await tr.close()


async def test_a_request_given_up_before_its_answer_leaves_no_connection_for_the_next_one():
    """Given up while the server has not answered yet: its connection is closed, not pooled. Pooled,
    the next request on it would read the late answer to the one given up as its own."""
    async def handler(request: web.Request) -> web.StreamResponse:
        if request.headers["X-Request-ID"] == rq.sent_request_id("t-late"):
            await asyncio.sleep(0.5)
            return await sse_response(request, [chunk({"content": "late answer"}), chunk({}, finish_reason="stop"),
                                                DONE])
        return await _answer(request)

    with FakeServer(handler) as srv:
        tr = Transport(ClientConfig(read_timeout_s=10, total_timeout_s=20), TargetConfig(), srv.url)
        try:
            task = asyncio.ensure_future(_one(tr, "t-late"))
            for _ in range(200):
                await asyncio.sleep(0.01)
                if srv.headers:
                    break
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert tr.pool_state()["idle"] == 0
            res, trace = await _one(tr, "t-next")
            await asyncio.sleep(0.6)  # (past the late answer)
        finally:
            await tr.close()
    assert trace.reused is False  # a new connection
    assert res.error is None and res.stream.content == "hi"


async def test_a_redirect_is_judged_as_an_answer_not_followed():
    async def handler(request: web.Request) -> web.Response:
        return web.Response(status=307, headers={"Location": "/v1/elsewhere"})

    with FakeServer(handler) as srv:
        tr = Transport(ClientConfig(read_timeout_s=5, total_timeout_s=10), TargetConfig(), srv.url)
        try:
            res, trace = await _one(tr, "t-redirect")
        finally:
            await tr.close()
        assert len(srv.headers) == 1  # nothing was sent to the Location
    assert (res.status, res.error) == (307, "not_a_stream"), res
    assert "HTTP 307" in res.error_msg


def test_a_secret_header_value_on_two_lines_is_refused_up_front(monkeypatch):
    monkeypatch.setenv("AGENTLOAD_TEST_TEAM", "team-7\r\nX-Injected: 1")
    with pytest.raises(UserError) as e:
        Transport(ClientConfig(), TargetConfig(headers_env={"X-Team-Token": "AGENTLOAD_TEST_TEAM"}),
                  "http://127.0.0.1:9/v1")
    msg = str(e.value)
    assert "AGENTLOAD_TEST_TEAM" in msg and "line break" in msg and "\n" not in msg
    assert "team-7" not in msg  # (the value is a secret)


def test_a_header_line_break_never_reaches_the_wire():
    from agentload.run.direct import _line

    assert _line("X-A", "b c") == "X-A: b c\r\n"
    for name, value in (("X-A", "b\r\nX-Injected: 1"), ("X-A", "b\nc"), ("X-A\r\nX-B", "c")):
        with pytest.raises(ValueError, match="newline or carriage return"):
            _line(name, value)


async def test_without_the_direct_path_requests_go_through_session_post(monkeypatch, capsys):
    """When this aiohttp lacks an internal the direct path needs (forced here), one warning line
    names it and requests go through session.post, with the same result."""
    from agentload.run import direct, transport

    monkeypatch.setattr(direct, "_missing", ["ResponseHandler.read()"])
    monkeypatch.setattr(transport, "_warned", set())
    with FakeServer(_answer) as srv:
        tr = Transport(ClientConfig(read_timeout_s=5, total_timeout_s=10), TargetConfig(), srv.url)
        try:
            assert not tr.direct
            res, trace = await _one(tr, "t-fallback")
            assert getattr(tr.session_for(0).connector, "direct", None) is None
        finally:
            await tr.close()
    assert (res.status, res.error, res.stream.token_chunks) == (200, None, 1)
    err = capsys.readouterr().err
    assert err.count("agentload: warning") == 1 and "ResponseHandler.read()" in err and "ClientSession.post" in err


async def test_a_failed_connect_is_aiohttps_error():
    tr = Transport(ClientConfig(connect_timeout_s=2, pool_timeout_s=2), TargetConfig(), "http://127.0.0.1:9/v1")
    try:
        assert tr.direct
        trace = Trace("agent", 0, 1, 0, "t-refused", 1, len(BODY), 10)
        with pytest.raises(aiohttp.ClientConnectorError):
            await rq.send(tr.session_for(0), tr.url, BODY, trace)
    finally:
        await tr.close()
    assert "conn_start" in trace.t and "sent" not in trace.t and trace.phase() == "connect"


async def test_the_total_timeout_ends_a_request_waiting_for_its_head_on_both_paths(monkeypatch):
    """The `total` timeout counts from the request's start on the direct path too: a server that never
    sends the head ends the request as `total_timeout` (not a read timeout, not a hang), on the direct
    path and through session.post alike, and the connection is not handed back to the pool."""
    from agentload.run import direct, transport

    async def silent(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(5)  # (a client that waited this long answered 500: the test fails)
        raise AssertionError("the client waited past its total timeout")

    results = []
    for missing in (None, ["ResponseHandler.read()"]):
        monkeypatch.setattr(direct, "_missing", missing)
        monkeypatch.setattr(transport, "_warned", set())
        with FakeServer(silent) as srv:
            tr = Transport(ClientConfig(read_timeout_s=20, total_timeout_s=0.4), TargetConfig(), srv.url)
            try:
                assert tr.direct == (missing is None)
                rid = f"t-total-{missing is None}"
                trace = Trace("agent", 0, 1, 0, rid, 1, len(BODY), 10)
                with pytest.raises(asyncio.TimeoutError) as e:  # (`attempt` names it, as here)
                    await rq.send(tr.session_for(0), tr.url, BODY, trace)
                pool = tr.session_for(0).connector
            finally:
                await tr.close()
        results.append((rq.classify_exception(e.value)[0], "sent" in trace.t, "first_byte" in trace.t))
        assert not getattr(pool, "_conns", {}), "a connection that got no answer went back to the pool"
    assert results == [("total_timeout", True, False)] * 2, results


async def _ready_together(tr: Transport, n: int, prefix: str) -> list[Trace]:
    """`n` requests made ready in one loop step (on connections already in the pool), read to the end."""
    traces = [Trace("agent", i, 1, 0, f"{prefix}-{i}", 1, len(BODY), 10) for i in range(n)]
    results = await asyncio.wait_for(asyncio.gather(*(rq.send(tr.session_for(0), tr.url, BODY, t) for t in traces)), 10)
    assert [r.error for r in results] == [None] * n and all(r.stream.content == "hi" for r in results)
    return traces


@pytest.mark.parametrize("at_step_end", [True, False])
async def test_requests_made_ready_in_one_loop_step_are_written_together_at_its_end(monkeypatch, at_step_end):
    """The requests of a burst leave together: each request's write waits for the end of the loop
    step in which it was made ready, so none is written while the others of that step are still
    being made (with `WRITE_AT_STEP_END` off, the first is written before the last is made). Its
    `sent` is stamped when its write is made, and each answer is read as before."""
    from agentload.run import direct

    monkeypatch.setattr(direct, "WRITE_AT_STEP_END", at_step_end)
    with FakeServer(_answer) as srv:
        tr = Transport(ClientConfig(limit=8, read_timeout_s=5, total_timeout_s=10), TargetConfig(), srv.url)
        try:
            assert tr.direct
            await _ready_together(tr, 4, "t-warm")  # four connections in the pool
            assert tr.pool_state()["idle"] == 4
            traces = await _ready_together(tr, 4, "t-burst")
            assert tr.pool_state()["idle"] == 4 and tr.connections_opened == 4
        finally:
            await tr.close()
    assert all(t.reused for t in traces)
    last_made = max(t.t["start"] for t in traces)
    first_written = min(t.t["sent"] for t in traces)
    assert (first_written > last_made) == at_step_end, [(t.t["start"], t.t["sent"]) for t in traces]
    for t in traces:
        assert t.t["start"] <= t.t["sent"] <= t.t["headers"] <= t.t["first_token"] <= t.t["end"]
    assert len(srv.requests) == 8 and all(r == orjson.loads(BODY) for r in srv.requests)


async def test_a_connection_closed_before_the_step_end_write_fails_the_request_in_send(monkeypatch):
    """A connection closed between the request being made ready and the end of the step (the
    server's close read in between): nothing is written, the request fails in `send` with the
    error an immediate write to a closing transport gives, and the connection is not pooled."""
    from agentload.run import direct

    write = direct._write_request

    def closed_first(proto, transport, *args):
        transport.close()
        write(proto, transport, *args)

    monkeypatch.setattr(direct, "_write_request", closed_first)
    with FakeServer(_answer) as srv:
        tr = Transport(ClientConfig(read_timeout_s=5, total_timeout_s=10), TargetConfig(), srv.url)
        trace = Trace("agent", 0, 1, 0, "t-closed", 1, len(BODY), 10)
        try:
            with pytest.raises(aiohttp.ClientConnectionResetError, match="Cannot write to closing transport"):
                await asyncio.wait_for(rq.send(tr.session_for(0), tr.url, BODY, trace), 10)
            assert tr.pool_state()["idle"] == 0 and tr.pool_state()["in_use"] == 0
        finally:
            await tr.close()
        assert srv.requests == []
    assert "sent" not in trace.t and "headers" not in trace.t and trace.phase() == "send"


async def test_a_request_at_or_above_the_write_buffers_high_water_mark_is_written_at_once(monkeypatch):
    """A body the transport may not take whole (at or above its high-water mark) is written at once,
    in the request's own step, so that its `sent` waits for the transport to drain, as before."""
    from agentload.run import direct

    deferred = []
    write = direct._write_request
    monkeypatch.setattr(direct, "_write_request", lambda *a: (deferred.append(a[4].request_id), write(*a)))
    big = orjson.dumps({"model": "fake", "stream": True, "max_tokens": 4,
                        "messages": [{"role": "user", "content": "hello " * 20_000}]})
    with FakeServer(_answer) as srv:
        tr = Transport(ClientConfig(read_timeout_s=5, total_timeout_s=10), TargetConfig(), srv.url)
        try:
            for rid, body in (("t-small", BODY), ("t-big", big)):
                trace = Trace("agent", 0, 1, 0, rid, 1, len(body), 10)
                res = await asyncio.wait_for(rq.send(tr.session_for(0), tr.url, body, trace), 10)
                assert res.error is None and "sent" in trace.t
        finally:
            await tr.close()
        assert len(srv.requests[1]["messages"][0]["content"]) == 6 * 20_000
    assert len(big) > 65536 and deferred == ["t-small"]
