"""Hand each block of a response body to a callback as aiohttp's parser delivers it.

A streamed body read with `await content.readany()` costs, for every network read, a future
resolved, a task woken and stepped, and the stream's buffer bookkeeping, before our own code
sees a byte. Here the body's aiohttp `StreamReader` is switched, for the length of one
response, to a subclass whose `feed_data` calls `feed(data)` directly from the protocol's
`data_received`: the SSE decoder, the chunk accumulator and every timestamp run right where the
bytes arrive (so the stamps are also taken earlier, before any other task runs), and the
request's task wakes once, at the end of the body.

Everything else stays aiohttp's: the connection goes back to the pool through the stream's own
EOF callbacks, a read timeout or a broken connection arrives through `set_exception`, and the
`total` timeout through the stream's timer context, exactly as for `readany()`.

The idle read timeout (`sock_read`): aiohttp cancels and re-arms a timer on every network read.
While a body goes to a sink, that timer is replaced by one lazy timer per response: it wakes
`sock_read` seconds after the last byte it knows of, looks at the time of the last byte
(`last_byte_ns()`), and either re-arms for the remainder or fires aiohttp's own read-timeout
handler (same exception, same message, the connection is not reused).

`read_body` returns False when this path cannot be taken (another StreamReader type, a reader
someone else is waiting on, an aiohttp without the internals below): the caller then reads with
`readany()`, which gives the same result.

The aiohttp internals this path relies on (pyproject pins the minor versions they were tested
with) are checked once per process by `missing_hooks()`: StreamReader's `_eof_waiter`,
`_waiter`, `_buffer`, `_loop`, `_timer` (a context manager), `total_bytes`, the methods the
parser and `read_body` call, a class swap to `_SinkReader` and back, and ResponseHandler's
`read_timeout` property, `_drop_timeout` and `_on_read_timeout`. If anything is missing, every
body is read with `readany()` (the transport prints one warning line naming what was missing).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable

from aiohttp.streams import StreamReader

__all__ = ["missing_hooks", "read_body", "supported"]


class _Sink(asyncio.Future):
    """The future the request waits on (resolved at EOF or on error), carrying the callback."""

    __slots__ = ("feed", "error")


class _SinkReader(StreamReader):
    """Same layout as StreamReader (no new slots), so a live reader can switch class and back.

    While the sink is attached it sits in `_eof_waiter`, the slot StreamReader resolves at
    EOF (`feed_eof`) and on error (`set_exception`).
    """

    __slots__ = ()

    def feed_data(self, data: bytes, size: int = 0) -> bool:
        sink = self._eof_waiter
        if type(sink) is not _Sink:
            return StreamReader.feed_data(self, data, size)
        if data:
            self.total_bytes += len(data)
            try:
                sink.feed(data)
            except Exception as e:  # a bug in the callback must not break aiohttp's parser
                sink.error = e
                self.set_exception(e)
        return False

    # Chunked transfer encoding: the boundaries only matter to readchunk(); keeping them would
    # grow a deque per chunk and eventually pause reading.
    def begin_http_chunk_receiving(self) -> None:
        if type(self._eof_waiter) is not _Sink:
            StreamReader.begin_http_chunk_receiving(self)

    def end_http_chunk_receiving(self) -> None:
        if type(self._eof_waiter) is not _Sink:
            StreamReader.end_http_chunk_receiving(self)


class _IdleTimer:
    """One timer per response instead of one per read: see the module docstring."""

    __slots__ = ("loop", "timeout_ns", "last_byte_ns", "fire", "sink", "handle")

    def __init__(self, loop: asyncio.AbstractEventLoop, timeout_s: float, last_byte_ns: Callable[[], int],
                 fire: Callable[[], None], sink: asyncio.Future):
        self.loop = loop
        self.timeout_ns = int(timeout_s * 1e9)
        self.last_byte_ns = last_byte_ns
        self.fire = fire
        self.sink = sink
        self.handle = loop.call_later(timeout_s, self._check)

    def _check(self) -> None:
        if self.sink.done():  # the body ended (or failed) first: the connection may serve another request now
            return
        idle = time.perf_counter_ns() - self.last_byte_ns()
        if idle >= self.timeout_ns:
            self.fire()
        else:
            self.handle = self.loop.call_later((self.timeout_ns - idle) / 1e9, self._check)

    def cancel(self) -> None:
        self.handle.cancel()


_READER_ATTRS = ("_eof_waiter", "_waiter", "_buffer", "_loop", "_timer", "total_bytes")
_READER_METHODS = ("feed_data", "feed_eof", "set_exception", "exception", "read_nowait", "is_eof",
                   "begin_http_chunk_receiving", "end_http_chunk_receiving")
_PROTOCOL_METHODS = ("_drop_timeout", "_on_read_timeout")
_missing: list[str] | None = None  # None: not checked yet in this process


def _check() -> list[str]:
    """The aiohttp internals the sink path needs that this aiohttp lacks ([] when all are there)."""
    missing = [f"StreamReader.{m}()" for m in _READER_METHODS if not callable(getattr(StreamReader, m, None))]
    try:  # a reader as the connection makes it (it keeps the loop it is given and calls nothing on it)
        r = StreamReader(_NoProtocol(), 2 ** 16, loop=_NO_LOOP)  # type: ignore[arg-type]
    except Exception as e:
        return missing + [f"StreamReader(protocol, limit, loop=...) ({e.__class__.__name__}: {e})"]
    missing += [f"StreamReader.{a}" for a in _READER_ATTRS if not hasattr(r, a)]
    if getattr(r, "_eof_waiter", 0) is not None or getattr(r, "_waiter", 0) is not None:
        missing.append("StreamReader._eof_waiter/_waiter (None on a new reader)")
    timer = getattr(r, "_timer", None)
    if timer is not None and not (hasattr(timer, "__enter__") and hasattr(timer, "__exit__")):
        missing.append("StreamReader._timer (a context manager)")
    try:
        r.__class__ = _SinkReader
        r.__class__ = StreamReader
    except TypeError:
        missing.append("StreamReader layout (class swap to a subclass with no new slots)")
    try:
        from aiohttp.client_proto import ResponseHandler
    except ImportError:
        return missing + ["aiohttp.client_proto.ResponseHandler"]
    rt = getattr(ResponseHandler, "read_timeout", None)
    if not isinstance(rt, property) or rt.fset is None:
        missing.append("ResponseHandler.read_timeout (a settable property)")
    missing += [f"ResponseHandler.{m}()" for m in _PROTOCOL_METHODS if not callable(getattr(ResponseHandler, m, None))]
    return missing


class _NoProtocol:
    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...


_NO_LOOP = object()


def missing_hooks() -> list[str]:
    """What the sink path needs from aiohttp's internals and this aiohttp lacks; checked once per
    process. Empty: the sink path is used; otherwise every body is read with `readany()`."""
    global _missing
    if _missing is None:
        _missing = _check()
    return _missing


def supported(content: object) -> bool:
    return type(content) is StreamReader and not missing_hooks()


async def read_body(content: StreamReader, feed: Callable[[bytes], None], protocol: Any = None,
                    last_byte_ns: Callable[[], int] | None = None) -> bool:
    """Read the whole body into `feed`; False (nothing consumed) if this path is unavailable.

    With the connection's `protocol` and `last_byte_ns` (perf_counter_ns of the last read fed),
    the idle read timeout is kept by one lazy timer instead of aiohttp's timer per read.
    """
    if not supported(content) or content._eof_waiter is not None or content._waiter is not None:
        return False
    exc = content.exception()
    if exc is not None:
        raise exc
    if content._buffer:  # what arrived with the headers, before we got here
        feed(content.read_nowait(-1))
    if content.is_eof():
        return True
    sink = _Sink(loop=content._loop)
    sink.feed = feed
    sink.error = None
    idle = None
    if last_byte_ns is not None and protocol is not None:
        read_timeout = getattr(protocol, "read_timeout", None)
        if read_timeout and hasattr(protocol, "_drop_timeout") and hasattr(protocol, "_on_read_timeout"):
            # aiohttp sets read_timeout again for the next request on this connection
            protocol.read_timeout = None
            protocol._drop_timeout()
            idle = _IdleTimer(content._loop, read_timeout, last_byte_ns, protocol._on_read_timeout, sink)
    content._eof_waiter = sink
    content.__class__ = _SinkReader
    try:
        with content._timer:  # aiohttp's `total` timeout cancels the tasks inside this context
            await sink
    finally:
        if idle is not None:
            idle.cancel()
        content.__class__ = StreamReader
        if content._eof_waiter is sink:
            content._eof_waiter = None
    return True
