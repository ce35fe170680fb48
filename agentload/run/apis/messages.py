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

Tool calls are assembled by `ToolCalls` (agentload.run.apis.tool_calls) and checked as chat's are:
their joined `input_json_delta`s must be a JSON object (`tool_call_problems`).
"""

from __future__ import annotations

from typing import Any

import orjson

from agentload.run.apis.reader import (
    DONE,
    FINISH,
    USAGE,
    EventReader,
    Handler,
    error_text,
)

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


class MessagesStream(EventReader):
    """Accumulates one Messages answer (streamed or not); the interface of ChatStream."""

    END = "message_stop"  # the terminal event: without it the answer was cut short
    FINISH = "stop_reason"
    OBJECT = "message"

    __slots__ = ("stop_reason", "_in", "_out", "_cached", "_created")
    # `ping` and `content_block_stop` (one a block), the same in every answer: taken without a parse
    # when byte for byte one parsed before (EventReader._quiet)
    _quiet: set[bytes] | None = set()

    def __init__(self) -> None:
        super().__init__()
        self.stop_reason: str | None = None  # as sent
        # usage's counts as last sent (`_usage`)
        self._in: int | None = None
        self._out: int | None = None
        self._cached: int | None = None
        self._created: int | None = None

    # ---- streaming: one handler per event type (`HANDLERS`)

    def _block_delta(self, obj: dict) -> int:
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
            if part:  # (KeyError: the arguments of a block that never opened as a tool_use)
                self.calls.add_arguments(obj["index"], part)
                return self._token("tool")
            if obj["index"] not in self.calls.calls:
                raise KeyError(obj["index"])
            return 0
        if dt == "thinking_delta":
            return self._token("reasoning") if d.get("thinking") else 0
        return 0  # signature_delta, citations_delta, ...: no output of their own

    def _block_start(self, obj: dict) -> int:
        b = obj["content_block"]
        bt = b["type"]
        if bt == "tool_use":
            name = b.get("name")
            inp = b.get("input")  # (a server may send the whole input here, not as deltas)
            self.calls.open(obj["index"], b.get("id"), name, "{}" if inp is None else _dumps(inp).decode())
            return self._token("tool") if name else 0
        if bt == "text" and b.get("text"):
            self._content.append(b["text"])
            return self._token("text")
        if bt == "thinking" and b.get("thinking"):
            return self._token("reasoning")
        return 0

    def _message_start(self, obj: dict) -> int:
        m = obj["message"]
        if type(m) is not dict:
            raise TypeError
        self.id = m.get("id")
        self.model = m.get("model")
        self.fingerprint = m.get("system_fingerprint")
        return self._usage(m.get("usage"))

    def _message_delta(self, obj: dict) -> int:
        flags = 0
        d = obj.get("delta")
        if d:
            sr = d.get("stop_reason")
            if sr:
                if type(sr) is not str:
                    raise TypeError
                self._stop(sr)
                flags = FINISH
        return flags | self._usage(obj.get("usage"))

    def _message_stop(self, obj: dict) -> int:
        self.done = True
        self.dones += 1
        return DONE

    def _stop(self, reason: str) -> None:
        self.stop_reason = reason
        self.finish_reason = STOP_REASONS.get(reason, reason)

    def _usage(self, u: Any) -> int:
        if not u:
            return 0
        if type(u) is not dict:
            raise TypeError
        # (each count kept from the last event that had it as an int: message_start's input, message_delta's output)
        v = u.get("input_tokens")
        if type(v) is int:
            self._in = v
        v = u.get("output_tokens")
        if type(v) is int:
            self._out = v
        v = u.get("cache_read_input_tokens")
        if type(v) is int:
            self._cached = v
        v = u.get("cache_creation_input_tokens")
        if type(v) is int:
            self._created = v
        usage: dict[str, Any] = {}
        cached = self._cached
        if self._in is not None:
            usage["prompt_tokens"] = self._in + (cached or 0) + (self._created or 0)
        if self._out is not None:
            usage["completion_tokens"] = self._out
        if cached is not None:
            usage["prompt_tokens_details"] = {"cached_tokens": cached}
        self.usage = usage or None
        return USAGE if usage else 0

    def _shaped(self, obj: dict) -> tuple[bytes, str, int | None] | None:
        """A text or input_json delta (a token: the handler took it) is its one string."""
        if obj["type"] == "content_block_delta":
            d = obj["delta"]
            if d["type"] == "text_delta":
                return b'"text"', d["text"], None
            if d["type"] == "input_json_delta" and type(obj["index"]) is int:
                return b'"partial_json"', d["partial_json"], obj["index"]
        return None

    HANDLERS: dict[str, Handler] = {
        "content_block_delta": _block_delta, "content_block_start": _block_start, "message_start": _message_start,
        "message_delta": _message_delta, "message_stop": _message_stop, "error": EventReader._error_object,
    }  # ping, content_block_stop, and events this version does not know: nothing

    # ---- non-streamed

    @classmethod
    def from_response(cls, body: bytes) -> "MessagesStream":
        self = cls()
        obj = self._whole_object(body)
        if obj is None:
            return self
        if obj.get("type") == "error" or "error" in obj:
            self._set_error(error_text(obj.get("error"), obj))
            return self
        content = obj.get("content")
        if obj.get("type") != "message" or type(content) is not list:
            self.not_completion = "no content list" if obj.get("type") == "message" else "type is not 'message'"
            return self
        self.id, self.model, self.fingerprint = obj.get("id"), obj.get("model"), obj.get("system_fingerprint")
        try:
            for i, b in enumerate(content):
                bt = b.get("type")
                if bt == "text" and b.get("text"):
                    self._content.append(b["text"])
                    self._token("text")
                elif bt == "tool_use":
                    self.calls.open(i, b.get("id"), b.get("name"), _dumps(b.get("input") or {}).decode())
                    self._token("tool")
                elif bt == "thinking" and b.get("thinking"):
                    self._token("reasoning")
            sr = obj.get("stop_reason")
            if sr:
                self._stop(sr)
            self._usage(obj.get("usage"))
        except (AttributeError, TypeError):
            self._bad(body)
        self.done = True
        if self.first_kind is not None:
            self.token_chunks = 1
        return self


Stream = MessagesStream
