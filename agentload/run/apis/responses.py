"""OpenAI's Responses API (`POST <endpoint>/responses`): the request and its stream.

The request: `model`, `max_output_tokens`, `stream`, `store`, flat `tools`
(`{"type": "function", name, description, parameters}`), `tool_choice` ("auto", "required",
"none" or `{"type": "function", "name": ...}`), `instructions` (the system prompt), then `input`:
`message` items for the user's turns and the assistant's text, one `function_call` item per tool
call and one `function_call_output` per result, joined by `call_id`. Stateless by default (the
whole input every round, `store: false`, as Codex sends it); with `[conversation]
responses_chain`, each round sends only its new items with the previous answer's
`previous_response_id` and `store: true` (agentload.run.conversation).

The stream (`ResponsesStream`), events by their `type`:

- `response.created`: the response's id (what `previous_response_id` names) and model;
- output: `response.output_text.delta` (text), `response.refusal.delta` (text),
  `response.function_call_arguments.delta` (a tool call's arguments),
  `response.reasoning_summary_text.delta` / `response.reasoning_text.delta` (reasoning), and a
  `function_call` item's name in `response.output_item.added` (a token, as a tool-call name is
  in chat); tool calls join by `output_index` (`item_id` where that is missing); a call whose
  arguments came only whole (`response.function_call_arguments.done`, `response.output_item.done`)
  takes them from there (`ToolCalls`, agentload.run.apis.tool_calls: checked as chat's are, and
  the deltas joined must be what the done events give whole);
- `response.completed`: the end (finish_reason tool_calls if it called a tool, else stop), and
  usage (input_tokens, input_tokens_details.cached_tokens, output_tokens);
- `response.incomplete` with reason `max_output_tokens`: the end of an answer that ran into
  max_output_tokens (finish_reason length, as chat's `length` and Messages' `max_tokens`: a canary's
  8 tokens end so); with any other reason (content_filter, ...), `response.failed` (with its error)
  and `error`: in-band errors, never a healthy answer. A stream without either end is cut short.
"""

from __future__ import annotations

from typing import Any

import orjson

from agentload.run.apis.reader import (
    DONE,
    ERROR,
    FINISH,
    USAGE,
    EventReader,
    Handler,
    error_text,
    short,
)

NAME = "responses"
SYSTEM: bytes | None = b'"instructions":'
ITEMS = b'"input":['

_loads = orjson.loads
_dumps = orjson.dumps
_JSONDecodeError = orjson.JSONDecodeError


def tool_choice(choice: Any) -> Any:
    if choice is None or isinstance(choice, str):
        return choice
    return {"type": "function", "name": choice["function"]["name"]}


def head(cfg: Any, model: str, tools: list[dict[str, Any]]) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "max_output_tokens": cfg.max_tokens, "stream": cfg.stream,
                            "store": bool(getattr(cfg, "responses_chain", False))}
    if tools:
        body["tools"] = [{"type": "function", "name": f["name"], "description": f.get("description", ""),
                          "parameters": f.get("parameters") or {"type": "object"}}
                         for f in (t["function"] for t in tools)]
        choice = tool_choice(cfg.tool_choice_json())
        if choice is not None:
            body["tool_choice"] = choice
    return body


def encode(messages: list[dict[str, Any]]) -> list[bytes]:
    out: list[bytes] = []
    for m in messages:
        role = m.get("role")
        if role == "tool":
            out.append(_dumps({"type": "function_call_output", "call_id": m.get("tool_call_id") or "",
                               "output": m.get("content") or ""}))
        elif role == "assistant":
            text = m.get("content")
            calls = m.get("tool_calls")
            if text or not calls:
                out.append(_dumps({"type": "message", "role": "assistant", "content": text or ""}))
            for c in calls or ():
                fn = c.get("function") or {}
                out.append(_dumps({"type": "function_call", "call_id": c.get("id") or "", "name": fn.get("name") or "",
                                   "arguments": fn.get("arguments") or ""}))
        else:
            out.append(_dumps({"type": "message", "role": role or "user", "content": m.get("content") or ""}))
    return out


def headers(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key is not None else {}


class ResponsesStream(EventReader):
    """Accumulates one Responses answer (streamed or not); the interface of ChatStream."""

    END = "response.completed"
    FINISH = "response.completed"
    OBJECT = "response"

    __slots__ = ("status", "_by_item")

    def __init__(self) -> None:
        super().__init__()
        self.status: str | None = None  # the response's final status (completed, failed, incomplete)
        self._by_item: dict[Any, int] = {}  # item id -> output_index

    # ---- streaming: one handler per event type (`HANDLERS`)

    def _call_index(self, obj: dict) -> int:
        """The index of the call an event is about (KeyError: no call opened there)."""
        idx = obj.get("output_index")
        if type(idx) is not int:
            idx = self._by_item.get(obj.get("item_id"))
        if idx is None or idx not in self.calls.calls:
            raise KeyError(idx)
        return idx

    def _text_delta(self, obj: dict) -> int:
        d = obj["delta"]
        if type(d) is not str:
            raise TypeError
        if d:
            self._content.append(d)
            return self._token("text")
        return 0

    def _arguments_delta(self, obj: dict) -> int:
        d = obj["delta"]
        if type(d) is not str:
            raise TypeError
        idx = self._call_index(obj)  # (KeyError: the arguments of an item that never opened as a function_call)
        if d:
            self.calls.add_arguments(idx, d)
            return self._token("tool")
        return 0

    def _reasoning_delta(self, obj: dict) -> int:
        return self._token("reasoning") if obj.get("delta") else 0

    def _item_added(self, obj: dict) -> int:
        item = obj["item"]
        if item["type"] != "function_call":
            return 0
        idx = obj.get("output_index")
        if type(idx) is not int:
            idx = len(self.calls)
        name = item.get("name")
        self.calls.open(idx, item.get("call_id"), name, item.get("arguments") or None)
        if item.get("id"):
            self._by_item[item["id"]] = idx
        return self._token("tool") if name else 0

    def _arguments_done(self, obj: dict) -> int:
        try:
            idx = self._call_index(obj)
        except KeyError:
            return 0
        if type(obj.get("arguments")) is str:
            self.calls.whole_arguments(idx, obj["arguments"])
        return 0

    def _item_done(self, obj: dict) -> int:
        item = obj["item"]
        if item["type"] == "function_call":
            idx = obj.get("output_index")
            if type(idx) is not int:  # (llama-server's events carry no output_index: the item's id joins them)
                idx = self._by_item.get(item.get("id"))
            if type(idx) is not int or idx not in self.calls.calls:
                # a call that came only whole: its name and arguments are output
                self.calls.open(idx if type(idx) is int else len(self.calls), item.get("call_id"), item.get("name"),
                                item.get("arguments"))
                return self._token("tool")
            if type(item.get("arguments")) is str:
                self.calls.whole_arguments(idx, item["arguments"])
            self.calls.open(idx, item.get("call_id"), item.get("name"))
        elif item["type"] == "message" and not self._content:  # text that came only whole
            text = "".join(p.get("text") or "" for p in item.get("content") or () if type(p) is dict)
            if text:
                self._content.append(text)
                return self._token("text")
        return 0

    def _created(self, obj: dict) -> int:
        r = obj["response"]
        if type(r) is not dict:
            raise TypeError
        if self.id is None:
            self.id = r.get("id")
            self.model = r.get("model")
            self.fingerprint = r.get("system_fingerprint")
        return 0

    def _completed(self, obj: dict) -> int:
        r = obj["response"]
        if type(r) is not dict:
            raise TypeError
        self.done = True
        self.dones += 1
        self.status = r.get("status") or "completed"
        if self.id is None:
            self.id = r.get("id")
            self.model = r.get("model")
        self.finish_reason = "tool_calls" if self.calls else "stop"
        return DONE | FINISH | self._usage(r.get("usage"))

    def _failed(self, obj: dict) -> int:
        r = obj.get("response")
        r = r if type(r) is dict else {}
        self.status = r.get("status") or obj["type"].rpartition(".")[2]
        self._usage(r.get("usage"))
        if obj["type"] == "response.failed":
            return self._set_error(_failed_text(r))
        return self._incomplete(r)

    def _incomplete(self, r: dict) -> int:
        """A response that ended incomplete: an answer cut by max_output_tokens (chat's finish_reason
        "length", Messages' max_tokens: a canary's 8 tokens end so), else an error."""
        d = r.get("incomplete_details")
        reason = d.get("reason") if type(d) is dict else None
        if reason == "max_output_tokens":
            self.done = True
            self.dones += 1
            self.finish_reason = "length"
            return DONE | FINISH
        return self._set_error(_incomplete_text(reason))

    def _usage(self, u: Any) -> int:
        if not u:
            return 0
        if type(u) is not dict:
            raise TypeError
        usage: dict[str, Any] = {}
        if type(u.get("input_tokens")) is int:
            usage["prompt_tokens"] = u["input_tokens"]
        if type(u.get("output_tokens")) is int:
            usage["completion_tokens"] = u["output_tokens"]
        d = u.get("input_tokens_details")
        if type(d) is dict and type(d.get("cached_tokens")) is int:
            usage["prompt_tokens_details"] = {"cached_tokens": d["cached_tokens"]}
        self.usage = usage or None
        return USAGE if usage else 0

    def _shaped(self, obj: dict) -> tuple[bytes, str, int | None] | None:
        """A text delta, or the arguments delta of a call named by its output_index (not by an
        item id, whose call an item added later may change), is its one string."""
        t = obj["type"]
        if t == "response.output_text.delta" or t == "response.refusal.delta":
            return b'"delta"', obj["delta"], None
        if t == "response.function_call_arguments.delta" and type(obj.get("output_index")) is int:
            return b'"delta"', obj["delta"], obj["output_index"]
        return None

    HANDLERS: dict[str, Handler] = {
        "response.output_text.delta": _text_delta, "response.refusal.delta": _text_delta,
        "response.function_call_arguments.delta": _arguments_delta,
        "response.reasoning_summary_text.delta": _reasoning_delta, "response.reasoning_text.delta": _reasoning_delta,
        "response.output_item.added": _item_added, "response.function_call_arguments.done": _arguments_done,
        "response.output_item.done": _item_done,
        "response.created": _created, "response.in_progress": _created, "response.queued": _created,
        "response.completed": _completed, "response.failed": _failed, "response.incomplete": _failed,
        "error": EventReader._error_object,
    }  # content_part.added/done, output_text.done, and events this version does not know: nothing

    def add_error_event(self, payload: bytes) -> int:
        """An SSE `event: error`: always an error (a response.failed or .incomplete in it is read as one)."""
        try:
            obj = orjson.loads(payload)
        except orjson.JSONDecodeError:
            obj = None
        if type(obj) is dict and obj.get("type") in ("response.failed", "response.incomplete"):
            return self.add(payload) | ERROR
        return super().add_error_event(payload)

    # ---- non-streamed

    @classmethod
    def from_response(cls, body: bytes) -> "ResponsesStream":
        self = cls()
        obj = self._whole_object(body)
        if obj is None:
            return self
        if obj.get("object") != "response":
            if obj.get("error"):
                self._set_error(error_text(obj["error"], obj))
            else:
                self.not_completion = "object is not 'response'"
            return self
        self.id, self.model, self.fingerprint = obj.get("id"), obj.get("model"), obj.get("system_fingerprint")
        try:
            self._whole_output(obj.get("output") or ())
            self._usage(obj.get("usage"))
        except (AttributeError, TypeError):
            self._bad(body)
        self._whole_status(obj)
        if self.first_kind is not None:
            self.token_chunks = 1
        return self

    def _whole_output(self, output: Any) -> None:
        for i, item in enumerate(output):
            it = item.get("type")
            if it == "message":
                for p in item.get("content") or ():
                    if p.get("text"):
                        self._content.append(p["text"])
                        self._token("text")
            elif it == "function_call":
                self.calls.open(i, item.get("call_id"), item.get("name"), item.get("arguments"))
                self._token("tool")
            elif it == "reasoning":
                self._token("reasoning")

    def _whole_status(self, obj: dict) -> None:
        status = self.status = obj.get("status")
        if status == "completed":
            self.done = True
            self.finish_reason = "tool_calls" if self.calls else "stop"
        elif status == "failed":
            self._set_error(_failed_text(obj))
        elif status == "incomplete":
            self._incomplete(obj)
        else:
            self.not_completion = f"status {status!r}, not completed"


def _failed_text(r: dict) -> str:
    err = r.get("error")
    return "response.failed: " + (error_text(err, r) if err else "no error object")


def _incomplete_text(reason: Any) -> str:
    return short(f"response.incomplete: {reason or 'no reason given'} (the answer was cut short)")


Stream = ResponsesStream
