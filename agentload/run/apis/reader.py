"""What every API's reader of one answer shares: the flags `add` returns, the fields it fills, the
error texts, and the assistant turn it gives back.

`AnswerReader` holds the fields and results every reader has (chat's `ChatStream`, Messages'
`MessagesStream`, Responses' `ResponsesStream`), its tool calls in one `ToolCalls`, and the read
loop (`add_many`) that takes a stream's token events by their learned shape (see `add_many`);
`EventReader` adds the parsing of the APIs whose events name their own `type` and end with a
terminal event (Messages, Responses): each subclass gives a table of handlers, one per event type.

Flags (what a data event carried, or-ed over a read's events):

- `TOKEN`: output: text, reasoning, a tool call's name or a piece of its arguments. Not output: a
  role-only chunk, an id-only tool-call fragment, a finish-only or usage-only chunk.
- `FINISH`: the answer said how it ended (chat's finish_reason, Messages' stop_reason, ...).
- `USAGE`: token counts.
- `DONE`: the end of the answer (chat's `[DONE]`, `message_stop`, `response.completed`).
- `ERROR`: an in-band error (`.error` keeps the first as a short line, `.errors` counts them).
- `BAD_JSON`: a malformed event (not JSON, not an object, wrong-shaped fields): counted in
  `.bad_json` (the record's `bad_events`), its first bytes in `.first_bad`; never raises.

Size: the readers' shared fast paths (`add_many`, `take_read`, `add_events` and its `_add_event`)
stay beside the parse whose results they must equal, event for event.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Optional, Tuple

import orjson

from agentload.run.apis.tool_calls import PIECES, ToolCalls

TOKEN = 1
FINISH = 2
USAGE = 4
DONE = 8
ERROR = 16
BAD_JSON = 32

_ERROR_MAX = 300  # characters kept in .error
BAD_SAMPLE = 120  # bytes of the first malformed payload kept in .first_bad
QUIET_LEN = 96  # (EventReader._quiet) the longest event remembered, and looked up
QUIET_MAX = 32
MAX_SHAPES = 4  # token-event shapes learned per stream (a server whose every event differs: the parsed path)
# The send stamp agentload's mock and bench/server.py put in an answer's first token event (read by
# `sse_body.server_stamp`): that event is not the stream's usual shape, so none is learnt from it
SERVER_STAMP = b'"mock_sent_ns":'

# A stream's usual token event as the bytes around its one changing JSON string (`_learn`): (head,
# tail, where the string goes: None for the answer's text, else a tool call's index)
Shape = Tuple[bytes, bytes, Optional[int]]
# A network read that is one whole event of a stream's learnt shape (`AnswerReader.take_read`): (the
# read's bytes up to the string's opening quote, from its closing quote to the read's end, the
# length of the first, of the second less its quote, where the event's data payload starts in the
# read, the shape's call)
ReadShape = Tuple[bytes, bytes, int, int, int, Optional[int]]

_loads = orjson.loads
_JSONDecodeError = orjson.JSONDecodeError


def whole_read(head: bytes, tail: bytes, call: int | None) -> ReadShape | None:
    """The read shape of one whole SSE event, `head` + one JSON string's contents + `tail` (head:
    `data: ` or `event: NAME\ndata: ` and the learnt payload's bytes up to the string's opening
    quote; tail: from its closing quote, then the blank line): None unless the event's only line
    breaks are its name line's and its end (a payload that held one, learnt from the SSE decoder,
    is not one line), with no CR, no `event: error` and the string's two quotes where they go."""
    i = head.find(b"\n")
    at = 6 if i < 0 else i + 7  # where the data line's payload starts
    if (head[at - 6:at] != b"data: " or (i >= 0 and (not head.startswith(b"event: ") or head[:13] == b"event: error\n"))
            or head.find(b"\n", at) >= 0 or b"\r" in head or b"\r" in tail or tail.find(b"\n") != len(tail) - 2
            or not tail.endswith(b"\n\n") or not head.endswith(b'"') or not tail.startswith(b'"')):
        return None
    return head, tail, len(head), len(tail) - 1, at, call


def short(s: str) -> str:
    """One line of at most _ERROR_MAX characters."""
    s = " ".join(s.split())
    return s if len(s) <= _ERROR_MAX else s[: _ERROR_MAX - 3] + "..."


def error_text(err: Any, obj: dict) -> str:
    """A one-line summary of an error object: ``type (code): message``."""
    if isinstance(err, dict):
        msg = err.get("message")
        typ = err.get("type")
        code = err.get("code")
    else:
        msg = err if isinstance(err, str) and err else None
        typ = obj.get("type") if obj.get("type") != "error" else None
        code = obj.get("code")
        if msg is None and obj.get("object") == "error":
            msg = obj.get("message")
    head = str(typ) if typ else ""
    if code is not None:
        head = f"{head} ({code})" if head else str(code)
    if msg is None:
        msg = orjson.dumps(err).decode() if err is not None and err != "" else ""
    text = f"{head}: {msg}" if head and msg else (head or str(msg) or "error")
    return short(text)


def assistant_turn(text: str | None, calls: list | None, content: str = "empty") -> dict:
    """An assistant turn as agentload sends it back: its text, or for a turn without text (a
    tool-call turn) `"content": ""` (content="empty"), `null` ("null") or no content key ("omit");
    `tool_calls` only when there are some. The one rule for scripted and model turns."""
    if text:
        msg: dict = {"role": "assistant", "content": text}
    elif content == "empty":
        msg = {"role": "assistant", "content": ""}
    elif content == "null":
        msg = {"role": "assistant", "content": None}
    else:  # omit
        msg = {"role": "assistant"}
    if calls:
        msg["tool_calls"] = calls
    return msg


class AnswerReader:
    """The fields and results of one answer, whatever its API (see `agentload.run.apis`)."""

    END: str | None = None  # the API's terminal event (None: chat's, whose [DONE] is optional)
    FINISH = "finish_reason"  # what says how the answer ended, in the API's words
    OBJECT = "chat.completion"  # what a non-streamed answer is
    _text_shapes: Any = None  # a new stream's first shapes (EventReader's; chat's: none)

    __slots__ = ("id", "model", "fingerprint", "finish_reason", "usage", "error", "errors", "chunks", "token_chunks",
                 "bad_json", "first_bad", "done", "dones", "no_choices", "not_completion", "first_token_payload",
                 "first_kind", "after_done", "after_done_tokens", "first_after_done", "_content", "calls", "_shape",
                 "_learned", "_event_shape", "_read", "_read_later")

    def __init__(self) -> None:
        self.id: str | None = None
        self.model: str | None = None
        self.fingerprint: object = None  # system_fingerprint: the backend that answered
        self.finish_reason: str | None = None  # in chat's words: stop, length, tool_calls, ...
        self.usage: dict | None = None  # in chat's keys
        self.error: str | None = None  # first in-band error, short
        self.errors = 0
        self.chunks = 0  # data payloads added
        self.token_chunks = 0  # payloads that returned TOKEN
        self.bad_json = 0  # malformed events (see BAD_JSON)
        self.first_bad: bytes | None = None  # leading bytes of the first malformed event
        self.done = False
        self.dones = 0  # end events seen
        self.no_choices = 0  # events that carried no output
        self.not_completion: str | None = None  # from_response: why the body is not the API's answer object
        self.first_token_payload: bytes | None = None  # the first event that carried a token
        self.first_kind: str | None = None  # what that first output was: text, tool or reasoning
        self.after_done = 0  # (chat) data events after the first [DONE] (not taken)
        self.after_done_tokens = 0  # ... of which carried a token
        self.first_after_done: bytes | None = None  # the first one's leading bytes
        self._content: list[str] = []
        self.calls = ToolCalls()
        self._learned = 0  # shapes learned so far (at most MAX_SHAPES per stream)
        known = self._text_shapes
        if known is None:
            self._shape: Shape | None = None  # the stream's usual token event (`_learn`), or None
            self._event_shape: Shape | None = None  # _shape with its event's name line before it (`add_events`)
            self._read: ReadShape | None = None  # a read of one whole event of the learnt shape (`take_read`)
        else:  # (EventReader's: the text shape the last stream of its API learnt)
            self._shape, self._event_shape, self._read = known
        self._read_later = False  # _read is to be made from the learnt shape when a read asks (`_make_read`)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(chunks={self.chunks}, token_chunks={self.token_chunks}, "
                f"content_chars={len(self.content)}, tool_calls={len(self.calls)}, "
                f"finish_reason={self.finish_reason!r}, usage={self.usage is not None}, "
                f"done={self.done}, errors={self.errors}, bad_json={self.bad_json})")

    # ------------------------------------------------------------------ streaming

    def add(self, payload: bytes) -> int:
        """Add one SSE data payload; return its flags (TOKEN|FINISH|USAGE|DONE|ERROR|BAD_JSON)."""
        return self.add_many((payload,))

    def add_many(self, payloads: Iterable[bytes]) -> int:
        """Add SSE data payloads, in stream order (the events of one read); return the flags of what
        any of them carried (`add`'s, or-ed). Each payload is taken exactly as by `add` (which is
        this with one payload).

        A stream's token events differ from one another only in their text (the same id, type,
        index and nulls around it), so once one has been parsed and its shape learned (`_learn`),
        a payload that is byte for byte that shape around one JSON string is an event of that shape
        carrying that string: it is not parsed as an object. The strings of a read's such events
        are decoded together by one `orjson.loads` of an array, which also validates each of them
        (`_shaped_texts`); anything else, or a batch that does not decode to exactly one string per
        event, goes through `_add_one` (the API's own parse): every event is still checked."""
        out = 0
        shaped: list[bytes] | None = None
        shape = self._shape
        head, tail, hl = (shape[0], shape[1], len(shape[0])) if shape else (None, b"", 0)
        for payload in payloads:
            # (the tail is looked for after the head: the two cannot overlap)
            if head is not None and payload.startswith(head) and payload.endswith(tail, hl):
                if shaped is None:
                    shaped = [payload]
                else:
                    shaped.append(payload)
                continue
            if shaped:
                out |= self._add_shaped(shaped, shape)  # type: ignore[arg-type]
                shaped = None
            out |= self._add_one(payload)
            if self._shape is not shape:
                shape = self._shape
                head, tail, hl = shape[0], shape[1], len(shape[0])  # type: ignore[index]
        if shaped:
            out |= self._add_shaped(shaped, shape)  # type: ignore[arg-type]
        return out

    def take_read(self, data: bytes) -> int:
        """A network read that is exactly one whole event of the stream's learnt shape around one
        non-empty JSON string (`_read`: a paced stream's token event, a read of its own), taken as
        its parse would take it: TOKEN. Anything else (another event, more than one, an empty or
        malformed string, an answer already ended) is not taken: -1, for the read loop's usual path,
        which parses what it must. The shape holds every line break of the read (`whole_read`); the
        string between the head's opening quote and the tail's closing one is decoded as one JSON
        string, which holds none and can only be one string (orjson rejects anything after it)."""
        shape = self._read
        if shape is None:
            if not self._read_later:
                return -1
            shape = self._make_read()
            if shape is None:
                return -1
        if self.done:
            return -1
        head, tail, hl, cut, at, call = shape
        if not data.startswith(head) or not data.endswith(tail, hl):  # (the two cannot overlap)
            return -1
        try:
            text = _loads(data[hl - 1:len(data) - cut])
        except _JSONDecodeError:
            return -1
        if not text:  # (no token: the usual path counts it)
            return -1
        self.chunks += 1
        self.token_chunks += 1
        if call is None:
            self._content.append(text)
        else:
            self._take_piece(call, text)
        if self.first_token_payload is None:
            self.first_token_payload = data[at:-2]
            if self.first_kind is None:
                self.first_kind = "text" if call is None else "tool"
        return TOKEN

    def _make_read(self) -> ReadShape | None:
        """(`take_read`: `_read_later`) `_read` made from the stream's learnt shape, where a reader
        learns shapes that a burst's one read never needs (chat's, a stream's own)."""
        self._read_later = False
        return None

    def _take_piece(self, call: int, text: str) -> None:
        """A piece of tool call `call`'s arguments, taken by shape (`take_read`)."""
        self.calls.calls[call][PIECES].append(text)

    def add_events(self, events: list[bytes]) -> tuple[int, int]:
        """Whole SSE events of one `event:` and one `data:` line each, as the read loop splits them
        (`EventReader.add_events`); their flags and how many were taken. This reader takes none:
        the read loop hands them all to the SSE decoder."""
        return 0, 0

    def _add_one(self, payload: bytes) -> int:
        """One payload, parsed and taken field by field (the API's reader)."""
        raise NotImplementedError

    def _add_shaped(self, payloads: list[bytes], shape: Shape) -> int:
        """Payloads of the learned `shape` (`add_many`); their flags."""
        raise NotImplementedError

    def _learn(self, payload: bytes, key: bytes, text: str, call: int | None) -> None:
        """`payload` was a token event whose whole effect was its one output string `text`, the value
        of `key` (`b'"content"'`, `b'"text"'`, ...): the answer's text (call None) or a piece of the
        arguments of tool call `call`. Keep the bytes around that string as the stream's shape when
        they can only be that: the key occurs once in the payload, right before a colon and the
        string as orjson writes it. (Quotes inside a JSON string are escaped, so those bytes are the
        object's own key; another spelling of the same text, `\\u00e9` for an accent, learns
        nothing and the stream's events are parsed.) An event with the server's send stamp
        (`SERVER_STAMP`, the first token's on agentload's mock and the bench server) is unlike the
        stream's others: none is learnt from it, and the next token event is learnt from."""
        if SERVER_STAMP in payload:
            return
        self._learned += 1
        if payload.count(key) != 1:  # (also as a string anywhere else, or the key spelt with spaces)
            return
        key += b":"
        lit = orjson.dumps(text)
        at = payload.find(key + lit)
        if at < 0:
            return
        a = at + len(key) + 1  # just past the string's opening quote
        self._shape = (payload[:a], payload[a + len(lit) - 2:], call)

    @staticmethod
    def _shaped_texts(payloads: list[bytes], shape: Shape) -> list | None:
        """The strings of payloads that are `shape`'s head, then the bytes of one JSON string's
        contents, then its tail; None where they are not all that. The contents are decoded as one
        array, `["c1",\n"c2",...]`: a raw line break may not occur inside a JSON string, so no
        string can run from one payload's part into the next, and the array has exactly one
        element per payload only if each part is exactly one string's contents (so each payload
        is the learned event with another string in it)."""
        a, b = len(shape[0]), len(shape[1])
        try:
            texts = _loads(b'["' + b'",\n"'.join([p[a:len(p) - b] for p in payloads]) + b'"]')
        except _JSONDecodeError:
            return None
        return texts if len(texts) == len(payloads) else None

    def _take_shaped(self, payloads: list[bytes], texts: list, call: int | None, data_at: int = 0) -> int:
        """Shaped payloads' strings taken, as their events' parse would have: the answer's text
        (call None) or pieces of tool call `call`'s arguments. Returns how many carried a token
        (an empty string is none). (`data_at`: where the payload starts in each, after an event's
        name line.)"""
        n = len(payloads)
        self.chunks += n
        tokens = n - texts.count("")
        if not tokens:
            return 0
        if call is None:
            self._content.extend(texts)
        else:
            self.calls.calls[call][PIECES].extend(texts)
        if self.first_token_payload is None:
            self.first_token_payload = payloads[next(i for i, t in enumerate(texts) if t)][data_at:]
            if self.first_kind is None:
                self.first_kind = "text" if call is None else "tool"
        self.token_chunks += tokens
        return tokens

    def _bad(self, payload: bytes) -> int:
        """Count one malformed event (see BAD_JSON)."""
        self.bad_json += 1
        if self.first_bad is None:
            self.first_bad = payload[:BAD_SAMPLE]
        return BAD_JSON

    def _set_error(self, text: str) -> int:
        self.errors += 1
        if self.error is None:
            self.error = text
        return ERROR

    def _whole_object(self, body: bytes) -> dict | None:
        """A non-streamed body as its JSON object (None: it is not one, counted malformed)."""
        self.chunks = 1
        try:
            obj = _loads(body)
        except _JSONDecodeError:
            self.not_completion = "not JSON"
            self._bad(body)
            return None
        if type(obj) is not dict:
            self.not_completion = f"a JSON {type(obj).__name__.replace('NoneType', 'null')}, not an object"
            self._bad(body)
            return None
        return obj

    # ------------------------------------------------------------------ results

    @property
    def content(self) -> str:
        parts = self._content
        if len(parts) > 1:
            parts[:] = ["".join(parts)]
        return parts[0] if parts else ""

    @property
    def tool_calls(self) -> list[dict]:
        """Joined tool calls in index order (`ToolCalls.as_list`)."""
        return self.calls.as_list()

    @property
    def tool_call_count(self) -> int:
        """len(self.tool_calls), without building them when there are none."""
        return len(self.calls.as_list()) if self.calls else 0

    def tool_call_problems(self, expected: bool = False, max_tokens: int | None = None) -> list[str] | None:
        """Why this answer's tool calls cannot be sent back as they came (`ToolCalls.problems`)."""
        return self.calls.problems(self.finish_reason, self.token_chunks, self.usage, expected, max_tokens)

    def assistant_message(self, content: str = "null") -> dict:
        """The assistant message a real agent appends to its history (see `assistant_turn`).

        ``content`` says how a turn with no text is sent (``conversation.assistant_content``:
        "empty", "null" or "omit"); ``tool_calls`` is omitted when there are none; ids and
        arguments exactly as received. Reasoning is not sent back.
        """
        calls = self.calls.as_list() if self.calls else None
        if calls:
            for c in calls:
                c["type"] = "function"
        return assistant_turn(self.content, calls, content)


Handler = Callable[[Any, dict], int]


class EventReader(AnswerReader):
    """An answer whose events each name their `type` and end with a terminal event (Messages,
    Responses). A subclass gives `HANDLERS` (event type -> handler of the parsed event, returning
    its flags; a wrong-shaped event raises AttributeError, TypeError, KeyError or ValueError and is
    counted malformed), `_usage`, and `_shaped` (which token events `add_many` may learn the
    shape of)."""

    __slots__ = ()
    HANDLERS: dict[str, Handler] = {}
    # The text shape the last stream of this API learnt, as `_shape` and `_event_shape`: a new
    # stream starts with it, so a server whose text events are the same from one answer to the next
    # (Messages': no id in them) has each answer's taken by shape from its first. A text event's
    # effect is its string whatever came before it in its stream; a tool call's piece is not passed
    # on (its call may not be open in the next stream). Set where a stream learns one (`_add_event`),
    # with the read shape of the event shape (`whole_read`); taken by `AnswerReader.__init__`.
    _text_shapes: tuple[Shape, Shape, ReadShape | None] | None = None
    # Short whole events (`NAME\ndata: PAYLOAD`, at most QUIET_LEN bytes) of a type no handler takes,
    # each byte for byte one this API's readers parsed before: the same bytes, so the same object, a
    # valid one, of the same effect (a count), taken without a parse (`add_events`). At most
    # QUIET_MAX; a server whose every such event differs fills it, and it is dropped (None: no more
    # look-ups). None: the API's are not looked up (Responses': each names its item).
    _quiet: set[bytes] | None = None

    def _shaped(self, obj: dict) -> tuple[bytes, str, int | None] | None:
        """A token event (its handler took it) whose whole effect is one output string: (its key,
        the string, None for the answer's text or the int index of the tool call it is a piece
        of); else None."""
        return None

    def _add_shaped(self, payloads: list[bytes], shape: Shape) -> int:
        texts = self._shaped_texts(payloads, shape)
        if texts is None:
            out = 0
            for p in payloads:
                out |= self._add_one(p)
            return out
        tokens = self._take_shaped(payloads, texts, shape[2])
        self.no_choices += len(payloads) - tokens
        return TOKEN if tokens else 0

    def add_events(self, events: list[bytes]) -> tuple[int, int]:
        """The events of one read, in stream order, each as `NAME\\ndata: PAYLOAD` (a read of
        whole events split on `\\n\\nevent: `, its first `event: ` cut: `sse_body`); returns the
        flags of what they carried (`add_many`'s) and how many were taken. An event is taken when
        it is exactly one `event:` line and one `data:` line: its PAYLOAD as `add` takes a data
        event's, or as `add_error_event` under `event: error`. The first one that is anything else
        (a line break elsewhere, `data:` without its space, another field) is not taken, nor any
        after it: the caller hands them to the SSE decoder.

        A token event that is byte for byte the stream's learned shape with its name line before
        it (`_event_shape`, learnt with `_shape`) around one JSON string is taken by that shape,
        as in `add_many`, without a look at its lines of its own: the shape holds the event's one
        line break, and a JSON string none (`_shaped_texts`). A short event of no effect that is
        byte for byte one parsed before (`_quiet`: Messages' `ping`, `content_block_stop`) is
        counted without a parse; a byte off, it is parsed."""
        out = taken = 0
        run: list[bytes] | None = None
        quiet = self._quiet
        shape = self._event_shape
        head, tail, hl = (shape[0], shape[1], len(shape[0])) if shape else (None, b"", 0)
        for ev in events:
            # (no shape: b"" is not None; the tail is looked for after the head: the two cannot overlap)
            if ev[:hl] == head and ev.endswith(tail, hl):
                if run is None:
                    run = [ev]
                else:
                    run.append(ev)
                continue
            if run:
                flags, n = self._add_run(run, shape)  # type: ignore[arg-type]
                out |= flags
                taken += n
                if n < len(run):
                    return out, taken
                run = None
            if quiet is not None and len(ev) <= QUIET_LEN and ev in quiet:  # (see _quiet)
                self.chunks += 1
                self.no_choices += 1
                taken += 1
                continue
            flags = self._add_event(ev)
            if flags < 0:
                return out, taken
            out |= flags
            taken += 1
            if self._event_shape is not shape:
                shape = self._event_shape
                head, tail, hl = shape[0], shape[1], len(shape[0])  # type: ignore[index]
        if run:
            flags, n = self._add_run(run, shape)  # type: ignore[arg-type]
            out |= flags
            taken += n
        return out, taken

    def _add_run(self, run: list[bytes], shape: Shape) -> tuple[int, int]:
        """Events of the learned event shape (`add_events`): their flags and how many were taken;
        where their strings are not each one JSON string, each is taken on its own, up to the first
        that is not one event."""
        texts = self._shaped_texts(run, shape)
        if texts is None:
            out = 0
            for i, ev in enumerate(run):
                flags = self._add_event(ev)
                if flags < 0:
                    return out, i
                out |= flags
            return out, len(run)
        tokens = self._take_shaped(run, texts, shape[2], shape[0].find(b"\n") + 7)
        self.no_choices += len(run) - tokens
        return (TOKEN if tokens else 0), len(run)

    def _add_event(self, ev: bytes) -> int:
        """One event `NAME\\ndata: PAYLOAD` (`add_events`): its flags, or -1 when it is not exactly
        that (one line break, then `data: `). Its payload is taken as `_add_one` takes it, written
        out here (one call fewer for each of an answer's parsed events)."""
        i = ev.find(b"\n")
        if ev[i:i + 7] != b"\ndata: " or ev.find(b"\n", i + 7) >= 0:
            return -1
        if i == 5 and ev[:5] == b"error":
            return self.add_error_event(ev[12:])
        payload = ev[i + 7:]
        try:
            obj = _loads(payload)
        except _JSONDecodeError:
            obj = None
        if type(obj) is not dict or type(t := obj.get("type")) is not str:
            return self._add_one(payload)  # ([DONE], or malformed: counted there)
        self.chunks += 1
        handler = self.HANDLERS.get(t)
        if handler is None:  # (events this version does not know: 0)
            self.no_choices += 1
            quiet = self._quiet
            if quiet is not None and len(ev) <= QUIET_LEN:  # (see _quiet)
                if len(quiet) < QUIET_MAX:
                    quiet.add(ev)
                else:
                    type(self)._quiet = None
            return 0
        try:
            flags = handler(self, obj)
        except (AttributeError, TypeError, KeyError, ValueError):
            return self._bad(payload)
        if not flags & TOKEN:
            self.no_choices += 1
            return flags
        shape = self._shape
        self._token_event(obj, payload)
        learnt = self._shape
        if learnt is not shape and learnt is not None:  # learnt from this event: the same with its name line
            self._event_shape = (ev[:i + 7] + learnt[0], learnt[1], learnt[2])
            self._read = whole_read(b"event: " + self._event_shape[0], learnt[1] + b"\n\n", learnt[2])
            if learnt[2] is None:  # (text only: see _text_shapes)
                type(self)._text_shapes = (learnt, self._event_shape, self._read)
        return flags

    def _add_one(self, payload: bytes) -> int:
        self.chunks += 1
        try:
            obj = _loads(payload)
        except _JSONDecodeError:
            if payload.strip() == b"[DONE]":  # (not these APIs'; some proxies add it): nothing
                self.dones += 1
                self.no_choices += 1
                return 0
            return self._bad(payload)
        if type(obj) is not dict or type(obj.get("type")) is not str:
            return self._bad(payload)
        handler = self.HANDLERS.get(obj["type"])
        try:
            flags = handler(self, obj) if handler is not None else 0  # (events this version does not know: 0)
        except (AttributeError, TypeError, KeyError, ValueError):
            return self._bad(payload)
        if flags & TOKEN:
            self._token_event(obj, payload)
        else:
            self.no_choices += 1
        return flags

    def _token_event(self, obj: dict, payload: bytes) -> None:
        """A parsed event its handler found a token in: counted, and its shape learnt if it has one."""
        self.token_chunks += 1
        if self.first_token_payload is None:
            self.first_token_payload = payload
        if self._learned < MAX_SHAPES:
            got = self._shaped(obj)
            if got is not None:
                self._learn(payload, *got)

    def _token(self, kind: str) -> int:
        if self.first_kind is None:
            self.first_kind = kind
        return TOKEN

    def _error_object(self, obj: dict) -> int:
        """An `error` event: `{"type": "error", "error": {...}}`, or the error's fields at the top."""
        err = obj.get("error")
        return self._set_error(error_text(err if err is not None else obj, obj))

    def add_error_event(self, payload: bytes) -> int:
        """The data of an SSE `event: error`: always an error, whatever its data."""
        try:
            obj = _loads(payload)
        except _JSONDecodeError:
            obj = None
        self.chunks += 1
        if type(obj) is dict:
            return self._error_object(obj)
        return self._set_error(short(payload.decode("utf-8", "replace").strip() or "error event"))

    def _usage(self, u: Any) -> int:
        raise NotImplementedError
