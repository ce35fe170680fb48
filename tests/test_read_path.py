"""The body read path (agentload.run.body_sink) and the timing-error measurement.

- The sink path (body blocks handed to the SSE decoder from aiohttp's protocol callback) gives
  the same result as the general `readany()` loop, over real HTTP against the mock, for every
  stream shape and fault the mock has; read and total timeouts behave the same on both.
- Both paths fail closed the same way (fakeserver: HTML for a stream, garbage events, an
  `event: error`, a trailing event the stream ends without a blank line for), and a token in
  that trailing event is stamped like any other.
- aiohttp's private internals both paths rely on are checked once per process: the check passes
  on the installed aiohttp; when it fails (forced here), bodies are read with `readany()` and give
  the same record, the pool's unknown counts are left out (never 0), and one warning line names
  what was missing. The stamps' internals (the traced connector and request) are the one stamping
  path: they stamp every phase of a pooled request, and an aiohttp without them is an error
  naming its version.
- The server's own first-token stamp (`mock_sent_ns`) is joined into the record as
  `server_first_token_ns`; the timing error (client first token - server send) is non-negative
  and lies inside the request, on the same CLOCK_MONOTONIC. No wall-clock thresholds.
"""

from __future__ import annotations

import asyncio

import aiohttp
import aiohttp.web
import orjson
import pytest
from aiohttp.streams import StreamReader

import agentload.run.request as rq
from agentload.errors import UserError
from agentload.mock import MockConfig, MockProcess
from agentload.records import Record, Trace, load_records
from agentload.run import body_sink, transport
from agentload.run.scenario import ClientConfig, TargetConfig
from agentload.run.transport import Transport
from fakeserver import DONE, FakeServer, chunk, sse_response
from helpers import run_scenario

BODY = orjson.dumps({"model": "mock-model", "stream": True, "max_tokens": 16, "stream_options": {"include_usage": True},
                     "tools": [{"type": "function", "function": {"name": "lookup", "parameters": {
                         "type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}}],
                     "messages": [{"role": "user", "content": "hello " * 30}]})
PLAIN = orjson.dumps({"model": "mock-model", "stream": True, "max_tokens": 16,
                      "messages": [{"role": "user", "content": "hello " * 30}]})


async def _no_sink(content, feed, protocol=None, last_byte_ns=None) -> bool:
    return False


async def _send(url: str, body: bytes, client: ClientConfig, sink: bool, monkeypatch) -> tuple[rq.Result, Trace]:
    if not sink:
        monkeypatch.setattr(rq, "read_body", _no_sink)
    else:
        monkeypatch.undo()
    return await _request(url, body, client)


async def _request(url: str, body: bytes, client: ClientConfig, tr: Transport | None = None) -> tuple[rq.Result, Trace]:
    own = tr is None
    tr = tr or Transport(client, TargetConfig(), url)
    session = tr.session_for(0)
    trace = Trace("agent", 0, 1, 0, "test-a0-r1-c0", 1, len(body), 10)
    try:
        try:
            res = await asyncio.wait_for(rq.send(session, tr.url, body, trace), 20)
        except Exception as e:  # as agent.attempt does
            err, msg = rq.classify_exception(e)
            res = rq.Result(None, None, err, msg)
    finally:
        if own:
            await tr.close()
    return res, trace


def _shape(res: rq.Result, trace: Trace) -> dict:
    cs = res.stream
    return {"status": res.status, "error": res.error, "chunks": trace.chunks, "token_chunks": trace.token_chunks,
            "comments": trace.comments, "bytes_in": trace.bytes_in, "first_token": "first_token" in trace.t,
            "content": cs.content if cs else None, "tool_calls": cs.tool_calls if cs else None,
            "finish": cs.finish_reason if cs else None, "usage": cs.usage if cs else None,
            "done": cs.done if cs else None}


MOCKS = {
    "vllm-paced": dict(decode_tokens_per_s=2000, output_tokens=12),
    "sglang-burst": dict(style="sglang", decode_tokens_per_s=0, output_tokens=12),
    "tool-calls": dict(decode_tokens_per_s=0, tool_calls_per_response=2),
    "pings-mid-stream": dict(decode_tokens_per_s=0, output_tokens=8, ping_while_stalled_s=0.05,
                             stall_mid_stream={"after_tokens": 3, "for_s": 0.3}),
    "chunked-many": dict(decode_tokens_per_s=0, output_tokens=200, chunk_tokens=1),
}


@pytest.mark.parametrize("name", sorted(MOCKS))
async def test_sink_path_reads_the_same_as_readany(name, monkeypatch):
    cfg = MOCKS[name]
    body = BODY if name == "tool-calls" else PLAIN
    with MockProcess.start(MockConfig(base_latency_ms=1, tool_call_rounds=0, **cfg)) as m:
        client = ClientConfig(read_timeout_s=10, total_timeout_s=20)
        fast, tf = await _send(m.url, body, client, True, monkeypatch)
        slow, ts = await _send(m.url, body, client, False, monkeypatch)
    a, b = _shape(fast, tf), _shape(slow, ts)
    if name == "tool-calls":  # the mock draws fresh call ids per request
        for s in (a, b):
            for c in s["tool_calls"]:
                c["id"] = "x"
    if name == "pings-mid-stream":  # how many pings fit in a stall is the server's timing, not ours
        assert a.pop("comments") > 0 and b.pop("comments") > 0
        a.pop("bytes_in"), b.pop("bytes_in")
    assert a == b
    assert fast.error is None and tf.token_chunks > 0 and tf.chunks >= tf.token_chunks


async def test_read_timeout_fires_on_both_paths_and_pings_keep_it_alive(monkeypatch):
    stall = {"after_tokens": 2, "for_s": 3.0}
    client = ClientConfig(read_timeout_s=0.4, total_timeout_s=20)
    with MockProcess.start(MockConfig(base_latency_ms=1, decode_tokens_per_s=0, output_tokens=6,
                                      stall_mid_stream=stall)) as m:
        fast, tf = await _send(m.url, PLAIN, client, True, monkeypatch)
        slow, ts = await _send(m.url, PLAIN, client, False, monkeypatch)
    assert fast.error == slow.error == "read_timeout", (fast, slow)
    assert tf.token_chunks == ts.token_chunks == 2  # what came before the silence was kept
    with MockProcess.start(MockConfig(base_latency_ms=1, decode_tokens_per_s=0, output_tokens=6,
                                      stall_mid_stream={"after_tokens": 2, "for_s": 1.0},
                                      ping_while_stalled_s=0.1)) as m:
        fast, tf = await _send(m.url, PLAIN, client, True, monkeypatch)
    assert fast.error is None and tf.comments > 0 and tf.token_chunks == 6


async def test_total_timeout_is_kept_on_the_sink_path(monkeypatch):
    client = ClientConfig(read_timeout_s=10, total_timeout_s=0.5)
    with MockProcess.start(MockConfig(base_latency_ms=1, decode_tokens_per_s=0, output_tokens=6,
                                      stall_mid_stream={"after_tokens": 2, "for_s": 3.0},
                                      ping_while_stalled_s=0.1)) as m:
        fast, _ = await _send(m.url, PLAIN, client, True, monkeypatch)
        slow, _ = await _send(m.url, PLAIN, client, False, monkeypatch)
    assert fast.error == slow.error == "total_timeout", (fast, slow)


async def test_connection_goes_back_to_the_pool_after_a_sink_read():
    """Two sequential requests on one session: the second reuses the first's connection."""
    with MockProcess.start(MockConfig(base_latency_ms=1, decode_tokens_per_s=0, output_tokens=20)) as m:
        tr = Transport(ClientConfig(limit=1), TargetConfig(), m.url)
        session = tr.session_for(0)
        try:
            traces = []
            for i in range(3):
                trace = Trace("agent", 0, i + 1, 0, f"t-{i}", 1, len(PLAIN), 10)
                res = await asyncio.wait_for(rq.send(session, tr.url, PLAIN, trace), 10)
                assert res.error is None
                traces.append(trace)
            assert [t.reused for t in traces] == [False, True, True]
            assert tr.pool_state()["opened"] == 1
        finally:
            await tr.close()


def _in_order(t: dict[str, int], *names: str) -> bool:
    return all(t[a] <= t[b] for a, b in zip(names, names[1:]))


async def test_the_traced_pool_stamps_the_wait_the_connection_and_its_reuse():
    """Three requests at once through a pool of one connection: the session's own connector and
    request classes stamp every phase, in order. The first request opens the one connection, the
    other two wait for it and reuse it; the pool's state (and its printed form) then counts one
    connection opened, idle again."""
    with MockProcess.start(MockConfig(base_latency_ms=20, decode_tokens_per_s=0, output_tokens=4)) as m:
        tr = Transport(ClientConfig(limit=1), TargetConfig(), m.url)
        session = tr.session_for(0)
        assert type(session.connector) is transport._TracedConnector and session.trace_configs == []
        traces = [Trace("agent", i, 1, 0, f"t-{i}", 1, len(PLAIN), 10) for i in range(3)]
        try:
            results = await asyncio.wait_for(asyncio.gather(*(rq.send(session, tr.url, PLAIN, t) for t in traces)), 20)
            assert [r.error for r in results] == [None] * 3
            state = tr.pool_state()
            printed = repr(tr)
        finally:
            await tr.close()
    assert state == {"pools": 1, "in_use": 0, "idle": 1, "waiters": 0, "limit": 1, "opened": 1}, state
    assert printed == "<Transport shared pools=1 in_use=0 idle=1 waiters=0 limit=1 opened=1>", printed
    first, *waiting = sorted(traces, key=lambda t: t.t["headers"])
    assert first.reused is False and [t.reused for t in waiting] == [True, True]
    assert _in_order(first.t, "start", "conn_start", "conn_end", "sent", "headers", "first_token", "end")
    for t in waiting:  # the pool was full: they waited for the one connection, then used it
        assert "conn_start" not in t.t
        assert _in_order(t.t, "start", "queued_start", "queued_end", "sent", "headers", "first_token", "end")
        assert t.t["queued_end"] >= first.t["end"] - 5_000_000  # not before the first one let go of it


async def test_an_aiohttp_without_the_stamping_methods_is_an_error_naming_its_version(fresh_checks, monkeypatch):
    """As if aiohttp had renamed a parameter of _create_connection: no phase could be stamped, so no
    run starts; the error names the installed aiohttp, what it lacks and the range agentload wants."""
    monkeypatch.setitem(transport._TRACE_HOOKS, (aiohttp.TCPConnector, "_create_connection"), ("req", "traces", "t"))
    for _ in range(2):  # not only the first Transport of the process
        with pytest.raises(UserError) as info:
            Transport(ClientConfig(), TargetConfig(), "http://127.0.0.1:9/v1")
        msg = str(info.value)
        assert msg.startswith(f"aiohttp {aiohttp.__version__}: missing or reshaped "
                              "TCPConnector._create_connection(req, traces, t), which agentload stamps"), msg
        assert "aiohttp" in msg.rsplit("expected ", 1)[1] and "\n" not in msg, msg


async def test_a_connection_that_fails_leaves_the_request_in_connect():
    """A refused connection: conn_start without conn_end, no `sent` (the phase it died in is connect)."""
    tr = Transport(ClientConfig(connect_timeout_s=2), TargetConfig(), "http://127.0.0.1:9/v1")
    trace = Trace("agent", 0, 1, 0, "t-refused", 1, len(PLAIN), 10)
    try:
        with pytest.raises(aiohttp.ClientConnectorError):
            await asyncio.wait_for(rq.send(tr.session_for(0), tr.url, PLAIN, trace), 10)
    finally:
        await tr.close()
    assert "conn_start" in trace.t and "conn_end" not in trace.t and "sent" not in trace.t
    assert trace.reused is False and trace.phase() == "connect"
    assert transport.current_trace.get() is None  # the task lets go of the trace once the request is over


@pytest.mark.parametrize("at_step_end", [True, False])
async def test_a_body_write_that_failed_is_not_sent_on_the_direct_path(monkeypatch, at_step_end):
    """The kernel refuses the request (its socket's write side shut down once the connection is
    made: the write fails with EPIPE, as on a connection reset under it), on the direct path
    against the real mock, written at the end of the step or at once: no `sent` stamp, the request
    fails in `send`, which is not the server's phase, and the broken connection is not handed back
    to the pool."""
    import socket

    from agentload.run import direct

    monkeypatch.setattr(direct, "WRITE_AT_STEP_END", at_step_end)

    connect = transport._TracedConnector.connect
    pools = []

    async def broken(self, req, traces, timeout):
        conn = await connect(self, req, traces, timeout)
        conn.transport.get_extra_info("socket").shutdown(socket.SHUT_WR)
        pools.append(self)
        return conn

    monkeypatch.setattr(transport._TracedConnector, "connect", broken)
    with MockProcess.start(MockConfig(base_latency_ms=1, decode_tokens_per_s=0, output_tokens=4)) as m:
        tr = Transport(ClientConfig(read_timeout_s=5, total_timeout_s=10), TargetConfig(), m.url)
        assert tr.direct
        trace = Trace("agent", 0, 1, 0, "t-refused-write", 1, len(PLAIN), 10)
        try:
            with pytest.raises(aiohttp.ClientOSError, match="Can not write request"):
                await asyncio.wait_for(rq.send(tr.session_for(0), tr.url, PLAIN, trace), 10)
            assert tr.pool_state()["idle"] == 0 and tr.pool_state()["in_use"] == 0
        finally:
            await tr.close()
    assert pools and "conn_end" in trace.t and "sent" not in trace.t and "headers" not in trace.t
    assert trace.phase() == "send"


async def test_a_body_write_that_failed_is_not_sent(monkeypatch):
    """The socket refuses the body (the error a write to a reset connection gives, injected into
    aiohttp's body write against the real mock), on the `session.post` path. aiohttp does not raise
    a failed write: it leaves it on the connection and returns, so `sent` must not be stamped from
    that return: the request failed in `send`, which is not the server's phase."""
    from aiohttp.payload import BytesPayload

    async def refused(self, writer, content_length=None):
        raise ConnectionResetError(104, "Connection reset by peer")

    monkeypatch.setattr(BytesPayload, "write_with_length", refused)
    with MockProcess.start(MockConfig(base_latency_ms=1, decode_tokens_per_s=0, output_tokens=4)) as m:
        tr = Transport(ClientConfig(read_timeout_s=5, total_timeout_s=10), TargetConfig(), m.url)
        tr.direct = False  # (before its first pool is made)
        trace = Trace("agent", 0, 1, 0, "t-refused-body", 1, len(PLAIN), 10)
        try:
            with pytest.raises(aiohttp.ClientOSError, match="Can not write request body"):
                await asyncio.wait_for(rq.send(tr.session_for(0), tr.url, PLAIN, trace), 10)
            await asyncio.sleep(0.1)  # (the body-writing task is done by now)
        finally:
            await tr.close()
    assert "conn_end" in trace.t and "sent" not in trace.t and "headers" not in trace.t
    assert trace.phase() == "send"


@pytest.fixture
def fresh_checks(monkeypatch):
    """The once-per-process checks and warnings, as in a new process (restored afterwards)."""
    monkeypatch.setattr(body_sink, "_missing", None)
    monkeypatch.setattr(transport, "_pool_unknown", None)
    monkeypatch.setattr(transport, "_trace_hooks_checked", False)
    monkeypatch.setattr(transport, "_warned", set())


async def test_the_aiohttp_internals_check_passes_on_the_installed_aiohttp(fresh_checks, capsys):
    assert body_sink._check() == []
    tr = Transport(ClientConfig(), TargetConfig(), "http://127.0.0.1:9/v1")
    try:
        assert transport.check_read_path() and body_sink.missing_hooks() == []
        transport.check_trace_hooks()  # (raises if anything is missing)
        assert type(tr.session_for(0).connector) is transport._TracedConnector
        tr.session_for(0)
        assert transport._pool_unknown == []
        state = tr.pool_state()
        assert "unknown" not in state and {"in_use", "idle", "waiters"} <= set(state)
    finally:
        await tr.close()
    assert "warning" not in capsys.readouterr().err


def _count_readany(monkeypatch) -> list[int]:
    calls = [0]
    orig = StreamReader.readany

    async def readany(self):
        calls[0] += 1
        return await orig(self)

    monkeypatch.setattr(StreamReader, "readany", readany)
    return calls


@pytest.mark.parametrize("name", ["vllm-paced", "tool-calls", "chunked-many"])
async def test_missing_internals_fall_back_to_readany_with_the_same_record(name, fresh_checks, monkeypatch, capsys):
    cfg = MOCKS[name]
    body = BODY if name == "tool-calls" else PLAIN
    client = ClientConfig(read_timeout_s=10, total_timeout_s=20)
    calls = _count_readany(monkeypatch)
    with MockProcess.start(MockConfig(base_latency_ms=1, tool_call_rounds=0, **cfg)) as m:
        fast, tf = await _request(m.url, body, client)
        assert calls[0] == 0  # the sink path took the body
        # an aiohttp that renamed a hook: checked once, one warning, every body read with readany()
        monkeypatch.setattr(body_sink, "_check", lambda: ["StreamReader._eof_waiter"])
        monkeypatch.setattr(body_sink, "_missing", None)
        slow, ts = await _request(m.url, body, client)
        again, _ = await _request(m.url, body, client)  # a second transport: no second warning
    assert calls[0] > 0
    a, b = _shape(fast, tf), _shape(slow, ts)
    if name == "tool-calls":
        for sh in (a, b):
            for c in sh["tool_calls"]:
                c["id"] = "x"
    assert a == b and slow.error is None and again.error is None
    warnings = [ln for ln in capsys.readouterr().err.splitlines() if "warning" in ln]
    assert len(warnings) == 1, warnings
    assert "StreamReader._eof_waiter" in warnings[0] and "readany()" in warnings[0]


async def test_pool_state_degrades_to_unknown_fields_when_connector_internals_are_missing(
        fresh_checks, monkeypatch, capsys):
    monkeypatch.setitem(transport._POOL_HOOKS, "waiters", ("_waiters_renamed", True))  # as if aiohttp renamed it
    with MockProcess.start(MockConfig(base_latency_ms=1, decode_tokens_per_s=0, output_tokens=4)) as m:
        tr = Transport(ClientConfig(), TargetConfig(), m.url)
        try:
            res, _ = await _request(m.url, PLAIN, ClientConfig(), tr)
            assert res.error is None
            state = tr.pool_state()
            assert "waiters" not in state and state["unknown"] == ["waiters"]
            assert state["in_use"] == 0 and state["idle"] == 1 and state["opened"] == 1
            assert "waiters=?" in repr(tr)
            conn = tr.session_for(0).connector
            acquired, conn._acquired = conn._acquired, None  # reshaped mid-run: unknown, never a crash
            try:
                state = tr.pool_state()
            finally:
                conn._acquired = acquired
            assert state["unknown"] == ["waiters", "in_use"] and "in_use" not in state and state["idle"] == 1
        finally:
            await tr.close()
    warnings = [ln for ln in capsys.readouterr().err.splitlines() if "warning" in ln]
    assert len(warnings) == 1 and "TCPConnector._waiters_renamed" in warnings[0], warnings


def test_a_run_with_the_fallbacks_forced_is_healthy(tmp_path, fresh_checks, monkeypatch):
    """The whole run path (sampler, live state, verdict, reports) with both fallbacks at once."""
    monkeypatch.setattr(body_sink, "_check", lambda: ["StreamReader._timer"])
    monkeypatch.setitem(transport._POOL_HOOKS, "waiters", ("_waiters_renamed", True))
    res = run_scenario("demo", tmp_path, ["agents.count=3", "agents.rounds=2", "canary.every_s=0"])
    assert res.summary["verdict"]["kind"] == "healthy"
    samples = [orjson.loads(ln) for ln in (tmp_path / "samples.jsonl").read_bytes().splitlines()]
    assert samples and all(s["pool"]["unknown"] == ["waiters"] and "waiters" not in s["pool"] for s in samples)


FAIL_CLOSED = {
    "html": (None, "not_a_stream", "HTTP 200 text/html; charset=utf-8, not an event stream: <html>hi</html>", 0, 0),
    "garbage": (["data: {x\n\n", "data: [1]\n\n", DONE], "malformed_stream",
                "stream ended with [DONE] after 2 malformed event(s) of 2: no token, no finish_reason; "
                "first malformed event: {x", 2, 0),
    "role-only": ([chunk({"role": "assistant", "content": ""}), DONE], "empty_stream",
                  "stream ended with [DONE] after 1 role-only/empty chunk(s): no token, no finish_reason", 0, 0),
    "pings-only": ([": ping\n\n", ": ping\n\n"], "empty_stream",
                   "stream ended at EOF after 2 comment(s): no token, no finish_reason", 0, 0),
    "error-event": ([chunk({"content": "a"}), 'event: error\ndata: {"message": "m", "code": 500}\n\n', DONE],
                    "inband_error", "500: m", 0, 1),
    "trailing-error-event": ([chunk({"content": "a"}), "event: error\ndata: gone"], "inband_error", "gone", 0, 1),
    "trailing-token": ([chunk({"role": "assistant"}), chunk({"content": "hi"}, "stop").rstrip("\n")], None, None, 0, 1),
}


@pytest.mark.parametrize("name", sorted(FAIL_CLOSED))
async def test_both_paths_fail_closed_the_same_way(name, monkeypatch):
    events, error, msg, bad, tokens = FAIL_CLOSED[name]

    async def handler(request):
        if events is None:
            return aiohttp.web.Response(text="<html>hi</html>", content_type="text/html")
        return await sse_response(request, events)

    client = ClientConfig(read_timeout_s=10, total_timeout_s=20)
    with FakeServer(handler) as srv:
        for sink in (True, False):
            res, trace = await _send(srv.url, PLAIN, client, sink, monkeypatch)
            assert (res.error, res.error_msg, trace.bad_events, trace.token_chunks) == (error, msg, bad, tokens), sink
            assert ("first_token" in trace.t) == (tokens > 0), trace.t


def test_server_stamp_parser():
    from agentload.run.sse_body import server_stamp

    assert server_stamp(b'{"mock_sent_ns":123456,"id":"x"}') == 123456
    assert server_stamp(b'{"mock_sent_ns": 42}') == 42
    assert server_stamp(b'{"id":"x"}') is None
    assert server_stamp(b'{"mock_sent_ns":"oops"}') is None


@pytest.mark.parametrize("stream", [True, False])
def test_timing_error_is_joined_non_negative_and_inside_the_request(tmp_path, stream):
    res = run_scenario("demo", tmp_path, ["agents.count=4", "agents.rounds=3", "canary.every_s=0",
                                          f"conversation.stream={'true' if stream else 'false'}",
                                          "mock.decode_tokens_per_s=2000"])
    assert res.summary["verdict"]["kind"] == "healthy"
    recs = [r for r in load_records(tmp_path / "records.jsonl").records if r.kind == "agent"]
    assert len(recs) == 12
    for r in recs:
        assert r.server_first_token_ns is not None, r
        t = r.t
        # the server can only send after the request began, and the client only see it after that
        assert t["start"] <= r.server_first_token_ns <= t["first_token"] <= t["end"]
        if stream:  # and after the response headers went out (they precede the first token)
            assert r.server_first_token_ns >= t["sent"]
    te = res.summary["timing_error"]  # the report states it too
    assert te["n"] == 12 and 0 <= te["p50_ms"] <= te["p99_ms"] <= te["max_ms"]
    assert "timing error vs the server's own send stamp" in res.text


def test_old_records_without_the_server_stamp_still_load(tmp_path):
    tr = Trace("agent", 0, 1, 0, "r-a0-r1-c0", 2, 100, 25)
    tr.t.update(start=1, end=2)
    rec = Record.from_trace("r", tr, outcome="ok", status=200, finish_reason="stop")
    d = orjson.loads(rec.to_json())
    del d["server_first_token_ns"]  # a line written before the field existed
    (tmp_path / "records.jsonl").write_bytes(orjson.dumps(d) + b"\n")
    loaded = load_records(tmp_path / "records.jsonl")
    assert loaded.torn_lines == 0 and loaded.records[0].server_first_token_ns is None
    assert loaded.records[0] == rec


async def test_token_reads_count_reads_and_a_burst_is_one_read(monkeypatch):
    """Tokens paced 30 ms apart come one read each; a whole answer written at once is one read, on
    both read paths; the response's Server header is kept."""
    tokens = [chunk({"content": f"t{i}"}) for i in range(6)]
    end = [chunk({}, "stop"), DONE]

    async def paced(request):
        resp = aiohttp.web.StreamResponse(headers={"Content-Type": "text/event-stream", "Server": "paced/1.0"})
        await resp.prepare(request)
        for ev in tokens:
            await resp.write(ev.encode())
            await asyncio.sleep(0.03)
        for ev in end:
            await resp.write(ev.encode())
        await resp.write_eof()
        return resp

    async def burst(request):
        resp = aiohttp.web.StreamResponse(headers={"Content-Type": "text/event-stream", "Server": "nginx/1.22.1"})
        await resp.prepare(request)
        await resp.write("".join(tokens + end).encode())
        await resp.write_eof()
        return resp

    client = ClientConfig(read_timeout_s=10, total_timeout_s=20)
    for handler, reads, server in ((paced, 6, "paced/1.0"), (burst, 1, "nginx/1.22.1")):
        with FakeServer(handler) as srv:
            for sink in (True, False):
                res, trace = await _send(srv.url, PLAIN, client, sink, monkeypatch)
                assert res.error is None and trace.token_chunks == 6, (res, sink)
                assert trace.token_reads == reads and trace.server == server, (trace.token_reads, trace.server, sink)


async def test_a_cut_streams_silence_before_the_cut_counts_in_its_largest_gap(monkeypatch):
    """Two tokens, then 0.6 s of silence, then the connection is cut mid-body (as a proxy's read
    timeout does): the largest gap is that silence, ending at the request's end."""

    async def handler(request):
        resp = aiohttp.web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(2):
            await resp.write(chunk({"content": f"t{i}"}).encode())
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.6)
        request.transport.close()  # no last chunk: the chunked body is cut
        return resp

    client = ClientConfig(read_timeout_s=10, total_timeout_s=20)
    with FakeServer(handler) as srv:
        for sink in (True, False):
            res, trace = await _send(srv.url, PLAIN, client, sink, monkeypatch)
            assert res.error == "ClientPayloadError", (res, sink)
            assert trace.token_chunks == 2
            assert 550e6 <= trace.max_gap <= 5e9, trace.max_gap
            assert trace.max_gap_at == trace.t["end"]
