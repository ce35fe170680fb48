"""Send one request and read its answer to the end, stamping first byte, tokens and completion.

`send` is the one way a request goes out (agents, canaries, probes, and `agentload proxy` with a
`tap`): through agentload's queue in front of the pool when there is one, then the pool's direct
path (`direct`) or `session.post`. The answer is read by the request's API's reader (`apis`):
an event stream through `sse_body.SSEBody` on the parser's hook (`body_sink`), anything else
whole; what it was is `answer`'s verdict (`Result`: ok, or the error class that says why not).
An exception (a refused connection, a cut body, a timeout) is named by `classify_exception`.
"""

from __future__ import annotations

import asyncio
import email.utils
import re
import time
import uuid
from hashlib import sha1 as _sha1
from typing import TYPE_CHECKING, Any, Callable, Protocol

import aiohttp

from agentload import redact
from agentload.records import Trace
from agentload.run.answer import (
    Result,
    content_encoding_error,
    first_bytes,
    protocol_notes,
    stream_verdict,
    what_came,
    whole_verdict,
)
from agentload.run.body_sink import read_body
from agentload.run.chat_stream import ChatStream
from agentload.run.request_body import ConversationBody, body_bytes, wants_stream
from agentload.run.sse_body import SSEBody, server_stamp
from agentload.run.transport import current_trace

if TYPE_CHECKING:
    from agentload.run.direct import DirectPost

_now = time.perf_counter_ns
_ERROR_BODY_LIMIT = 300
_SSE_TYPE = "text/event-stream"
# the encodings aiohttp's parser decodes (br and zstd only with their packages: else it refuses the
# response's head, `_decode_refused`); any other Content-Encoding comes through as it was sent
_DECODED = frozenset({"identity", "gzip", "deflate", "br", "zstd"})
_DECODE_REFUSED = "can not decode content-encoding"



# uuid5(REQUEST_ID_NAMESPACE, readable id) is the id sent by default: a server's log line with it
# joins to the record (`Record.id_sent`), and anyone can recompute it from `Record.request_id`.
REQUEST_ID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "agentload:request-id")
_NS_BYTES = REQUEST_ID_NAMESPACE.bytes


def sent_request_id(readable: str, fmt: str = "uuid") -> str:
    """The value of the request id header for the readable id `<run>-a<agent>-r<round>-c<call>`:
    a UUID derived from it (`fmt` "uuid": servers such as llama-cpp-python answer 400 with an
    empty body to an X-Request-ID that is not a UUID), or the readable id itself ("readable")."""
    if fmt != "uuid":
        return readable
    # uuid.uuid5(REQUEST_ID_NAMESPACE, readable), written out: 0.9 us a request instead of 4
    x = _sha1(_NS_BYTES + readable.encode()).hexdigest()
    # version 5 in the 13th hex digit, the RFC 4122 variant (10xx) in the 17th
    return f"{x[:8]}-{x[8:12]}-5{x[13:16]}-{_VARIANT[x[16]]}{x[17:20]}-{x[20:32]}"


_VARIANT = {c: "89ab"[int(c, 16) & 3] for c in "0123456789abcdef"}


def empty_error_hint(status: int, session: aiohttp.ClientSession, id_header: str | None) -> str:
    """The error message of an HTTP error with an empty body: the names (never the values: some are
    secrets) of the headers agentload sent, since a server may refuse one of them without a word."""
    names = list(dict.fromkeys([*session.headers.keys(), *([id_header] if id_header else [])]))
    return (f"HTTP {status} with an empty body (agentload sent headers: {', '.join(names)}; "
            f"a server may reject a header's format)")



def _undecoded(headers: Any) -> str | None:
    """The response's Content-Encoding when aiohttp's parser did not decode it, else None."""
    enc = headers.get("Content-Encoding")
    if enc is None or enc.strip().lower() in _DECODED:
        return None
    return enc


def _decode_refused(e: aiohttp.ClientResponseError) -> Result | None:
    """aiohttp refused a response's head for an encoding it knows but cannot decode here (br
    without Brotli, zstd without its package): that answer, naming the encoding, else None."""
    msg = str(e.message)
    if _DECODE_REFUSED not in msg.lower():
        return None
    m = re.search(r"\((\w+)\)", msg)
    return content_encoding_error(m.group(1) if m else msg.rsplit(" ", 1)[-1], None, "", msg)



class Tap(Protocol):
    """Where a response goes on as it arrives (`send`'s `tap`): its head, then each block of its
    body as read, `write` being called right where the block arrives (on the parser's hook, before
    any other task runs, and before agentload reads the block: it must not wait; under backpressure
    it holds the upstream's reading), `wrote_first_token` after the write of the block that turned
    out to carry the answer's first token, and `flush` once the body has ended (what a held write
    still owes)."""

    async def head(self, resp: aiohttp.ClientResponse) -> None: ...

    def write(self, block: bytes) -> None: ...

    def wrote_first_token(self) -> None: ...

    async def flush(self) -> None: ...

    def client_gone(self) -> bool: ...



def retry_after_s(value: str | None, date: str | None = None, now: float | None = None) -> float | None:
    """The wait a `Retry-After` header asks for, in seconds (>= 0): a number of seconds, or an HTTP
    date, counted from the response's own `Date` header when it has one (the server's clock), else
    from `now` (time.time()). None: no header, or one that is neither."""
    if value is None:
        return None
    v = value.strip()
    try:
        x = float(v)
        return x if x >= 0 and x == x and x != float("inf") else None
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(v)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    base = None
    if date:
        try:
            base = email.utils.parsedate_to_datetime(date).timestamp()
        except (TypeError, ValueError, IndexError, AttributeError):
            base = None
    if base is None:
        base = time.time() if now is None else now
    return max(0.0, when.timestamp() - base)


def _retry_after(resp: aiohttp.ClientResponse) -> float | None:
    h = resp.headers
    return retry_after_s(h.get("Retry-After"), h.get("Date"))



async def send(session: aiohttp.ClientSession, url: str, body: "bytes | ConversationBody", trace: Trace,
               extra_headers: dict[str, str] | None = None, stream: bool | None = None,
               id_header: str | None = "X-Request-ID", tap: "Tap | None" = None,
               stream_cls: Any = ChatStream, done_grace_s: float = 1.0) -> Result:
    """One request; the caller wraps it in the give-up timeout the watchdog can fire.

    `done_grace_s`: how long past a stream's [DONE] its body's end is waited for (`SSEBody`).
    `tap`: where the response goes on as it arrives (`agentload proxy`: to the harness), its head
    first, then every block of its body as read (`Tap`).
    `stream_cls`: the reader of the answer in the request's API (`apis.<api>.Stream`; chat's by default).

    `stream`: whether the body asks for a stream (None: read from the body, `wants_stream`).
    `id_header`: the header that carries `trace.id_sent` (set by the caller, `agent.attempt`;
    when it is not, the readable `trace.request_id` is sent and recorded); None or "": no id sent.
    """
    t = trace.t
    if id_header:
        if trace.id_sent is None:
            trace.id_sent = trace.request_id
        headers = {id_header: trace.id_sent}
    else:
        headers = {}
    if extra_headers:
        headers.update(extra_headers)
    t["start"] = _now()
    # for the session's traced connector and request (this task's context only); let go after, so a
    # thinking agent does not keep its last request's trace alive
    token = current_trace.set(trace)
    if body.__class__ is not bytes:  # a body the transport may park while the request waits for the pool
        trace.body = body
    connector = session.connector
    gate = getattr(connector, "gate", None)  # agentload's queue in front of the pool, if any
    direct = getattr(connector, "direct", None)  # the pool's DirectPost, if the transport made one
    if direct is not None and direct.url != url:
        direct = None
    try:
        if gate is None:
            return await _exchange(session, url, body, trace, headers, stream, id_header, None, direct, tap,
                                   stream_cls, done_grace_s)
        timeout = None if gate.enter_now() else await gate.wait(trace, url)
        try:
            return await _exchange(session, url, body, trace, headers, stream, id_header, timeout, direct, tap,
                                   stream_cls, done_grace_s)
        finally:
            gate.leave()
    finally:
        trace.body = None
        current_trace.reset(token)


async def _exchange(session: aiohttp.ClientSession, url: str, body: "bytes | ConversationBody", trace: Trace,
                    headers: dict[str, str], stream: bool | None, id_header: str | None,
                    timeout: aiohttp.ClientTimeout | None, direct: "DirectPost | None" = None,
                    tap: "Tap | None" = None, stream_cls: Any = ChatStream, done_grace_s: float = 1.0) -> Result:
    """`send`'s request and response, read to the end (`timeout`: the session's, unless given; `direct`:
    sent through it, else through `session.post`)."""
    t = trace.t
    tm = session.timeout if timeout is None else timeout
    if direct is not None:
        # (a harness's request through `agentload proxy` goes upstream at once: the harness waits on it alone)
        cm: Any = direct.post(body, headers, trace, tm, now=tap is not None)
    else:
        cm = session.post(url, data=body, headers=headers, trace_request_ctx=trace, timeout=tm)
    try:
        return await _response(session, cm, body, trace, stream, id_header, tap, stream_cls, done_grace_s)
    except aiohttp.ClientResponseError as e:  # (a head aiohttp could not take: a refused encoding?)
        refused = _decode_refused(e)
        if refused is None:
            raise
        t.setdefault("end", _now())
        return refused


async def _response(session: aiohttp.ClientSession, cm: Any, body: "bytes | ConversationBody", trace: Trace,
                    stream: bool | None, id_header: str | None, tap: "Tap | None", stream_cls: Any,
                    done_grace_s: float) -> Result:
    """`_exchange`'s response (`cm`: the request, as `session.post` gives it), read to the end."""
    t = trace.t
    async with cm as resp:
        status = resp.status
        server = resp.headers.get("Server")
        if server:
            trace.server = server[:100]
        if "headers" not in t:  # (stamped by the on_request_end signal where TraceConfig stamps)
            t["headers"] = _now()
        if "sent" not in t:  # a request without a body, or headers before its body was through
            t["sent"] = t["headers"]
        if tap is not None:
            await tap.head(resp)
        if status >= 400:
            return await _error_answer(session, resp, trace, id_header, tap)
        ctype = resp.headers.get("Content-Type", "")
        enc = _undecoded(resp.headers)
        if enc is not None:  # nothing in it can be read: not read (the connection is not reused)
            t["end"] = _now()
            return content_encoding_error(enc, status, ctype)
        if _SSE_TYPE not in ctype and _SSE_TYPE not in ctype.lower():
            return await _whole_answer(resp, body, trace, stream, tap, stream_cls, ctype)
        return await _read_stream(resp, trace, tap, stream_cls, done_grace_s)


async def _error_answer(session: aiohttp.ClientSession, resp: aiohttp.ClientResponse, trace: Trace,
                        id_header: str | None, tap: "Tap | None") -> Result:
    """An HTTP error (status >= 400): its body, read whole, is the message."""
    status = resp.status
    raw = await resp.read()
    trace.t["end"] = _now()
    if tap is not None:
        tap.write(raw)
        await tap.flush()
    if not raw.strip():
        return Result(status, None, f"http_{status}", empty_error_hint(status, session, id_header), _retry_after(resp))
    # redacted before it is cut: a server that echoes the key must not leave a tail of it
    msg = redact.redact(raw[:4 * _ERROR_BODY_LIMIT].decode("utf-8", "replace"))
    msg = msg.replace("\n", " ")[:_ERROR_BODY_LIMIT]
    return Result(status, None, f"http_{status}", msg, _retry_after(resp))


async def _whole_answer(resp: aiohttp.ClientResponse, body: "bytes | ConversationBody", trace: Trace,
                        stream: bool | None, tap: "Tap | None", stream_cls: Any, ctype: str) -> Result:
    """A 2xx answer that is not an event stream, read whole: the answer, if no stream was asked for."""
    t = trace.t
    status = resp.status
    raw = await resp.read()
    now = _now()
    if tap is not None:
        tap.write(raw)
        await tap.flush()
    t["first_byte"] = t.get("first_byte", now)
    trace.bytes_in += len(raw)
    if stream is None:
        stream = wants_stream(body_bytes(body))
    t["end"] = now
    if stream:  # a stream was asked for: whatever this is, it is not the answer
        return Result(status, None, "not_a_stream",
                      f"{what_came(status, ctype)}, not an event stream: {first_bytes(raw)}")
    cs = stream_cls.from_response(raw)
    trace.chunks = 1
    trace.bad_events = cs.bad_json
    if cs.error is None and cs.not_completion is None and cs.token_chunks:
        t["first_token"] = now
        trace.token_reads = 1
        trace.last_token = now
        trace.server_first_token_ns = server_stamp(raw)
        trace.first_output = cs.first_kind
        if tap is not None:  # (written on whole, above: the harness's first token came with it)
            tap.wrote_first_token()
    return whole_verdict(cs, status, ctype, raw)


async def _read_stream(resp: aiohttp.ClientResponse, trace: Trace, tap: "Tap | None", stream_cls: Any,
                       done_grace_s: float) -> Result:
    """An event stream, read to its end by `SSEBody`, and judged (`answer.stream_verdict`)."""
    reader = SSEBody(trace, stream_cls)
    cut = False
    try:
        try:
            await _read_body(resp, reader, tap, done_grace_s)
        except aiohttp.ClientPayloadError:
            if not reader.cs.done:
                raise
            # the answer had ended ([DONE]) when the body was cut (llama-cpp-python's
            # interrupt_requests): judge the answer, not the transport's complaint
            cut = True
    except Exception:  # the body was cut (a proxy's timeout, a reset, a read timeout)
        reader.cut()
        raise
    finally:  # also when the read fails or is given up: what was counted so far is kept
        reader.unwatch()
        reader.sync()
    cs = reader.finish()
    error, msg = stream_verdict(cs, trace)
    if error == "incomplete_stream":  # the body ended mid-answer: cut, as above
        reader.cut()
    else:  # a body held open past [DONE]: the answer ended at [DONE], as an SDK client sees it
        trace.t["end"] = reader.done_at if reader.held_open else _now()
    if cut and msg:
        msg += "; then the server closed the connection without ending the chunked body"
    notes = protocol_notes(cs, reader.held_open, done_grace_s) if cs.after_done or reader.held_open else None
    return Result(resp.status, cs, error, msg, None, notes)


async def _read_body(resp: aiohttp.ClientResponse, reader: SSEBody, tap: "Tap | None", done_grace_s: float) -> None:
    """Every block of the body to `reader.feed`: on the parser's hook (`read_body`), else one task
    wake-up per read; through `agentload proxy` (`tap`) each block also goes on to the tap as it came,
    in the same call."""
    content = resp.content
    conn = resp.connection
    feed: Callable[[bytes, int], None] = reader.feed
    if tap is None:
        reader.watch(content, conn, done_grace_s)
    else:  # (the harness reads the body as the server ends it: no grace past [DONE] here)
        feed = _tee(feed, tap, reader.trace.t)
    if not await read_body(content, feed, conn.protocol if conn is not None else None, reader.last_byte_ns):
        while True:  # the general path: any StreamReader, one task wake-up per read
            data = await content.readany()
            if not data:
                break
            feed(data, 0)
    if tap is not None:
        await tap.flush()


def _tee(feed: Callable[[bytes, int], None], tap: "Tap", t: dict[str, int]) -> Callable[[bytes, int], None]:
    """A read on to the tap first, so that reading it never delays it, then to the reader (also when
    the write failed: what was read is counted); then, if the read carried the first token, the tap
    is told."""
    write = tap.write

    def both(data: bytes, now: int = 0) -> None:
        try:
            write(data)
        finally:
            had = "first_token" in t
            feed(data, now)
        if not had and "first_token" in t:
            tap.wrote_first_token()
    return both


def classify_exception(e: BaseException) -> tuple[str, str]:
    """Error class and a one-line message for a failed request."""
    name = type(e).__name__
    if isinstance(e, aiohttp.ClientConnectorCertificateError):  # the certificate was refused: say why
        cert = e.certificate_error
        why = getattr(cert, "verify_message", None) or getattr(cert, "reason", None) or str(cert)
        return "tls_certificate", f"TLS certificate of {e.host}:{e.port} not accepted: {why}"[:_ERROR_BODY_LIMIT]
    if isinstance(e, aiohttp.ClientConnectorSSLError):
        return "tls_handshake", (f"TLS handshake with {e.host}:{e.port} failed: {e.os_error}"
                                 .replace("\n", " ")[:_ERROR_BODY_LIMIT])
    if isinstance(e, aiohttp.ConnectionTimeoutError):  # a ServerTimeoutError subclass: test it first
        name = "connect_timeout"
    elif isinstance(e, aiohttp.ServerTimeoutError):
        name = "read_timeout" if "read" in str(e).lower() else "ServerTimeoutError"
    elif isinstance(e, asyncio.TimeoutError) and not isinstance(e, aiohttp.ClientError):
        name = "total_timeout"
    msg = str(e).replace("\n", " ")[:_ERROR_BODY_LIMIT] or name
    return name, msg
