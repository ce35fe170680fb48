"""The chat route's bytes: its SSE chunks (as vLLM and SGLang frame them) and its unary body.

An answer's stream is a `Frames`: `open` (written with the headers: chat's role-only chunk),
one of `chunks` per token chunk, `close` after the last (finish, usage if asked, [DONE]). The
serving loop (mock/handler.py) writes them, paced and faulted; Messages and Responses make their
own Frames of the same plan (mock/apis.py).
"""

from __future__ import annotations

from typing import Any

import orjson

_dumps = orjson.dumps

DONE = b"data: [DONE]\n\n"
PING = b": ping\n\n"
SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}


class Frames:
    """An answer's bytes as the serving loop writes them: `open` with the headers, one of `chunks`
    per token chunk (`toks` tokens each), `close` after the last."""

    __slots__ = ("open", "chunks", "toks", "close")

    def __init__(self) -> None:
        self.open = b""
        self.chunks: list[bytes] = []
        self.toks: list[int] = []
        self.close = b""


def fingerprint(backend: str) -> bytes:
    """The `system_fingerprint` member every chunk carries, encoded once per server."""
    return b',"system_fingerprint":' + _dumps(backend)


def chat_frames(plan: Any, body: dict[str, Any], cid: str, created: int, model: str, usage: dict[str, Any],
                fingerprint: bytes, sglang: bool) -> Frames:
    """The chat answer's chunks: the role chunk first, one per token chunk, then finish, usage, [DONE]."""
    # Everything of a chunk but its delta and finish_reason, encoded once per request.
    head = b'data: {"id":"' + cid.encode() + b'","object":"chat.completion.chunk","created":' + str(created).encode() \
        + b',"model":' + _dumps(model) + fingerprint + b',"choices":[{"index":0,"delta":'
    tail = b',"logprobs":null,"finish_reason":null' + (b',"matched_stop":null}]' if sglang else b"}]")
    tail += b',"usage":null}\n\n' if sglang else b"}\n\n"
    role = b'{"role":"assistant","content":"","reasoning_content":null,"tool_calls":null}' if sglang \
        else b'{"role":"assistant","content":""}'
    f = Frames()
    f.open = head + role + tail
    deltas = plan.deltas
    n = len(deltas)
    finish = b',"logprobs":null,"finish_reason":"' + plan.finish.encode() + b'"'
    finish += b',"matched_stop":null}]' if sglang else b"}]"
    finish += b',"usage":null}\n\n' if sglang else b"}\n\n"
    if sglang or n == 0:
        # SGLang puts finish_reason in a chunk of its own; with no tokens vLLM does too.
        f.chunks = [head + d + tail for d in deltas]
        end = [head + (b'{"role":null,"content":null,"reasoning_content":null,"tool_calls":null}' if sglang
                       else b'{"content":""}') + finish]
    else:
        f.chunks = [head + d + tail for d in deltas[:-1]]
        f.chunks.append(head + deltas[-1] + finish)
        end = []
    f.toks = plan.tokens
    opts = body.get("stream_options")
    if isinstance(opts, dict) and opts.get("include_usage"):
        end.append(b'data: {"id":"' + cid.encode() + b'","object":"chat.completion.chunk","created":'
                   + str(created).encode() + b',"model":' + _dumps(model) + fingerprint
                   + b',"choices":[],"usage":' + _dumps(usage) + b"}\n\n")
    end.append(DONE)
    f.close = b"".join(end)
    return f


def chat_unary(plan: Any, cid: str, created: int, model: str, backend: str, usage: dict[str, Any]) -> dict[str, Any]:
    """The chat answer as one JSON object (`stream` false)."""
    return {"id": cid, "object": "chat.completion", "created": created, "model": model,
            "system_fingerprint": backend,
            "choices": [{"index": 0, "message": plan.message, "logprobs": None, "finish_reason": plan.finish}],
            "usage": usage}


def chat_error(status: int, message: str, etype: str) -> bytes:
    """An error body as OpenAI's chat route answers it."""
    return _dumps({"error": {"message": message, "type": etype, "param": None, "code": status}})


def stamped(chunk: bytes, sent_ns: int) -> bytes:
    """`chunk` with "mock_sent_ns" in its last event (the one that carries its token), for the
    timing-accuracy benchmark: stamped just before the write."""
    at = chunk.rfind(b"data: {") + 7
    return chunk[:at] + b'"mock_sent_ns":' + str(sent_ns).encode() + b"," + chunk[at:]
