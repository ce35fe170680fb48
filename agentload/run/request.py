"""Send one chat completion and read it to the end, stamping first byte, tokens and completion.

aiohttp fires no signal while a body is read, so the read loop stamps these itself. Each block
of bytes is handed to `SSEBody.feed` as aiohttp's parser delivers it (`body_sink`: no task
wake-up per read; `readany()` where that path is not available), which splits SSE events from
the block and parses each data payload once. An SSE comment (`: ping`) is counted, never taken
as progress; an `event: error` goes to `ChatStream.add_error_event`.

The verdict fails closed: a response is `ok` only if it is what was asked for. Error classes
(`Result.error`) besides `http_<status>` and the exception classes of `classify_exception`:

- `not_a_stream`: a stream was asked for (`"stream": true` in the body), the answer is 2xx but
  its Content-Type is not `text/event-stream` (an HTML login page, a JSON object).
- `bad_response`: a non-streamed 2xx body that is not a `chat.completion` object (not JSON,
  no choices, no message).
- `inband_error`: an error object in the body or the stream, or an SSE `event: error`.
- `malformed_stream`: the stream had malformed events (not JSON, not an object, wrong-shaped
  fields) and neither a token nor a finish_reason.
- `empty_stream`: the stream ended ([DONE] or EOF) with no malformed event, no token and no
  finish_reason (an answer that finished empty, with a finish_reason, is ok).
- `incomplete_stream`: tokens came, then the stream ended with neither finish_reason nor [DONE].
- `no_finish_reason`: tokens came, then [DONE], but no finish_reason: an answer cut short.
- `content_encoding`: a 2xx body in a `Content-Encoding` agentload cannot decode (it asks for
  identity; gzip and deflate sent anyway are decoded by aiohttp's parser, on either request path):
  one aiohttp does not know (`x-snappy`, `gzip, br`), or br/zstd without their package. The
  message names the encoding.
- `bad_tool_call`: a tool call that cannot be sent back: its arguments joined are not JSON (a
  Messages `tool_use`'s input not an object), or it has no id or name (Messages, Responses).

Messages and Responses streams (`apis`) end with their terminal event (`message_stop`,
`response.completed`): without it a stream is `incomplete_stream` (tokens came) or `empty_stream`;
`event: error`, `response.failed` and `response.incomplete` are `inband_error`s.

Each message is one line naming what came back (status, Content-Type, first bytes, or what
the stream carried). Malformed events are counted in `Trace.bad_events` even when the request is
otherwise ok. `first_token` is stamped only when a token arrived.

Size: ~760 lines: the read path (SSE body, the answer's verdict, the proxy's tap) in one place;
a split by idea is issue 28's next step.
"""

from __future__ import annotations

import asyncio
import email.utils
import re
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol
from hashlib import sha1 as _sha1

import aiohttp
import aiohttp.payload
from multidict import CIMultiDict

from agentload import redact
from agentload.run.body_sink import read_body
from agentload.run.chat_stream import DONE, TOKEN, ChatStream
from agentload.records import Trace
from agentload.run.sse import COMMENT, DATA, SSEDecoder
from agentload.run.transport import current_trace

if TYPE_CHECKING:
    from agentload.run.conversation import Conversation
    from agentload.run.direct import DirectPost

_now = time.perf_counter_ns
_ERROR_BODY_LIMIT = 300
_FIRST_BYTES = 120  # bytes of an unexpected body quoted in the error message
_SERVER_STAMP = b'"mock_sent_ns":'
_STREAM_KEY = b'"stream":'
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


def wants_stream(body: bytes) -> bool:
    """Does this request body ask for a stream (`"stream": true`)?

    The first `"stream":` in a JSON body is the top-level key: a string cannot hold an unescaped
    quote, and agentload's bodies put `stream` before `tools` and `messages`. One scan that stops
    near the start of the body; no parse.
    """
    i = body.find(_STREAM_KEY)
    if i < 0:
        return False
    return body[i + 9:i + 24].lstrip()[:4] == b"true"


def first_bytes(raw: bytes, limit: int = _FIRST_BYTES) -> str:
    """The first `limit` bytes of a body as one line of text (for error messages)."""
    if not raw:
        return "(empty body)"
    text = redact.redact(raw[:4 * limit].decode("utf-8", "replace"))[:limit]
    text = text.replace("\r", " ").replace("\n", " ").replace("\t", " ")
    return text + ("..." if len(raw) > limit else "")


def content_encoding_error(enc: str, status: int | None, ctype: str, why: str = "") -> Result:
    """The answer of a body in an encoding agentload cannot decode (see `content_encoding`)."""
    came = f"{_what_came(status, ctype)} " if status is not None else "an answer "
    return Result(status, None, "content_encoding",
                  f"{came}with Content-Encoding: {enc}, which agentload cannot decode (it asked for identity; "
                  f"it decodes gzip and deflate){f': {why}' if why else ''}")


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


def _what_came(status: int, ctype: str) -> str:
    return f"HTTP {status} {ctype}" if ctype else f"HTTP {status} (no Content-Type)"


def _stream_verdict(cs: ChatStream, trace: Trace) -> tuple[str | None, str | None]:
    """The error class and message of a stream that was read to its end (None, None: ok).

    A stream of another API (`apis`) names its own terminal event (`END`: message_stop,
    response.completed) and must end with it; its tool calls must be whole (`tool_call_problems`)."""
    if cs.error is not None:
        return "inband_error", cs.error
    end_event = getattr(cs, "END", None)
    if end_event is not None:
        return _api_stream_verdict(cs, trace, end_event)
    if cs.token_chunks == 0 and cs.finish_reason is None:
        end = "with [DONE]" if cs.done else "at EOF"
        if cs.bad_json:
            return "malformed_stream", (
                f"stream ended {end} after {cs.bad_json} malformed event(s) of {cs.chunks - cs.dones}: no token, "
                f"no finish_reason; first malformed event: {first_bytes(cs.first_bad or b'')}")
        return "empty_stream", f"stream ended {end}{_arrived(cs, trace)}: no token, no finish_reason"
    if cs.finish_reason is None:
        if not cs.done:
            return "incomplete_stream", "stream ended without finish_reason or [DONE]"
        # tokens, then [DONE] with no finish_reason: an answer cut short (llama-cpp-python's
        # interrupt_requests does this after some tokens), not one that said how it ended
        return "no_finish_reason", (f"stream ended with [DONE] after {cs.token_chunks} token chunk(s) but no "
                                    f"finish_reason: the answer may have been cut short")
    return None, None


def _api_stream_verdict(cs: Any, trace: Trace, end_event: str) -> tuple[str | None, str | None]:
    """`_stream_verdict` for a stream whose API has a terminal event (Messages, Responses)."""
    end = f"with {end_event}" if cs.done else "at EOF"
    if cs.token_chunks == 0 and (cs.finish_reason is None or not cs.done):
        if cs.bad_json:
            return "malformed_stream", (
                f"stream ended {end} after {cs.bad_json} malformed event(s) of {cs.chunks}: no output; "
                f"first malformed event: {first_bytes(cs.first_bad or b'')}")
        if not cs.done or cs.finish_reason is None:
            what = (f"{cs.chunks} event(s) without output" if cs.chunks else
                    (f"{trace.bytes_in} byte(s) and no event" if trace.bytes_in else "an empty body"))
            comments = f" and {trace.comments} comment(s)" if trace.comments else ""
            return "empty_stream", f"stream ended {end} after {what}{comments}: no output, no {cs.FINISH}"
    if not cs.done:
        return "incomplete_stream", (f"stream ended without {end_event} after {cs.token_chunks} output event(s): "
                                     f"the answer was cut short")
    if cs.finish_reason is None:
        return "no_finish_reason", (f"stream ended with {end_event} after {cs.token_chunks} output event(s) but no "
                                    f"{cs.FINISH}: the answer may have been cut short")
    problems = cs.tool_call_problems()
    if problems:
        return "bad_tool_call", "; ".join(problems)
    return None, None


def _arrived(cs: ChatStream, trace: Trace) -> str:
    """What an empty stream carried (it had no token, no finish_reason, no malformed event)."""
    parts = []
    with_choices = cs.chunks - cs.dones - cs.no_choices  # each had choices but nothing in them
    if with_choices:
        parts.append(f"{with_choices} role-only/empty chunk(s)")
    if cs.no_choices:
        parts.append(f"{cs.no_choices} chunk(s) without choices" + (" (usage)" if cs.usage else ""))
    if trace.comments:
        parts.append(f"{trace.comments} comment(s)")
    if parts:
        return " after " + ", ".join(parts)
    if cs.done:
        return " and nothing before it"
    return f" after {trace.bytes_in} byte(s) and no event" if trace.bytes_in else " with an empty body"


def server_stamp(payload: bytes) -> int | None:
    """The server's send stamp (`"mock_sent_ns": <int>`) in a chunk, if it carries one.

    Looked for only in the chunk that produced the first token, so ordinary chunks cost nothing.
    """
    i = payload.find(_SERVER_STAMP)
    if i < 0:
        return None
    i += len(_SERVER_STAMP)
    j = i
    n = len(payload)
    while j < n and payload[j] in b" 0123456789":
        j += 1
    try:
        return int(payload[i:j])
    except ValueError:
        return None


class ConversationBody(aiohttp.payload.Payload):
    """A conversation's request body as aiohttp's payload: the bytes are asked of the
    conversation when they are written, so while the request waits for a pool connection the
    conversation alone holds them, and can keep them compressed (`park`, called by the
    transport when many bodies are queued). Nothing else on the send path holds the bytes.

    Payload's own __init__ (content type guessing, a header map per request) is not run: the
    headers are one shared map, and the size is the body's length."""

    _autoclose = True  # no file or socket behind it

    def __init__(self, conv: "Conversation"):  # (Payload.__init__ not called: see above)
        self._value = conv
        self._size = len(conv.body())
        self._encoding = None
        self._filename = None
        self._headers = _JSON_HEADERS

    def raw(self) -> bytes:
        return self._value.body()

    def park(self) -> int:
        """Compress the waiting body; the bytes freed (0: already parked, or not whole)."""
        return self._value.park()

    def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        return self._value.body().decode(encoding, errors)

    async def as_bytes(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        return self._value.body()

    async def write(self, writer) -> None:
        await writer.write(self._value.body())

    async def write_with_length(self, writer, content_length: int | None) -> None:
        body = self._value.body()
        await writer.write(body if content_length is None else body[:content_length])


_JSON_HEADERS = CIMultiDict({"Content-Type": "application/json"})


def body_bytes(body: "bytes | ConversationBody") -> bytes:
    return body if isinstance(body, bytes) else body.raw()


class Tap(Protocol):
    """Where a response goes on as it arrives (`send`'s `tap`)."""

    async def head(self, resp: aiohttp.ClientResponse) -> None: ...

    async def data(self, block: bytes) -> None: ...

    def client_gone(self) -> bool: ...


@dataclass(slots=True)
class Result:
    status: int | None
    stream: ChatStream | None
    error: str | None  # error class; None when the request completed
    error_msg: str | None
    retry_after_s: float | None = None
    protocol: list[str] | None = None  # `protocol_notes`: what the stream did wrong around its [DONE]


AFTER_DONE = "events_after_done"
HELD_OPEN = "held_open_after_done"


def protocol_notes(cs: ChatStream, held_open: bool, grace_s: float) -> list[str]:
    """What a stream that was read did against the protocol without keeping its answer from being
    read, one `code: detail` line each (the record's `protocol`): data events after its [DONE]
    (`events_after_done`: never part of the answer, which an SDK client ends at [DONE]), a body
    the server held open past its [DONE] (`held_open_after_done`: ended by agentload)."""
    out = []
    end = getattr(cs, "END", "[DONE]")  # (Messages, Responses: their terminal event)
    if getattr(cs, "after_done", 0):
        out.append(f"{AFTER_DONE}: {cs.after_done} data event(s) after [DONE], {cs.after_done_tokens} with tokens "
                   f"(not counted: the answer ends at [DONE]); first: {first_bytes(cs.first_after_done or b'')}")
    if held_open:
        out.append(f"{HELD_OPEN}: the body was still open {grace_s:g} s after {end}; agentload ended the "
                   f"read there and closed the connection")
    return out


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


class SSEBody:
    """The read loop's per-read work: stamps, SSE events, chunk accumulation.

    `feed(data, now)` is called once per network read with everything that read carried, and its
    arrival stamp: from the connection's parser hook (`body_sink.read_body`, the fast path), or
    after `await content.readany()`. Every stamp is a read's: first byte, first token (the read
    that carried the first token), the gaps between tokens (between the reads that carried them).

    A read of whole one-line `data:` events only (a paced stream's one event, a burst's whole
    answer), while nothing is held from an earlier read (`plain`), is split into its payloads in
    one pass (a few C scans, one split) and handed to `ChatStream.add_many` in one call; anything
    else (comments, `event:` lines, CRs, a partial event, a BOM) goes through the SSE decoder
    event by event. The decoder is made when it is first needed (most streams never need it), and
    its `bytes_fed`/`events` count only what it saw. `chunks` and `token_chunks` are the
    ChatStream's (one count, copied to the trace by `sync`).

    `[DONE]` ends the answer (`ChatStream`: nothing after it is taken) and the read: `watch(content,
    conn, grace_s)` has the body's end waited for at most `grace_s` past it (the end of the chunked
    body, or the connection's, usually in the same read or the next); a body still open then is
    ended here, its connection closed (never back in the pool with the rest of a body on it), and
    `held_open` says so. `done_at` is the read that carried the [DONE].
    """

    __slots__ = ("trace", "t", "cs", "dec", "last_byte", "plain", "done_at", "held_open", "content", "conn",
                 "grace_s", "handle")

    def __init__(self, trace: Trace, stream_cls: Any = ChatStream):
        self.trace = trace
        self.t = trace.t
        self.cs = stream_cls()
        self.dec: SSEDecoder | None = None
        self.last_byte = _now()  # (headers) for the idle read timeout
        # nothing held from an earlier read (no partial event, no CR) and no BOM still possible
        self.plain = False
        self.done_at = 0  # the read that carried [DONE]
        self.held_open = False  # the body was still open grace_s after [DONE]: ended by us
        self.content: Any = None  # (`watch`) the body's StreamReader, its connection, the grace
        self.conn: Any = None
        self.grace_s = 0.0
        self.handle: asyncio.TimerHandle | None = None

    def watch(self, content: Any, conn: Any, grace_s: float) -> None:
        """End the read at most `grace_s` after [DONE] (see the class docstring)."""
        self.content = content
        self.conn = conn
        self.grace_s = grace_s

    def _done(self, now: int) -> None:
        """The read that carried [DONE] (once a stream): the answer is complete; the body's end is
        given `grace_s` to come (none when it came in this same read)."""
        self.done_at = now
        tr = self.trace
        if "first_token" in self.t:  # [DONE] is progress: the watchdog counts a stall from it
            tr.last_token = now
        content = self.content
        if content is not None and not content.is_eof():
            self.handle = asyncio.get_running_loop().call_later(self.grace_s, self._held_open)

    def _held_open(self) -> None:
        """`grace_s` after [DONE] and the body has not ended: end it here. The connection is closed
        first (so that the EOF callbacks cannot hand it back to the pool), then the body's reader
        is told its end (which wakes the read, `body_sink` or `readany`)."""
        self.handle = None
        content = self.content
        if content is None or content.is_eof() or content.exception() is not None:
            return
        self.held_open = True
        if self.conn is not None:
            self.conn.close()
        content.feed_eof()

    def unwatch(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None
        self.content = self.conn = None

    def last_byte_ns(self) -> int:
        return self.last_byte

    def _decoder(self) -> SSEDecoder:
        dec = self.dec = SSEDecoder()
        if self.plain:  # the stream's first bytes went by without it: no BOM to look for
            dec.no_bom()
        return dec

    def feed(self, data: bytes, now: int = 0) -> None:
        """One read (`now`: when it arrived; 0: now)."""
        if not now:
            now = _now()
        self.last_byte = now
        trace = self.trace
        if trace.bytes_in == 0:
            self.t.setdefault("first_byte", now)
            if self.dec is None and data[:6] == b"data: ":  # the first read, and no BOM before it
                self.plain = True
        trace.bytes_in += len(data)
        if self.plain and data[:6] == b"data: " and b"\r" not in data:
            end = data.rfind(b"\n\n")  # the end of the read's last whole event
            if end > 0:
                if data.find(b"\n", 6) == end:  # one event (a paced stream's read)
                    payloads = (data[6:end],)
                else:
                    payloads = data[6:end].split(b"\n\ndata: ")
                    if data.count(b"\n", 6, end) != 2 * len(payloads) - 2:  # a line break inside an event: not one-line events
                        payloads = ()
                if payloads:
                    cs = self.cs
                    had = cs.token_chunks
                    flags = cs.add_many(payloads)
                    if flags & TOKEN:
                        trace.token_reads += 1
                        if had:  # (`_tokens`, written out: the path of nearly every read)
                            gap = now - trace.last_token
                            if gap > trace.max_gap:
                                trace.max_gap = gap
                                trace.max_gap_at = now
                            trace.last_token = now
                        else:
                            self._tokens(0, now)
                            trace.first_output = cs.first_kind
                    if flags & DONE:
                        self._done(now)
                    if end + 2 < len(data):  # the start of the next event: the decoder holds it
                        (self.dec or self._decoder()).feed(data[end + 2:])
                        self.plain = False
                    return
        dec = self.dec or self._decoder()
        for kind, payload in dec.feed(data):
            self._event(kind, payload, now)
        self.plain = dec.idle()

    def _tokens(self, had: int, now: int) -> None:
        """A read carried tokens (`had`: token chunks before it)."""
        trace = self.trace
        if had == 0:
            self.t["first_token"] = now
            trace.server_first_token_ns = server_stamp(self.cs.first_token_payload or b"")
            trace.first_output = self.cs.first_kind
        else:
            gap = now - trace.last_token
            if gap > trace.max_gap:
                trace.max_gap = gap
                trace.max_gap_at = now
        trace.last_token = now

    def _event(self, kind: int, payload: bytes, now: int) -> None:
        """One event from the decoder."""
        if kind == COMMENT:
            self.trace.comments += 1
            return
        cs = self.cs
        had = cs.token_chunks
        flags = cs.add(payload) if kind == DATA else cs.add_error_event(payload)
        if flags & TOKEN:
            if not had or now != self.trace.last_token:  # the read's first event with a token
                self.trace.token_reads += 1
            self._tokens(had, now)  # (a read's second token: a gap of 0, nothing changes)
        if flags & DONE:  # keep reading to the body's end (`_done`), so the connection can go back to the pool
            self._done(now)
        # ERROR: keep reading to EOF so the connection goes back to the pool cleanly

    def cut(self) -> None:
        """The body ended in a failure (cut, reset, timed out): its silence since the last token (or
        since its first byte, or its headers) counts in its largest gap, ending at `end`."""
        now = _now()
        trace = self.trace
        t = self.t
        last = trace.last_token or t.get("first_byte") or t.get("headers")
        if last and now - last > trace.max_gap:
            trace.max_gap = now - last
            trace.max_gap_at = now
        t.setdefault("end", now)

    def sync(self) -> None:
        """Copy the stream's counts to the trace (at the end of the body, also a cut one)."""
        cs = self.cs
        tr = self.trace
        tr.chunks = cs.chunks
        tr.token_chunks = cs.token_chunks
        tr.bad_events = cs.bad_json

    def finish(self) -> ChatStream:
        """End of body: take the event the stream ended without a blank line for, if any."""
        events = self.dec.flush() if self.dec is not None else None
        if events:
            now = _now()
            for kind, payload in events:
                self._event(kind, payload, now)
        self.plain = False
        self.sync()
        return self.cs


async def send(session: aiohttp.ClientSession, url: str, body: "bytes | ConversationBody", trace: Trace,
               extra_headers: dict[str, str] | None = None, stream: bool | None = None,
               id_header: str | None = "X-Request-ID", tap: "Tap | None" = None,
               stream_cls: Any = ChatStream, done_grace_s: float = 1.0) -> Result:
    """One request; the caller wraps it in the give-up timeout the watchdog can fire.

    `done_grace_s`: how long past a stream's [DONE] its body's end is waited for (`SSEBody`).
    `tap`: where the response goes on as it arrives (`agentload proxy`: to the harness), its head
    first, then every block of its body as read (the general read path: one task wake-up a read).
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
        cm: Any = direct.post(body, headers, trace, tm)
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
            raw = await resp.read()
            t["end"] = _now()
            if tap is not None:
                await tap.data(raw)
            if not raw.strip():
                msg = empty_error_hint(status, session, id_header)
                return Result(status, None, f"http_{status}", msg, _retry_after(resp))
            # redacted before it is cut: a server that echoes the key must not leave a tail of it
            msg = redact.redact(raw[:4 * _ERROR_BODY_LIMIT].decode("utf-8", "replace"))
            msg = msg.replace("\n", " ")[:_ERROR_BODY_LIMIT]
            return Result(status, None, f"http_{status}", msg, _retry_after(resp))
        ctype = resp.headers.get("Content-Type", "")
        enc = _undecoded(resp.headers)
        if enc is not None:  # nothing in it can be read: not read (the connection is not reused)
            t["end"] = _now()
            return content_encoding_error(enc, status, ctype)
        if _SSE_TYPE not in ctype and _SSE_TYPE not in ctype.lower():
            raw = await resp.read()
            now = _now()
            if tap is not None:
                await tap.data(raw)
            t["first_byte"] = t.get("first_byte", now)
            trace.bytes_in += len(raw)
            if stream is None:
                stream = wants_stream(body_bytes(body))
            if stream:  # a stream was asked for: whatever this is, it is not the answer
                t["end"] = now
                return Result(status, None, "not_a_stream",
                              f"{_what_came(status, ctype)}, not an event stream: {first_bytes(raw)}")
            cs = stream_cls.from_response(raw)
            trace.chunks = 1
            trace.bad_events = cs.bad_json
            if cs.error is None and cs.not_completion is None and cs.token_chunks:
                t["first_token"] = now
                trace.token_reads = 1
                trace.last_token = now
                trace.server_first_token_ns = server_stamp(raw)
                trace.first_output = cs.first_kind
            t["end"] = now
            if cs.error is not None:
                return Result(status, cs, "inband_error", cs.error)
            if cs.not_completion is not None:
                return Result(status, cs, "bad_response",
                              f"{_what_came(status, ctype)}, not a {getattr(cs, 'OBJECT', 'chat.completion')} object "
                              f"({cs.not_completion}): {first_bytes(raw)}")
            problems = cs.tool_call_problems() if hasattr(cs, "END") else None
            if problems:
                return Result(status, cs, "bad_tool_call", "; ".join(problems))
            return Result(status, cs, None, None)

        reader = SSEBody(trace, stream_cls)
        content = resp.content
        conn = resp.connection
        if tap is None:  # (through `agentload proxy` the harness reads the body as the server ends it)
            reader.watch(content, conn, done_grace_s)
        cut = False
        try:
            try:
                if tap is not None:
                    while True:  # each block on to the tap as it came
                        data = await content.readany()
                        if not data:
                            break
                        reader.feed(data)
                        await tap.data(data)
                elif not await read_body(content, reader.feed, conn.protocol if conn is not None else None,
                                         reader.last_byte_ns):
                    while True:  # the general path: any StreamReader, one task wake-up per read
                        data = await content.readany()
                        if not data:
                            break
                        reader.feed(data)
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
        error, msg = _stream_verdict(cs, trace)
        if error == "incomplete_stream":  # the body ended mid-answer: cut, as above
            reader.cut()
        else:  # a body held open past [DONE]: the answer ended at [DONE], as an SDK client sees it
            t["end"] = reader.done_at if reader.held_open else _now()
        if cut and msg:
            msg += "; then the server closed the connection without ending the chunked body"
        notes = (protocol_notes(cs, reader.held_open, done_grace_s) if getattr(cs, "after_done", 0) or reader.held_open
                 else None)
        return Result(status, cs, error, msg, None, notes)


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
