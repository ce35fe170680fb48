"""An OpenAI-compatible chat completions server with a latency model and fault injection.

Timeline of one admitted request (all times from admission, i.e. after the `max_running` queue):

    headers + role-only chunk      immediately (stream); ttfb therefore measures queueing only
    first token                    base_latency_ms + prompt_tokens / prefill_tokens_per_s
    next chunks                    one per `chunk_tokens` tokens at decode_tokens_per_s
    finish, usage, [DONE]          right after the last token

Faults, in the order they are decided:
    error_at_round / error_rate    answered at once, before admission (like a router rejecting)
    max_running                    admission queue; a hang or stall keeps its slot, as on an engine
    hang_above_tokens              nothing at all is sent; after `hang_s` the connection is closed
                                   without a response (default: wait until the client goes)
    stall_after_headers_above...   headers + role chunk, then silence (pings if configured);
                                   after `hang_s` the connection is closed mid-body
    stall_mid_stream               a gap of `for_s` once `after_tokens` tokens were sent
    drop_mid_stream_rate           the transport is aborted half-way through the body
    reject_protocol_violations     unanswered / unknown tool_call ids get a 400 (else only counted)
    tool_call_rate                 the share of answers that call a tool (tool_choice "required" or a
                                   named tool still forces one, "none" still forbids it): 0 plays a
                                   model that never calls one

Non-streaming requests: the whole body is sent when the last token would have been; a stall
after headers sends status + headers and no body (no pings: they would corrupt the JSON); a
mid-stream stall delays the body by `for_s`; a drop sends half the Content-Length, then aborts.

Counters are served at GET /mock/stats (and zeroed by POST /mock/reset) so tests can assert
on what the server really did.
"""

from __future__ import annotations

import asyncio
import collections
import math
import os
import random
import time
import zlib
from typing import Any

import orjson
from aiohttp import web

from agentload.mock.config import DEFAULT_KEEPALIVE_S, MockConfig
from agentload.tokens import _WORDS, prompt_tokens, text_tokens

_perf_ns = time.perf_counter_ns
_dumps = orjson.dumps

DONE = b"data: [DONE]\n\n"
PING = b": ping\n\n"
SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
# Long agent contexts easily pass aiohttp's default 1 MiB request body limit.
CLIENT_MAX_SIZE = 256 * 1024 * 1024


def runner_kwargs(cfg: MockConfig) -> dict[str, Any]:
    """Settings that belong to aiohttp's server/runner rather than the Application."""
    return {
        "keepalive_timeout": cfg.keepalive_timeout_s if cfg.keepalive_timeout_s is not None else DEFAULT_KEEPALIVE_S,
        # Without this, aiohttp keeps running a handler whose client has gone: a hang would
        # then leak its task (and its max_running slot) forever.
        "handler_cancellation": True,
        "access_log": None,  # no per-request logging on a benchmark target
        "shutdown_timeout": 1.0,  # hung handlers must not hold SIGTERM for aiohttp's default 60 s
    }


async def start_server(cfg: MockConfig, host: str = "127.0.0.1", port: int = 0,
                       backlog: int = 2048) -> tuple[web.AppRunner, int]:
    """Start the app in the running loop; returns the runner (call .cleanup()) and the bound port."""
    runner = web.AppRunner(make_app(cfg), **runner_kwargs(cfg))
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=backlog, reuse_address=True)
    await site.start()
    return runner, runner.addresses[0][1]


class Stats:
    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.requests_total = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.queued = 0
        self.max_queued = 0
        self.completed = 0
        self.by_status: collections.Counter[int] = collections.Counter()
        self.hung = 0
        self.hangs_given_up = 0
        self.stalled = 0
        self.pings = 0
        self.dropped = 0
        self.errors_injected = 0
        self.client_gone = 0
        self.protocol_violations = 0
        self.last_request_ids: collections.deque[str] = collections.deque(maxlen=100)
        self.rounds_seen: collections.Counter[int] = collections.Counter()
        self.max_prompt_tokens = 0

    def snapshot(self) -> dict[str, Any]:
        return {
            "requests_total": self.requests_total,
            "in_flight": self.in_flight,
            "max_in_flight": self.max_in_flight,
            "queued": self.queued,
            "max_queued": self.max_queued,
            "completed": self.completed,
            "by_status": {str(k): v for k, v in sorted(self.by_status.items())},
            "hung": self.hung,
            "hangs_given_up": self.hangs_given_up,
            "stalled": self.stalled,
            "pings": self.pings,
            "dropped": self.dropped,
            "errors_injected": self.errors_injected,
            "client_gone": self.client_gone,
            "protocol_violations": self.protocol_violations,
            "last_request_ids": list(self.last_request_ids),
            "rounds_seen": {str(k): v for k, v in sorted(self.rounds_seen.items())},
            "max_prompt_tokens": self.max_prompt_tokens,
            # lets tests check that hung/cancelled requests leave no task behind
            "tasks": len(asyncio.all_tasks()),
        }


# ---------------------------------------------------------------- request analysis


def protocol_violation(messages: list[dict[str, Any]]) -> bool:
    """True if a tool_call id is never answered by a later tool message, or a tool message
    answers an id no earlier assistant message announced (OpenAI rejects both with a 400)."""
    pending: set[str] = set()
    known: set[str] = set()
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


def request_id(request: web.Request, body: dict[str, Any]) -> str | None:
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


def _short_text(rng: random.Random, lo: int = 1, hi: int = 4) -> str:
    return " ".join(rng.choices(_WORDS, k=rng.randint(lo, hi)))


def gen_value(schema: Any, rng: random.Random, depth: int = 0) -> Any:
    """A JSON value valid against a (simple) JSON schema: the subset tool definitions use."""
    if not isinstance(schema, dict) or depth > 32:
        return _short_text(rng)
    if "const" in schema:
        return schema["const"]
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return rng.choice(enum)
    t = schema.get("type")
    if isinstance(t, list):
        t = next((x for x in t if x != "null"), "null")
    if t is None:
        if "properties" in schema:
            t = "object"
        elif "items" in schema:
            t = "array"
        else:
            for key in ("anyOf", "oneOf", "allOf"):
                options = schema.get(key)
                if isinstance(options, list) and options:
                    return gen_value(options[0], rng, depth + 1)
            t = "string"
    if t == "object":
        props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        required = schema.get("required") if isinstance(schema.get("required"), list) else []
        out: dict[str, Any] = {}
        for name, sub in props.items():
            if name in required or rng.random() < 0.5:
                out[name] = gen_value(sub, rng, depth + 1)
        for name in required:
            if name not in out:
                out[name] = _short_text(rng)
        return out
    if t == "array":
        lo = schema.get("minItems", 1)
        lo = lo if isinstance(lo, int) and lo >= 0 else 1
        hi = schema.get("maxItems", lo + 2)
        hi = hi if isinstance(hi, int) and hi >= lo else lo + 2
        n = lo if depth >= 4 else rng.randint(lo, min(hi, lo + 3))
        return [gen_value(schema.get("items"), rng, depth + 1) for _ in range(n)]
    if t in ("integer", "number"):
        lo, hi = schema.get("minimum"), schema.get("maximum")
        if not isinstance(lo, (int, float)):
            ex = schema.get("exclusiveMinimum")
            lo = ex + 1 if isinstance(ex, (int, float)) and not isinstance(ex, bool) else 0
        if not isinstance(hi, (int, float)):
            ex = schema.get("exclusiveMaximum")
            hi = ex - 1 if isinstance(ex, (int, float)) and not isinstance(ex, bool) else lo + 100
        if hi < lo:
            hi = lo
        if t == "integer":
            ilo, ihi = math.ceil(lo), math.floor(hi)
            return rng.randint(ilo, max(ilo, ihi))
        return round(rng.uniform(lo, hi), 3)
    if t == "boolean":
        return rng.random() < 0.5
    if t == "null":
        return None
    text = _short_text(rng)
    min_len, max_len = schema.get("minLength"), schema.get("maxLength")
    if isinstance(min_len, int) and len(text) < min_len:
        text = text + "x" * (min_len - len(text))
    if isinstance(max_len, int) and len(text) > max_len:
        text = text[:max_len]
    return text


def _offered_tools(tools: Any) -> list[tuple[str, Any]]:
    out = []
    if isinstance(tools, list):
        for t in tools:
            fn = t.get("function") if isinstance(t, dict) else None
            if isinstance(fn, dict) and isinstance(fn.get("name"), str) and fn["name"]:
                out.append((fn["name"], fn.get("parameters")))
    return out


# ---------------------------------------------------------------- answer plan


class Plan:
    """What to answer, pre-encoded: the deltas of the token chunks and the unary message."""

    __slots__ = ("deltas", "tokens", "finish", "completion_tokens", "message")

    def __init__(self) -> None:
        self.deltas: list[bytes] = []  # JSON of each token chunk's delta
        self.tokens: list[int] = []  # tokens carried by each of those chunks
        self.finish = "stop"
        self.completion_tokens = 0
        self.message: dict[str, Any] = {}


def plan_answer(cfg: MockConfig, body: dict[str, Any], round_: int, rng: random.Random,
                stream: bool) -> Plan:
    plan = Plan()
    sglang = cfg.style == "sglang"
    offered = _offered_tools(body.get("tools"))
    choice = body.get("tool_choice")
    use_tools = bool(offered) and choice != "none" and (
        choice == "required" or isinstance(choice, dict)
        or ((cfg.tool_call_rounds == 0 or round_ <= cfg.tool_call_rounds)
            and (cfg.tool_call_rate >= 1.0 or rng.random() < cfg.tool_call_rate)))
    if use_tools:
        if isinstance(choice, dict):
            wanted = (choice.get("function") or {}).get("name")
            offered = [t for t in offered if t[0] == wanted] or offered
        calls = []
        step = 4 * cfg.chunk_tokens  # arguments are ASCII: 4 chars per token
        for index in range(cfg.tool_calls_per_response):
            name, params = rng.choice(offered)
            args = _dumps(gen_value(params if params is not None else {"type": "object"}, rng)).decode()
            cid = "call_" + os.urandom(12).hex()
            calls.append({"id": cid, "type": "function", "function": {"name": name, "arguments": args}})
            if not stream:
                plan.completion_tokens += text_tokens(name) + text_tokens(args)
                continue
            first = {"index": index, "id": cid, "type": "function", "function": {"name": name, "arguments": ""}}
            head = {"role": None, "content": None, "reasoning_content": None} if sglang else {}
            plan.deltas.append(_dumps({**head, "tool_calls": [first]}))
            plan.tokens.append(text_tokens(name))
            for pos in range(0, len(args), step):
                piece = args[pos:pos + step]
                if sglang:
                    frag = {"id": None, "index": index, "type": None, "function": {"name": None, "arguments": piece}}
                else:
                    frag = {"index": index, "function": {"arguments": piece}}
                plan.deltas.append(_dumps({**head, "tool_calls": [frag]}))
                plan.tokens.append(text_tokens(piece))
        if stream:
            plan.completion_tokens = sum(plan.tokens)
        plan.finish = "tool_calls"
        plan.message = {"role": "assistant", "content": None, "tool_calls": calls}
        return plan

    n = cfg.output_tokens
    cap = body.get("max_completion_tokens")
    if not isinstance(cap, int) or isinstance(cap, bool):
        cap = body.get("max_tokens")
    if isinstance(cap, int) and not isinstance(cap, bool) and cap < n:
        n, plan.finish = max(cap, 0), "length"
    words = rng.choices(_WORDS, k=n)  # same alphabet as tokens.synthetic_text: 1 word = 1 token
    plan.completion_tokens = n
    plan.message = {"role": "assistant", "content": " ".join(words)}
    if not sglang:
        plan.message["tool_calls"] = []  # vLLM sends an empty list
    if stream:
        c = cfg.chunk_tokens
        pre, post = (b'{"role":null,"content":', b',"reasoning_content":null,"tool_calls":null}') if sglang \
            else (b'{"content":', b"}")
        for i in range(0, n, c):
            piece = " ".join(words[i:i + c])
            plan.deltas.append(pre + _dumps(piece if i == 0 else " " + piece) + post)
            plan.tokens.append(len(words[i:i + c]))
    return plan


# ---------------------------------------------------------------- the server


class MockServer:
    def __init__(self, cfg: MockConfig):
        self.cfg = cfg
        self.stats = Stats()
        self.fault_rng = random.Random(cfg.seed)
        self.sem = asyncio.Semaphore(cfg.max_running) if cfg.max_running else None
        self._ids = 0
        self._id_prefix = os.urandom(4).hex()

    # -- helpers

    def _error(self, status: int, message: str, headers: dict[str, str], etype: str | None = None) -> web.Response:
        self.stats.by_status[status] += 1
        etype = etype or {400: "invalid_request_error", 429: "rate_limit_exceeded"}.get(status, "server_error")
        if status in (429, 503):
            headers = {**headers, "Retry-After": "1"}
        body = _dumps({"error": {"message": message, "type": etype, "param": None, "code": status}})
        return web.Response(status=status, body=body, headers=headers, content_type="application/json")

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
            await resp.write(PING)
            self.stats.pings += 1

    # -- routes

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def models(self, request: web.Request) -> web.Response:
        created = int(time.time())
        data = [{"id": m, "object": "model", "created": created, "owned_by": "agentload-mock"} for m in self.cfg.models]
        return web.Response(body=_dumps({"object": "list", "data": data}), content_type="application/json")

    async def stats_view(self, request: web.Request) -> web.Response:
        return web.Response(body=_dumps(self.stats.snapshot()), content_type="application/json")

    async def reset_view(self, request: web.Request) -> web.Response:
        self.stats.reset()
        return web.Response(body=_dumps(self.stats.snapshot()), content_type="application/json")

    async def chat(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        recv_ns = _perf_ns()
        st = self.stats
        cfg = self.cfg
        st.requests_total += 1
        self._ids += 1
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            body = None
        rid = request_id(request, body) if isinstance(body, dict) else request.headers.get("X-Request-ID")
        rid = rid or f"mock-{self._id_prefix}-{self._ids}"
        st.last_request_ids.append(rid)
        headers = {"X-Request-ID": rid, "x-mock-recv-ns": str(recv_ns)}
        if not isinstance(body, dict):
            return self._error(400, "request body is not a JSON object", headers)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            return self._error(400, "'messages' must be a non-empty list of objects", headers)
        tools = body.get("tools")
        if tools is not None and not isinstance(tools, list):
            return self._error(400, "'tools' must be a list", headers)

        round_ = 1
        for m in messages:
            if m.get("role") == "assistant":
                round_ += 1
        st.rounds_seen[round_] += 1
        ptoks = prompt_tokens(messages, tools)
        if ptoks > st.max_prompt_tokens:
            st.max_prompt_tokens = ptoks
        if protocol_violation(messages):
            st.protocol_violations += 1
            if cfg.reject_protocol_violations:
                return self._error(400, "an assistant message with 'tool_calls' must be followed by tool "
                                        "messages responding to each 'tool_call_id'", headers)

        if cfg.error_at_round == round_ or (cfg.error_rate > 0 and self.fault_rng.random() < cfg.error_rate):
            st.errors_injected += 1
            return self._error(cfg.error_status, f"injected error (round {round_})", headers)

        # Admission. Queued requests hold nothing; a disconnect while queued cancels the wait.
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
            return await self._serve(request, body, rid, round_, ptoks, headers)
        except asyncio.CancelledError:
            st.client_gone += 1  # handler_cancellation: the client closed the connection
            raise
        except ConnectionError:
            st.client_gone += 1  # a write found the transport closed before the cancel arrived
            return web.Response()
        finally:
            st.in_flight -= 1
            if self.sem is not None:
                self.sem.release()

    async def _serve(self, request: web.Request, body: dict[str, Any], rid: str, round_: int,
                     ptoks: int, headers: dict[str, str]) -> web.StreamResponse:
        cfg, st = self.cfg, self.stats
        loop = asyncio.get_running_loop()
        admitted = loop.time()

        if cfg.hang_above_tokens is not None and ptoks >= cfg.hang_above_tokens:
            st.hung += 1
            await self._stall(None, cfg.hang_s)
            st.hangs_given_up += 1
            return self._cut(request)

        stream = bool(body.get("stream"))
        rng = random.Random((cfg.seed << 32) ^ zlib.crc32(rid.encode()))
        plan = plan_answer(cfg, body, round_, rng, stream)
        model = body.get("model") if isinstance(body.get("model"), str) else cfg.models[0]
        cid = f"chatcmpl-{self._id_prefix}{self._ids:08x}"
        created = int(time.time())
        ttft = cfg.base_latency_ms / 1000.0 + (ptoks / cfg.prefill_tokens_per_s if cfg.prefill_tokens_per_s else 0.0)
        stall_after_headers = (cfg.stall_after_headers_above_tokens is not None
                               and ptoks >= cfg.stall_after_headers_above_tokens)
        mid = cfg.stall_mid_stream
        if mid is not None and ptoks < mid.above_tokens:
            mid = None
        drop = cfg.drop_mid_stream_rate > 0 and self.fault_rng.random() < cfg.drop_mid_stream_rate
        usage = {"prompt_tokens": ptoks, "completion_tokens": plan.completion_tokens,
                 "total_tokens": ptoks + plan.completion_tokens}

        if not stream:
            return await self._unary(request, plan, headers, cid, created, model, usage, admitted + ttft,
                                     stall_after_headers, mid, drop)

        resp = web.StreamResponse(status=200, headers={**headers, **SSE_HEADERS})
        await resp.prepare(request)
        st.by_status[200] += 1

        sglang = cfg.style == "sglang"
        # Everything of a chunk but its delta and finish_reason, encoded once per request.
        head = b'data: {"id":"' + cid.encode() + b'","object":"chat.completion.chunk","created":' + str(created).encode() \
            + b',"model":' + _dumps(model) + b',"choices":[{"index":0,"delta":'
        tail = b',"logprobs":null,"finish_reason":null' + (b',"matched_stop":null}]' if sglang else b"}]")
        tail += b',"usage":null}\n\n' if sglang else b"}\n\n"
        role = b'{"role":"assistant","content":"","reasoning_content":null,"tool_calls":null}' if sglang \
            else b'{"role":"assistant","content":""}'
        await resp.write(head + role + tail)

        if stall_after_headers:
            st.stalled += 1
            await self._stall(resp, cfg.hang_s)
            st.hangs_given_up += 1
            return self._cut(request)

        deltas, toks = plan.deltas, plan.tokens
        n = len(deltas)
        finish = b',"logprobs":null,"finish_reason":"' + plan.finish.encode() + b'"'
        finish += b',"matched_stop":null}]' if sglang else b"}]"
        finish += b',"usage":null}\n\n' if sglang else b"}\n\n"
        if sglang or n == 0:
            # SGLang puts finish_reason in a chunk of its own; with no tokens vLLM does too.
            last = None
            end_chunk = head + (
                b'{"role":null,"content":null,"reasoning_content":null,"tool_calls":null}' if sglang
                else b'{"content":""}') + finish
        else:
            last = n - 1
            end_chunk = b""
        drop_at = (max(1, n // 2) if n else 0) if drop else -1
        rate = cfg.decode_tokens_per_s
        batch = rate == 0  # no pacing: coalesce writes between stall/drop points
        pending: list[bytes] = []
        t = admitted + ttft
        emitted = 0
        for i in range(n):
            delay = t - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            if mid is not None and emitted >= mid.after_tokens:
                if pending:
                    await resp.write(b"".join(pending))
                    pending.clear()
                st.stalled += 1
                await self._stall(resp, mid.for_s)
                mid = None
                t = loop.time()
            if i == drop_at:
                if pending:
                    await resp.write(b"".join(pending))
                st.dropped += 1
                return self._cut(request, abort=True)
            chunk = head + deltas[i] + (finish if i == last else tail)
            if i == 0:
                # stamped just before the write, for the timing-accuracy benchmark
                await resp.write(b'data: {"mock_sent_ns":' + str(_perf_ns()).encode() + b"," + chunk[7:])
            elif batch:
                pending.append(chunk)
            else:
                await resp.write(chunk)
            emitted += toks[i]
            if rate:
                t += toks[i] / rate
        if drop_at >= n and drop:
            if pending:
                await resp.write(b"".join(pending))
            st.dropped += 1
            return self._cut(request, abort=True)
        pending.append(end_chunk)
        opts = body.get("stream_options")
        if isinstance(opts, dict) and opts.get("include_usage"):
            pending.append(b'data: {"id":"' + cid.encode() + b'","object":"chat.completion.chunk","created":'
                           + str(created).encode() + b',"model":' + _dumps(model)
                           + b',"choices":[],"usage":' + _dumps(usage) + b"}\n\n")
        pending.append(DONE)
        await resp.write(b"".join(pending))
        await resp.write_eof()
        st.completed += 1
        return resp

    async def _unary(self, request: web.Request, plan: Plan, headers: dict[str, str], cid: str, created: int,
                     model: str, usage: dict[str, int], first_token_at: float, stall_after_headers: bool,
                     mid: Any, drop: bool) -> web.StreamResponse:
        cfg, st = self.cfg, self.stats
        loop = asyncio.get_running_loop()
        if stall_after_headers:
            resp = web.StreamResponse(status=200, headers=headers)
            resp.content_type = "application/json"
            await resp.prepare(request)
            st.by_status[200] += 1
            st.stalled += 1
            await self._stall(None, cfg.hang_s)  # no pings: they would corrupt a JSON body
            st.hangs_given_up += 1
            return self._cut(request)
        done_at = first_token_at
        if cfg.decode_tokens_per_s:
            done_at += plan.completion_tokens / cfg.decode_tokens_per_s
        if mid is not None and plan.completion_tokens > mid.after_tokens:
            st.stalled += 1
            done_at += mid.for_s
        delay = done_at - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        out = {"id": cid, "object": "chat.completion", "created": created, "model": model,
               "choices": [{"index": 0, "message": plan.message, "logprobs": None, "finish_reason": plan.finish}],
               "usage": usage, "mock_sent_ns": _perf_ns()}
        payload = _dumps(out)
        if drop:
            resp = web.StreamResponse(status=200, headers=headers)
            resp.content_type = "application/json"
            resp.content_length = len(payload)
            await resp.prepare(request)
            st.by_status[200] += 1
            await resp.write(payload[: len(payload) // 2])
            st.dropped += 1
            return self._cut(request, abort=True)
        st.by_status[200] += 1
        st.completed += 1
        return web.Response(body=payload, headers=headers, content_type="application/json")


MOCK_KEY = web.AppKey("mock", MockServer)


def make_app(cfg: MockConfig) -> web.Application:
    """The mock as an aiohttp Application. Run it with `runner_kwargs(cfg)` (keep-alive timeout,
    handler cancellation), as `start_server` and `python -m agentload.mock` do."""
    server = MockServer(cfg)
    app = web.Application(client_max_size=CLIENT_MAX_SIZE)
    app[MOCK_KEY] = server
    app.router.add_post("/v1/chat/completions", server.chat)
    app.router.add_get("/v1/models", server.models)
    app.router.add_get("/health", server.health)
    app.router.add_get("/mock/stats", server.stats_view)
    app.router.add_post("/mock/reset", server.reset_view)
    return app
