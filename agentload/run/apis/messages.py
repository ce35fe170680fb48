"""Anthropic's Messages API (`POST <endpoint>/messages`): the request and its stream.

The request: `model`, `max_tokens` (the API requires it), `stream`, `tools` as
`{name, description, input_schema}`, `tool_choice` in Anthropic's form (`{"type": "auto"}`,
`"any"` for OpenAI's "required", `{"type": "tool", "name": ...}`, `"none"`), `system`, then
`messages`: the assistant's tool calls as `tool_use` blocks (`input` an object), the tool results
of one round as one user message of `tool_result` blocks. Headers: `anthropic-version` and the
key as `x-api-key`.

The stream (`MessagesStream`), events by their `type` (the SSE `event:` line is not needed, but
`event: error` is an error whatever its data):

- `message_start`: the message's id, model and first usage (input_tokens, cache_read_input_tokens,
  cache_creation_input_tokens; the prompt is their sum, as chat's prompt_tokens counts it);
- `content_block_start`: a `tool_use` block opens a tool call (its name is output: a token, as a
  tool-call name is in chat); `content_block_delta`: `text_delta` (text), `input_json_delta`
  (a tool call's arguments), `thinking_delta` (reasoning): output if not empty;
- `message_delta`: `stop_reason` (end_turn and stop_sequence -> stop, tool_use -> tool_calls,
  max_tokens -> length, refusal -> content_filter, others as sent) and the output usage;
- `message_stop`: the end. A stream without it is cut short (`incomplete_stream`), whatever came;
- `error` (Anthropic's `overloaded_error`, ...): an in-band error; `ping`: nothing.

A tool call's joined `input_json_delta`s must be a JSON object (`tool_call_problems`).
"""

from __future__ import annotations

from typing import Any, Iterable

import orjson

from agentload.run.chat_stream import (BAD_JSON, BAD_SAMPLE, DONE, ERROR, FINISH, TOKEN, USAGE, _error_text, _short,
                                       assistant_turn)

NAME = "messages"
SYSTEM: bytes | None = b'"system":'
ITEMS = b'"messages":['
VERSION = "2023-06-01"

_loads = orjson.loads
_dumps = orjson.dumps
_JSONDecodeError = orjson.JSONDecodeError

STOP_REASONS = {"end_turn": "stop", "stop_sequence": "stop", "tool_use": "tool_calls", "max_tokens": "length",
                "refusal": "content_filter"}


def tool_choice(choice: Any) -> Any:
    """OpenAI's tool_choice (as chat sends it) in Anthropic's form."""
    if choice is None:
        return None
    if choice == "auto":
        return {"type": "auto"}
    if choice == "required":
        return {"type": "any"}
    if choice == "none":
        return {"type": "none"}
    return {"type": "tool", "name": choice["function"]["name"]}


def head(cfg: Any, model: str, tools: list[dict[str, Any]]) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "max_tokens": cfg.max_tokens, "stream": cfg.stream}
    if tools:
        body["tools"] = [{"name": f["name"], "description": f.get("description", ""),
                          "input_schema": f.get("parameters") or {"type": "object"}}
                         for f in (t["function"] for t in tools)]
        choice = tool_choice(cfg.tool_choice_json())
        if choice is not None:
            body["tool_choice"] = choice
    return body


def _input(arguments: Any) -> Any:
    """A tool call's arguments (a JSON string in chat's form) as tool_use's `input` object."""
    try:
        v = _loads(arguments) if arguments else {}
    except _JSONDecodeError:
        return {}  # (a model's arguments that are not JSON fail their request first: tool_call_problems)
    return v if type(v) is dict else {}


def encode(messages: list[dict[str, Any]]) -> list[bytes]:
    out: list[bytes] = []
    results: list[dict[str, Any]] = []
    for m in messages:
        role = m.get("role")
        if role == "tool":
            results.append({"type": "tool_result", "tool_use_id": m.get("tool_call_id") or "",
                            "content": m.get("content") or ""})
            continue
        if results:
            out.append(_dumps({"role": "user", "content": results}))
            results = []
        if role == "assistant":
            text = m.get("content")
            calls = m.get("tool_calls")
            if not calls:
                out.append(_dumps({"role": "assistant", "content": text or ""}))
                continue
            blocks: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
            for c in calls:
                fn = c.get("function") or {}
                blocks.append({"type": "tool_use", "id": c.get("id") or "", "name": fn.get("name") or "",
                               "input": _input(fn.get("arguments"))})
            out.append(_dumps({"role": "assistant", "content": blocks}))
        else:
            out.append(_dumps({"role": "user", "content": m.get("content") or ""}))
    if results:
        out.append(_dumps({"role": "user", "content": results}))
    return out


def headers(key: str | None) -> dict[str, str]:
    h = {"anthropic-version": VERSION}
    if key is not None:
        h["x-api-key"] = key
    return h


class MessagesStream:
    """Accumulates one Messages answer (streamed or not); the interface of ChatStream."""

    END = "message_stop"  # the terminal event: without it the answer was cut short
    FINISH = "stop_reason"
    OBJECT = "message"

    __slots__ = ("id", "model", "fingerprint", "finish_reason", "stop_reason", "usage", "error", "errors", "chunks",
                 "token_chunks", "bad_json", "first_bad", "done", "dones", "no_choices", "not_completion",
                 "first_token_payload", "first_kind", "_content", "_calls", "_in", "_out", "_cached", "_created")

    def __init__(self) -> None:
        self.id: str | None = None
        self.model: str | None = None
        self.fingerprint: object = None
        self.finish_reason: str | None = None
        self.stop_reason: str | None = None  # as sent
        self.usage: dict | None = None  # in chat's keys (see the module docstring)
        self.error: str | None = None
        self.errors = 0
        self.chunks = 0
        self.token_chunks = 0
        self.bad_json = 0
        self.first_bad: bytes | None = None
        self.done = False
        self.dones = 0
        self.no_choices = 0  # events that carried no output (message_start, ping, block stops, ...)
        self.not_completion: str | None = None
        self.first_token_payload: bytes | None = None
        self.first_kind: str | None = None
        self._content: list[str] = []
        self._calls: dict[int, list] = {}  # block index -> [id, name, [partial_json]]
        self._in = self._out = self._cached = self._created = None

    def __repr__(self) -> str:
        return (f"MessagesStream(chunks={self.chunks}, token_chunks={self.token_chunks}, "
                f"tool_calls={len(self._calls)}, stop_reason={self.stop_reason!r}, done={self.done}, "
                f"errors={self.errors}, bad_json={self.bad_json})")

    # ---- streaming

    def add_many(self, payloads: Iterable[bytes]) -> int:
        out = 0
        for p in payloads:
            out |= self.add(p)
        return out

    def add(self, payload: bytes) -> int:
        self.chunks += 1
        try:
            obj = _loads(payload)
        except _JSONDecodeError:
            if payload.strip() == b"[DONE]":  # (not Anthropic's; some proxies add it): nothing
                self.dones += 1
                self.no_choices += 1
                return 0
            return self._bad(payload)
        if type(obj) is not dict or type(obj.get("type")) is not str:
            return self._bad(payload)
        try:
            flags = self._event(obj)
        except (AttributeError, TypeError, KeyError, ValueError):
            return self._bad(payload)
        if flags & TOKEN:
            self.token_chunks += 1
            if self.first_token_payload is None:
                self.first_token_payload = payload
        else:
            self.no_choices += 1
        return flags

    def _event(self, obj: dict) -> int:
        t = obj["type"]
        if t == "content_block_delta":
            d = obj["delta"]
            dt = d["type"]
            if dt == "text_delta":
                text = d["text"]
                if type(text) is not str:
                    raise TypeError
                if text:
                    self._content.append(text)
                    return self._token("text")
                return 0
            if dt == "input_json_delta":
                part = d["partial_json"]
                if type(part) is not str:
                    raise TypeError
                call = self._calls.get(obj["index"])
                if call is None:  # arguments of a block that never opened as a tool_use
                    raise KeyError
                if part:
                    call[2].append(part)
                    return self._token("tool")
                return 0
            if dt == "thinking_delta":
                return self._token("reasoning") if d.get("thinking") else 0
            return 0  # signature_delta, citations_delta, ...: no output of their own
        if t == "content_block_start":
            b = obj["content_block"]
            bt = b["type"]
            if bt == "tool_use":
                name = b.get("name")
                self._calls[obj["index"]] = [b.get("id"), name, []]
                inp = b.get("input")
                if inp:  # (a server that sends the whole input here, not as deltas)
                    self._calls[obj["index"]][2].append(_dumps(inp).decode())
                return self._token("tool") if name else 0
            if bt == "text" and b.get("text"):
                self._content.append(b["text"])
                return self._token("text")
            if bt == "thinking" and b.get("thinking"):
                return self._token("reasoning")
            return 0
        if t == "message_start":
            m = obj["message"]
            if type(m) is not dict:
                raise TypeError
            self.id = m.get("id")
            self.model = m.get("model")
            self.fingerprint = m.get("system_fingerprint")
            return self._usage(m.get("usage"))
        if t == "message_delta":
            flags = 0
            d = obj.get("delta")
            if d:
                sr = d.get("stop_reason")
                if sr:
                    if type(sr) is not str:
                        raise TypeError
                    self.stop_reason = sr
                    self.finish_reason = STOP_REASONS.get(sr, sr)
                    flags = FINISH
            return flags | self._usage(obj.get("usage"))
        if t == "message_stop":
            self.done = True
            self.dones += 1
            return DONE
        if t == "error":
            return self._set_error(_error_text(obj.get("error"), obj))
        return 0  # ping, content_block_stop, and events this version does not know

    def _token(self, kind: str) -> int:
        if self.first_kind is None:
            self.first_kind = kind
        return TOKEN

    def _usage(self, u: Any) -> int:
        if not u:
            return 0
        if type(u) is not dict:
            raise TypeError
        for key, attr in (("input_tokens", "_in"), ("output_tokens", "_out"), ("cache_read_input_tokens", "_cached"),
                          ("cache_creation_input_tokens", "_created")):
            v = u.get(key)
            if type(v) is int:
                setattr(self, attr, v)
        usage: dict[str, Any] = {}
        if self._in is not None:
            usage["prompt_tokens"] = self._in + (self._cached or 0) + (self._created or 0)
        if self._out is not None:
            usage["completion_tokens"] = self._out
        if self._cached is not None:
            usage["prompt_tokens_details"] = {"cached_tokens": self._cached}
        self.usage = usage or None
        return USAGE if usage else 0

    def add_error_event(self, payload: bytes) -> int:
        """The data of an SSE `event: error`: always an error."""
        try:
            obj = _loads(payload)
        except _JSONDecodeError:
            obj = None
        self.chunks += 1
        if type(obj) is dict:
            err = obj.get("error")
            return self._set_error(_error_text(err if err is not None else obj, obj))
        return self._set_error(_short(payload.decode("utf-8", "replace").strip() or "error event"))

    def _bad(self, payload: bytes) -> int:
        self.bad_json += 1
        if self.first_bad is None:
            self.first_bad = payload[:BAD_SAMPLE]
        return BAD_JSON

    def _set_error(self, text: str) -> int:
        self.errors += 1
        if self.error is None:
            self.error = text
        return ERROR

    # ---- non-streamed

    @classmethod
    def from_response(cls, body: bytes) -> "MessagesStream":
        self = cls()
        self.chunks = 1
        try:
            obj = _loads(body)
        except _JSONDecodeError:
            self.not_completion = "not JSON"
            self._bad(body)
            return self
        if type(obj) is not dict:
            self.not_completion = "not a JSON object"
            self._bad(body)
            return self
        if obj.get("type") == "error" or "error" in obj:
            self._set_error(_error_text(obj.get("error"), obj))
            return self
        content = obj.get("content")
        if obj.get("type") != "message" or type(content) is not list:
            self.not_completion = "no content list" if obj.get("type") == "message" else "type is not 'message'"
            return self
        self.id, self.model, self.fingerprint = obj.get("id"), obj.get("model"), obj.get("system_fingerprint")
        token = False
        try:
            for i, b in enumerate(content):
                bt = b.get("type")
                if bt == "text" and b.get("text"):
                    self._content.append(b["text"])
                    token = True
                    self.first_kind = self.first_kind or "text"
                elif bt == "tool_use":
                    self._calls[i] = [b.get("id"), b.get("name"), [_dumps(b.get("input") or {}).decode()]]
                    token = True
                    self.first_kind = self.first_kind or "tool"
                elif bt == "thinking" and b.get("thinking"):
                    token = True
                    self.first_kind = self.first_kind or "reasoning"
            sr = obj.get("stop_reason")
            if sr:
                self.stop_reason = sr
                self.finish_reason = STOP_REASONS.get(sr, sr)
            self._usage(obj.get("usage"))
        except (AttributeError, TypeError):
            self._bad(body)
        self.done = True
        if token:
            self.token_chunks = 1
        return self

    # ---- results

    @property
    def content(self) -> str:
        parts = self._content
        if len(parts) > 1:
            parts[:] = ["".join(parts)]
        return parts[0] if parts else ""

    @property
    def tool_calls(self) -> list[dict]:
        out = []
        for idx in sorted(self._calls):
            cid, name, parts = self._calls[idx]
            out.append({"id": cid, "type": "function", "function": {"name": name, "arguments": "".join(parts) or "{}"}})
        return out

    @property
    def tool_call_count(self) -> int:
        return len(self._calls)

    def tool_call_problems(self, expected: bool = False, max_tokens: int | None = None) -> list[str] | None:
        """Why the tool calls cannot be sent back as they came, one `code: detail` line each (None:
        they can), in ChatStream's codes: `truncated` (stop_reason max_tokens on an answer with a tool
        call), `bad_arguments` (the joined input_json_delta events are not a JSON object), `no_id`,
        `no_name`."""
        if not self._calls:
            return None
        out = []
        for i, c in enumerate(self.tool_calls):
            fn = c["function"]
            who = f"call {i} ({fn['name']})" if fn["name"] else f"call {i}"
            if not c["id"]:
                out.append(f"no_id: {who} came without an id (a tool_result cannot name it)")
            if not fn["name"]:
                out.append(f"no_name: {who} came without a name")
            try:
                ok = type(_loads(fn["arguments"])) is dict
            except _JSONDecodeError:
                ok = False
            if not ok:
                out.append(f"bad_arguments: {who} input_json_delta events joined are not a JSON object: "
                           f"{_short(fn['arguments'][:120])}")
        if self.finish_reason == "length":
            out.insert(0, f"truncated: stop_reason max_tokens after {self.token_chunks} output event(s) with "
                          f"{len(self._calls)} tool call(s)")
        return out or None

    def assistant_message(self, content: str = "null") -> dict:
        return assistant_turn(self.content, self.tool_calls if self._calls else None, content)
Stream = MessagesStream
