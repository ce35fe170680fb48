"""The floors of a proxy: a TCP relay that passes every read on at once and understands nothing,
and (`--http`) a plain aiohttp proxy that forwards each request and passes each block of its answer
on as it arrives, reading and recording nothing.

Each connection accepted on loopback gets its own connection to the upstream; whatever one side's
read returns is written to the other side in the same callback (asyncio Protocols on uvloop, no
HTTP parsing, no task per connection, no records). It is what any proxy that forwards each block
as it arrives must pay at the least: per block one read and one write, the write being the one
that carries the loopback's delivery to the reader (on Linux the sender's system call runs the
receiving side's TCP stack and wakes the reader). `bench.proxy` runs the same client through it
beside `agentload proxy`, so the proxy's CPU can be read against what forwarding alone costs, and
`--http` against what HTTP on both sides costs (aiohttp's low-level server and its client, as
`agentload proxy` uses them) before agentload reads, times or records anything.

    python -m bench.relay --upstream 127.0.0.1:PORT [--http]    # prints BENCH_RELAY_LISTENING port=P
"""

from __future__ import annotations

import argparse
import asyncio
import sys


class _Side(asyncio.Protocol):
    """One end of a relayed connection: what it reads goes to `peer`'s transport."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: _Side | None = None
        self.pending: list[bytes] = []  # read before the upstream connection was made (then sent at once)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        peer = self.peer
        if peer is not None and peer.transport is not None:
            peer.transport.write(data)
        else:
            self.pending.append(data)

    def connection_lost(self, exc: Exception | None) -> None:
        peer = self.peer
        if peer is not None and peer.transport is not None:
            peer.transport.close()


async def serve(upstream_host: str, upstream_port: int) -> None:
    loop = asyncio.get_running_loop()

    def accepted() -> _Side:
        down = _Side()

        async def connect() -> None:
            try:
                _, up = await loop.create_connection(_Side, upstream_host, upstream_port)
            except OSError:
                if down.transport is not None:
                    down.transport.close()
                return
            up.peer, down.peer = down, up
            if down.transport is None or down.transport.is_closing():
                up.transport.close()  # type: ignore[union-attr]  (the client left before the upstream answered)
                return
            for side in (down, up):  # what either side read before the two were joined
                if side.pending:
                    side.peer.transport.write(b"".join(side.pending))  # type: ignore[union-attr]
                    side.pending.clear()

        loop.create_task(connect())
        return down

    server = await loop.create_server(accepted, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    print(f"BENCH_RELAY_LISTENING port={port}", flush=True)
    async with server:
        await server.serve_forever()


async def serve_http(upstream_host: str, upstream_port: int) -> None:
    import aiohttp
    from aiohttp import web

    base = f"http://{upstream_host}:{upstream_port}"
    hop = {"connection", "keep-alive", "transfer-encoding", "host", "content-length", "upgrade", "te", "trailer"}
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), auto_decompress=False)

    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in hop}
        async with session.request(request.method, base + request.rel_url.path_qs, data=body or None,
                                   headers=headers, allow_redirects=False) as up:
            resp = web.StreamResponse(status=up.status, reason=up.reason)
            for k, v in up.headers.items():
                if k.lower() not in hop:
                    resp.headers.add(k, v)
            await resp.prepare(request)
            async for block in up.content.iter_any():
                await resp.write(block)
            await resp.write_eof()
            return resp

    loop = asyncio.get_running_loop()
    server = await loop.create_server(web.Server(handle), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    print(f"BENCH_RELAY_LISTENING port={port}", flush=True)
    try:
        async with server:
            await server.serve_forever()
    finally:
        await session.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--upstream", required=True, help="host:port of the server")
    ap.add_argument("--http", action="store_true", help="a plain aiohttp proxy instead of a TCP relay")
    a = ap.parse_args(argv)
    host, _, port = a.upstream.rpartition(":")
    if host not in ("127.0.0.1", "localhost", "::1", "[::1]"):
        print(f"bench.relay: --upstream {a.upstream}: expected a loopback host:port", file=sys.stderr)
        return 2
    import uvloop

    try:
        uvloop.run((serve_http if a.http else serve)(host.strip("[]"), int(port)))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
