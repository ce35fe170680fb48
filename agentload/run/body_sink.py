"""Hand a response body to a callback once per network read, as aiohttp's parser delivers it.

A streamed body read with `await content.readany()` costs, for every network read, a future
resolved, a task woken and stepped, and the stream's buffer bookkeeping, before our own code
sees a byte. Here the body's aiohttp `StreamReader` is switched, for the length of one
response, to a subclass whose `feed_data` keeps what the parser hands it, and the connection's
HTTP parser is wrapped (`_ReadHook`) so that once the parser is through with a read, everything
that read carried goes to `feed(data, now)` in one call, `now` being the read's arrival (taken
before the parser ran): the SSE decoder, the chunk accumulator and every timestamp run right
where the bytes arrive, before any other task runs, once per read and not once per HTTP chunk
(a server that writes a whole answer at once sends it as 30+ chunks in one read), and the
request's task wakes once, at the end of the body. Without the connection's protocol (or with a
parser this module does not know), `feed` is called once per HTTP chunk instead, with the same
result.

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
`read_timeout` property, `_drop_timeout`, `_on_read_timeout` and `_parser` (the parser
`data_received` hands each read to). If anything is missing, every body is read with
`readany()` (the transport prints one warning line naming what was missing).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable

from aiohttp.streams import StreamReader

__all__ = ["missing_hooks", "read_body", "supported"]

_now = time.perf_counter_ns


class _Sink(asyncio.Future):
    """The future the request waits on (resolved at EOF or on error), carrying the callback and,
    while a read is being parsed, the body bytes it carried so far (`pieces`)."""

    __slots__ = ("feed", "error", "pieces")
    feed: Callable[[bytes, int], None]
    error: BaseException | None
    pieces: list[bytes]


class _SinkReader(StreamReader):
    """Same layout as StreamReader (no new slots), so a live reader can switch class and back.

    While the sink is attached it sits in `_eof_waiter`, the slot StreamReader resolves at
    EOF (`feed_eof`) and on error (`set_exception`). Each block the parser delivers is kept in
    the sink's `pieces`, for `_ReadHook` to hand over once the read is parsed.
    """

    __slots__ = ()

    def feed_data(self, data: bytes, size: int = 0) -> bool:
        sink = self._eof_waiter
        if type(sink) is not _Sink:
            return StreamReader.feed_data(self, data, size)
        if data:
            sink.pieces.append(data)
        return False

    # Chunked transfer encoding: the boundaries only matter to readchunk(), which nobody calls on
    # a body read through a sink; keeping them would grow a deque per chunk and eventually pause
    # reading. (Past the sink's end, an error, the reader only buffers what still comes, for no
    # one: the connection is not reused.) The C parser calls both twice per HTTP chunk (70 times
    # for a 35-chunk answer in one read): a builtin that takes no argument and does nothing costs
    # half a Python method's call from C. (A bound builtin is no descriptor: no `self` is passed.)
    begin_http_chunk_receiving = end_http_chunk_receiving = ().__len__  # type: ignore[assignment]


class _ChunkSinkReader(_SinkReader):
    """No parser hook (no protocol given): each block goes to `feed` as the parser delivers it."""

    __slots__ = ()

    def feed_data(self, data: bytes, size: int = 0) -> bool:
        sink = self._eof_waiter
        if type(sink) is not _Sink:
            return StreamReader.feed_data(self, data, size)
        if data:
            self.total_bytes += len(data)
            _feed(self, sink, data, _now())
        return False


def _feed(reader: StreamReader, sink: _Sink, data: bytes, now: int) -> None:
    try:
        sink.feed(data, now)
    except Exception as e:  # a bug in the callback must not break aiohttp's parser
        _failed(reader, sink, e)


def _failed(reader: StreamReader, sink: _Sink, e: Exception) -> None:
    """The callback raised: the body's read fails with it (raised by read_body, also when the
    body had already ended in the read that made it fail)."""
    if sink.error is None:
        sink.error = e
    if not sink.done():
        reader.set_exception(e)


class _ReadHook:
    """Stands in for the connection's HTTP parser while a body goes to a sink: the parser's own
    work on one read, then everything the read carried to the sink in one call, stamped with the
    read's arrival. Anything else asked of it is the parser's."""

    __slots__ = ("parser", "protocol", "reader", "sink", "pieces", "feed")
    # It stays in place until read_body ends, also past the body's end (the connection may be back
    # in the pool by then): it only ever hands the parser's work through, and the next request on
    # the connection puts a parser of its own there first (`set_response_params`).

    def __init__(self, parser: Any, protocol: Any, reader: StreamReader, sink: _Sink):
        self.parser = parser
        self.protocol = protocol
        self.reader = reader
        self.sink = sink
        self.pieces = sink.pieces
        self.feed = sink.feed

    def feed_data(self, data: bytes) -> Any:
        now = _now()
        try:
            return self.parser.feed_data(data)
        finally:
            pieces = self.pieces
            if pieces:
                block = b"".join(pieces)  # (one piece: that same bytes object)
                pieces.clear()
                self.reader.total_bytes += len(block)
                try:
                    self.feed(block, now)
                except Exception as e:  # a bug in the callback must not break aiohttp's parser
                    _failed(self.reader, self.sink, e)

    def unhook(self) -> None:
        if self.protocol._parser is self:
            self.protocol._parser = self.parser

    def __getattr__(self, name: str) -> Any:
        return getattr(self.parser, name)


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
    code = getattr(getattr(ResponseHandler, "data_received", None), "__code__", None)
    if code is None or not {"_parser", "feed_data"} <= set(code.co_names) or not hasattr(ResponseHandler, "_parser"):
        missing.append("ResponseHandler._parser (data_received hands each read to its feed_data)")
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


async def read_body(content: StreamReader, feed: Callable[[bytes, int], None], protocol: Any = None,
                    last_byte_ns: Callable[[], int] | None = None) -> bool:
    """Read the whole body into `feed(data, now)`; False (nothing consumed) if this path is unavailable.

    With the connection's `protocol`, `feed` gets each network read once (see the module
    docstring), and with `last_byte_ns` (perf_counter_ns of the last read fed) the idle read
    timeout is kept by one lazy timer instead of aiohttp's timer per read.
    """
    if not supported(content) or content._eof_waiter is not None or content._waiter is not None:
        return False
    exc = content.exception()
    if exc is not None:
        raise exc
    if content._buffer:  # what arrived with the headers, before we got here
        feed(content.read_nowait(-1), _now())
    if content.is_eof():
        return True
    sink = _Sink(loop=content._loop)
    sink.feed = feed
    sink.error = None
    sink.pieces = []
    idle = None
    hook = None
    if protocol is not None:
        if last_byte_ns is not None:
            read_timeout = getattr(protocol, "read_timeout", None)
            if read_timeout and hasattr(protocol, "_drop_timeout") and hasattr(protocol, "_on_read_timeout"):
                # aiohttp sets read_timeout again for the next request on this connection
                protocol.read_timeout = None
                protocol._drop_timeout()
                idle = _IdleTimer(content._loop, read_timeout, last_byte_ns, protocol._on_read_timeout, sink)
        parser = getattr(protocol, "_parser", None)
        if parser is not None and type(parser) is not _ReadHook and hasattr(parser, "feed_data"):
            hook = _ReadHook(parser, protocol, content, sink)
            protocol._parser = hook
    content._eof_waiter = sink
    content.__class__ = _SinkReader if hook is not None else _ChunkSinkReader
    try:
        with content._timer:  # aiohttp's `total` timeout cancels the tasks inside this context
            await sink
    finally:
        if idle is not None:
            idle.cancel()
        if hook is not None:
            hook.unhook()
        content.__class__ = StreamReader
        if content._eof_waiter is sink:
            content._eof_waiter = None
    if sink.pieces:  # kept by the reader but not handed over by the hook (a parser that went around it)
        block = b"".join(sink.pieces)
        sink.pieces.clear()
        content.total_bytes += len(block)
        _feed(content, sink, block, _now())
    if sink.error is not None:  # the callback failed (after the body ended, in the read that ended it)
        raise sink.error
    return True
