"""Byte-level Server-Sent Events decoder (the per-read hot path).

``SSEDecoder.feed(data)`` is called once per network read and returns the events
completed by that read, in order, as ``(kind, payload)`` tuples:

- ``(DATA, payload)``: the event's data lines joined with ``b"\\n"`` (SSE spec).
- ``(COMMENT, text)``: one per comment line (``: ping`` from a router while the
  backend stalls). ``text`` is the line without the colon and without exactly one
  leading space (``b": ping"`` -> ``b"ping"``, ``b":"`` -> ``b""``), the same rule
  as for field values, so ``encode_comment`` round-trips.
- ``(ERROR_EVENT, payload)``: an event whose ``event:`` field is ``error``; the
  payload is its data (``b""`` if it had no data line: an error is never dropped).

Rules (WHATWG SSE parsing, with the exceptions noted):

- Lines end with ``\\r\\n``, ``\\n`` or ``\\r``, mixed freely; a ``\\r\\n`` split across
  two reads is one line ending. A leading UTF-8 BOM is skipped.
- An event ends at a blank line. Comments in an event's block are returned when the
  block ends, before the block's data event (a router's ``: ping\\n\\n`` is its own
  block, so it is returned as soon as it has arrived).
- ``data:`` with or without one space after the colon; a ``data`` line without a
  colon is an empty data line. An event with at least one data line is returned even
  if its data is empty (``data:\\n\\n`` -> ``(DATA, b"")``); a block with no data line
  returns nothing (except ``event: error``, see above).
- ``id:``, ``retry:``, other event names and unknown fields are ignored.
- ``flush()`` returns a trailing event the stream ended without a blank line for
  (the spec would discard it; a load generator wants to see it).

The decoder works on blocks, not bytes: line endings are normalised with
``bytes.replace`` (only when the read contains a ``\\r``), the block boundary is
found with ``bytes.split(b"\\n\\n")``, and the common block ``data: <json>`` (one
line) is recognised by a prefix compare and one ``in`` scan, with no line loop.
A partial event is kept as a list of pieces and joined once, so an event that
arrives in many small reads is not re-scanned quadratically.
"""

from __future__ import annotations

__all__ = [
    "DATA",
    "COMMENT",
    "ERROR_EVENT",
    "SSEDecoder",
    "encode_event",
    "encode_comment",
]

DATA = 0
COMMENT = 1
ERROR_EVENT = 2

_BOM = b"\xef\xbb\xbf"


class SSEDecoder:
    """Incremental SSE decoder; one per response body.

    Attributes: ``bytes_fed`` (total bytes passed to ``feed``), ``events``
    (number of DATA/ERROR_EVENT events returned), ``comments`` (number of COMMENT
    events returned).
    """

    __slots__ = ("bytes_fed", "events", "comments", "_pending", "_last", "_cr", "_bom")

    def __init__(self) -> None:
        self.bytes_fed = 0
        self.events = 0
        self.comments = 0
        self._pending: list[bytes] = []  # normalised bytes of the unfinished block
        self._last = b""  # last byte of _pending (b"\n" or other), for boundary checks
        self._cr = False  # previous read ended with b"\r": drop a leading b"\n" now
        self._bom = True  # still at the very start of the stream (BOM not yet ruled out)

    def __repr__(self) -> str:
        pending = sum(len(p) for p in self._pending)
        return (
            f"SSEDecoder(bytes_fed={self.bytes_fed}, events={self.events}, "
            f"comments={self.comments}, pending_bytes={pending})"
        )

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        """Decode one read; return the events it completed, in stream order."""
        if not data:
            return []
        self.bytes_fed += len(data)
        # Fast path: the read is exactly one whole one-line `data:` event and nothing is pending
        # (nearly every read of a paced stream): two memchr scans, no split.
        if (not self._pending and not self._bom and not self._cr and data[:6] == b"data: "
                and data.find(b"\n") == len(data) - 2 and data[-1] == 10 and b"\r" not in data):
            self.events += 1
            return [(DATA, data[6:-2])]
        if self._bom:
            data = self._strip_bom(data)
            if not data:
                return []
        if self._cr:
            self._cr = False
            if data[0] == 10:  # b"\n" completing a b"\r\n" split across reads
                data = data[1:]
                if not data:
                    return []
        if b"\r" in data:
            if data[-1] == 13:
                self._cr = True
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")

        pending = self._pending
        if pending:
            # No boundary in this read nor across the junction: just keep the piece.
            if b"\n\n" not in data and not (data[0] == 10 and self._last == b"\n"):
                pending.append(data)
                self._last = data[-1:]
                return []
            pending.append(data)
            data = b"".join(pending)
            pending.clear()

        blocks = data.split(b"\n\n")
        rest = blocks.pop()
        if rest:
            pending.append(rest)
            self._last = rest[-1:]

        out: list[tuple[int, bytes]] = []
        append = out.append
        n = 0
        for block in blocks:
            # Fast path: one line "data: ..." (the shape of nearly every chunk).
            if block[:6] == b"data: " and b"\n" not in block:
                append((DATA, block[6:]))
                n += 1
            elif block:
                n += self._block(block, out)
        self.events += n
        return out

    def no_bom(self) -> None:
        """The stream's first bytes were seen elsewhere and hold no BOM (they start with
        ``data: ``): never look for one."""
        if not self._pending:
            self._bom = False

    def idle(self) -> bool:
        """Nothing held: no partial event, no BOM still possible, no CR carried over. The next
        read then decodes on its own: whole one-line ``data:`` events to their payloads alone,
        which a caller may take without calling ``feed`` (``request.SSEBody`` does)."""
        return not self._pending and not self._bom and not self._cr

    def flush(self) -> list[tuple[int, bytes]]:
        """End of stream: return the unterminated trailing event, if any; reset."""
        out: list[tuple[int, bytes]] = []
        if self._pending:
            block = b"".join(self._pending)
            self._pending.clear()
            self.events += self._block(block, out)
        self._last = b""
        self._cr = False
        return out

    def _strip_bom(self, data: bytes) -> bytes:
        # The BOM may itself be split across reads: keep the candidate prefix pending.
        if self._pending:  # a partial BOM prefix was held back
            data = b"".join(self._pending) + data
            self._pending.clear()
        if len(data) < 3 and _BOM.startswith(data):
            self._pending.append(data)
            self._last = data[-1:]
            return b""
        self._bom = False
        if data.startswith(_BOM):
            return data[3:]
        return data

    def _block(self, block: bytes, out: list[tuple[int, bytes]]) -> int:
        """Slow path: parse a block line by line. Returns the number of data events."""
        data_lines: list[bytes] | None = None
        event = None
        for line in block.split(b"\n"):
            if not line:
                continue
            colon = line.find(b":")
            if colon == 0:
                value = line[1:]
                if value[:1] == b" ":
                    value = value[1:]
                out.append((COMMENT, value))
                self.comments += 1
                continue
            if colon < 0:
                name, value = line, b""
            else:
                name = line[:colon]
                value = line[colon + 1 :]
                if value[:1] == b" ":
                    value = value[1:]
            if name == b"data":
                if data_lines is None:
                    data_lines = [value]
                else:
                    data_lines.append(value)
            elif name == b"event":
                event = value
            # id, retry and unknown fields: ignored
        if data_lines is not None:
            out.append((ERROR_EVENT if event == b"error" else DATA, b"\n".join(data_lines)))
            return 1
        if event == b"error":
            out.append((ERROR_EVENT, b""))
            return 1
        return 0


def encode_event(payload: bytes, *, event: bytes | None = None, eol: bytes = b"\n") -> bytes:
    """Encode one SSE event: ``data: <payload>`` + blank line.

    A payload containing ``\\n`` becomes several ``data:`` lines (decoded back to the
    same bytes). ``event`` adds an ``event:`` line (e.g. ``b"error"``). ``eol`` is the
    line ending (``b"\\n"``, ``b"\\r\\n"`` or ``b"\\r"``). A payload containing ``\\r``
    cannot be represented in SSE and raises ValueError.
    """
    if b"\r" in payload:
        raise ValueError("an SSE data payload cannot contain b'\\r'")
    if b"\n" in payload:
        body = eol.join(b"data: " + line for line in payload.split(b"\n"))
    else:
        body = b"data: " + payload
    if event is not None:
        if b"\r" in event or b"\n" in event:
            raise ValueError("an SSE event name cannot contain a line break")
        body = b"event: " + event + eol + body
    return body + eol + eol


def encode_comment(text: bytes = b"", *, eol: bytes = b"\n") -> bytes:
    """Encode one SSE comment as its own block: ``: <text>`` + blank line."""
    if b"\r" in text or b"\n" in text:
        raise ValueError("an SSE comment cannot contain a line break")
    return b": " + text + eol + eol
