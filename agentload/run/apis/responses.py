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
  takes them from there;
- `response.completed`: the end (finish_reason tool_calls if it called a tool, else stop), and
  usage (input_tokens, input_tokens_details.cached_tokens, output_tokens);
- `response.incomplete` with reason `max_output_tokens`: the end of an answer that ran into
  max_output_tokens (finish_reason length, as chat's `length` and Messages' `max_tokens`: a canary's
  8 tokens end so); with any other reason (content_filter, ...), `response.failed` (with its error)
  and `error`: in-band errors, never a healthy answer. A stream without either end is cut short.
"""

from __future__ import annotations

from typing import Any, Iterable

import orjson

from agentload.run.chat_stream import (BAD_JSON, BAD_SAMPLE, DONE, ERROR, FINISH, TOKEN, USAGE, _error_text, _short,
                                       assistant_turn)

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


_TEXT_DELTAS = frozenset({"response.output_text.delta", "response.refusal.delta"})
_REASONING_DELTAS = frozenset({"response.reasoning_summary_text.delta", "response.reasoning_text.delta"})


class ResponsesStream:
    """Accumulates one Responses answer (streamed or not); the interface of ChatStream."""

    END = "response.completed"
    FINISH = "response.completed"
    OBJECT = "response"

    __slots__ = ("id", "model", "fingerprint", "finish_reason", "usage", "error", "errors", "chunks", "token_chunks",
                 "bad_json", "first_bad", "done", "dones", "no_choices", "not_completion", "first_token_payload",
                 "first_kind", "status", "_content", "_calls", "_by_item")

    def __init__(self) -> None:
        self.id: str | None = None
        self.model: str | None = None
        self.fingerprint: object = None
        self.finish_reason: str | None = None
        self.usage: dict | None = None
        self.error: str | None = None
        self.errors = 0
        self.chunks = 0
        self.token_chunks = 0
        self.bad_json = 0
        self.first_bad: bytes | None = None
        self.done = False
        self.dones = 0
        self.no_choices = 0  # events that carried no output
        self.not_completion: str | None = None
        self.first_token_payload: bytes | None = None
        self.first_kind: str | None = None
        self.status: str | None = None  # the response's final status (completed, failed, incomplete)
        self._content: list[str] = []
        self._calls: dict[int, list] = {}  # output_index -> [call_id, name, [argument deltas], whole arguments]
        self._by_item: dict[str, int] = {}  # item id -> output_index

    def __repr__(self) -> str:
        return (f"ResponsesStream(chunks={self.chunks}, token_chunks={self.token_chunks}, "
                f"tool_calls={len(self._calls)}, status={self.status!r}, errors={self.errors}, bad_json={self.bad_json})")

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
            if payload.strip() == b"[DONE]":  # (not OpenAI's; some servers add it): nothing
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

    def _call(self, obj: dict) -> list | None:
        idx = obj.get("output_index")
        if type(idx) is not int:
            idx = self._by_item.get(obj.get("item_id"))
        return self._calls.get(idx) if idx is not None else None

    def _event(self, obj: dict) -> int:
        t = obj["type"]
        if t in _TEXT_DELTAS:
            d = obj["delta"]
            if type(d) is not str:
                raise TypeError
            if d:
                self._content.append(d)
                return self._token("text")
            return 0
        if t == "response.function_call_arguments.delta":
            d = obj["delta"]
            if type(d) is not str:
                raise TypeError
            call = self._call(obj)
            if call is None:  # arguments of an item that never opened as a function_call
                raise KeyError
            if d:
                call[2].append(d)
                return self._token("tool")
            return 0
        if t in _REASONING_DELTAS:
            return self._token("reasoning") if obj.get("delta") else 0
        if t == "response.output_item.added":
            item = obj["item"]
            if item["type"] == "function_call":
                idx = obj.get("output_index")
                if type(idx) is not int:
                    idx = len(self._calls)
                name = item.get("name")
                self._calls[idx] = [item.get("call_id"), name, [], item.get("arguments") or None]
                if item.get("id"):
                    self._by_item[item["id"]] = idx
                return self._token("tool") if name else 0
            return 0
        if t == "response.function_call_arguments.done":
            call = self._call(obj)
            if call is not None and type(obj.get("arguments")) is str:
                call[3] = obj["arguments"]
            return 0
        if t == "response.output_item.done":
            item = obj["item"]
            if item["type"] == "function_call":
                idx = obj.get("output_index")
                call = self._calls.get(idx) if type(idx) is int else None
                if call is None:  # a call that came only whole: its name and arguments are output
                    idx = idx if type(idx) is int else len(self._calls)
                    self._calls[idx] = [item.get("call_id"), item.get("name"), [], item.get("arguments")]
                    return self._token("tool")
                if type(item.get("arguments")) is str:
                    call[3] = item["arguments"]
                call[0] = call[0] or item.get("call_id")
                call[1] = call[1] or item.get("name")
            elif item["type"] == "message" and not self._content:  # text that came only whole
                text = "".join(p.get("text") or "" for p in item.get("content") or () if type(p) is dict)
                if text:
                    self._content.append(text)
                    return self._token("text")
            return 0
        if t == "response.created" or t == "response.in_progress" or t == "response.queued":
            r = obj["response"]
            if type(r) is not dict:
                raise TypeError
            if self.id is None:
                self.id = r.get("id")
                self.model = r.get("model")
                self.fingerprint = r.get("system_fingerprint")
            return 0
        if t == "response.completed":
            r = obj["response"]
            if type(r) is not dict:
                raise TypeError
            self.done = True
            self.dones += 1
            self.status = r.get("status") or "completed"
            if self.id is None:
                self.id = r.get("id")
                self.model = r.get("model")
            self.finish_reason = "tool_calls" if self._calls else "stop"
            return DONE | FINISH | self._usage(r.get("usage"))
        if t == "response.failed" or t == "response.incomplete":
            r = obj.get("response")
            r = r if type(r) is dict else {}
            self.status = r.get("status") or t.rpartition(".")[2]
            self._usage(r.get("usage"))
            if t == "response.failed":
                err = r.get("error")
                return self._set_error("response.failed: " + (_error_text(err, r) if err else "no error object"))
            d = r.get("incomplete_details")
            reason = d.get("reason") if type(d) is dict else None
            if reason == "max_output_tokens":  # chat's finish_reason "length", Messages' max_tokens: an answer
                self.done = True
                self.dones += 1
                self.finish_reason = "length"
                return DONE | FINISH
            return self._set_error(f"response.incomplete: {reason or 'no reason given'} (the answer was cut short)")
        if t == "error":
            err = obj.get("error")
            return self._set_error(_error_text(err if err is not None else obj, obj))
        return 0  # content_part.added/done, output_text.done, and events this version does not know

    def _token(self, kind: str) -> int:
        if self.first_kind is None:
            self.first_kind = kind
        return TOKEN

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

    def add_error_event(self, payload: bytes) -> int:
        try:
            obj = _loads(payload)
        except _JSONDecodeError:
            obj = None
        self.chunks += 1
        if type(obj) is dict:
            if obj.get("type") in ("response.failed", "response.incomplete"):
                self.chunks -= 1
                return self.add(payload) | ERROR
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
    def from_response(cls, body: bytes) -> "ResponsesStream":
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
        if obj.get("object") != "response":
            if obj.get("error"):
                self._set_error(_error_text(obj["error"], obj))
            else:
                self.not_completion = "object is not 'response'"
            return self
        self.id, self.model, self.fingerprint = obj.get("id"), obj.get("model"), obj.get("system_fingerprint")
        status = self.status = obj.get("status")
        try:
            for i, item in enumerate(obj.get("output") or ()):
                it = item.get("type")
                if it == "message":
                    for p in item.get("content") or ():
                        if p.get("text"):
                            self._content.append(p["text"])
                            self.first_kind = self.first_kind or "text"
                elif it == "function_call":
                    self._calls[i] = [item.get("call_id"), item.get("name"), [], item.get("arguments")]
                    self.first_kind = self.first_kind or "tool"
                elif it == "reasoning":
                    self.first_kind = self.first_kind or "reasoning"
            self._usage(obj.get("usage"))
        except (AttributeError, TypeError):
            self._bad(body)
        if status == "completed":
            self.done = True
            self.finish_reason = "tool_calls" if self._calls else "stop"
        elif status == "failed":
            err = obj.get("error")
            self._set_error("response.failed: " + (_error_text(err, obj) if err else "no error object"))
        elif status == "incomplete":
            d = obj.get("incomplete_details")
            reason = d.get("reason") if type(d) is dict else None
            if reason == "max_output_tokens":
                self.done = True
                self.finish_reason = "length"
            else:
                self._set_error(f"response.incomplete: {reason or 'no reason given'} (the answer was cut short)")
        else:
            self.not_completion = f"status {status!r}, not completed"
        if self.first_kind is not None:
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
            cid, name, parts, whole = self._calls[idx]
            args = "".join(parts) if parts else (whole or "")
            out.append({"id": cid, "type": "function", "function": {"name": name, "arguments": args}})
        return out

    @property
    def tool_call_count(self) -> int:
        return len(self._calls)

    def tool_call_problems(self, expected: bool = False, max_tokens: int | None = None) -> list[str] | None:
        """Why the tool calls cannot be sent back as they came, one `code: detail` line each (None:
        they can), in ChatStream's codes: `truncated` (an answer that ran into max_output_tokens with a
        function call), `bad_arguments` (arguments that are not a JSON object, or deltas that joined
        differ from the arguments the done event then gave), `no_id` (no call_id), `no_name`."""
        if not self._calls:
            return None
        out = []
        for i, idx in enumerate(sorted(self._calls)):
            cid, name, parts, whole = self._calls[idx]
            args = "".join(parts) if parts else (whole or "")
            who = f"call {i} ({name})" if name else f"call {i}"
            if not cid:
                out.append(f"no_id: {who} came without a call_id (a function_call_output cannot name it)")
            if not name:
                out.append(f"no_name: {who} came without a name")
            try:
                ok = type(_loads(args)) is dict
            except _JSONDecodeError:
                ok = False
            if not ok:
                out.append(f"bad_arguments: {who} arguments are not a JSON object: {_short(args[:120])}")
            elif parts and whole is not None and whole != args:
                out.append(f"bad_arguments: {who} argument deltas joined differ from the arguments of its done event")
        if self.finish_reason == "length":
            out.insert(0, f"truncated: max_output_tokens reached after {self.token_chunks} output event(s) with "
                          f"{len(self._calls)} function call(s)")
        return out or None

    def assistant_message(self, content: str = "null") -> dict:
        return assistant_turn(self.content, self.tool_calls if self._calls else None, content)
Stream = ResponsesStream
