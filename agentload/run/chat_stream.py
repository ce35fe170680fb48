"""Accumulator for one OpenAI chat-completions response (streamed or not).

One ``ChatStream`` per request. ``add(payload)`` takes one SSE data payload (what
``sse.SSEDecoder`` returns) and returns a bitmask saying what the chunk carried, so
the read loop can stamp its timestamps without looking inside the JSON itself::

    flags = cs.add(payload)
    if flags & TOKEN and t_first_token is None: t_first_token = now

``add_many(payloads)`` takes the events of one network read in one call (what ``add`` does for
each, in order) and returns their flags or-ed; ``first_token_payload`` keeps the payload of the
first chunk that carried a token (where a server's own send stamp is looked for).

Flags:

- ``TOKEN``: the chunk carries output. That is a non-empty ``content``,
  ``reasoning_content`` (or vLLM's newer ``reasoning``) string, or a tool-call
  fragment with a non-empty ``function.name`` or a non-empty ``function.arguments``
  fragment. NOT tokens: a role-only first chunk (``{"role":"assistant","content":""}``
  as vLLM and SGLang send), a tool-call fragment carrying only ``id``/``type``/
  ``index`` (no generated text yet), a finish-only chunk, a usage-only chunk.
- ``FINISH``: a non-null ``finish_reason`` (also in a chunk of its own with an empty
  delta, as SGLang sends it).
- ``USAGE``: a non-empty ``usage`` object (the ``choices: []`` chunk of
  ``stream_options.include_usage``, or usage in every chunk with vLLM's continuous
  usage stats).
- ``DONE``: the ``[DONE]`` sentinel. It is the end of the answer, as for an SDK client: whatever
  comes after it is not taken (no token, no content, no finish_reason, no usage), only counted in
  ``.after_done`` (data events after the first ``[DONE]``, a repeated ``[DONE]`` aside),
  ``.after_done_tokens`` (those of them that carried a token) and ``.first_after_done`` (the first
  one's leading bytes): a protocol finding (`request.protocol_notes`), never part of the answer.
- ``ERROR``: an in-band error: ``{"error": {...}}`` / ``{"error": "..."}``
  (vLLM, SGLang, routers) or ``{"object": "error", "message": ...}`` (older vLLM).
  ``.error`` keeps the first one as a short string, ``.errors`` counts them.
- ``BAD_JSON``: a malformed event: the payload is not JSON, not a JSON object, or
  an object of the wrong shape (``choices`` not a list, a ``delta`` or tool-call
  ``function`` that is not an object, a non-string ``finish_reason``, a ``usage``
  that is not an object). Counted in ``.bad_json`` (the record's ``bad_events``),
  the first one's leading bytes kept in ``.first_bad``; never raises. Whatever
  the rest of a wrong-shaped chunk carried is still taken (a token next to a
  ``"usage": "n/a"`` is a token). ``.usage`` is only ever a dict or None.

``add_error_event(payload)`` takes the data of an SSE ``event: error``: always an
error (ERROR), whatever its payload; a non-JSON payload there is the error's text,
not a malformed event.

``from_response(body)`` reads a non-streamed body. ``.not_completion`` then says
why the body is not a ``chat.completion`` object (``"not JSON"``, ``"no choices"``,
...), None when it is one (or when it is an in-band error object, see ``.error``).

Only choice index 0 is accumulated (agents send ``n=1``; other choices are ignored).

Tool calls are joined by ``index``: ``id``, ``type`` and ``function.name`` come from
the first non-null value seen for that index (later values are ignored);
``arguments`` fragments are concatenated as received, even if the result is not
valid JSON. Explicit ``null``s (SGLang) and empty ids are ignored. A fragment without an
``index`` (non-conforming servers) continues the last call, unless it carries an
``id`` different from the last call's id, which starts a new call.

``tool_call_problems(expected)`` says, once the answer is read, why its tool calls cannot be sent
back as they came (a real agent would have to invent or repair something): a call without an id
or a name, arguments that are not a JSON object (not JSON, cut mid-JSON, an object sent instead of
a string), a second id on an index already taken by another call (two calls the server merged),
and an answer cut by ``finish_reason: "length"`` that carried a tool call or was asked for one.
Only the last check is made while the stream is read (a fragment's id against its call's).

Size: ~720 lines: chat's stream reader and its tool-call checks, which the other APIs' readers
mirror; a split by idea is issue 28's next step.
"""

from __future__ import annotations

from typing import Any, Iterable

import orjson

from agentload.records.record import BAD_ARGUMENTS, IDS_ON_ONE_INDEX, NO_ID, NO_NAME, TRUNCATED

__all__ = [
    "TOKEN",
    "FINISH",
    "USAGE",
    "DONE",
    "ERROR",
    "BAD_JSON",
    "ChatStream",
    "assistant_turn",
]

TOKEN = 1
FINISH = 2
USAGE = 4
DONE = 8
ERROR = 16
BAD_JSON = 32

_ERROR_MAX = 300  # characters kept in ChatStream.error
BAD_SAMPLE = 120  # bytes of the first malformed payload kept in ChatStream.first_bad
_MAX_SHAPES = 4  # token-chunk shapes learned per stream (a server whose every chunk differs: the parsed path)
_MAX_PROBLEMS = 8  # tool-call problems kept per answer


_loads = orjson.loads
_JSONDecodeError = orjson.JSONDecodeError


def _short(s: str) -> str:
    s = " ".join(s.split())
    return s if len(s) <= _ERROR_MAX else s[: _ERROR_MAX - 3] + "..."


def _error_text(err: Any, obj: dict) -> str:
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
    return _short(text)


class ChatStream:
    """Accumulates one chat-completions response; see the module docstring."""

    __slots__ = (
        "id",
        "model",
        "fingerprint",
        "finish_reason",
        "usage",
        "error",
        "errors",
        "chunks",
        "token_chunks",
        "bad_json",
        "first_bad",
        "done",
        "dones",
        "no_choices",
        "not_completion",
        "first_token_payload",
        "first_kind",
        "after_done",
        "after_done_tokens",
        "first_after_done",
        "_content",
        "_calls",
        "_last_index",
        "_odd_calls",
        "_shape",
        "_learned",
    )

    def __init__(self) -> None:
        self.id: str | None = None
        self.model: str | None = None
        self.fingerprint: object = None  # system_fingerprint: the backend that answered
        self.finish_reason: str | None = None
        self.usage: dict | None = None
        self.error: str | None = None  # first in-band error, short
        self.errors = 0
        self.chunks = 0  # data payloads added
        self.token_chunks = 0  # payloads that returned TOKEN
        self.bad_json = 0  # malformed events (see BAD_JSON)
        self.first_bad: bytes | None = None  # leading bytes of the first malformed event
        self.done = False
        self.dones = 0  # [DONE] sentinels seen
        self.no_choices = 0  # JSON objects without choices (usage-only chunks, errors, other)
        self.not_completion: str | None = None  # from_response: why the body is not a chat.completion
        self.first_token_payload: bytes | None = None  # the first chunk that carried a token
        self.first_kind: str | None = None  # what that first output was: text, tool or reasoning (`_first_kind`)
        self.after_done = 0  # data events after the first [DONE] (not taken)
        self.after_done_tokens = 0  # ... of which carried a token
        self.first_after_done: bytes | None = None  # the first one's leading bytes
        self._content: list[str] = []
        # index -> [id, type, name, [argument fragments]]
        self._calls: dict[int, list] = {}
        self._last_index: int | None = None
        self._odd_calls: list[str] | None = None  # what the fragments did that no call should (`tool_call_problems`)
        # The stream's usual token chunk as bytes around its one changing string (see `_learn`):
        # (head, tail, where the string goes: None for content, else a tool call's index), or None.
        self._shape: tuple[bytes, bytes, int | None] | None = None
        self._learned = 0  # shapes learned so far (at most _MAX_SHAPES per stream)

    def __repr__(self) -> str:
        return (
            f"ChatStream(chunks={self.chunks}, token_chunks={self.token_chunks}, "
            f"content_chars={len(self.content)}, tool_calls={len(self._calls)}, "
            f"finish_reason={self.finish_reason!r}, usage={self.usage is not None}, "
            f"done={self.done}, errors={self.errors}, bad_json={self.bad_json})"
        )

    # ------------------------------------------------------------------ streaming

    def add(self, payload: bytes) -> int:
        """Add one SSE data payload; return a bitmask of TOKEN|FINISH|USAGE|DONE|ERROR|BAD_JSON."""
        return self.add_many((payload,))

    def add_many(self, payloads: Iterable[bytes]) -> int:
        """Add SSE data payloads, in stream order (the events of one read); return the bitmask of
        what any of them carried (`add`'s flags, or-ed). Each payload is taken exactly as by `add`
        (which is this with one payload).

        A stream's token chunks differ from one another only in their text (the same id, model,
        created, index and nulls around it), so once a chunk has been parsed and its shape learned
        (`_learn`), a payload that is byte for byte that shape around one JSON string is a chunk of
        that shape carrying that string: it is not parsed as an object. The strings of a read's
        such chunks are decoded together by one `orjson.loads` of an array, which also validates
        each of them (see `_add_shaped`); anything else, or a batch that does not decode to
        exactly one string per chunk, goes through `_add_one`: every chunk is still checked."""
        out = 0
        shaped: list[bytes] | None = None
        shape = self._shape
        head, tail, least = (shape[0], shape[1], len(shape[0]) + len(shape[1])) if shape else (None, b"", 0)
        for payload in payloads:
            if head is not None and payload.startswith(head) and payload.endswith(tail) and len(payload) >= least:
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
                head, tail, least = shape[0], shape[1], len(shape[0]) + len(shape[1])  # type: ignore[index]
        if shaped:
            out |= self._add_shaped(shaped, shape)  # type: ignore[arg-type]
        return out

    def _add_shaped(self, payloads: list[bytes], shape: tuple[bytes, bytes, int | None]) -> int:
        """Payloads that are `shape`'s head, then the bytes of one JSON string's contents, then its
        tail. The contents are decoded as one array, `["c1",\n"c2",...]`: a raw line break may not
        occur inside a JSON string, so no string can run from one payload's part into the next, and
        the array has exactly one element per payload only if each part is exactly one string's
        contents (so each payload is the learned chunk with another string in it). Otherwise each
        payload is taken on its own (`_add_one`), as if there were no shape."""
        if self.done:  # after [DONE]: counted, never taken (a read's shaped chunks before it went first)
            return self._after_done(payloads)
        head, tail, call = shape
        a, b = len(head), len(tail)
        try:
            texts = _loads(b'["' + b'",\n"'.join([p[a:len(p) - b] for p in payloads]) + b'"]')
        except _JSONDecodeError:
            texts = None
        n = len(payloads)
        if texts is None or len(texts) != n:
            out = 0
            for p in payloads:
                out |= self._add_one(p)
            return out
        self.chunks += n
        if call is not None:
            self._last_index = call
        tokens = n - texts.count("")
        if not tokens:
            return 0
        if call is None:
            self._content.extend(texts)
        else:
            self._calls[call][3].extend(texts)
        if self.token_chunks == 0 and self.first_token_payload is None:
            self.first_token_payload = payloads[next(i for i, t in enumerate(texts) if t)]
            self.first_kind = "text" if call is None else "tool"
        self.token_chunks += tokens
        return TOKEN

    def _learn(self, payload: bytes, text: str, call: int | None) -> None:
        """`payload` was a token chunk whose one output string is `text` (content, or the arguments
        of tool call `call`). Keep the bytes around that string as the stream's shape when they
        can only be that: the key's name (`"content"`, `"arguments"`) occurs once in the payload,
        right before a colon and the string as orjson writes it. (Quotes inside a JSON string are escaped, so those
        bytes are the object's own key; another spelling of the same text, `\\u00e9` for an accent,
        learns nothing and the stream's chunks are parsed.)"""
        self._learned += 1
        name = b'"content"' if call is None else b'"arguments"'
        if payload.count(name) != 1:  # (also as a string anywhere else, or the key spelt with spaces)
            return
        key = name + b":"
        lit = orjson.dumps(text)
        at = payload.find(key + lit)
        if at < 0:
            return
        a = at + len(key) + 1  # just past the string's opening quote
        self._shape = (payload[:a], payload[a + len(lit) - 2:], call)

    def _add_one(self, payload: bytes) -> int:
        """One payload, parsed and looked at field by field (learns the stream's shape from a
        plain token chunk)."""
        if self.done:  # the answer ended at [DONE]: nothing after it is taken
            return self._after_done((payload,))
        if payload == b"[DONE]":
            self.done = True
            self.dones += 1
            self.chunks += 1
            return DONE
        self.chunks += 1
        try:
            obj = _loads(payload)
        except _JSONDecodeError:
            if payload.strip() == b"[DONE]":
                self.done = True
                self.dones += 1
                return DONE
            return self._bad(payload)
        if type(obj) is not dict:
            return self._bad(payload)

        flags = 0
        choices = obj.get("choices")
        if choices:
            if self.id is None:
                self.id = obj.get("id")
                self.model = obj.get("model")
                self.fingerprint = obj.get("system_fingerprint")
            try:  # zero-cost unless a field has the wrong type (a str delta, choices: 5, ...)
                for ch in choices:
                    if type(ch) is not dict or ch.get("index"):
                        continue  # only choice 0
                    delta = ch.get("delta")
                    c = tc = None
                    if delta:
                        c = delta.get("content")
                        if c and type(c) is str:
                            self._content.append(c)
                            flags = TOKEN
                        if c is None or len(delta) > 1:  # ({"content": ...} alone, the usual delta, has no more)
                            r = delta.get("reasoning_content") or delta.get("reasoning")
                            if r and type(r) is str:  # output (progress), never sent back: not kept
                                flags = TOKEN
                            tc = delta.get("tool_calls")
                            if tc and self._add_tool_calls(tc):
                                flags = TOKEN
                    fr = ch.get("finish_reason")
                    if fr:
                        if type(fr) is not str:
                            raise TypeError("finish_reason")
                        self.finish_reason = fr
                        flags |= FINISH
                    elif (flags and self._learned < _MAX_SHAPES and len(choices) == 1 and len(delta) == 1
                          and not obj.get("usage")):  # a plain token chunk: the stream's shape (`_learn`)
                        if c:
                            self._learn(payload, c, None)
                        elif tc and len(tc) == 1:
                            self._learn_call(payload, tc[0])
            except (AttributeError, TypeError):
                flags |= self._bad(payload)
        else:
            self.no_choices += 1
            if self.id is None and "id" in obj:
                self.id = obj.get("id")
                self.fingerprint = obj.get("system_fingerprint")
                self.model = obj.get("model")
            err = obj.get("error")
            if err or obj.get("object") == "error":
                flags |= self._set_error(_error_text(err, obj))
        u = obj.get("usage")
        if u:
            if type(u) is dict:
                self.usage = u
                flags |= USAGE
            else:  # "usage": "n/a": never kept (readers rely on a dict or None)
                flags |= self._bad(payload)
        if flags & TOKEN:
            self.token_chunks += 1
            if self.token_chunks == 1 and self.first_token_payload is None:
                self.first_token_payload = payload
                self.first_kind = self._first_kind()
        return flags

    def _first_kind(self) -> str:
        """What the first output was (called once, when it came): text if any content came with it,
        else a tool call if one has a name or arguments, else reasoning."""
        if self._content:
            return "text"
        if any(c[2] or c[3] for c in self._calls.values()):
            return "tool"
        return "reasoning"

    def _after_done(self, payloads: Iterable[bytes]) -> int:
        """Data events after the answer's [DONE]: counted (and whether each carried a token, read by
        a stream of its own), never taken. A repeated [DONE] only counts in `dones`."""
        for p in payloads:
            if p.strip() == b"[DONE]":
                self.dones += 1
                continue
            self.after_done += 1
            if self.first_after_done is None:
                self.first_after_done = p[:BAD_SAMPLE]
            if ChatStream()._add_one(p) & TOKEN:
                self.after_done_tokens += 1
        return 0

    def _learn_call(self, payload: bytes, frag: Any) -> None:
        """A chunk that was one tool call's arguments fragment and nothing else: its shape."""
        if type(frag) is not dict or set(frag) - {"index", "function"}:
            return
        fn = frag.get("function")
        idx = frag.get("index")
        if type(idx) is not int or type(fn) is not dict or set(fn) != {"arguments"}:
            return
        args = fn["arguments"]
        if type(args) is str and args and idx in self._calls:
            self._learn(payload, args, idx)

    def add_error_event(self, payload: bytes) -> int:
        """Add the payload of an SSE ``event: error``: always reports ERROR.

        A JSON object is taken like any chunk (an ``{"error": ...}`` inside gives the text),
        else its own ``message``/``type``/``code`` give it; any other payload (plain text, no
        data at all) is the error's text and is not counted as a malformed event. After [DONE] it
        is counted with the events after it, never taken.
        """
        if self.done:
            return self._after_done((payload,))
        try:
            obj = _loads(payload)
        except _JSONDecodeError:
            obj = None
        if type(obj) is dict:
            flags = self.add(payload)
            if not flags & ERROR:
                flags |= self._set_error(_error_text(obj, obj))
            return flags
        self.chunks += 1
        text = payload.decode("utf-8", "replace").strip() or "error event"
        return self._set_error(_short(text))

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

    def _add_tool_calls(self, frags: Any) -> bool:
        """Merge tool-call fragments; True if any carried a name or arguments text."""
        token = False
        calls = self._calls
        for f in frags:
            if type(f) is not dict:
                continue
            idx = f.get("index")
            fid = f.get("id")
            if type(idx) is not int:
                # Non-conforming server without index: continue the last call unless
                # this fragment opens a new one (a different id).
                last = self._last_index
                if last is None or (fid and calls[last][0] is not None and calls[last][0] != fid):
                    idx = 0 if last is None else max(calls) + 1
                else:
                    idx = last
            call = calls.get(idx)
            if call is None:
                call = calls[idx] = [None, None, None, []]
            self._last_index = idx
            if fid:
                if call[0] is None:
                    call[0] = fid
                elif fid != call[0]:  # a second call on a taken index: joined into one by the rule above
                    self._odd(f"{IDS_ON_ONE_INDEX}: index {idx} carried the ids {_sample(call[0])} and "
                              f"{_sample(fid)}: two calls that would be merged into one")
            ftype = f.get("type")
            if ftype is not None and call[1] is None:
                call[1] = ftype
            fn = f.get("function")
            if fn:
                name = fn.get("name")
                if name:
                    if call[2] is None:
                        call[2] = name
                    token = True
                args = fn.get("arguments")
                if args:
                    if type(args) is not str:  # non-conforming: an object, not a string
                        args = orjson.dumps(args).decode()
                        self._odd(f"{BAD_ARGUMENTS}: index {idx} sent its arguments as a JSON "
                                  f"{_json_type(fn.get('arguments'))}, not a string")
                    call[3].append(args)
                    token = True
        return token

    def _odd(self, line: str) -> None:
        odd = self._odd_calls
        if odd is None:
            self._odd_calls = [line]
        elif len(odd) < _MAX_PROBLEMS and line not in odd:
            odd.append(line)

    def tool_call_problems(self, expected: bool = False, max_tokens: int | None = None) -> list[str] | None:
        """Why this answer's tool calls cannot be sent back as they came, one `code: detail` line
        each (the record's `tool_call_problems`); None when nothing is wrong. `expected`: a tool call
        was asked for (`tool_choice` "required" or a tool's name), so an answer cut by max_tokens is
        truncated even without one. Codes: `truncated` (finish_reason length on an answer that carried
        a tool call or was asked for one; or arguments cut mid-JSON once the answer's tokens reached
        `max_tokens`, whatever finish_reason said: llama-cpp-python says "tool_calls" for a named tool
        however it ended), `bad_arguments`, `no_id`, `no_name`, `ids_on_one_index`."""
        calls = self._calls
        if not calls and not (expected and self.finish_reason == "length"):
            return None
        out: list[str] = []
        cut = 0
        for i, c in enumerate(self.tool_calls if calls else ()):
            fn = c["function"]
            name = fn["name"]
            who = f"call {i} ({name})" if name else f"call {i}"
            if not c["id"]:
                out.append(f"{NO_ID}: {who} came without an id (a tool result cannot name it)")
            if not name:
                out.append(f"{NO_NAME}: {who} came without a function name")
            args = fn["arguments"]
            try:
                obj = _loads(args)
            except _JSONDecodeError:
                cut += 1
                out.append(f"{BAD_ARGUMENTS}: {who} arguments are not JSON ({len(args)} chars): {_sample(args)}")
                continue
            if type(obj) is not dict:
                out.append(f"{BAD_ARGUMENTS}: {who} arguments are a JSON {_json_type(obj)}, not an object: "
                           f"{_sample(args)}")
        if self._odd_calls:
            out.extend(self._odd_calls)
        n = len(self.tool_calls) if calls else 0
        if self.finish_reason == "length" and (calls or expected):
            what = (f"{n} tool call(s), the arguments of {cut} cut mid-JSON" if cut else
                    f"{n} tool call(s) with whole arguments" if n else "no tool call, though one was asked for")
            out.insert(0, f"{TRUNCATED}: finish_reason length after {self.token_chunks} token chunk(s): {what}")
        elif cut and max_tokens:
            u = self.usage.get("completion_tokens") if self.usage else None
            used, unit = (u, "completion_tokens") if type(u) is int else (self.token_chunks, "token chunk(s)")
            if used >= max_tokens:
                out.insert(0, f"{TRUNCATED}: finish_reason {self.finish_reason} but {used} {unit}, max_tokens "
                              f"{max_tokens}: {n} tool call(s), the arguments of {cut} cut mid-JSON")
        return out[:_MAX_PROBLEMS] or None

    # ------------------------------------------------------------------ non-streaming

    @classmethod
    def from_response(cls, body: bytes) -> "ChatStream":
        """Build from a non-streaming body: a ``chat.completion`` object or an error object.

        ``chunks`` is 1, ``token_chunks`` is 1 if the message had content, reasoning or
        a tool call; a body that is not a JSON object counts in ``bad_json`` (as does a
        ``usage`` that is not an object). ``not_completion`` says why the body is not a
        ``chat.completion`` object (None if it is one, or an error object: see ``error``).
        """
        self = cls()
        self.chunks = 1
        try:
            obj = _loads(body)
        except _JSONDecodeError:
            self.not_completion = "not JSON"
            self._bad(body)
            return self
        if type(obj) is not dict:
            self.not_completion = f"a JSON {type(obj).__name__.replace('NoneType', 'null')}, not an object"
            self._bad(body)
            return self
        self.id = obj.get("id")
        self.fingerprint = obj.get("system_fingerprint")
        self.model = obj.get("model")
        token = False
        choices = obj.get("choices")
        if choices and type(choices) is not list:
            self.not_completion = "choices is not a list"
        elif choices:
            self.not_completion = "no choice 0 with a message"
            for ch in choices:
                if type(ch) is not dict or ch.get("index"):
                    continue
                msg = ch.get("message")
                if type(msg) is not dict:
                    msg = ch.get("delta")
                if type(msg) is not dict:
                    self.not_completion = "choice 0 has no message object"
                    break
                self.not_completion = None
                c = msg.get("content")
                if c and type(c) is str:
                    self._content.append(c)
                    token = True
                r = msg.get("reasoning_content") or msg.get("reasoning")
                if r and type(r) is str:
                    token = True
                tcs = msg.get("tool_calls")
                if tcs and type(tcs) is list:
                    frags = []
                    for i, tc in enumerate(tcs):
                        if type(tc) is dict:
                            tc = dict(tc)
                            tc.setdefault("index", i)
                            if tc["index"] is None:
                                tc["index"] = i
                            frags.append(tc)
                    try:
                        if self._add_tool_calls(frags):
                            token = True
                    except (AttributeError, TypeError):  # a "function" that is not an object
                        self._bad(body)
                fr = ch.get("finish_reason")
                if fr:
                    if type(fr) is str:
                        self.finish_reason = fr
                    else:
                        self._bad(body)
                break
        else:
            err = obj.get("error")
            if err or obj.get("object") == "error":
                self._set_error(_error_text(err, obj))
            else:
                self.not_completion = "no choices"
        u = obj.get("usage")
        if u:
            if type(u) is dict:
                self.usage = u
            else:
                self._bad(body)
        if token:
            self.token_chunks = 1
            self.first_kind = self._first_kind()
        return self

    # ------------------------------------------------------------------ results

    @property
    def content(self) -> str:
        parts = self._content
        if len(parts) > 1:
            parts[:] = ["".join(parts)]
        return parts[0] if parts else ""

    @property
    def tool_calls(self) -> list[dict]:
        """Joined tool calls in index order: ``{"id","type","function":{"name","arguments"}}``.

        ``type`` defaults to ``"function"`` if the server never sent one; ``id`` and
        ``name`` are None if never sent (the caller decides what to do about that).
        An index that only ever received nulls/empty strings is not a call and is skipped.
        """
        out = []
        for idx in sorted(self._calls):
            cid, ctype, name, args = self._calls[idx]
            if cid is None and name is None and not args:
                continue  # an empty fragment (only index/type/nulls) is not a call
            if len(args) > 1:
                args[:] = ["".join(args)]
            out.append(
                {
                    "id": cid,
                    "type": ctype or "function",
                    "function": {"name": name, "arguments": args[0] if args else ""},
                }
            )
        return out

    @property
    def tool_call_count(self) -> int:
        """len(self.tool_calls), without building them when there are none."""
        return len(self.tool_calls) if self._calls else 0

    def assistant_message(self, content: str = "null") -> dict:
        """The assistant message a real agent appends to its history (see `assistant_turn`).

        ``content`` says how a turn with no text is sent (``conversation.assistant_content``:
        "empty", "null" or "omit"); ``tool_calls`` is omitted when there are none; ids and
        arguments exactly as received. Reasoning is not sent back.
        """
        calls = self.tool_calls if self._calls else None
        if calls:
            for c in calls:
                c["type"] = "function"
        return assistant_turn(self.content, calls, content)


def _sample(text: str, n: int = 60) -> str:
    """A short quote of what the server sent."""
    q = orjson.dumps(text[:n]).decode()
    return q + ("..." if len(text) > n else "")


def _json_type(v: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(type(v), "number")


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
