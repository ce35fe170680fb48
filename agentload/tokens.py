"""One token estimate shared by the agents and the mock server.

Both sides must count the same way, so that a mock threshold such as
`hang_above_tokens = 6000` trips exactly when agentload's estimate crosses 6000.
The rule: a token is 4 bytes of UTF-8 text (rounded up), plus a fixed overhead per
message, plus the serialized tool schemas. Synthetic text is built from 4-byte
words ("abc ") so that N words are exactly N tokens.
"""

from __future__ import annotations

import random
from typing import Any, Iterable

import orjson

BYTES_PER_TOKEN = 4
TOKENS_PER_MESSAGE = 4

# 3-letter words + a space = 4 bytes = 1 token each.
_WORDS = [a + b + c for a in "bdfgklmnprstvz" for b in "aeiou" for c in "lmnrst"]


def text_tokens(text: str | None) -> int:
    if not text:
        return 0
    n = len(text.encode("utf-8")) if not text.isascii() else len(text)
    return -(-n // BYTES_PER_TOKEN)


def message_tokens(message: dict[str, Any]) -> int:
    # (`agentload proxy` counts every message of every request it forwards: written for speed)
    n = TOKENS_PER_MESSAGE
    content = message.get("content")
    if content and isinstance(content, str):
        n += -(-(len(content) if content.isascii() else len(content.encode("utf-8"))) // BYTES_PER_TOKEN)
    calls = message.get("tool_calls")
    if calls:
        for call in calls:
            fn = call.get("function") or {}
            n += text_tokens(fn.get("name")) + text_tokens(fn.get("arguments"))
    return n


def prompt_tokens(messages: Iterable[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> int:
    n = 0
    for m in messages:
        n += message_tokens(m)
    if tools:
        n += text_tokens(orjson.dumps(tools).decode())
    return n


def synthetic_text(rng: random.Random, tokens: int) -> str:
    """Text of exactly `tokens` tokens by the rule above (no trailing space)."""
    if tokens <= 0:
        return ""
    words = rng.choices(_WORDS, k=tokens)
    # N words joined by N-1 spaces is 4N-1 bytes, which rounds up to N tokens.
    return " ".join(words)
