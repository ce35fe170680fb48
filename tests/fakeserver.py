"""A small real HTTP server on 127.0.0.1 for tests that need answers the mock never gives
(HTML instead of a stream, garbage events, `event: error`, odd usage fields, echoed headers).

It runs in a thread with its own event loop, so both in-process runs (`run_to_dir`, which calls
`asyncio.run`) and CLI subprocesses can talk to it:

    async def handler(request):            # an aiohttp handler for POST /v1/chat/completions
        return web.Response(text="<html>", content_type="text/html")

    with FakeServer(handler) as srv:
        run_scenario("demo", tmp_path, [f'target.endpoint="{srv.url}"'])
        srv.requests  # the JSON bodies received, in order
        srv.headers   # their headers, in order

`FakeServer(handler, gets={"/props": props_handler})` serves more GET routes.
        srv.paths     # their paths with query strings, in order

`sse_response(request, events)` writes a text/event-stream body from raw event strings.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import Awaitable, Callable

import orjson
from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
SHUTDOWN_GRACE_S = 0.5


async def sse_response(request: web.Request, events: list[str], status: int = 200,
                       content_type: str = "text/event-stream") -> web.StreamResponse:
    """Write each event string as given (include the trailing blank line yourself, e.g. 'data: x\\n\\n')."""
    resp = web.StreamResponse(status=status, headers={"Content-Type": content_type})
    await resp.prepare(request)
    for ev in events:
        await resp.write(ev.encode())
    await resp.write_eof()
    return resp


def chunk(delta: dict | None = None, finish_reason: str | None = None, **extra) -> str:
    """One chat.completion.chunk as an SSE data event."""
    obj = {"id": "fake-1", "object": "chat.completion.chunk", "model": "fake",
           "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish_reason}], **extra}
    return "data: " + orjson.dumps(obj).decode() + "\n\n"


DONE = "data: [DONE]\n\n"


class FakeServer:
    def __init__(self, handler: Handler, path: str = "/v1/chat/completions", gets: dict[str, Handler] | None = None,
                 ssl_context=None):
        self.handler = handler
        self.path = path
        self.gets = dict(gets or {})  # more GET routes (path -> handler), e.g. llama.cpp's /props
        # bound here on a port the kernel picks, listened on by the server's thread: no other process
        # can take the port between finding it free and binding it
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.ssl_context = ssl_context  # an ssl.SSLContext: the server speaks TLS (https://)
        self.url = f"{'https' if ssl_context else 'http'}://127.0.0.1:{self.port}/v1"
        self.requests: list[dict] = []
        self.headers: list[dict[str, str]] = []
        self.paths: list[str] = []  # path and query string of each request, in order
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None

    async def _record(self, request: web.Request) -> web.StreamResponse:
        self.headers.append(dict(request.headers))
        self.paths.append(request.path_qs)
        try:
            self.requests.append(orjson.loads(await request.read()))
        except orjson.JSONDecodeError:
            self.requests.append({})
        return await self.handler(request)

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "fake", "object": "model"}]})

    async def _main(self) -> None:
        app = web.Application()
        app.router.add_post(self.path, self._record)
        app.router.add_get("/v1/models", self._models)
        for path, h in self.gets.items():
            app.router.add_get(path, h)
        # at the end, a handler still running (one that hangs on purpose) is cancelled after
        # SHUTDOWN_GRACE_S instead of aiohttp's 60 s, past __exit__'s 10 s join: the test is done with it
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=SHUTDOWN_GRACE_S)
        await runner.setup()
        site = web.SockSite(runner, self._sock, ssl_context=self.ssl_context)
        await site.start()
        self._stop = asyncio.Event()
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            await runner.cleanup()

    def __enter__(self) -> "FakeServer":
        def target() -> None:
            self._loop = asyncio.new_event_loop()
            self._loop.run_until_complete(self._main())
            self._loop.close()

        self._thread = threading.Thread(target=target, daemon=True, name="fakeserver")
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("fake server did not start within 10 s")
        return self

    def __exit__(self, *exc) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(10)
        self._sock.close()
