"""An OpenAI-compatible chat completions server with a latency model and fault injection.

It serves `POST /v1/chat/completions`, and Anthropic's `POST /v1/messages` and OpenAI's
`POST /v1/responses` (agentload/mock/apis.py reads their requests into chat's form and frames the
answer in their events): whatever is said below of a chat request holds for the three routes.

Timeline of one admitted request (all times from admission, i.e. after the `max_running` queue):

    headers + role-only chunk      immediately (stream); ttfb therefore measures queueing only
    first token                    base_latency_ms + (prompt_tokens - cached_tokens) / prefill_tokens_per_s
    next chunks                    one per `chunk_tokens` tokens at decode_tokens_per_s
    finish, usage, [DONE]          right after the last token

Every chunk and every unary answer carries `"system_fingerprint": <name>`, every chat response
the header `x-mock-backend: <name>`, so a client behind a router sees which backend answered.

Prefix cache (`prefix_cache_tokens` > 0), the automatic prefix caching of vLLM/SGLang, made
deterministic: the prompt is a chain of nodes, one per message, keyed by the hash of the
previous key and the message's canonical JSON (the chain starts from the model and the tools;
the tools' tokens count with the first node). cached_tokens = the tokens of the longest chain
prefix found in an LRU of nodes, capped at prompt_tokens - 1 and floored to whole
`prefix_block_tokens` blocks. At admission every node of the prompt is inserted or touched and
the least recently used nodes go until the cache fits its capacity. Usage then reports
`"prompt_tokens_details": {"cached_tokens": N}`, as vLLM does; without the cache it does not.

Faults from the config, in the order they are decided:
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

Live faults, set during a run with POST /mock/fault (`{"fault": F, "for_s": S, "slow_factor": X,
"error_status": N}`; one at a time, a new one replaces the old, "none" clears, `for_s` ends it by
itself on the loop clock) and read with GET /mock/fault:
    hang      the engine stops: no request (in flight or new) gets another token or its finish,
              new ones not even headers, GET /health does not answer; when it ends every schedule
              resumes where it stood, shifted by the time the hang lasted (so a hang shorter than
              a client's give-up looks slow, not hung)
    slow      base latency x slow_factor and prefill rate / slow_factor for requests admitted
              while it lasts; decode rate / slow_factor for tokens paced while it lasts
    errors    every new chat request is answered error_status at once (Retry-After: 1 for 429/503)
    drop      every stream (in flight or new) is aborted at its next token write; a unary answer
              sends half its body, then aborts

Non-streaming requests: the whole body is sent when the last token would have been; a stall
after headers sends status + headers and no body (no pings: they would corrupt the JSON); a
mid-stream stall delays the body by `for_s`; a drop sends half the Content-Length, then aborts.

Request log (`request_log = path`): every chat request appends one JSON line when it ends,
however it ends, with one write(2) on an O_APPEND descriptor (a SIGKILL loses only the requests
still in flight): id (as in the X-Request-ID answer header), backend, recv_ns (once the body is
read, as x-mock-recv-ns) and end_ns (perf_counter_ns: CLOCK_MONOTONIC, comparable with a client's
stamps on the same host), round, prompt_tokens, cached_tokens (null: no cache, or not admitted),
status (null if no status line was sent), outcome (ok; error: an injected error status; rejected:
a 400; client_gone; dropped; cut: closed by the server after hang_s), fault (the live fault at
receipt), stream, api (chat, messages or responses: the route), traceparent (the W3C trace context
the request carried, as a router passed it on: the second way to join a line to agentload's record).

Counters are served at GET /mock/stats (and zeroed by POST /mock/reset, which keeps the prefix
cache's contents and the live fault) so tests can assert on what the server really did.

Size: over 1,000 lines (prefix cache, answer planning, SSE framing, the serve path); splitting it
by idea is issue 28's next step (the three APIs' shapes already live in mock/apis.py).
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import math
import os
import random
import time
import zlib
from typing import Any

import orjson
from aiohttp import web

from agentload.errors import ScenarioError, UserError
from agentload.mock import apis
from agentload.mock.config import DEFAULT_KEEPALIVE_S, LiveFault, MockConfig
from agentload.tokens import _WORDS, message_tokens, prompt_tokens, text_tokens
from agentload.validate import At, build

_perf_ns = time.perf_counter_ns
_dumps = orjson.dumps
_blake = hashlib.blake2b

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
    # reuse_address: a backend restarted on its port must not wait for the old connections'
    # TIME_WAIT to pass
    site = web.TCPSite(runner, host, port, backlog=backlog, reuse_address=True)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()  # closes the request log; the caller may try again
        raise
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
        self.request_log_errors = 0

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
            "request_log_errors": self.request_log_errors,
            # lets tests check that hung/cancelled requests leave no task behind
            "tasks": len(asyncio.all_tasks()),
        }


class PrefixCache:
    """An LRU of prompt-chain nodes (see the module docstring): node hash -> its tokens."""

    def __init__(self, capacity_tokens: int, block_tokens: int):
        self.capacity = capacity_tokens
        self.block = block_tokens
        self.nodes: collections.OrderedDict[bytes, int] = collections.OrderedDict()
        self.used = 0
        self.reset_counters()

    def reset_counters(self) -> None:
        self.lookups = 0
        self.hit_requests = 0
        self.cached_tokens_total = 0
        self.prompt_tokens_total = 0

    @staticmethod
    def chain(model: str, tools: list[Any] | None, messages: list[dict[str, Any]]) -> list[tuple[bytes, int]]:
        """(key, tokens) of each message's node; the tokens add up to prompt_tokens(messages, tools)."""
        tools_json = _dumps(tools) if tools else b""
        key = _blake(_dumps(model) + b"\0" + tools_json, digest_size=8).digest()
        extra = text_tokens(tools_json.decode()) if tools else 0  # counted as tokens.prompt_tokens does
        out = []
        for m in messages:
            # sorted keys: the same message from another client library is the same node
            key = _blake(key + _dumps(m, option=orjson.OPT_SORT_KEYS), digest_size=8).digest()
            out.append((key, message_tokens(m) + extra))
            extra = 0
        return out

    def admit(self, chain: list[tuple[bytes, int]], ptoks: int) -> int:
        """Look the prompt up, then insert/touch its nodes; returns its cached tokens."""
        nodes = self.nodes
        hit = 0
        for key, toks in chain:
            if key not in nodes:
                break
            hit += toks
        # an engine always computes the last token itself, and caches whole blocks only
        hit = min(hit, ptoks - 1)
        cached = max(0, hit - hit % self.block)
        # Leaf first, root last: the shared root of many prompts is then the most recently used,
        # and eviction takes the tails of prompts before the prefixes others build on (as vLLM
        # frees a request's blocks in reverse order).
        used = self.used
        for key, toks in reversed(chain):
            if key in nodes:
                nodes.move_to_end(key)
            else:
                nodes[key] = toks
                used += toks
        while used > self.capacity:
            used -= nodes.popitem(last=False)[1]
        self.used = used
        self.lookups += 1
        if cached:
            self.hit_requests += 1
        self.cached_tokens_total += cached
        self.prompt_tokens_total += ptoks
        return cached

    def snapshot(self) -> dict[str, int]:
        return {"capacity_tokens": self.capacity, "used_tokens": self.used, "lookups": self.lookups,
                "hit_requests": self.hit_requests, "cached_tokens_total": self.cached_tokens_total,
                "prompt_tokens_total": self.prompt_tokens_total}


class Rec:
    """What the request log says of one chat request; filled in as the request goes."""

    __slots__ = ("recv_ns", "fault", "rid", "round", "ptoks", "cached", "status", "outcome", "stream", "api",
                 "traceparent")

    def __init__(self, recv_ns: int, fault: str | None, api: str = "chat"):
        self.api = api
        self.recv_ns = recv_ns
        self.fault = fault
        self.rid: str | None = None
        self.round: int | None = None
        self.ptoks: int | None = None
        self.cached: int | None = None
        self.status: int | None = None
        self.outcome: str | None = None
        self.stream = False
        self.traceparent: str | None = None  # the W3C trace context the request carried (a router passes it on)


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
        self.cache = PrefixCache(cfg.prefix_cache_tokens, cfg.prefix_block_tokens) if cfg.prefix_cache_tokens else None
        self.store = apis.ResponseStore()  # Responses answers kept for previous_response_id
        self._fingerprint = b',"system_fingerprint":' + _dumps(cfg.name)  # goes into every chunk's head
        self._log_fd: int | None = None
        # the live fault (POST /mock/fault)
        self.fault: str | None = None
        self._slow = 1.0  # the factor in force: 1 unless "slow" is live
        self._error_status = 503
        self.running = asyncio.Event()  # cleared while "hang" is live; every write waits for it
        self.running.set()
        self._paused_s = 0.0  # seconds hung in all hangs that have ended
        self._paused_at: float | None = None  # loop time the current hang began
        self._fault_since: float | None = None
        self._fault_until: float | None = None
        self._fault_timer: asyncio.TimerHandle | None = None
        self._faults_applied = 0

    # -- helpers

    def _error(self, status: int, message: str, headers: dict[str, str], rec: Rec,
               etype: str | None = None) -> web.Response:
        """An error answer, in the shape of the request's API (`rec.api`)."""
        self.stats.by_status[status] += 1
        rec.status = status
        rec.outcome = "rejected" if status == 400 else "error"
        etype = etype or {400: "invalid_request_error", 429: "rate_limit_exceeded"}.get(status, "server_error")
        if status in (429, 503):
            headers = {**headers, "Retry-After": "1"}
        body = (_dumps({"error": {"message": message, "type": etype, "param": None, "code": status}})
                if rec.api == "chat" else apis.error_body(rec.api, status, message, etype))
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

    async def _pace(self, t: float, base: float) -> tuple[float, float]:
        """Wait until loop time `t` and while hung. A hang that passes meanwhile moves `t` by
        its length: the engine was stopped, so its schedule resumes where it stood. `base` is
        `_paused_s` as of the schedule `t` was computed in; returns both, brought up to date."""
        loop = asyncio.get_running_loop()
        running = self.running
        while True:
            if not running.is_set():
                await running.wait()  # no polling; a client disconnect cancels it
            if self._paused_s != base:
                t += self._paused_s - base
                base = self._paused_s
            delay = t - loop.time()
            if delay <= 0:
                return t, base
            await asyncio.sleep(delay)

    # -- the live fault

    def set_fault(self, spec: LiveFault) -> None:
        """Replace the live fault; "none" clears it. A `for_s` ends it on the loop clock."""
        loop = asyncio.get_running_loop()
        if self._fault_timer is not None:
            self._fault_timer.cancel()
            self._fault_timer = None
        name = None if spec.fault == "none" else spec.fault
        self._apply(name, spec.slow_factor, int(spec.error_status), loop.time())
        self._faults_applied += 1
        if name is not None and spec.for_s is not None:
            self._fault_until = loop.time() + spec.for_s
            self._fault_timer = loop.call_later(spec.for_s, self._expire)

    def _expire(self) -> None:
        self._fault_timer = None
        self._apply(None, 1.0, self._error_status, asyncio.get_running_loop().time())

    def _apply(self, name: str | None, slow_factor: float, error_status: int, now: float) -> None:
        if name == "hang":
            if self._paused_at is None:
                self._paused_at = now
                self.running.clear()
        elif self._paused_at is not None:
            # first the hang's length, then the wake-up: waiters read it to shift their schedules
            self._paused_s += now - self._paused_at
            self._paused_at = None
            self.running.set()
        self.fault = name
        self._slow = slow_factor if name == "slow" else 1.0
        self._error_status = error_status
        self._fault_since = now
        self._fault_until = None

    def fault_state(self) -> dict[str, Any]:
        now = asyncio.get_running_loop().time()
        since, until = self._fault_since, self._fault_until
        return {"fault": self.fault,
                "since_s_ago": None if since is None else round(now - since, 3),
                "remaining_s": None if until is None else round(max(0.0, until - now), 3),
                "applied": self._faults_applied}

    def snapshot(self) -> dict[str, Any]:
        out = self.stats.snapshot()
        out["backend"] = self.cfg.name
        out["prefix_cache"] = (self.cache.snapshot() if self.cache is not None else
                               PrefixCache(0, self.cfg.prefix_block_tokens).snapshot())
        out["fault"] = self.fault_state()
        return out

    # -- the request log

    async def open_log(self, app: web.Application) -> None:
        path = self.cfg.request_log
        if path is None:
            return
        try:
            self._log_fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            # not an OSError: serve() would take it for a port it cannot listen on
            raise UserError(f"request_log: cannot open {path} for appending ({e.strerror or e})") from None

    async def close_log(self, app: web.Application) -> None:
        if self._fault_timer is not None:  # the loop may close before it fires
            self._fault_timer.cancel()
            self._fault_timer = None
        if self._log_fd is not None:
            os.close(self._log_fd)
            self._log_fd = None

    def _log(self, rec: Rec) -> None:
        line = _dumps({"id": rec.rid, "backend": self.cfg.name, "recv_ns": rec.recv_ns, "end_ns": _perf_ns(),
                       "round": rec.round, "prompt_tokens": rec.ptoks, "cached_tokens": rec.cached,
                       "status": rec.status, "outcome": rec.outcome or "error", "fault": rec.fault,
                       "stream": rec.stream, "api": rec.api, "traceparent": rec.traceparent},
                      option=orjson.OPT_APPEND_NEWLINE)
        try:
            os.write(self._log_fd, line)  # one write on O_APPEND: lines never interleave or tear
        except OSError:
            self.stats.request_log_errors += 1  # a full disk must not fail the request

    # -- routes

    async def health(self, request: web.Request) -> web.Response:
        # a wedged engine's health check does not answer either; the prober's timeout decides
        while not self.running.is_set():
            await self.running.wait()
        return web.json_response({"status": "ok"}, headers={"x-mock-backend": self.cfg.name})

    async def models(self, request: web.Request) -> web.Response:
        created = int(time.time())
        data = [{"id": m, "object": "model", "created": created, "owned_by": "agentload-mock"} for m in self.cfg.models]
        return web.Response(body=_dumps({"object": "list", "data": data}), content_type="application/json")

    async def stats_view(self, request: web.Request) -> web.Response:
        return web.Response(body=_dumps(self.snapshot()), content_type="application/json")

    async def reset_view(self, request: web.Request) -> web.Response:
        self.stats.reset()
        if self.cache is not None:
            self.cache.reset_counters()
        return web.Response(body=_dumps(self.snapshot()), content_type="application/json")

    async def fault_view(self, request: web.Request) -> web.Response:
        if request.method == "POST":
            where = "POST /mock/fault"
            try:
                body = orjson.loads(await request.read())
            except orjson.JSONDecodeError:
                body = None
            if not isinstance(body, dict):
                message = f"{where}: expected a JSON object {{\"fault\": \"hang\"|\"slow\"|\"errors\"|\"drop\"|\"none\", ...}}"
                return web.Response(status=400, body=_dumps({"error": message}), content_type="application/json")
            try:
                spec = build(LiveFault, body, At(where))
            except ScenarioError as e:
                return web.Response(status=400, body=_dumps({"error": str(e)}), content_type="application/json")
            self.set_fault(spec)
        return web.Response(body=_dumps(self.fault_state()), content_type="application/json")

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._entry(request, "chat")

    async def messages(self, request: web.Request) -> web.StreamResponse:
        return await self._entry(request, "messages")

    async def responses(self, request: web.Request) -> web.StreamResponse:
        return await self._entry(request, "responses")

    async def _entry(self, request: web.Request, api: str) -> web.StreamResponse:
        raw = await request.read()
        rec = Rec(_perf_ns(), self.fault, api)
        rec.traceparent = request.headers.get("traceparent")
        try:
            return await self._chat(request, raw, rec)
        except asyncio.CancelledError:
            rec.outcome = "client_gone"  # handler_cancellation: the client closed the connection
            raise
        finally:
            if self._log_fd is not None:
                self._log(rec)

    async def _chat(self, request: web.Request, raw: bytes, rec: Rec) -> web.StreamResponse:
        recv_ns = rec.recv_ns
        st = self.stats
        cfg = self.cfg
        st.requests_total += 1
        self._ids += 1
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            body = None
        rid = request_id(request, body) if isinstance(body, dict) else request.headers.get("X-Request-ID")
        rid = rec.rid = rid or f"mock-{self._id_prefix}-{self._ids}"
        st.last_request_ids.append(rid)
        headers = {"X-Request-ID": rid, "x-mock-recv-ns": str(recv_ns), "x-mock-backend": cfg.name}
        if not isinstance(body, dict):
            return self._error(400, "request body is not a JSON object", headers, rec)
        rec.stream = bool(body.get("stream"))
        orig = body
        if rec.api != "chat":  # read into chat's form: everything below is the chat route's (mock/apis.py)
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

        round_ = 1
        for m in messages:
            if m.get("role") == "assistant":
                round_ += 1
        rec.round = round_
        st.rounds_seen[round_] += 1
        ptoks = rec.ptoks = prompt_tokens(messages, tools)
        if ptoks > st.max_prompt_tokens:
            st.max_prompt_tokens = ptoks
        if protocol_violation(messages):
            st.protocol_violations += 1
            if cfg.reject_protocol_violations:
                return self._error(400, "an assistant message with 'tool_calls' must be followed by tool "
                                        "messages responding to each 'tool_call_id'", headers, rec)

        if self.fault == "errors":
            st.errors_injected += 1
            return self._error(self._error_status, "injected error (live fault)", headers, rec)
        if cfg.error_at_round == round_ or (cfg.error_rate > 0 and self.fault_rng.random() < cfg.error_rate):
            st.errors_injected += 1
            return self._error(cfg.error_status, f"injected error (round {round_})", headers, rec)

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
            return await self._serve(request, body, rid, round_, ptoks, headers, rec, orig)
        except asyncio.CancelledError:
            st.client_gone += 1  # handler_cancellation: the client closed the connection
            raise
        except ConnectionError:
            st.client_gone += 1  # a write found the transport closed before the cancel arrived
            rec.outcome = "client_gone"
            return web.Response()
        finally:
            st.in_flight -= 1
            if self.sem is not None:
                self.sem.release()

    async def _serve(self, request: web.Request, body: dict[str, Any], rid: str, round_: int,
                     ptoks: int, headers: dict[str, str], rec: Rec, orig: dict[str, Any]) -> web.StreamResponse:
        cfg, st = self.cfg, self.stats
        loop = asyncio.get_running_loop()

        if cfg.hang_above_tokens is not None and ptoks >= cfg.hang_above_tokens:
            st.hung += 1
            await self._stall(None, cfg.hang_s)
            st.hangs_given_up += 1
            rec.outcome = "cut"
            return self._cut(request)

        # A live hang: no headers until it ends (a hang that comes later stops the token writes).
        while not self.running.is_set():
            await self.running.wait()
        admitted = loop.time()
        base = self._paused_s  # hangs from here on shift this request's schedule

        stream = bool(body.get("stream"))
        api = rec.api
        rng = random.Random((cfg.seed << 32) ^ zlib.crc32(rid.encode()))
        plan = plan_answer(cfg, body, round_, rng, stream and api == "chat")  # (chat's chunks: chat's only)
        model = body.get("model") if isinstance(body.get("model"), str) else cfg.models[0]
        cid = f"chatcmpl-{self._id_prefix}{self._ids:08x}" if api == "chat" else f"resp_{self._id_prefix}{self._ids:08x}"
        created = int(time.time())
        cached = 0
        if self.cache is not None:
            tools = body.get("tools")
            cached = rec.cached = self.cache.admit(PrefixCache.chain(model, tools, body["messages"]), ptoks)
        slow = self._slow
        ttft = cfg.base_latency_ms * slow / 1000.0 + (
            (ptoks - cached) * slow / cfg.prefill_tokens_per_s if cfg.prefill_tokens_per_s else 0.0)
        stall_after_headers = (cfg.stall_after_headers_above_tokens is not None
                               and ptoks >= cfg.stall_after_headers_above_tokens)
        mid = cfg.stall_mid_stream
        if mid is not None and ptoks < mid.above_tokens:
            mid = None
        drop = cfg.drop_mid_stream_rate > 0 and self.fault_rng.random() < cfg.drop_mid_stream_rate
        usage: dict[str, Any] = {"prompt_tokens": ptoks, "completion_tokens": plan.completion_tokens,
                                 "total_tokens": ptoks + plan.completion_tokens}
        if self.cache is not None:
            usage["prompt_tokens_details"] = {"cached_tokens": cached}

        if not stream:
            return await self._unary(request, plan, headers, cid, created, model, usage, admitted + ttft, base,
                                     stall_after_headers, mid, drop, rec, body, orig)

        resp = web.StreamResponse(status=200, headers={**headers, **SSE_HEADERS})
        await resp.prepare(request)
        st.by_status[200] += 1
        rec.status = 200

        if api == "chat":
            frames = self._chat_frames(plan, body, cid, created, model, usage)
        elif api == "messages":
            frames = apis.messages_frames(plan, model, cfg.name, usage, cfg.chunk_tokens)
        else:
            frames = apis.responses_frames(plan, cid, created, model, cfg.name, usage, cfg.chunk_tokens, orig)
        await resp.write(frames.open)

        if stall_after_headers:
            st.stalled += 1
            await self._stall(resp, cfg.hang_s)
            st.hangs_given_up += 1
            rec.outcome = "cut"
            return self._cut(request)

        chunks, toks = frames.chunks, frames.toks
        n = len(chunks)
        drop_at = (max(1, n // 2) if n else 0) if drop else -1
        rate = cfg.decode_tokens_per_s
        batch = rate == 0  # no pacing: coalesce writes between stall/drop points
        pending: list[bytes] = []
        running = self.running
        t = admitted + ttft
        emitted = 0
        for i in range(n):
            if not running.is_set() or self._paused_s != base or t > loop.time():
                t, base = await self._pace(t, base)
            if mid is not None and emitted >= mid.after_tokens:
                if pending:
                    await resp.write(b"".join(pending))
                    pending.clear()
                st.stalled += 1
                await self._stall(resp, mid.for_s)
                mid = None
                t = loop.time()
            if i == drop_at or self.fault == "drop":
                if pending:
                    await resp.write(b"".join(pending))
                st.dropped += 1
                rec.outcome = "dropped"
                return self._cut(request, abort=True)
            chunk = chunks[i]
            if i == 0:
                # stamped just before the write, for the timing-accuracy benchmark (in the chunk's last
                # event: the one that carries its token)
                at = chunk.rfind(b"data: {") + 7
                await resp.write(chunk[:at] + b'"mock_sent_ns":' + str(_perf_ns()).encode() + b"," + chunk[at:])
            elif batch:
                pending.append(chunk)
            else:
                await resp.write(chunk)
            emitted += toks[i]
            if rate:
                t += toks[i] * self._slow / rate  # "slow" paces the tokens sent while it lasts
        while not running.is_set():
            await running.wait()
        if (drop_at >= n and drop) or self.fault == "drop":
            if pending:
                await resp.write(b"".join(pending))
            st.dropped += 1
            rec.outcome = "dropped"
            return self._cut(request, abort=True)
        pending.append(frames.close)
        await resp.write(b"".join(pending))
        await resp.write_eof()
        st.completed += 1
        rec.outcome = "ok"
        if api == "responses":
            self._store(orig, cid, body, plan)
        return resp

    def _store(self, orig: dict[str, Any], rid: str, body: dict[str, Any], plan: Plan) -> None:
        """A Responses answer that completed, kept for `previous_response_id` (store: true, the API's default)."""
        if orig.get("store", True) and plan.finish != "length":
            self.store.put(rid, [*body["messages"], plan.message])

    def _chat_frames(self, plan: Plan, body: dict[str, Any], cid: str, created: int, model: str,
                     usage: dict[str, Any]) -> apis.Frames:
        """The chat answer's chunks: the role chunk first, one per token chunk, then finish, usage, [DONE]."""
        sglang = self.cfg.style == "sglang"
        # Everything of a chunk but its delta and finish_reason, encoded once per request.
        head = b'data: {"id":"' + cid.encode() + b'","object":"chat.completion.chunk","created":' + str(created).encode() \
            + b',"model":' + _dumps(model) + self._fingerprint + b',"choices":[{"index":0,"delta":'
        tail = b',"logprobs":null,"finish_reason":null' + (b',"matched_stop":null}]' if sglang else b"}]")
        tail += b',"usage":null}\n\n' if sglang else b"}\n\n"
        role = b'{"role":"assistant","content":"","reasoning_content":null,"tool_calls":null}' if sglang \
            else b'{"role":"assistant","content":""}'
        f = apis.Frames()
        f.open = head + role + tail
        deltas = plan.deltas
        n = len(deltas)
        finish = b',"logprobs":null,"finish_reason":"' + plan.finish.encode() + b'"'
        finish += b',"matched_stop":null}]' if sglang else b"}]"
        finish += b',"usage":null}\n\n' if sglang else b"}\n\n"
        if sglang or n == 0:
            # SGLang puts finish_reason in a chunk of its own; with no tokens vLLM does too.
            f.chunks = [head + d + tail for d in deltas]
            end = [head + (b'{"role":null,"content":null,"reasoning_content":null,"tool_calls":null}' if sglang
                           else b'{"content":""}') + finish]
        else:
            f.chunks = [head + d + tail for d in deltas[:-1]]
            f.chunks.append(head + deltas[-1] + finish)
            end = []
        f.toks = plan.tokens
        opts = body.get("stream_options")
        if isinstance(opts, dict) and opts.get("include_usage"):
            end.append(b'data: {"id":"' + cid.encode() + b'","object":"chat.completion.chunk","created":'
                       + str(created).encode() + b',"model":' + _dumps(model) + self._fingerprint
                       + b',"choices":[],"usage":' + _dumps(usage) + b"}\n\n")
        end.append(DONE)
        f.close = b"".join(end)
        return f

    async def _unary(self, request: web.Request, plan: Plan, headers: dict[str, str], cid: str, created: int,
                     model: str, usage: dict[str, Any], first_token_at: float, base: float,
                     stall_after_headers: bool, mid: Any, drop: bool, rec: Rec, body: dict[str, Any],
                     orig: dict[str, Any]) -> web.StreamResponse:
        cfg, st = self.cfg, self.stats
        if stall_after_headers:
            resp = web.StreamResponse(status=200, headers=headers)
            resp.content_type = "application/json"
            await resp.prepare(request)
            st.by_status[200] += 1
            rec.status = 200
            st.stalled += 1
            await self._stall(None, cfg.hang_s)  # no pings: they would corrupt a JSON body
            st.hangs_given_up += 1
            rec.outcome = "cut"
            return self._cut(request)
        done_at = first_token_at
        if cfg.decode_tokens_per_s:
            done_at += plan.completion_tokens * self._slow / cfg.decode_tokens_per_s
        if mid is not None and plan.completion_tokens > mid.after_tokens:
            st.stalled += 1
            done_at += mid.for_s
        await self._pace(done_at, base)
        if rec.api == "messages":
            out = apis.messages_unary(plan, model, cfg.name, usage)
        elif rec.api == "responses":
            out = apis.responses_unary(plan, cid, created, model, cfg.name, usage, orig)
        else:
            out = {"id": cid, "object": "chat.completion", "created": created, "model": model,
                   "system_fingerprint": cfg.name,
                   "choices": [{"index": 0, "message": plan.message, "logprobs": None, "finish_reason": plan.finish}],
                   "usage": usage}
        out["mock_sent_ns"] = _perf_ns()
        payload = _dumps(out)
        if drop or self.fault == "drop":
            resp = web.StreamResponse(status=200, headers=headers)
            resp.content_type = "application/json"
            resp.content_length = len(payload)
            await resp.prepare(request)
            st.by_status[200] += 1
            rec.status = 200
            await resp.write(payload[: len(payload) // 2])
            st.dropped += 1
            rec.outcome = "dropped"
            return self._cut(request, abort=True)
        st.by_status[200] += 1
        st.completed += 1
        rec.status = 200
        rec.outcome = "ok"
        if rec.api == "responses":
            self._store(orig, cid, body, plan)
        return web.Response(body=payload, headers=headers, content_type="application/json")


MOCK_KEY = web.AppKey("mock", MockServer)


def make_app(cfg: MockConfig) -> web.Application:
    """The mock as an aiohttp Application. Run it with `runner_kwargs(cfg)` (keep-alive timeout,
    handler cancellation), as `start_server` and `python -m agentload.mock` do."""
    server = MockServer(cfg)
    app = web.Application(client_max_size=CLIENT_MAX_SIZE)
    app[MOCK_KEY] = server
    app.on_startup.append(server.open_log)
    app.on_cleanup.append(server.close_log)
    app.router.add_post("/v1/chat/completions", server.chat)
    app.router.add_post("/v1/messages", server.messages)
    app.router.add_post("/v1/responses", server.responses)
    app.router.add_get("/v1/models", server.models)
    app.router.add_get("/health", server.health)
    app.router.add_get("/mock/stats", server.stats_view)
    app.router.add_post("/mock/reset", server.reset_view)
    app.router.add_get("/mock/fault", server.fault_view)
    app.router.add_post("/mock/fault", server.fault_view)
    return app
