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

Layout: this module is the app (routes, the counters and the live fault as served, start-up);
mock/handler.py the chat routes' request path, one request's story (parse, refuse, admit, serve,
log); mock/plan.py what to answer (text or tool calls, the latency model, the per-request
faults), with mock/schema_values.py for tool-call arguments; mock/framing.py chat's SSE chunks
and unary body, mock/apis.py the Messages and Responses shapes; mock/prefix_cache.py,
mock/live_fault.py, mock/request_log.py and mock/stats.py one piece of state each.
"""

from __future__ import annotations

import time
from typing import Any

import orjson
from aiohttp import web

from agentload.errors import ScenarioError
from agentload.mock.config import DEFAULT_KEEPALIVE_S, LiveFault, MockConfig
from agentload.mock.handler import ChatHandler
from agentload.mock.live_fault import LiveFaults
from agentload.mock.prefix_cache import PrefixCache
from agentload.mock.request_log import RequestLog
from agentload.mock.stats import Stats
from agentload.validate import At, build

_dumps = orjson.dumps

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


class MockServer:
    """One mock backend: its state, and the routes; the chat routes' request path is ChatHandler's."""

    def __init__(self, cfg: MockConfig):
        self.cfg = cfg
        self.stats = Stats()
        self.live = LiveFaults()
        self.cache = PrefixCache(cfg.prefix_cache_tokens, cfg.prefix_block_tokens) if cfg.prefix_cache_tokens else None
        self.log = RequestLog(cfg.request_log, cfg.name, self.stats)
        self.handler = ChatHandler(cfg, self.stats, self.live, self.cache, self.log)

    def snapshot(self) -> dict[str, Any]:
        out = self.stats.snapshot()
        out["backend"] = self.cfg.name
        out["prefix_cache"] = (self.cache.snapshot() if self.cache is not None else
                               PrefixCache(0, self.cfg.prefix_block_tokens).snapshot())
        out["fault"] = self.live.state()
        return out

    async def open_log(self, app: web.Application) -> None:
        self.log.open()

    async def close_log(self, app: web.Application) -> None:
        self.live.cancel_timer()
        self.log.close()

    # -- routes

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self.handler.handle(request, "chat")

    async def messages(self, request: web.Request) -> web.StreamResponse:
        return await self.handler.handle(request, "messages")

    async def responses(self, request: web.Request) -> web.StreamResponse:
        return await self.handler.handle(request, "responses")

    async def health(self, request: web.Request) -> web.Response:
        # a wedged engine's health check does not answer either; the prober's timeout decides
        await self.live.until_running()
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
            self.live.set(spec)
        return web.Response(body=_dumps(self.live.state()), content_type="application/json")


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
