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

Tool calls are assembled by `agentload.run.apis.tool_calls.ToolCalls.merge_chat` (joined by
``index``); ``tool_call_problems(expected, max_tokens)`` is its check of whether they can be sent
back as they came, the same for every API. The fields, flags and results every API's reader
shares are `agentload.run.apis.reader`'s.
"""

from __future__ import annotations

from typing import Any, Iterable

import orjson

from agentload.run.apis.reader import (
    BAD_JSON,
    BAD_SAMPLE,
    DONE,
    ERROR,
    FINISH,
    MAX_SHAPES,
    TOKEN,
    USAGE,
    AnswerReader,
    ReadShape,
    Shape,
    error_text,
    short,
    whole_read,
)
from agentload.run.apis.tool_calls import NAME, PIECES

__all__ = ["TOKEN", "FINISH", "USAGE", "DONE", "ERROR", "BAD_JSON", "ChatStream"]

_loads = orjson.loads
_JSONDecodeError = orjson.JSONDecodeError


class ChatStream(AnswerReader):
    """Accumulates one chat-completions response; see the module docstring."""

    __slots__ = ()

    # ------------------------------------------------------------------ streaming
    # (`add` and `add_many`, the read loop with the learned token-chunk shape: `AnswerReader`'s)

    def _add_shaped(self, payloads: list[bytes], shape: Shape) -> int:
        """Payloads of the learned shape (`AnswerReader.add_many`): their strings taken as their
        chunks' parse would have, or each taken on its own (`_add_one`) where they are not all of
        that shape."""
        if self.done:  # after [DONE]: counted, never taken (a read's shaped chunks before it went first)
            return self._after_done(payloads)
        texts = self._shaped_texts(payloads, shape)
        if texts is None:
            out = 0
            for p in payloads:
                out |= self._add_one(p)
            return out
        call = shape[2]
        if call is not None:
            self.calls.last_index = call
        return TOKEN if self._take_shaped(payloads, texts, call) else 0

    def _add_one(self, payload: bytes) -> int:
        """One payload, parsed and looked at field by field (learns the stream's shape from a
        plain token chunk)."""
        if self.done:  # the answer ended at [DONE]: nothing after it is taken
            return self._after_done((payload,))
        self.chunks += 1
        if payload == b"[DONE]":
            self.done = True
            self.dones += 1
            return DONE
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
        choices = obj.get("choices")
        flags = self._choices(payload, obj, choices) if choices else self._no_choices(obj)
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

    def _choices(self, payload: bytes, obj: dict, choices: Any) -> int:
        """A chunk's choices (only choice 0 is taken: agents send n=1); its flags."""
        if self.id is None:
            self.id = obj.get("id")
            self.model = obj.get("model")
            self.fingerprint = obj.get("system_fingerprint")
        flags = 0
        try:  # zero-cost unless a field has the wrong type (a str delta, choices: 5, ...)
            for ch in choices:
                if type(ch) is not dict or ch.get("index"):
                    continue  # only choice 0
                delta: Any = ch.get("delta")
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
                        if tc and self.calls.merge_chat(tc):
                            flags = TOKEN
                fr = ch.get("finish_reason")
                if fr:
                    if type(fr) is not str:
                        raise TypeError("finish_reason")
                    self.finish_reason = fr
                    flags |= FINISH
                elif (flags and self._learned < MAX_SHAPES and len(choices) == 1 and len(delta) == 1
                      and not obj.get("usage")):  # a plain token chunk: the stream's shape (`_learn`)
                    if c:
                        self._learn(payload, b'"content"', c, None)
                    elif tc and len(tc) == 1:
                        self._learn_call(payload, tc[0])
        except (AttributeError, TypeError):
            flags |= self._bad(payload)
        return flags

    def _no_choices(self, obj: dict) -> int:
        """A chunk without choices: usage only, an in-band error, or something else; its flags."""
        self.no_choices += 1
        if self.id is None and "id" in obj:
            self.id = obj.get("id")
            self.fingerprint = obj.get("system_fingerprint")
            self.model = obj.get("model")
        err = obj.get("error")
        if err or obj.get("object") == "error":
            return self._set_error(error_text(err, obj))
        return 0

    def _first_kind(self) -> str:
        """What the first output was (called once, when it came): text if any content came with it,
        else a tool call if one has a name or arguments, else reasoning."""
        if self._content:
            return "text"
        if any(c[NAME] or c[PIECES] for c in self.calls.calls.values()):
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

    def _learn(self, payload: bytes, key: bytes, text: str, call: int | None) -> None:
        """`AnswerReader._learn`; the read that is one whole chunk of the shape learnt is made when
        the next read comes (`take_read`: a burst's answer is all in the read that taught it)."""
        super()._learn(payload, key, text, call)
        self._read = None
        self._read_later = self._shape is not None

    def _make_read(self) -> ReadShape | None:
        self._read_later = False
        shape = self._shape
        self._read = whole_read(b"data: " + shape[0], shape[1] + b"\n\n", shape[2]) if shape else None
        return self._read

    def _take_piece(self, call: int, text: str) -> None:
        """(`AnswerReader.take_read`) a fragment without an index continues this call, as after `_add_shaped`."""
        self.calls.last_index = call
        super()._take_piece(call, text)

    def _learn_call(self, payload: bytes, frag: Any) -> None:
        """A chunk that was one tool call's arguments fragment and nothing else: its shape."""
        if type(frag) is not dict or set(frag) - {"index", "function"}:
            return
        fn = frag.get("function")
        idx = frag.get("index")
        if type(idx) is not int or type(fn) is not dict or set(fn) != {"arguments"}:
            return
        args = fn["arguments"]
        if type(args) is str and args and idx in self.calls.calls:
            self._learn(payload, b'"arguments"', args, idx)

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
                flags |= self._set_error(error_text(obj, obj))
            return flags
        self.chunks += 1
        text = payload.decode("utf-8", "replace").strip() or "error event"
        return self._set_error(short(text))

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
        obj = self._whole_object(body)
        if obj is None:
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
                token = self._whole_message(body, msg)
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
                self._set_error(error_text(err, obj))
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

    def _whole_message(self, body: bytes, msg: dict) -> bool:
        """Choice 0's message of a non-streamed answer; True if it carried output."""
        token = False
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
                if self.calls.merge_chat(frags):
                    token = True
            except (AttributeError, TypeError):  # a "function" that is not an object
                self._bad(body)
        return token
