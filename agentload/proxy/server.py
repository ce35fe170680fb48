"""`agentload proxy`: a reverse proxy on loopback that a real harness points at instead of its server.

Every request is forwarded upstream through agentload's own transport (its pool, its stamps), and
its answer goes back to the harness block by block as it arrives, never buffered. Each request
leaves one record, as an agent's request in a run does, with two legs on one clock:

- upstream: the run's stamps (`start`, `queued_*`, `conn_*`, `sent`, `headers`, `first_byte`,
  `first_token`, `end`), so the phase table places a stall exactly as in a run;
- downstream (the harness's side): `down_start` (its request's head arrived), `down_body` (its
  body was read), `down_headers` (the answer's head was sent on), `down_first_token` (the block
  with the first token was written on), `down_end`.

The record's `agent` is the conversation the request belongs to and `round` its round, inferred
from the messages (`agentload.proxy.conversations`); records keep shapes (sizes, counts, timings),
never text. The harness's headers go upstream as they came (its key too: it is never written
anywhere), but for the hop-by-hop ones and `Accept-Encoding` (agentload reads the stream it
forwards; an answer compressed for the harness could not be read).

What the harness sees when something goes wrong is what the server did: an error status with its
body as sent; an upstream that breaks mid-stream is a break downstream too (the connection closed
without the body's end). Only where no answer came at all (no connection, no head before the
give-up) does the proxy answer itself: a 502 or 504 whose JSON body and `X-Agentload-Proxy` header
say it was agentload.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import aiohttp
import orjson
from aiohttp import web

from agentload.proxy.conversations import Conversations, conversation_items
from agentload.records import Record, Trace
from agentload.redact import add_secret, redact_bytes
from agentload.run import apis
from agentload.run.agent import attempt
from agentload.run.context import AgentState
from agentload.tokens import prompt_tokens

if TYPE_CHECKING:
    from agentload.run.context import RunContext

_now = time.perf_counter_ns

# not forwarded either way: they describe one hop, not the message (RFC 9110 7.6.1), plus what
# the proxy sets itself (Host, the body's length and framing)
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
                        "trailer", "transfer-encoding", "upgrade", "host", "content-length"})
_NOT_UPSTREAM = HOP_BY_HOP | {"accept-encoding"}
# request headers whose values are credentials (registered as secrets: redacted in every output)
SECRET_HEADERS = frozenset({"authorization", "x-api-key", "api-key", "proxy-authorization", "cookie",
                            "x-goog-api-key", "openai-organization"})
_NOT_DOWNSTREAM = HOP_BY_HOP | {"content-encoding"}
MAX_BODY_BYTES = 256 * 1024 * 1024  # a harness's request body (a long conversation with images)


class DownstreamTap:
    """Carries the upstream answer on to the harness as it arrives (`request.send`'s tap).

    Each block is written on in the call that read it (on the upstream parser's hook: no task
    wake-up, no await). A chunked answer (HTTP/1.1, the usual case) is framed here and handed to
    the harness's transport in one `write`, past aiohttp's writer (a coroutine and a join per
    block for the same bytes); anything else, and the block of the read that ended the upstream
    body (it goes with the body's end: one write, not two), by driving `StreamResponse.write` /
    `write_eof` one step, which completes at once unless the write must wait. When the
    transport's buffer is above its high-water mark (the harness reads slower than the server
    sends), the wait for its drain goes to a task and the upstream's reading is held until it is
    done, so the proxy never buffers more than one read beyond the mark and blocks stay in order.
    A body that broke never ends downstream either (`Proxy.handle` closes the connection)."""

    __slots__ = ("request", "trace", "resp", "writer", "gone", "upstream", "held")

    def __init__(self, request: web.BaseRequest, trace: Trace):
        self.request = request
        self.trace = trace
        self.resp: web.StreamResponse | None = None
        self.writer: Any = None  # the response's writer, when its body is chunked (framed here, `write`)
        self.gone = False
        self.upstream: Any = None  # the upstream response (its connection's reading is held under backpressure)
        self.held: asyncio.Task | None = None  # a write waiting for the harness's transport to drain

    async def head(self, upstream: Any) -> None:
        resp = web.StreamResponse(status=upstream.status, reason=getattr(upstream, "reason", None))
        for k, v in upstream.headers.items():
            if k.lower() not in _NOT_DOWNSTREAM:
                resp.headers.add(k, v)
        self.resp = resp
        self.upstream = upstream
        try:
            writer = await resp.prepare(self.request)
        except (ConnectionError, aiohttp.ClientConnectionResetError):
            self.gone = True
            raise
        if getattr(writer, "chunked", False) and getattr(writer, "_compress", None) is None:
            self.writer = writer
        self.trace.t["down_headers"] = _now()

    def write(self, block: bytes) -> None:
        resp = self.resp
        if resp is None or not block:
            return
        body = getattr(self.upstream, "content", None)
        writer = self.writer
        if writer is not None and (body is None or not body.is_eof()):
            transport = writer.transport
            if transport is None or transport.is_closing():
                self.gone = True
                raise aiohttp.ClientConnectionResetError("Cannot write to closing transport")
            transport.write(b"%x\r\n%b\r\n" % (len(block), block))
            if writer.protocol.writing_paused and (self.held is None or self.held.done()):
                self._hold(writer.drain(), None)  # (a hold still pending has paused the reading already)
        else:
            # the read that ended the upstream body: its block and the body's end in one write
            step = resp.write_eof(block) if body is not None and body.is_eof() else resp.write(block)
            try:
                waiting = step.send(None)
            except StopIteration:
                pass  # written, no wait: the usual case
            except (ConnectionError, aiohttp.ClientConnectionResetError):
                self.gone = True
                raise
            else:  # the block is with the transport; the write waits for its buffer to drain
                self._hold(step, waiting)
        self.trace.t["down_end"] = _now()  # (the last block's: the record is written when the upstream body ends)

    def wrote_first_token(self) -> None:
        """The block just written on carried the answer's first token (the reader read it after the write)."""
        t = self.trace.t
        if "down_end" in t and "down_first_token" not in t:
            t["down_first_token"] = t["down_end"]

    def _hold(self, step: Any, waiting: Any) -> None:
        """Backpressure: the upstream's reading paused until `step` (the write) has finished."""
        conn = getattr(self.upstream, "connection", None)
        transport = conn.transport if conn is not None else None
        content = getattr(self.upstream, "content", None)
        if transport is not None and content is not None and content.is_eof():
            transport = None  # the body has ended (its connection may be back in the pool): nothing to hold
        if transport is not None:
            transport.pause_reading()
        self.held = asyncio.get_running_loop().create_task(self._finish(step, waiting, transport))

    async def _finish(self, step: Any, waiting: Any, transport: Any) -> None:
        try:
            while True:  # resume the write each time what it waits on is done, as its own task would
                if waiting is None:  # (a bare yield: one loop step)
                    await asyncio.sleep(0)
                else:
                    await asyncio.wait((waiting,))
                try:
                    waiting = step.send(None)
                except StopIteration:
                    return
        except (ConnectionError, aiohttp.ClientConnectionResetError):
            self.gone = True  # (the next write, or the end, fails on the closed transport)
        finally:
            step.close()
            if transport is not None and not transport.is_closing():
                transport.resume_reading()

    async def flush(self) -> None:
        """What a held write still owes (its drain), once the body has ended."""
        held = self.held
        if held is not None:
            self.held = None
            await held
        if self.gone:
            raise aiohttp.ClientConnectionResetError("the harness closed its connection")

    def client_gone(self) -> bool:
        """The harness closed its connection (the request's give-up was its own)."""
        if self.gone:
            return True
        tr = self.request.transport
        return tr is None or tr.is_closing()


class Proxy:
    """The proxy's request handler: one per `agentload proxy` run (it holds the conversations)."""

    def __init__(self, ctx: "RunContext", upstream: str, session_header: str | None,
                 bodies: Path | None = None):
        self.ctx = ctx
        self.upstream = upstream.rstrip("/")
        parts = urlsplit(self.upstream)
        self.origin = f"{parts.scheme}://{parts.netloc}"
        self.prefix = parts.path  # "/v1", "/openai", ""
        self.session_header = session_header
        self.conversations = Conversations()
        self.session = ctx.transport.session_for(0)
        self.passed_through = 0  # requests that are no conversation (GET /v1/models, ...): forwarded, not recorded
        # --capture-bodies: each recorded request's body, one JSON line, secrets redacted (for `replay`)
        self.bodies_fd = os.open(bodies, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600) if bodies else -1

    def url_for(self, request: web.BaseRequest) -> str:
        """The upstream URL of a request: the upstream's base and the harness's path after it.

        The harness's base URL is the proxy's (`http://127.0.0.1:P/v1`), so its path names the API
        (`/v1/chat/completions`) and the upstream's base only its server (`http://host:port`); an
        upstream given with a path (`http://host/openai`) keeps it in front; an upstream given with the
        harness's own prefix (`--upstream http://host:8000/v1`) does not get it twice."""
        path = request.rel_url.path_qs
        if self.prefix and (path == self.prefix or path.startswith(self.prefix + "/")):
            return self.origin + path
        return self.upstream + path

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        t_in = _now()
        expect = request.headers.get("Expect")
        if expect is not None:  # (what aiohttp's router does for an Application)
            if expect.lower() != "100-continue":
                raise web.HTTPExpectationFailed(text=f"Unknown Expect: {expect}")
            if request.version == aiohttp.HttpVersion11:
                await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        raw = await request.read()
        t_body = _now()
        body = _json_object(raw) if request.method == "POST" else None
        items = conversation_items(body) if body is not None else None
        if body is None or items is None:
            if request.method == "POST" and is_api_path(request.path):
                why = "is not a JSON object" if body is None else "carries no `messages` or `input` list"
                return await self._unreadable(request, raw, t_in, t_body, why)
            return await self._pass_through(request, raw)
        ctx = self.ctx
        session = request.headers.get(self.session_header) if self.session_header else None
        pl = self.conversations.place(items, session)
        agent, rnd = pl.conversation, pl.round
        rid = f"{ctx.run_id}-a{agent}-r{rnd}-c{pl.call}"
        tools = body.get("tools") if isinstance(body.get("tools"), list) else None
        trace = Trace("agent", agent, rnd, pl.call, rid, len(items), len(raw),
                      prompt_tokens([m for m in items if isinstance(m, dict)], tools))
        trace.t["down_start"] = t_in
        trace.t["down_body"] = t_body
        st = ctx.agent_states.get(agent)
        if st is None:
            st = ctx.agent_states[agent] = AgentState(agent)
        st.round, st.state, st.since, st.trace = rnd, "request", _now(), trace
        tap = DownstreamTap(request, trace)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _NOT_UPSTREAM}
        for k, v in headers.items():  # the harness's credentials: hidden wherever a server echoes them
            if k.lower() in SECRET_HEADERS:
                add_secret(v.removeprefix("Bearer ").removeprefix("bearer ").strip())
        if self.bodies_fd >= 0:
            line = b'{"request_id":%b,"agent":%d,"round":%d,"call":%d,"body":%b}\n' % (
                orjson.dumps(rid), agent, rnd, pl.call, raw.strip())
            os.write(self.bodies_fd, redact_bytes(line))
        try:
            rec, res = await attempt(ctx, self.session, trace, raw, url=self.url_for(request),
                                     headers=headers, tap=tap, stream_cls=stream_of(request.path))
        finally:
            st.trace = None
        ok = rec.outcome == "ok"
        self.conversations.answered(agent, ok)
        if ok:
            st.rounds_completed += 1
            st.state = "tool" if rec.tool_calls else "done"
        else:
            st.state = "stalled" if rec.outcome == "stalled" else "error"
        st.since = _now()
        if tap.resp is None:  # no answer came through: the proxy says so itself
            status = 504 if rec.outcome == "stalled" or (rec.error or "").endswith("timeout") else 502
            return web.json_response(
                {"error": {"type": "agentload_proxy", "code": rec.error,
                           "message": f"agentload proxy: {rec.error_msg or rec.error}"}},
                status=status, headers={"X-Agentload-Proxy": rec.error or "error"})
        resp = tap.resp
        if (res is None or res.status is None) and not tap.gone:
            # the upstream answer broke (or was given up) mid-body: pass the break on, not an end
            # (an answer read to its end is forwarded whole, whatever its verdict)
            if request.transport is not None:
                request.transport.close()
            return resp
        if not tap.gone:
            try:
                await resp.write_eof()
            except (ConnectionError, aiohttp.ClientConnectionResetError):
                pass  # (the harness left after the last byte: its answer was whole)
        return resp

    def close(self) -> None:
        if self.bodies_fd >= 0:
            os.close(self.bodies_fd)
            self.bodies_fd = -1

    async def _unreadable(self, request: web.BaseRequest, raw: bytes, t_in: int, t_body: int,
                          why: str) -> web.StreamResponse:
        """A POST to an API path whose conversation agentload cannot read: forwarded as it came (the
        harness gets the server's answer), and recorded as an error of its own, `request_unreadable`,
        so a harness sending what agentload cannot follow never leaves a run that looks healthy."""
        ctx = self.ctx
        session = request.headers.get(self.session_header) if self.session_header else None
        pl = self.conversations.place(None, session)
        rid = f"{ctx.run_id}-a{pl.conversation}-r{pl.round}-c{pl.call}"
        trace = Trace("agent", pl.conversation, pl.round, pl.call, rid, 0, len(raw), 0)
        trace.t.update(start=t_in, down_start=t_in, down_body=t_body)
        resp = await self._pass_through(request, raw, counted=False)
        trace.t["end"] = _now()
        self.conversations.answered(pl.conversation, False)
        ctx.emit(Record.from_trace(
            ctx.run_id, trace, outcome="error", status=resp.status, error="request_unreadable",
            error_msg=f"the harness's {request.method} {request.path} body ({len(raw):,} bytes) {why}: "
                      f"forwarded as it came, its conversation and round not known"))
        return resp

    async def _pass_through(self, request: web.BaseRequest, raw: bytes, counted: bool = True) -> web.StreamResponse:
        """A request that carries no conversation: forwarded as it is, answer streamed back, no record."""
        self.passed_through += counted
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        try:
            async with self.session.request(request.method, self.url_for(request), data=raw or None,
                                            headers=headers, allow_redirects=False) as up:
                resp = web.StreamResponse(status=up.status, reason=up.reason)
                for k, v in up.headers.items():
                    if k.lower() not in HOP_BY_HOP:
                        resp.headers.add(k, v)
                await resp.prepare(request)
                async for block in up.content.iter_any():
                    await resp.write(block)
                await resp.write_eof()
                return resp
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            return web.json_response({"error": {"type": "agentload_proxy", "message": f"agentload proxy: {e!r}"[:300]}},
                                     status=502, headers={"X-Agentload-Proxy": type(e).__name__})


_API_SUFFIXES = ("/chat/completions", "/messages", "/responses")


def is_api_path(path: str) -> bool:
    """A path one of the APIs is posted to (whatever prefix the harness's base URL has)."""
    return path.rstrip("/").endswith(_API_SUFFIXES)


def stream_of(path: str) -> Any:
    """The reader of an answer by the API its path names (the harness speaks what it speaks)."""
    path = path.rstrip("/")
    for api, suffix in (("messages", "/messages"), ("responses", "/responses")):
        if path.endswith(suffix):
            return apis.get(api).Stream
    return apis.get("chat").Stream


def _json_object(raw: bytes) -> dict[str, Any] | None:
    try:
        v = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return v if isinstance(v, dict) else None


def make_server(proxy: Proxy, **kwargs: Any) -> web.Server:
    """aiohttp's low-level server with `proxy.handle` for every request: the proxy has one handler
    for every path and method, so no Application (its router, its match, its middleware chain) is
    run per request. `kwargs` go to the server's protocol (`handler_cancellation`, `access_log`)."""
    loop = asyncio.get_running_loop()

    def request(message: Any, payload: Any, protocol: Any, writer: Any, task: Any) -> web.BaseRequest:
        return web.BaseRequest(message, payload, protocol, writer, task, loop, client_max_size=MAX_BODY_BYTES)

    return web.Server(proxy.handle, request_factory=request, **kwargs)
