"""The mock's Anthropic Messages (`POST /v1/messages`) and OpenAI Responses (`POST /v1/responses`).

A request of either API is read into chat's form (`from_messages`, `from_responses`: the system
prompt, the messages with their tool calls and results, the tools, tool_choice, max_tokens), so
rounds, prompt tokens, the protocol check, the prefix cache, the answer plan and every fault are
the chat route's, and the prompt tokens are the ones agentload counted for the same conversation.
The answer is then written in the API's own events (`frames`): the same token chunks, paced and
faulted by the same loop (mock/handler.py), each framed as the API frames it:

- Messages: `message_start` (with the headers: input usage, and the cache's reads as
  `cache_read_input_tokens` where the prefix cache is on), one `content_block_start` per block
  with its first delta (a tool_use block's start carries its name: the first token of a call),
  `text_delta` / `input_json_delta`, `content_block_stop`, `message_delta` (stop_reason:
  end_turn, tool_use or max_tokens; output usage), `message_stop`;
- Responses: `response.created` and `response.in_progress` (with the headers), one
  `response.output_item.added` per item (a message with its `content_part.added`, or a
  function_call with its name), `response.output_text.delta` /
  `response.function_call_arguments.delta`, the `.done` events of each, then `response.completed`
  with the whole output and usage (`input_tokens_details.cached_tokens` where the prefix cache is
  on), or `response.incomplete` (reason max_output_tokens) when the answer ran into
  max_output_tokens. Stored responses (`store: true`) are kept (an LRU of `STORE_MAX`) so a
  request with `previous_response_id` continues them; an unknown id is a 400, as OpenAI answers it.

Every answer carries the backend's name (`system_fingerprint` in `message_start`'s message and in
the response object), as the chat route's chunks do.
"""

from __future__ import annotations

import collections
import os
from typing import Any

import orjson

from agentload.mock.framing import Frames
from agentload.tokens import text_tokens

_dumps = orjson.dumps
STORE_MAX = 50_000  # stored responses kept (the least recently used go first)
STOP_REASONS = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens"}


class BadRequest(Exception):
    """A request the API would refuse (400), with its message."""


# ---------------------------------------------------------------- requests into chat's form


def _text(content: Any, what: str) -> str:
    """A string, or a list of text blocks/parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for b in content:
            if not isinstance(b, dict):
                raise BadRequest(f"{what}: expected content blocks (objects)")
            t = b.get("text")
            if isinstance(t, str):
                out.append(t)
        return "".join(out)
    if content is None:
        return ""
    raise BadRequest(f"{what}: expected a string or a list of content blocks")


def _tools(tools: Any, schema_key: str, flat_type: bool) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise BadRequest("tools: expected a list")
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or not isinstance(t.get("name"), str):
            raise BadRequest(f"tools.{i}: expected an object with a name")
        if flat_type and t.get("type") != "function":
            continue  # (built-in tools: not the mock's)
        out.append({"type": "function", "function": {"name": t["name"], "description": t.get("description", ""),
                                                     "parameters": t.get(schema_key)}})
    return out


def from_messages(body: dict[str, Any]) -> dict[str, Any]:
    """An Anthropic Messages request in chat's form."""
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise BadRequest("messages: expected a non-empty list")
    if not isinstance(body.get("max_tokens"), int) or isinstance(body.get("max_tokens"), bool):
        raise BadRequest("max_tokens: Field required")
    out: list[dict[str, Any]] = []
    system = body.get("system")
    if system is not None:  # (an empty one too: a message, as chat's first message is, and counted so)
        out.append({"role": "system", "content": _text(system, "system")})
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise BadRequest(f"messages.{i}: expected an object with role 'user' or 'assistant'")
        content = m.get("content")
        if isinstance(content, str):
            out.append({"role": m["role"], "content": content})
            continue
        if not isinstance(content, list):
            raise BadRequest(f"messages.{i}.content: expected a string or a list of content blocks")
        if m["role"] == "assistant":
            text, calls = [], []
            for b in content:
                if not isinstance(b, dict):
                    raise BadRequest(f"messages.{i}.content: expected content blocks (objects)")
                if b.get("type") == "text":
                    text.append(b.get("text") or "")
                elif b.get("type") == "tool_use":
                    calls.append({"id": b.get("id"), "type": "function",
                                  "function": {"name": b.get("name"), "arguments": _dumps(b.get("input")).decode()}})
            msg: dict[str, Any] = {"role": "assistant", "content": "".join(text)}
            if calls:
                msg["tool_calls"] = calls
            out.append(msg)
            continue
        text = []
        for b in content:
            if not isinstance(b, dict):
                raise BadRequest(f"messages.{i}.content: expected content blocks (objects)")
            if b.get("type") == "tool_result":
                out.append({"role": "tool", "tool_call_id": b.get("tool_use_id"),
                            "content": _text(b.get("content"), f"messages.{i}.content.tool_result")})
            elif b.get("type") == "text":
                text.append(b.get("text") or "")
        if text:
            out.append({"role": "user", "content": "".join(text)})
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        kind: Any = choice.get("type")
        choice = {"auto": "auto", "any": "required", "none": "none"}.get(kind) if kind != "tool" else \
            {"type": "function", "function": {"name": choice.get("name")}}
    chat: dict[str, Any] = {"model": body.get("model"), "messages": out, "max_tokens": body["max_tokens"],
                            "stream": bool(body.get("stream"))}
    tools = _tools(body.get("tools"), "input_schema", False)
    if tools is not None:
        chat["tools"] = tools
    if choice is not None:
        chat["tool_choice"] = choice
    return chat


def _items(items: Any) -> list[dict[str, Any]]:
    """Responses `input` items in chat's form: function_calls join the assistant turn before them."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list):
        raise BadRequest("input: expected a string or a list of items")
    out: list[dict[str, Any]] = []
    for i, it in enumerate(items):
        if not isinstance(it, dict):
            raise BadRequest(f"input.{i}: expected an object")
        kind = it.get("type", "message")
        if kind == "message":
            role = it.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise BadRequest(f"input.{i}.role: expected 'user', 'assistant', 'system' or 'developer'")
            out.append({"role": "system" if role == "developer" else role,
                        "content": _text(it.get("content"), f"input.{i}.content")})
        elif kind == "function_call":
            call = {"id": it.get("call_id"), "type": "function",
                    "function": {"name": it.get("name"), "arguments": it.get("arguments")}}
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            out.append({"role": "tool", "tool_call_id": it.get("call_id"),
                        "content": _text(it.get("output"), f"input.{i}.output")})
        elif kind == "reasoning":
            continue
        else:
            raise BadRequest(f"input.{i}.type: {kind!r} is not an item the mock knows")
    return out


class ResponseStore:
    """Stored responses: id -> the whole conversation in chat's form (input and output), an LRU."""

    def __init__(self, capacity: int = STORE_MAX):
        self.capacity = capacity
        self.items: collections.OrderedDict[str, list[dict[str, Any]]] = collections.OrderedDict()

    def get(self, rid: str) -> list[dict[str, Any]] | None:
        got = self.items.get(rid)
        if got is not None:
            self.items.move_to_end(rid)
        return got

    def put(self, rid: str, messages: list[dict[str, Any]]) -> None:
        self.items[rid] = messages
        while len(self.items) > self.capacity:
            self.items.popitem(last=False)


def from_responses(body: dict[str, Any], store: ResponseStore) -> dict[str, Any]:
    """An OpenAI Responses request in chat's form (its stored conversation first, with
    previous_response_id)."""
    if "input" not in body:
        raise BadRequest("input: Field required")
    prev = body.get("previous_response_id")
    out: list[dict[str, Any]] = []
    if prev is not None:
        before = store.get(prev) if isinstance(prev, str) else None
        if before is None:
            raise BadRequest(f"Previous response with id '{prev}' not found.")
        out = list(before)
    instructions = body.get("instructions")
    if instructions is not None:
        system = {"role": "system", "content": _text(instructions, "instructions")}
        if out and out[0].get("role") == "system":
            out[0] = system
        else:
            out.insert(0, system)
    out.extend(_items(body["input"]))
    if not out:
        raise BadRequest("input: expected at least one item")
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        choice = {"type": "function", "function": {"name": choice.get("name")}}
    cap = body.get("max_output_tokens")
    chat: dict[str, Any] = {"model": body.get("model"), "messages": out, "stream": bool(body.get("stream"))}
    if isinstance(cap, int) and not isinstance(cap, bool):
        chat["max_tokens"] = cap
    tools = _tools(body.get("tools"), "parameters", True)
    if tools is not None:
        chat["tools"] = tools
    if choice is not None:
        chat["tool_choice"] = choice
    return chat


# ---------------------------------------------------------------- errors


def error_body(api: str, status: int, message: str, etype: str) -> bytes:
    if api == "messages":
        kind = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                429: "rate_limit_error", 529: "overloaded_error"}.get(status, "api_error")
        return _dumps({"type": "error", "error": {"type": kind, "message": message}})
    return _dumps({"error": {"message": message, "type": etype, "param": None, "code": status}})


# ---------------------------------------------------------------- answers in the API's events


def _event(name: str, obj: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + _dumps(obj) + b"\n\n"


def pieces(message: dict[str, Any], chunk_tokens: int) -> list[tuple[str, int, str, int]]:
    """The plan's answer as token chunks: (kind, call index, text, tokens), kind "text", "call"
    (a call's name opens it: its text is the name) or "args"; chunked as the chat route does."""
    out: list[tuple[str, int, str, int]] = []
    content = message.get("content")
    if content:
        words = content.split(" ")
        for i in range(0, len(words), chunk_tokens):
            part = words[i:i + chunk_tokens]
            out.append(("text", -1, ("" if i == 0 else " ") + " ".join(part), len(part)))
    step = 4 * chunk_tokens
    for k, call in enumerate(message.get("tool_calls") or ()):
        fn = call["function"]
        out.append(("call", k, fn["name"], text_tokens(fn["name"])))
        args = fn["arguments"]
        for pos in range(0, len(args), step):
            piece = args[pos:pos + step]
            out.append(("args", k, piece, text_tokens(piece)))
    return out


def messages_frames(plan: Any, model: str, backend: str, usage: dict[str, Any], chunk_tokens: int) -> Frames:
    f = Frames()
    mid = "msg_" + os.urandom(12).hex()
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    u: dict[str, Any] = {"input_tokens": usage["prompt_tokens"] - (cached or 0), "output_tokens": 1}
    if cached is not None:
        u["cache_creation_input_tokens"] = 0
        u["cache_read_input_tokens"] = cached
    f.open = _event("message_start", {"type": "message_start", "message": {
        "id": mid, "type": "message", "role": "assistant", "content": [], "model": model, "stop_reason": None,
        "stop_sequence": None, "usage": u, "system_fingerprint": backend}})
    block = -1
    calls = plan.message.get("tool_calls") or ()
    for kind, k, text, toks in pieces(plan.message, chunk_tokens):
        pre = b""
        if kind == "text" and block < 0:
            block = 0
            pre = _event("content_block_start", {"type": "content_block_start", "index": 0,
                                                 "content_block": {"type": "text", "text": ""}})
        if kind == "call":
            if block >= 0:
                pre = _event("content_block_stop", {"type": "content_block_stop", "index": block})
            block += 1
            f.chunks.append(pre + _event("content_block_start", {"type": "content_block_start", "index": block,
                                                                 "content_block": {"type": "tool_use",
                                                                                   "id": calls[k]["id"],
                                                                                   "name": text, "input": {}}}))
        elif kind == "text":
            f.chunks.append(pre + _event("content_block_delta", {"type": "content_block_delta", "index": block,
                                                                 "delta": {"type": "text_delta", "text": text}}))
        else:
            f.chunks.append(_event("content_block_delta", {"type": "content_block_delta", "index": block,
                                                           "delta": {"type": "input_json_delta",
                                                                     "partial_json": text}}))
        f.toks.append(toks)
    close = _event("content_block_stop", {"type": "content_block_stop", "index": block}) if block >= 0 else b""
    close += _event("message_delta", {"type": "message_delta",
                                      "delta": {"stop_reason": STOP_REASONS.get(plan.finish, plan.finish),
                                                "stop_sequence": None},
                                      "usage": {"output_tokens": plan.completion_tokens}})
    f.close = close + _event("message_stop", {"type": "message_stop"})
    return f


def messages_unary(plan: Any, model: str, backend: str, usage: dict[str, Any]) -> dict[str, Any]:
    msg = plan.message
    content: list[dict[str, Any]] = []
    if msg.get("content"):
        content.append({"type": "text", "text": msg["content"]})
    for c in msg.get("tool_calls") or ():
        content.append({"type": "tool_use", "id": c["id"], "name": c["function"]["name"],
                        "input": orjson.loads(c["function"]["arguments"])})
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    u: dict[str, Any] = {"input_tokens": usage["prompt_tokens"] - (cached or 0), "output_tokens": plan.completion_tokens}
    if cached is not None:
        u["cache_creation_input_tokens"] = 0
        u["cache_read_input_tokens"] = cached
    return {"id": "msg_" + os.urandom(12).hex(), "type": "message", "role": "assistant", "model": model,
            "content": content, "stop_reason": STOP_REASONS.get(plan.finish, plan.finish), "stop_sequence": None,
            "usage": u, "system_fingerprint": backend}


def _responses_usage(usage: dict[str, Any], output_tokens: int) -> dict[str, Any]:
    u: dict[str, Any] = {"input_tokens": usage["prompt_tokens"]}
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    if cached is not None:
        u["input_tokens_details"] = {"cached_tokens": cached}
    u.update(output_tokens=output_tokens, output_tokens_details={"reasoning_tokens": 0},
             total_tokens=usage["prompt_tokens"] + output_tokens)
    return u


def _output_items(plan: Any, ids: list[str]) -> list[dict[str, Any]]:
    msg = plan.message
    out: list[dict[str, Any]] = []
    if msg.get("content"):
        out.append({"id": ids[0], "type": "message", "status": "completed", "role": "assistant",
                    "content": [{"type": "output_text", "text": msg["content"], "annotations": []}]})
    for k, c in enumerate(msg.get("tool_calls") or ()):
        out.append({"id": ids[k + 1], "type": "function_call", "status": "completed", "call_id": c["id"],
                    "name": c["function"]["name"], "arguments": c["function"]["arguments"]})
    return out


def _response(rid: str, created: int, model: str, backend: str, status: str, output: list, usage: Any,
              body: dict[str, Any]) -> dict[str, Any]:
    return {"id": rid, "object": "response", "created_at": created, "status": status, "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": body.get("instructions"), "max_output_tokens": body.get("max_output_tokens"),
            "model": model, "output": output, "parallel_tool_calls": True,
            "previous_response_id": body.get("previous_response_id"), "store": bool(body.get("store", True)),
            "temperature": 1.0, "tool_choice": body.get("tool_choice", "auto"), "tools": body.get("tools") or [],
            "top_p": 1.0, "truncation": "disabled", "usage": usage, "system_fingerprint": backend}


def responses_frames(plan: Any, rid: str, created: int, model: str, backend: str, usage: dict[str, Any],
                     chunk_tokens: int, body: dict[str, Any]) -> Frames:
    f = Frames()
    seq = 0

    def ev(name: str, obj: dict[str, Any]) -> bytes:
        nonlocal seq
        obj = {"type": name, "sequence_number": seq, **obj}
        seq += 1
        return _event(name, obj)

    status = "incomplete" if plan.finish == "length" else "completed"
    ids = ["msg_" + os.urandom(12).hex()] + ["fc_" + os.urandom(12).hex() for _ in plan.message.get("tool_calls") or ()]
    final = _output_items(plan, ids)
    f.open = ev("response.created", {"response": _response(rid, created, model, backend, "in_progress", [], None, body)}) \
        + ev("response.in_progress", {"response": _response(rid, created, model, backend, "in_progress", [], None, body)})
    item = -1  # output_index of the item open
    is_text = bool(plan.message.get("content"))
    calls = plan.message.get("tool_calls") or ()

    def done_item(i: int) -> bytes:
        it = final[i]
        if it["type"] == "message":
            text = it["content"][0]["text"]
            return (ev("response.output_text.done", {"item_id": it["id"], "output_index": i, "content_index": 0,
                                                     "text": text, "logprobs": []})
                    + ev("response.content_part.done", {"item_id": it["id"], "output_index": i, "content_index": 0,
                                                        "part": it["content"][0]})
                    + ev("response.output_item.done", {"output_index": i, "item": it}))
        return (ev("response.function_call_arguments.done", {"item_id": it["id"], "output_index": i,
                                                             "arguments": it["arguments"]})
                + ev("response.output_item.done", {"output_index": i, "item": it}))

    for kind, k, text, toks in pieces(plan.message, chunk_tokens):
        if kind == "text":
            pre = b""
            if item < 0:
                item = 0
                pre = ev("response.output_item.added", {"output_index": 0, "item": {
                    "id": ids[0], "type": "message", "status": "in_progress", "role": "assistant", "content": []}}) \
                    + ev("response.content_part.added", {"item_id": ids[0], "output_index": 0, "content_index": 0,
                                                         "part": {"type": "output_text", "text": "", "annotations": []}})
            f.chunks.append(pre + ev("response.output_text.delta", {"item_id": ids[0], "output_index": 0,
                                                                    "content_index": 0, "delta": text, "logprobs": []}))
        elif kind == "call":
            pre = done_item(item) if item >= 0 else b""
            item = k + (1 if is_text else 0)
            f.chunks.append(pre + ev("response.output_item.added", {"output_index": item, "item": {
                "id": ids[k + 1], "type": "function_call", "status": "in_progress", "call_id": calls[k]["id"],
                "name": text, "arguments": ""}}))
        else:
            f.chunks.append(ev("response.function_call_arguments.delta", {"item_id": ids[k + 1], "output_index": item,
                                                                         "delta": text}))
        f.toks.append(toks)
    close = done_item(item) if item >= 0 else b""
    u = _responses_usage(usage, plan.completion_tokens)
    if status == "completed":
        close += ev("response.completed", {"response": _response(rid, created, model, backend, status, final, u, body)})
    else:
        close += ev("response.incomplete", {"response": _response(rid, created, model, backend, status, final, u, body)})
    f.close = close
    return f


def responses_unary(plan: Any, rid: str, created: int, model: str, backend: str, usage: dict[str, Any],
                    body: dict[str, Any]) -> dict[str, Any]:
    status = "incomplete" if plan.finish == "length" else "completed"
    ids = ["msg_" + os.urandom(12).hex()] + ["fc_" + os.urandom(12).hex() for _ in plan.message.get("tool_calls") or ()]
    return _response(rid, created, model, backend, status, _output_items(plan, ids),
                     _responses_usage(usage, plan.completion_tokens), body)
