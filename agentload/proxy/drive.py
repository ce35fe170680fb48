"""The proxy as a run: its server is what drives the requests (`runner.InProcess`'s `drive`)."""

from __future__ import annotations

import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web

from agentload.proxy.server import Proxy, make_server

if TYPE_CHECKING:
    from agentload.run.context import RunContext


def drive(sock: socket.socket, upstream: str, session_header: str | None, log=None, bodies: Path | None = None):
    """`InProcess`'s drive: serve the proxy on `sock` until the run stops, then let the requests in
    flight end (the runner bounds that by give_up_s) and close."""
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))

    async def run(ctx: "RunContext") -> None:
        proxy = Proxy(ctx, upstream, session_header, bodies)
        # handler_cancellation: a harness that closes its connection cancels its request upstream too
        runner = web.ServerRunner(make_server(proxy, handler_cancellation=True, access_log=None),
                                  shutdown_timeout=ctx.scenario.stall.give_up_s)
        await runner.setup()
        try:
            await web.SockSite(runner, sock).start()
            host, port = sock.getsockname()[:2]
            shown = f"[{host}]" if ":" in host else host
            log(f"agentload proxy: listening on http://{shown}:{port} -> {upstream}; point the harness's base URL "
                f"at http://{shown}:{port}/v1 (Ctrl-C ends it and writes the report)")
            await ctx.stop_event.wait()
        finally:
            await runner.cleanup()
            proxy.close()

    return run
