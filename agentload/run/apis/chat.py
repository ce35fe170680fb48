"""OpenAI's Chat Completions (`POST <endpoint>/chat/completions`): the request and its stream.

The request: `model`, `max_tokens`, `stream` (+ `stream_options.include_usage`), `tools` and
`tool_choice` as OpenAI writes them, then `messages`, the system prompt the first of them. The
stream is read by `ChatStream` (agentload.run.chat_stream).
"""

from __future__ import annotations

from typing import Any

import orjson

from agentload.run.chat_stream import ChatStream

NAME = "chat"
SYSTEM: bytes | None = None  # the system prompt is the first message
ITEMS = b'"messages":['
Stream = ChatStream


def head(cfg: Any, model: str, tools: list[dict[str, Any]]) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "max_tokens": cfg.max_tokens, "stream": cfg.stream}
    if cfg.stream and cfg.include_usage:
        body["stream_options"] = {"include_usage": True}
    if tools:
        body["tools"] = tools
        choice = cfg.tool_choice_json()
        if choice is not None:
            body["tool_choice"] = choice
    return body


def encode(messages: list[dict[str, Any]]) -> list[bytes]:
    return [orjson.dumps(m) for m in messages]


def headers(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key is not None else {}
