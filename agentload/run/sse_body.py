"""The read loop's per-read work on an event stream: stamps, SSE events, the answer's reader.

aiohttp fires no signal while a body is read, so the read loop stamps first byte, tokens and
completion itself. Each block of bytes is handed to `SSEBody.feed` as aiohttp's parser delivers it
(`body_sink`: no task wake-up per read; `readany()` where that path is not available), which
splits SSE events from the block and hands the data payloads to the API's reader (`apis`). An SSE
comment (`: ping`) is counted, never taken as progress; an `event: error` goes to the reader's
`add_error_event`. Malformed events are counted in `Trace.bad_events` even when the request is
otherwise ok; `first_token` is stamped only when a token arrived.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from agentload.records import Trace
from agentload.run.apis.reader import DONE, SERVER_STAMP, TOKEN, AnswerReader
from agentload.run.chat_stream import ChatStream
from agentload.run.sse import COMMENT, DATA, SSEDecoder

_now = time.perf_counter_ns


def server_stamp(payload: bytes) -> int | None:
    """The server's send stamp (`"mock_sent_ns": <int>`) in a chunk, if it carries one.

    Looked for only in the chunk that produced the first token, so ordinary chunks cost nothing.
    """
    i = payload.find(SERVER_STAMP)
    if i < 0:
        return None
    i += len(SERVER_STAMP)
    j = i
    n = len(payload)
    while j < n and payload[j] in b" 0123456789":
        j += 1
    try:
        return int(payload[i:j])
    except ValueError:
        return None


def _data_lines(data: bytes, end: int) -> tuple[bytes, ...] | list[bytes]:
    """The payloads of `data[:end]` if it is whole one-line `data:` events only (chat's), else ()."""
    if data.find(b"\n", 6) == end:  # one event (a paced stream's read)
        return (data[6:end],)
    payloads = data[6:end].split(b"\n\ndata: ")
    if data.count(b"\n", 6, end) != 2 * len(payloads) - 2:  # a line break inside an event: not one-line events
        return ()
    return payloads


class SSEBody:
    """The read loop's per-read work: stamps, SSE events, chunk accumulation.

    `feed(data, now)` is called once per network read with everything that read carried, and its
    arrival stamp: from the connection's parser hook (`body_sink.read_body`, the fast path), or
    after `await content.readany()`. Every stamp is a read's: first byte, first token (the read
    that carried the first token), the gaps between tokens (between the reads that carried them).

    While nothing is held from an earlier read (`plain`), a read that is exactly one whole token
    event of the stream's learnt shape (a paced stream's read: one event a read) is taken by the
    reader's `take_read`, one string decoded and nothing split or built; any other read's whole
    events are taken without the SSE decoder (`_whole_events`): one-line `data:` events only
    (chat's: a paced stream's one event, a burst's whole answer) are split into their payloads in
    a few C scans and handed to the reader's `add_many` in one call; a read that starts with
    `event: ` (Messages', Responses') is split on `\n\nevent: ` alone, one C split, and the
    reader's `add_events` takes its events up to the first that is not exactly one `event:` and
    one `data:` line (it checks each as it takes it: most by their learned shape, which holds the
    line break). Anything else (comments, other lines, CRs, a partial event, a BOM, an event not
    taken) goes through the SSE decoder event by event. The decoder is made when it is first
    needed (most streams never need it), and its `bytes_fed`/`events` count only what it saw.
    `chunks` and `token_chunks` are the reader's (one count, copied to the trace by `sync`).

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
            if self.dec is None and (data[:6] == b"data: " or data[:7] == b"event: "):  # no BOM before it
                self.plain = True
        trace.bytes_in += len(data)
        if self.plain:
            cs = self.cs
            had = cs.token_chunks
            if cs.take_read(data) > 0:  # one whole token event of the learnt shape: a paced stream's read
                trace.token_reads += 1
                if had:  # (`_tokens`, written out)
                    gap = now - trace.last_token
                    if gap > trace.max_gap:
                        trace.max_gap = gap
                        trace.max_gap_at = now
                    trace.last_token = now
                else:
                    self._tokens(0, now)
                return
            if b"\r" not in data and self._whole_events(data, now, cs, had):
                return
        dec = self.dec or self._decoder()
        for kind, payload in dec.feed(data):
            self._event(kind, payload, now)
        self.plain = dec.idle()

    def _whole_events(self, data: bytes, now: int, cs: Any, had: int) -> bool:
        """A read with nothing held before it and no CR (`feed`): its whole events taken without the
        decoder, as far as they go (see the class docstring), the rest handed to the decoder; False
        when none was taken (the caller's decoder takes the read)."""
        end = data.rfind(b"\n\n")  # the end of the read's last whole event
        if end <= 0:
            return False
        rest = end + 2  # where the bytes the decoder is given start
        if data[:6] == b"data: ":
            payloads = _data_lines(data, end)
            if not payloads:
                return False
            flags = cs.add_many(payloads)
        elif data[:7] == b"event: ":
            events = data[7:end].split(b"\n\nevent: ")
            flags, taken = cs.add_events(events)
            if not taken:
                return False
            if taken < len(events):  # the first event not taken on: the decoder's
                rest = sum(map(len, events[:taken])) + 9 * taken
        else:
            return False
        if flags & TOKEN:
            trace = self.trace
            trace.token_reads += 1
            if had:  # (`_tokens`, written out: a burst's every read, a paced stream's that take_read did not take)
                gap = now - trace.last_token
                if gap > trace.max_gap:
                    trace.max_gap = gap
                    trace.max_gap_at = now
                trace.last_token = now
            else:
                self._tokens(0, now)
        if flags & DONE:
            self._done(now)
        if rest < len(data):  # the next event's start, or events not taken: the decoder's
            dec = self.dec or self._decoder()
            for kind, payload in dec.feed(data[rest:]):
                self._event(kind, payload, now)
            self.plain = dec.idle()
        return True

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

    def finish(self) -> AnswerReader:
        """End of body: take the event the stream ended without a blank line for, if any."""
        events = self.dec.flush() if self.dec is not None else None
        if events:
            now = _now()
            for kind, payload in events:
                self._event(kind, payload, now)
        self.plain = False
        self.sync()
        return self.cs

