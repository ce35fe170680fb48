"""Conversations and rounds, inferred from a harness's own requests (`agentload proxy`).

A harness sends each round the whole conversation so far: the earlier request's messages, the
answer it got, the tool results, in that order. So a request whose messages begin with an
earlier request's messages (and are longer) continues that request's conversation, one round
later; a request with the very messages of an earlier one that failed is that round's retry;
anything else opens a new conversation, round 1. A session header (`--session-header`) names
the conversation outright and wins over the messages.

Messages are compared by a digest of each one in a canonical form (keys sorted; Anthropic's
`cache_control` marks dropped, since a harness moves them to the newest message every round),
chained so that a prefix of N messages is one digest. Only digests are kept, never text.

The digest is the interpreter's own hash of the canonical bytes, chained (64 bits, salted per
process): digests are only matched within the one proxy process that made them, never written,
and every request digests its whole conversation again, so it must be cheap (a blake2b per
message cost more than the rest of a request's bookkeeping). The marks are dropped only from a
message whose serialised form names `cache_control` (a search in bytes, no Python walk).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

_DROP = frozenset({"cache_control"})
_MARK = b'"cache_control"'


def _canonical(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _canonical(x) for k, x in v.items() if k not in _DROP}
    if isinstance(v, list):
        return [_canonical(x) for x in v]
    return v


def conversation_items(body: dict[str, Any]) -> list[Any] | None:
    """The ordered items a request carries its conversation in (chat and messages: `messages`,
    with the system prompt first; responses: `input`, with `instructions` first), or None."""
    items = body.get("messages")
    head: Any = body.get("system")
    if items is None:
        items = body.get("input")
        head = body.get("instructions")
        if isinstance(items, str):
            items = [{"role": "user", "content": items}]
    if not isinstance(items, list):
        return None
    return ([{"system": head}] if head else []) + items


def prefix_digests(items: list[Any]) -> list[int]:
    """d[i]: the digest of items[:i+1] (never 0: 0 stands for no messages)."""
    out: list[int] = []
    d = 0
    dumps, sort = orjson.dumps, orjson.OPT_SORT_KEYS
    for it in items:
        b = dumps(it, option=sort)
        if _MARK in b:
            b = dumps(_canonical(it), option=sort)
        d = hash((d, b)) or 1
        out.append(d)
    return out


@dataclass
class _Conversation:
    index: int
    round: int = 0
    call: int = 0
    last_digest: int = 0
    last_len: int = 0
    last_ok: bool | None = None  # None: the round's request is still in flight


@dataclass
class Placement:
    conversation: int  # the conversation's index (the record's `agent`)
    round: int
    call: int  # attempt within the round: a retry of the same messages counts up
    how: str  # "new", "continued", "retry", "session"


@dataclass
class Conversations:
    """Places each request in a conversation and a round. Bounded by the conversations seen."""

    convs: list[_Conversation] = field(default_factory=list)
    _by_digest: dict[int, list[int]] = field(default_factory=dict)  # last request's digest -> conversations
    _by_session: dict[str, int] = field(default_factory=dict)

    def place(self, items: list[Any] | None, session: str | None = None) -> Placement:
        digests = prefix_digests(items) if items else []
        full = digests[-1] if digests else 0
        if session:
            i = self._by_session.get(session)
            if i is None:
                i = self._by_session[session] = self._new().index
                return self._advance(self.convs[i], full, len(digests), "session", new_round=True)
            c = self.convs[i]
            retry = bool(full) and full == c.last_digest and c.last_ok is False
            return self._advance(c, full, len(digests), "session", new_round=not retry)
        # the same messages as a request that failed: its retry
        for i in self._by_digest.get(full, ()) if full else ():
            c = self.convs[i]
            if c.last_ok is False and c.last_len == len(digests):
                return self._advance(c, full, len(digests), "retry", new_round=False)
        # the longest earlier request this one begins with (and goes beyond): its next round
        for n in range(len(digests) - 1, 0, -1):
            for i in self._by_digest.get(digests[n - 1], ()):
                c = self.convs[i]
                if c.last_len == n and c.last_ok is not None:
                    return self._advance(c, full, len(digests), "continued", new_round=True)
        return self._advance(self._new(), full, len(digests), "new", new_round=True)

    def answered(self, conversation: int, ok: bool) -> None:
        """The round's request ended (ok: the harness got a whole answer)."""
        self.convs[conversation].last_ok = ok

    def _new(self) -> _Conversation:
        c = _Conversation(len(self.convs))
        self.convs.append(c)
        return c

    def _advance(self, c: _Conversation, digest: int, n: int, how: str, new_round: bool) -> Placement:
        if c.last_digest:
            ids = self._by_digest.get(c.last_digest)
            if ids is not None:
                ids.remove(c.index)
                if not ids:
                    del self._by_digest[c.last_digest]
        if new_round:
            c.round += 1
            c.call = 0
        else:
            c.call += 1
        c.last_digest, c.last_len, c.last_ok = digest, n, None
        if digest:
            self._by_digest.setdefault(digest, []).append(c.index)
        return Placement(c.index, c.round, c.call, how)
