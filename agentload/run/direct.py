"""A request sent on an aiohttp pool without ClientSession's per-request layers.

`session.post` builds, for every request, a merged header map, a URL, a `ClientRequest` (eleven
`update_*` steps over headers, host, auth, cookies, body, encoding), a `StreamWriter`, a task to
write the body and a `ClientResponse`: at burst 64 on bench/server.py, 302 us of CPU a request
through them, 245 us through `DirectPost` (`python -m bench.ab --only direct`). This is the same
exchange on the same connector, protocol and parser:

- aiohttp's: the connector (the pool, its limits, keep-alive, pool and connect timeouts, TLS, and
  the traced connector's stamps), the connection's protocol and C parser, the body's StreamReader
  (so `body_sink`), the exception classes, the `total` timeout (aiohttp's TimerContext, which the
  body's reads also run under, armed as its TimeoutHandle arms it) and the `sock_read` timer.
- agentload's: the request head, serialised from the session's headers once per pool (only the
  request id and Content-Length change per request), written with the body in one transport
  write at the end of the loop step in which the request was made ready, with the other requests
  of that step (`WRITE_AT_STEP_END`; a body at or above the transport's high-water mark, and a
  request of `agentload proxy`, at once); `sent` stamped once the write is handed to the transport
  (after a drain, if the transport asked for one). No redirect is followed (a 3xx is an answer,
  judged as any other: agents POST to an API) and no cookie is kept. A body the server compressed
  though agentload asked for identity is decompressed by aiohttp's parser (gzip, deflate), as
  under `session.post`.

Its aiohttp internals (pyproject pins the aiohttp minors they were tested with) are checked once
per process (`missing_hooks`); if any is missing, requests go through `session.post` as before and
the transport prints one warning line naming what was missing.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from math import ceil
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import http_exceptions
from aiohttp.client_exceptions import ClientConnectionResetError
from aiohttp.client_reqrep import ClientRequest
from aiohttp.helpers import TimerContext, TimerNoop
from yarl import URL

if TYPE_CHECKING:
    from agentload.records import Trace

__all__ = ["DirectPost", "missing_hooks"]

_now = time.perf_counter_ns

# set_response_params as ClientSession._request calls it for a POST (the values from the session)
_PARAMS = ("timer", "skip_payload", "read_until_eof", "auto_decompress", "read_timeout", "read_bufsize",
           "timeout_ceil_threshold", "max_line_size", "max_field_size")


def _line(name: str, value: str) -> str:
    """One header line; a CR or LF in either half would let a value write headers of its own."""
    line = f"{name}: {value}"
    if "\r" in line or "\n" in line:
        raise ValueError(f"header {name!r}: a newline or carriage return in a header name or value")
    return line + "\r\n"


class _Response:
    """What `request._exchange` reads of a response: status, headers, the body's StreamReader and
    the connection (whose protocol `body_sink` hooks)."""

    __slots__ = ("status", "headers", "content", "connection")

    def __init__(self, status: int, headers: Any, content: aiohttp.StreamReader, connection: Any):
        self.status = status
        self.headers = headers
        self.content = content
        self.connection = connection

    async def read(self) -> bytes:
        return await self.content.read()


# A request's write is made at the end of the loop step in which it became ready, together with
# the others made ready in that step, as aiohttp's own body-writing task makes it. Written at once
# instead, the requests of a burst (answers that arrived together, each agent's next request built
# from its own) leave one by one, a whole agent's answer handling apart (~180 us at burst 64), and a
# server that sleeps between them is woken for each: on bench/server.py it woke twice as often as
# for a raw aiohttp loop (epoll_wait 4,400 against 2,200 for 3,840 requests), and each wake-up of a
# process on another core costs the sending client's kernel time. Off: `--ablate writestep`.
WRITE_AT_STEP_END = True


def _high_water(transport: Any) -> int:
    """The write buffer's high-water mark: a request smaller than it never pauses writing, so its
    write can be left to a callback with no drain to wait for."""
    try:
        return transport.get_write_buffer_limits()[1]
    except (AttributeError, NotImplementedError):
        return 0


def _written(proto: Any, transport: Any, tr: "Trace | None", url: Any) -> None:
    """A request's write handed to the transport: `sent` stamped and the `sock_read` timer started
    (as after aiohttp's body write), or, when the connection closed under the write (the transport
    closes itself on a send error and tells the protocol a loop step later), the request failed in
    `send`, with no `sent`: the error goes to the protocol its response is read from."""
    if transport.is_closing() or proto.exception() is not None:
        if proto.exception() is None:
            proto.set_exception(aiohttp.ClientOSError(
                f"Can not write request for {url}: the connection was closed under the write"))
        return
    if tr is not None:
        tr.t["sent"] = _now()
    proto.start_timeout()


def _write_request(proto: Any, transport: Any, head: bytes, body: bytes, tr: "Trace | None", url: Any) -> None:
    """A request's write at the end of the loop step (`WRITE_AT_STEP_END`). A connection closed by
    then (the request given up and its connection closed, or the server's close read in between)
    fails the request as a write to a closing transport does."""
    if transport.is_closing():
        if proto.exception() is None:
            proto.set_exception(ClientConnectionResetError("Cannot write to closing transport"))
        return
    transport.writelines((head, body))
    _written(proto, transport, tr, url)


class DirectPost:
    """POSTs to one URL on one session's pool (see the module docstring); `post(...)` is used as
    `session.post(...)` is: `async with direct.post(body, headers, trace, timeout) as resp`. `body`:
    bytes, or an object whose `raw()` gives them (`request.ConversationBody`), asked for once a
    connection is there."""

    __slots__ = ("url", "connector", "loop", "template", "head", "params", "names", "lines")

    def __init__(self, session: aiohttp.ClientSession, url: str):
        u = URL(url)
        connector = session.connector
        assert connector is not None
        self.url = url
        self.connector = connector
        self.loop = session._loop  # (the public `loop` property is deprecated)
        # what connector.connect reads of a request (host, port, TLS, proxy), made once; never sent
        self.template = ClientRequest("POST", u, loop=self.loop, ssl=True)
        names = self.names = {k.lower() for k in session.headers}
        lines = self.lines = [(k.lower(), _line(k, v)) for k, v in session.headers.items()]
        if "host" not in names:
            lines.insert(0, ("host", _line("Host", u.host_port_subcomponent or "")))
        if connector.force_close and "connection" not in names:
            lines.append(("connection", "Connection: close\r\n"))
        lines.insert(0, ("", f"POST {u.raw_path_qs} HTTP/1.1\r\n"))
        self.head = "".join(line for _, line in lines).encode()  # (the API key is in these bytes, and nowhere else here)
        self.params: dict[str, Any] = {
            "skip_payload": False, "read_until_eof": True, "auto_decompress": True,
            "read_bufsize": getattr(session, "_read_bufsize", 2 ** 16),
            "timeout_ceil_threshold": getattr(connector, "_timeout_ceil_threshold", 5),
            "max_line_size": getattr(session, "_max_line_size", 8190),
            "max_field_size": getattr(session, "_max_field_size", 8190)}
        if _takes_max_headers:
            self.params["max_headers"] = getattr(session, "_max_headers", 128)

    def post(self, body: Any, headers: dict[str, str], trace: "Trace | None",
             timeout: aiohttp.ClientTimeout, now: bool = False) -> "_Exchange":
        """`now`: the request written at once, not at the end of the loop step (`WRITE_AT_STEP_END`)."""
        return _Exchange(self, body, headers, trace, timeout, now)


class _Exchange:
    """One request and its response's start; leaving it hands the connection back to the pool (or
    closes it when its body was not read to the end, as aiohttp's `release` decides)."""

    __slots__ = ("post", "body", "headers", "trace", "timeout", "now", "handle", "conn")

    def __init__(self, post: DirectPost, body: Any, headers: dict[str, str], trace: "Trace | None",
                 timeout: aiohttp.ClientTimeout, now: bool):
        self.post = post
        self.now = now
        self.body = body
        self.headers = headers
        self.trace = trace
        self.timeout = timeout
        self.handle: asyncio.TimerHandle | None = None
        self.conn: Any = None

    async def __aenter__(self) -> _Response:
        p = self.post
        tm = self.timeout
        total = tm.total
        timer: Any
        if total is not None and total > 0:
            # the `total` timeout armed as aiohttp's TimeoutHandle arms it (start() and timer()), its
            # one callback called directly: the handle's own object, list and call per request saved
            timer = TimerContext(p.loop)
            when = p.loop.time() + total
            if total >= tm.ceil_threshold:
                when = ceil(when)
            self.handle = p.loop.call_at(when, timer.timeout)
        else:
            timer = TimerNoop()
        try:
            with timer:  # the `total` timeout: cancels this task, raised here as asyncio.TimeoutError
                try:
                    conn = self.conn = await p.connector.connect(p.template, [], tm)
                except asyncio.TimeoutError as e:  # the pool (connect) timeout, named as aiohttp names it
                    raise aiohttp.ConnectionTimeoutError(f"Connection timeout to host {p.template.url}") from e
                proto = conn.protocol
                if proto is None:  # a connection just made holds its protocol until released
                    raise ClientConnectionResetError("Cannot write to closing transport")
                proto.set_response_params(timer=timer, read_timeout=tm.sock_read, **p.params)
                body = self.body
                if body.__class__ is not bytes:  # a conversation's body: its bytes asked for only now, so
                    body = body.raw()             # that it stays parked while the request waits for the pool
                headers = self.headers
                fixed = p.head
                if headers and not p.names.isdisjoint([k.lower() for k in headers]):
                    # a request's own header replaces the session's of that name, as in session.post
                    own = {k.lower() for k in headers}
                    fixed = "".join(line for name, line in p.lines if name not in own).encode()
                head = fixed + ("".join([_line(k, v) for k, v in headers.items()])
                                + f"Content-Length: {len(body)}\r\n\r\n").encode()
                transport = proto.transport
                if transport is None or transport.is_closing():
                    raise ClientConnectionResetError("Cannot write to closing transport")
                if WRITE_AT_STEP_END and not self.now and len(head) + len(body) < _high_water(transport):
                    # written with the other requests made ready in this loop step, at its end (see
                    # `_write_request`); the answer cannot come before the request: read from now on
                    p.loop.call_soon(_write_request, proto, transport, head, body, self.trace, p.template.url)
                else:
                    transport.writelines((head, body))
                    if proto.writing_paused:
                        await proto._drain_helper()
                    _written(proto, transport, self.trace, p.template.url)  # (a failed write: raised by read)
                while True:
                    try:
                        message, payload = await proto.read()
                    except http_exceptions.HttpProcessingError as e:
                        raise aiohttp.ClientResponseError(p.template.request_info, (), status=e.code,
                                                          message=e.message, headers=e.headers) from e
                    if message.code < 100 or message.code > 199 or message.code == 101:
                        break
                payload.on_eof(conn.release)  # back to the pool as soon as the body has ended
                return _Response(message.code, message.headers, payload, conn)
        # Before the response's head is in, a failed or cancelled request leaves its connection
        # closed: the server may still answer it, and the next request on it would read that answer.
        except aiohttp.ClientError:
            self._end(close=True)
            raise
        except OSError as e:  # as ClientSession._request wraps it
            self._end(close=True)
            if e.errno is None and isinstance(e, asyncio.TimeoutError):
                raise
            raise aiohttp.ClientOSError(*e.args) from e
        except BaseException:
            self._end(close=True)
            raise

    def _end(self, close: bool) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None
        conn = self.conn
        if conn is not None:
            self.conn = None
            if close:
                conn.close()
            else:  # back to the pool, or closed when the protocol says it cannot be reused (a body
                conn.release()  # not read to its end, an error on it): aiohttp's rule on release

    async def __aexit__(self, *exc: Any) -> None:
        self._end(close=False)


_missing: list[str] | None = None
_takes_max_headers = False


def missing_hooks() -> list[str]:
    """The aiohttp internals DirectPost needs that this aiohttp lacks ([]: all there); checked
    once per process."""
    global _missing, _takes_max_headers
    if _missing is None:
        missing = []
        from aiohttp.client_proto import ResponseHandler

        try:
            params = set(inspect.signature(ResponseHandler.set_response_params).parameters)
        except (TypeError, ValueError):
            params = set()
        if not set(_PARAMS) <= params:
            missing.append(f"ResponseHandler.set_response_params({', '.join(_PARAMS)})")
        _takes_max_headers = "max_headers" in params
        for name in ("read", "_drain_helper"):
            if not inspect.iscoroutinefunction(getattr(ResponseHandler, name, None)):
                missing.append(f"ResponseHandler.{name}()")
        for name in ("start_timeout", "exception"):
            if not callable(getattr(ResponseHandler, name, None)):
                missing.append(f"ResponseHandler.{name}()")
        if not isinstance(getattr(ResponseHandler, "writing_paused", None), property):
            missing.append("ResponseHandler.writing_paused")
        for cls, names in ((TimerContext, ("timeout", "__enter__", "__exit__")), (aiohttp.StreamReader, ("on_eof",))):
            missing += [f"{cls.__name__}.{n}()" for n in names if not callable(getattr(cls, n, None))]
        if not hasattr(URL, "host_port_subcomponent"):
            missing.append("yarl.URL.host_port_subcomponent")
        if not hasattr(http_exceptions, "HttpProcessingError"):
            missing.append("aiohttp.http_exceptions.HttpProcessingError")
        _missing = missing
    return _missing
