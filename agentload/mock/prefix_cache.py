"""The mock's prefix cache: vLLM's and SGLang's automatic prefix caching, made deterministic.

The prompt is a chain of nodes, one per message, keyed by the hash of the previous key and the
message's canonical JSON (the chain starts from the model and the tools; the tools' tokens count
with the first node). A prompt's cached tokens are the tokens of the longest chain prefix found
in an LRU of nodes, capped at prompt_tokens - 1 and floored to whole `block` tokens. At admission
every node of the prompt is inserted or touched and the least recently used nodes go until the
cache fits its capacity.
"""

from __future__ import annotations

import collections
import hashlib
from typing import Any

import orjson

from agentload.tokens import message_tokens, text_tokens

_dumps = orjson.dumps
_blake = hashlib.blake2b


class PrefixCache:
    """An LRU of prompt-chain nodes: node hash -> its tokens."""

    def __init__(self, capacity_tokens: int, block_tokens: int):
        self.capacity = capacity_tokens
        self.block = block_tokens
        self.nodes: collections.OrderedDict[bytes, int] = collections.OrderedDict()
        self.used = 0
        self.reset_counters()

    def reset_counters(self) -> None:
        self.lookups = 0
        self.hit_requests = 0
        self.cached_tokens_total = 0
        self.prompt_tokens_total = 0

    @staticmethod
    def chain(model: str, tools: list[Any] | None, messages: list[dict[str, Any]]) -> list[tuple[bytes, int]]:
        """(key, tokens) of each message's node; the tokens add up to prompt_tokens(messages, tools)."""
        tools_json = _dumps(tools) if tools else b""
        key = _blake(_dumps(model) + b"\0" + tools_json, digest_size=8).digest()
        extra = text_tokens(tools_json.decode()) if tools else 0  # counted as tokens.prompt_tokens does
        out = []
        for m in messages:
            # sorted keys: the same message from another client library is the same node
            key = _blake(key + _dumps(m, option=orjson.OPT_SORT_KEYS), digest_size=8).digest()
            out.append((key, message_tokens(m) + extra))
            extra = 0
        return out

    def admit(self, chain: list[tuple[bytes, int]], ptoks: int) -> int:
        """Look the prompt up, then insert/touch its nodes; returns its cached tokens."""
        nodes = self.nodes
        hit = 0
        for key, toks in chain:
            if key not in nodes:
                break
            hit += toks
        # an engine always computes the last token itself, and caches whole blocks only
        hit = min(hit, ptoks - 1)
        cached = max(0, hit - hit % self.block)
        # Leaf first, root last: the shared root of many prompts is then the most recently used,
        # and eviction takes the tails of prompts before the prefixes others build on (as vLLM
        # frees a request's blocks in reverse order).
        used = self.used
        for key, toks in reversed(chain):
            if key in nodes:
                nodes.move_to_end(key)
            else:
                nodes[key] = toks
                used += toks
        while used > self.capacity:
            used -= nodes.popitem(last=False)[1]
        self.used = used
        self.lookups += 1
        if cached:
            self.hit_requests += 1
        self.cached_tokens_total += cached
        self.prompt_tokens_total += ptoks
        return cached

    def snapshot(self) -> dict[str, int]:
        return {"capacity_tokens": self.capacity, "used_tokens": self.used, "lookups": self.lookups,
                "hit_requests": self.hit_requests, "cached_tokens_total": self.cached_tokens_total,
                "prompt_tokens_total": self.prompt_tokens_total}
