"""The chat routes' request path: one request's story, from its body to its log line.

POST /v1/chat/completions, /v1/messages and /v1/responses all come here (`ChatHandler.handle`);
a Messages or Responses body is read into chat's form first (mock/apis.py), so everything after
is the chat route's:

    parse        the body as JSON, its id, the answer's headers, the body checked
    note         its round and prompt tokens, counted
    refuse       a protocol violation (when rejected) or an injected error, answered at once
    admit        a `max_running` slot, then serve:
    serve        a config hang; the live hang; the answer planned and the faults drawn; then
    stream       the frames written on the latency model's schedule, stalled, dropped or cut
    or unary     the whole body when the last token would have been
    log          the request log's line, however the request ended

What each fault does is described in mock/server.py's docstring.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
import zlib
from typing import Any

import orjson
from aiohttp import web

from agentload.mock import apis, framing
from agentload.mock.config import MockConfig
from agentload.mock.framing import SSE_HEADERS, Frames
from agentload.mock.live_fault import LiveFaults
from agentload.mock.plan import (
    Faults,
    Plan,
    decode_s,
    draw_faults,
    first_token_s,
    plan_answer,
    usage,
)
from agentload.mock.prefix_cache import PrefixCache
from agentload.mock.request_log import Rec, RequestLog
from agentload.mock.stats import Stats
from agentload.tokens import prompt_tokens

_perf_ns = time.perf_counter_ns
_dumps = orjson.dumps


class Exchange:
    """One request on its way: aiohttp's request, its log record, its id and the answer's headers,
    its body in chat's form (`body`) and as it came (`orig`: a Responses body's own fields), its
    round and prompt tokens once noted."""

    __slots__ = ("request", "rec", "rid", "headers", "body", "orig", "round", "ptoks")

    def __init__(self, request: web.Request, rec: Rec, rid: str, headers: dict[str, str], body: dict[str, Any],
                 orig: dict[str, Any]):
        self.request = request
        self.rec = rec
        self.rid = rid
        self.headers = headers
        self.body = body
        self.orig = orig
        self.round = 0
        self.ptoks = 0


class Answer:
    """What an admitted request is answered, and when its first token is due (`first_token_at`, on
    the loop clock of the schedule whose hangs so far add up to `base`)."""

    __slots__ = ("plan", "cid", "created", "model", "usage", "first_token_at", "base")

    def __init__(self, plan: Plan, cid: str, created: int, model: str, usage: dict[str, Any],
                 first_token_at: float, base: float):
        self.plan = plan
        self.cid = cid
        self.created = created
        self.model = model
        self.usage = usage
        self.first_token_at = first_token_at
        self.base = base


class ChatHandler:
    def __init__(self, cfg: MockConfig, stats: Stats, live: LiveFaults, cache: PrefixCache | None,
                 log: RequestLog):
        self.cfg = cfg
        self.stats = stats
        self.live = live
        self.cache = cache
        self.log = log
        self.fault_rng = random.Random(cfg.seed)
        self.sem = asyncio.Semaphore(cfg.max_running) if cfg.max_running else None
        self._ids = 0
        self._id_prefix = os.urandom(4).hex()
        self.store = apis.ResponseStore()  # Responses answers kept for previous_response_id
        self._fingerprint = framing.fingerprint(cfg.name)  # goes into every chunk's head

    async def handle(self, request: web.Request, api: str) -> web.StreamResponse:
        """Answer one request of `api` (chat, messages or responses) and log it, however it ends."""
        raw = await request.read()
        rec = Rec(_perf_ns(), self.live.fault, api)
        rec.traceparent = request.headers.get("traceparent")
        try:
            return await self._answer(request, raw, rec)
        except asyncio.CancelledError:
            rec.outcome = "client_gone"  # handler_cancellation: the client closed the connection
            raise
        finally:
            self.log.write(rec)

    async def _answer(self, request: web.Request, raw: bytes, rec: Rec) -> web.StreamResponse:
        self.stats.requests_total += 1
        self._ids += 1
        ex = self._parse(request, raw, rec)
        if not isinstance(ex, Exchange):
            return ex  # a 400
        self._note(ex)
        refusal = self._refusal(ex)
        if refusal is not None:
            return refusal
        return await self._admit(ex)

    # -- before admission

    def _parse(self, request: web.Request, raw: bytes, rec: Rec) -> Exchange | web.Response:
        """The body as JSON, the request's id and the answer's headers, the body read into chat's
        form and checked; a 400 if it cannot be."""
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            body = None
        rid = request_id(request, body) if isinstance(body, dict) else request.headers.get("X-Request-ID")
        rid = rec.rid = rid or f"mock-{self._id_prefix}-{self._ids}"
        self.stats.last_request_ids.append(rid)
        headers = {"X-Request-ID": rid, "x-mock-recv-ns": str(rec.recv_ns), "x-mock-backend": self.cfg.name}
        if not isinstance(body, dict):
            return self._error(400, "request body is not a JSON object", headers, rec)
        rec.stream = bool(body.get("stream"))
        orig = body
        if rec.api != "chat":
            try:
                body = apis.from_messages(body) if rec.api == "messages" else apis.from_responses(body, self.store)
            except apis.BadRequest as e:
                return self._error(400, str(e), headers, rec)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            return self._error(400, "'messages' must be a non-empty list of objects", headers, rec)
        tools = body.get("tools")
        if tools is not None and not isinstance(tools, list):
            return self._error(400, "'tools' must be a list", headers, rec)
        return Exchange(request, rec, rid, headers, body, orig)

    def _note(self, ex: Exchange) -> None:
        """The request's round (one more than the assistant messages it carries) and prompt tokens."""
        st = self.stats
        messages = ex.body["messages"]
        round_ = 1
        for m in messages:
            if m.get("role") == "assistant":
                round_ += 1
        ex.round = ex.rec.round = round_
        st.rounds_seen[round_] += 1
        ptoks = ex.ptoks = ex.rec.ptoks = prompt_tokens(messages, ex.body.get("tools"))
        if ptoks > st.max_prompt_tokens:
            st.max_prompt_tokens = ptoks

    def _refusal(self, ex: Exchange) -> web.Response | None:
        """A 400 for a protocol violation (if rejected), or an injected error: the live fault's,
        then the config's (error_at_round, error_rate); None to go on."""
        cfg, st, rec = self.cfg, self.stats, ex.rec
        if protocol_violation(ex.body["messages"]):
            st.protocol_violations += 1
            if cfg.reject_protocol_violations:
                return self._error(400, "an assistant message with 'tool_calls' must be followed by tool "
                                        "messages responding to each 'tool_call_id'", ex.headers, rec)
        if self.live.fault == "errors":
            st.errors_injected += 1
            return self._error(self.live.error_status, "injected error (live fault)", ex.headers, rec)
        if cfg.error_at_round == ex.round or (cfg.error_rate > 0 and self.fault_rng.random() < cfg.error_rate):
            st.errors_injected += 1
            return self._error(cfg.error_status, f"injected error (round {ex.round})", ex.headers, rec)
        return None

    async def _admit(self, ex: Exchange) -> web.StreamResponse:
        """Serve in a `max_running` slot. Queued requests hold nothing; a disconnect while queued
        cancels the wait. A hang or stall keeps its slot, as on an engine."""
        st = self.stats
        if self.sem is not None:
            st.queued += 1
            st.max_queued = max(st.max_queued, st.queued)
            try:
                await self.sem.acquire()
            finally:
                st.queued -= 1
        st.in_flight += 1
        if st.in_flight > st.max_in_flight:
            st.max_in_flight = st.in_flight
        try:
            return await self._serve(ex)
        except asyncio.CancelledError:
            st.client_gone += 1  # handler_cancellation: the client closed the connection
            raise
        except ConnectionError:
            st.client_gone += 1  # a write found the transport closed before the cancel arrived
            ex.rec.outcome = "client_gone"
            return web.Response()
        finally:
            st.in_flight -= 1
            if self.sem is not None:
                self.sem.release()

    # -- admitted

    async def _serve(self, ex: Exchange) -> web.StreamResponse:
        cfg = self.cfg
        if cfg.hang_above_tokens is not None and ex.ptoks >= cfg.hang_above_tokens:
            self.stats.hung += 1
            return await self._cut_after_hang_s(ex, None)  # nothing at all is sent
        await self.live.until_running()  # a live hang: no headers until it ends
        answer = self._plan(ex)
        faults = draw_faults(cfg, ex.ptoks, self.fault_rng)
        if not ex.body.get("stream"):
            return await self._unary(ex, answer, faults)
        resp, frames = await self._open_stream(ex, answer)
        if faults.stall_after_headers:
            self.stats.stalled += 1
            return await self._cut_after_hang_s(ex, resp)
        return await self._stream(ex, resp, frames, answer, faults)

    def _plan(self, ex: Exchange) -> Answer:
        """The answer from the request's own seeded stream, its ids and usage (the prefix cache
        admits the prompt here), and its first token's time from now on the latency model."""
        cfg, body, rec = self.cfg, ex.body, ex.rec
        admitted = asyncio.get_running_loop().time()
        base = self.live.paused_s  # hangs from here on shift this request's schedule
        rng = random.Random((cfg.seed << 32) ^ zlib.crc32(ex.rid.encode()))
        # chat's chunk deltas are chat's only: the other APIs frame the plan's message
        plan = plan_answer(cfg, body, ex.round, rng, bool(body.get("stream")) and rec.api == "chat")
        asked = body.get("model")
        model = asked if isinstance(asked, str) else cfg.models[0]
        serial = f"{self._id_prefix}{self._ids:08x}"
        cid = f"chatcmpl-{serial}" if rec.api == "chat" else f"resp_{serial}"
        created = int(time.time())
        cached = None
        if self.cache is not None:
            chain = PrefixCache.chain(model, body.get("tools"), body["messages"])
            cached = rec.cached = self.cache.admit(chain, ex.ptoks)
        first_token_at = admitted + first_token_s(cfg, ex.ptoks, cached or 0, self.live.slow)
        return Answer(plan, cid, created, model, usage(ex.ptoks, plan, cached), first_token_at, base)

    async def _open_stream(self, ex: Exchange, a: Answer) -> tuple[web.StreamResponse, Frames]:
        """Status, headers and the stream's opening (chat's role-only chunk) at once."""
        resp = web.StreamResponse(status=200, headers={**ex.headers, **SSE_HEADERS})
        await resp.prepare(ex.request)
        self.stats.by_status[200] += 1
        ex.rec.status = 200
        frames = self._frames(ex, a)
        await resp.write(frames.open)
        return resp, frames

    def _frames(self, ex: Exchange, a: Answer) -> Frames:
        """The answer's stream in the request's API."""
        cfg, api = self.cfg, ex.rec.api
        if api == "chat":
            return framing.chat_frames(a.plan, ex.body, a.cid, a.created, a.model, a.usage, self._fingerprint,
                                       cfg.style == "sglang")
        if api == "messages":
            return apis.messages_frames(a.plan, a.model, cfg.name, a.usage, cfg.chunk_tokens)
        return apis.responses_frames(a.plan, a.cid, a.created, a.model, cfg.name, a.usage, cfg.chunk_tokens, ex.orig)

    async def _stream(self, ex: Exchange, resp: web.StreamResponse, frames: Frames, a: Answer,
                      faults: Faults) -> web.StreamResponse:
        """The token chunks on the latency model's schedule (a live hang stops it, "slow" slows
        it), with this request's mid-stream stall and drop and the live drop; then the close."""
        live, loop = self.live, asyncio.get_running_loop()
        chunks, toks = frames.chunks, frames.toks
        n = len(chunks)
        drop_at = (max(1, n // 2) if n else 0) if faults.drop else -1
        rate = self.cfg.decode_tokens_per_s
        batch = rate == 0  # no pacing: coalesce writes between stall/drop points
        pending: list[bytes] = []
        running, mid = live.running, faults.mid
        t, base = a.first_token_at, a.base
        emitted = 0
        for i in range(n):
            if not running.is_set() or live.paused_s != base or t > loop.time():
                t, base = await live.pace(t, base)
            if mid is not None and emitted >= mid.after_tokens:
                await self._stall_mid_stream(resp, pending, mid.for_s)
                mid = None
                t = loop.time()
            if i == drop_at or live.fault == "drop":
                return await self._drop(ex, resp, pending)
            chunk = chunks[i]
            if i == 0:
                await resp.write(framing.stamped(chunk, _perf_ns()))
            elif batch:
                pending.append(chunk)
            else:
                await resp.write(chunk)
            emitted += toks[i]
            if rate:
                t += toks[i] * live.slow / rate  # "slow" paces the tokens sent while it lasts
        await live.until_running()
        if (drop_at >= n and faults.drop) or live.fault == "drop":
            return await self._drop(ex, resp, pending)
        pending.append(frames.close)
        await resp.write(b"".join(pending))
        await resp.write_eof()
        self._completed(ex, a)
        return resp

    async def _stall_mid_stream(self, resp: web.StreamResponse, pending: list[bytes], seconds: float) -> None:
        if pending:
            await resp.write(b"".join(pending))
            pending.clear()
        self.stats.stalled += 1
        await self._stall(resp, seconds)

    async def _drop(self, ex: Exchange, resp: web.StreamResponse, pending: list[bytes]) -> web.Response:
        """Abort the transport half-way through the body (after what was batched so far)."""
        if pending:
            await resp.write(b"".join(pending))
        self.stats.dropped += 1
        ex.rec.outcome = "dropped"
        return self._cut(ex.request, abort=True)

    async def _unary(self, ex: Exchange, a: Answer, faults: Faults) -> web.StreamResponse:
        """The whole body when the last token would have been (a mid-stream stall delays it by
        `for_s`); a stall after headers sends status and headers only (no pings: they would
        corrupt a JSON body); a drop half the body."""
        st, plan = self.stats, a.plan
        if faults.stall_after_headers:
            await self._json_headers(ex)
            st.stalled += 1
            return await self._cut_after_hang_s(ex, None)
        done_at = a.first_token_at + decode_s(self.cfg, plan.completion_tokens, self.live.slow)
        mid = faults.mid
        if mid is not None and plan.completion_tokens > mid.after_tokens:
            st.stalled += 1
            done_at += mid.for_s
        await self.live.pace(done_at, a.base)
        payload = self._unary_body(ex, a)
        if faults.drop or self.live.fault == "drop":
            resp = await self._json_headers(ex, len(payload))
            await resp.write(payload[: len(payload) // 2])
            return await self._drop(ex, resp, [])
        st.by_status[200] += 1
        ex.rec.status = 200
        self._completed(ex, a)
        return web.Response(body=payload, headers=ex.headers, content_type="application/json")

    async def _json_headers(self, ex: Exchange, length: int | None = None) -> web.StreamResponse:
        """A unary answer's status and headers, sent before (or without) its body."""
        resp = web.StreamResponse(status=200, headers=ex.headers)
        resp.content_type = "application/json"
        if length is not None:
            resp.content_length = length
        await resp.prepare(ex.request)
        self.stats.by_status[200] += 1
        ex.rec.status = 200
        return resp

    def _unary_body(self, ex: Exchange, a: Answer) -> bytes:
        cfg, api = self.cfg, ex.rec.api
        if api == "messages":
            out = apis.messages_unary(a.plan, a.model, cfg.name, a.usage)
        elif api == "responses":
            out = apis.responses_unary(a.plan, a.cid, a.created, a.model, cfg.name, a.usage, ex.orig)
        else:
            out = framing.chat_unary(a.plan, a.cid, a.created, a.model, cfg.name, a.usage)
        out["mock_sent_ns"] = _perf_ns()
        return _dumps(out)

    def _completed(self, ex: Exchange, a: Answer) -> None:
        """An answer sent whole: counted, and a Responses answer kept for `previous_response_id`
        (store: true, the API's default) unless it ran out of tokens."""
        self.stats.completed += 1
        ex.rec.outcome = "ok"
        if ex.rec.api == "responses" and ex.orig.get("store", True) and a.plan.finish != "length":
            self.store.put(a.cid, [*ex.body["messages"], a.plan.message])

    # -- ends other than an answer

    def _error(self, status: int, message: str, headers: dict[str, str], rec: Rec,
               etype: str | None = None) -> web.Response:
        """An error answer, in the shape of the request's API (`rec.api`)."""
        self.stats.by_status[status] += 1
        rec.status = status
        rec.outcome = "rejected" if status == 400 else "error"
        etype = etype or {400: "invalid_request_error", 429: "rate_limit_exceeded"}.get(status, "server_error")
        if status in (429, 503):
            headers = {**headers, "Retry-After": "1"}
        body = (framing.chat_error(status, message, etype) if rec.api == "chat"
                else apis.error_body(rec.api, status, message, etype))
        return web.Response(status=status, body=body, headers=headers, content_type="application/json")

    async def _cut_after_hang_s(self, ex: Exchange, resp: web.StreamResponse | None) -> web.Response:
        """A hang or a stall after headers: silence (pings on `resp` if configured) until `hang_s`
        passes, then the connection closed; without `hang_s`, until the client goes."""
        await self._stall(resp, self.cfg.hang_s)
        self.stats.hangs_given_up += 1
        ex.rec.outcome = "cut"
        return self._cut(ex.request)

    @staticmethod
    def _cut(request: web.Request, abort: bool = False) -> web.Response:
        """Close the connection without (finishing) a response. The returned object is handed
        back to aiohttp, whose attempt to write it fails quietly on the closed transport."""
        transport = request.transport
        if transport is not None:
            transport.abort() if abort else transport.close()
        return web.Response()

    async def _stall(self, resp: web.StreamResponse | None, seconds: float | None) -> None:
        """Send no tokens for `seconds` (None = until cancelled); SSE pings if configured."""
        loop = asyncio.get_running_loop()
        period = self.cfg.ping_while_stalled_s
        if period is None or resp is None:
            if seconds is None:
                await loop.create_future()  # only a client disconnect (cancellation) ends this
            else:
                await asyncio.sleep(seconds)
            return
        end = None if seconds is None else loop.time() + seconds
        while True:
            wait = period if end is None else min(period, end - loop.time())
            if wait <= 0:
                return
            await asyncio.sleep(wait)
            if end is not None and loop.time() >= end:
                return
            await resp.write(framing.PING)
            self.stats.pings += 1


# ---------------------------------------------------------------- reading a request


def request_id(request: web.Request, body: dict[str, Any]) -> str | None:
    """The X-Request-ID header, else the body's `user`, else its `metadata.request_id`."""
    rid = request.headers.get("X-Request-ID")
    if rid:
        return rid
    user = body.get("user")
    if isinstance(user, str) and user:
        return user
    meta = body.get("metadata")
    if isinstance(meta, dict):
        rid = meta.get("request_id")
        if isinstance(rid, str) and rid:
            return rid
    return None


def protocol_violation(messages: list[dict[str, Any]]) -> bool:
    """True if a tool_call id is never answered by a later tool message, or a tool message
    answers an id no earlier assistant message announced (OpenAI rejects both with a 400)."""
    pending: set[Any] = set()  # ids as sent: a malformed call's may be None
    known: set[Any] = set()
    bad = False
    for m in messages:
        role = m.get("role")
        if role == "assistant":
            for call in m.get("tool_calls") or ():
                cid = call.get("id") if isinstance(call, dict) else None
                pending.add(cid)
                known.add(cid)
        elif role == "tool":
            cid = m.get("tool_call_id")
            if cid not in known:
                bad = True
            pending.discard(cid)
    return bad or bool(pending)
