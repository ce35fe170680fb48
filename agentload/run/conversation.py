"""One agent's growing conversation: messages, tool schemas, tool calls and their results.

The history only grows, so each message is serialised once and the request body is kept whole:
a fixed prefix (model, tools, settings: one bytes object shared by every agent with the same
settings), the messages so far, a fixed suffix. Appending a message copies the body once with the
new message in it; it never re-serialises the history, and sending hands over that same bytes
object. That body is the only copy of the history kept (`messages` decodes it on demand): not one
bytes object per message (orjson returns each result in an allocation of at least 4 KiB:
gigabytes for 10,000 long conversations), no dict per message (fewer objects for the garbage
collector to walk: shorter pauses), and no second copy while a request waits for a connection
(100,000 agents queued for a pool of 100: 3.5 KB less each). A body that waits while many
others do is parked: kept zlib-compressed until it is written (`park`, called by the transport
past `client.park_queued_bodies_mb` queued).

Every size, count and text is drawn from the agent's own numpy Generator (`agent_rng`): a
stream of its own, the same for the same seed whatever the number of agents.
"""

from __future__ import annotations

import random
import zlib
from typing import Any

import numpy as np
import numpy.random  # noqa: F401  numpy loads it lazily: at import here, not inside the first agent's first step (5-10 ms)
import orjson

from agentload.run import apis
from agentload.run.apis import chat as _chat
from agentload.run.apis.reader import assistant_turn
from agentload.run.scenario import ConversationConfig
from agentload.tokens import _WORDS, TOKENS_PER_MESSAGE, message_tokens, text_tokens

# The synthetic-text words with their trailing space: 4 bytes each, so one uint32 per word.
_WORD_CELLS = np.frombuffer("".join(w + " " for w in _WORDS).encode("ascii"), dtype=np.uint32)
_N_WORDS = float(len(_WORD_CELLS))


def agent_rng(seed: int, agent: int) -> np.random.Generator:
    """Agent `agent`'s stream: a child of `seed` (SeedSequence spawn key), whatever the agent count."""
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(agent,)))


# Short texts (a user turn, a tool call's arguments) are windows of one fixed table of random words
# (the same in every process): one scalar draw from the agent's stream picks the window, where a
# batch draw per text cost 2 us of numpy calls twice a round. Longer texts (system prompts, tool
# results) are drawn word by word, so that two agents never share a long prefix by chance.
_SHORT_MAX = 64
_TABLE_WORDS = 1 << 18  # 1 MB of words
_table: str | None = None  # (a str: a window of it is the text, no bytes decoded per text)


def _word_table() -> str:
    global _table
    if _table is None:
        u = np.random.default_rng(0x5EED_7E47).random(_TABLE_WORDS)
        u *= _N_WORDS
        _table = _WORD_CELLS[u.astype(np.intp)].tobytes().decode("ascii")
    return _table


def synthetic_text(rng: np.random.Generator, tokens: int) -> str:
    """Text of exactly `tokens` tokens by tokens.py's rule (4-byte words, no trailing space): a
    window of the word table (up to _SHORT_MAX words), else drawn in one batch (a few us for 300
    words, where random.choices took 24)."""
    if tokens <= 0:
        return ""
    if tokens <= _SHORT_MAX:
        at = int(rng.random() * (_TABLE_WORDS - tokens + 1)) * 4
        return (_table or _word_table())[at:at + 4 * tokens - 1]
    # floor(u * 420) of a 53-bit u: uniform over the words to 1e-13
    u = rng.random(tokens)
    u *= _N_WORDS  # in place: one array fewer
    cells = _WORD_CELLS[u.astype(np.intp)]
    return cells.tobytes()[:-1].decode("ascii")


def _below(rng: np.random.Generator, n: int) -> int:
    """A whole number in [0, n): a third of rng.integers' per-call cost."""
    return int(rng.random() * n)


def tool_schemas(n: int) -> list[dict[str, Any]]:
    """n deterministic tool schemas: the same for every agent and every run."""
    return [
        {
            "type": "function",
            "function": {
                "name": f"tool_{i}",
                "description": f"Simulated tool number {i}: looks something up and returns text.",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "query": {"type": "string", "description": "what to look up"},
                        "limit": {"type": "integer", "description": "how many results"},
                    },
                    "required": ["query"],
                },
            },
        }
        for i in range(n)
    ]


def _draw_group(cfg: ConversationConfig, rng: np.random.Generator) -> int:
    """The agent's prefix group, drawn from its own stream (the same for the same seed)."""
    w = cfg.group_weights or [1.0] * cfg.prefix_groups
    u = rng.random() * sum(w)
    for g, x in enumerate(w):
        u -= x
        if u < 0:
            return g
    return len(w) - 1


_GROUP_TEXT: dict[tuple[int, int], str] = {}
_GROUP_TOOLS: dict[tuple[int, int], list[dict[str, Any]]] = {}


def group_text(group: int, tokens: int) -> str:
    """A prefix group's shared system prompt: the same text for every agent of the group (drawn from
    the group's own stream; one string per group, shared by all its agents)."""
    key = (group, tokens)
    text = _GROUP_TEXT.get(key)
    if text is None:
        text = _GROUP_TEXT[key] = synthetic_text(np.random.default_rng([0x6A0E, group]), tokens)
    return text


def group_tools(tools: list[dict[str, Any]], group: int) -> list[dict[str, Any]]:
    """The group's tool list: the same tools (names unchanged: tool_choice still names them), each
    described as the group's own, so two groups' requests differ from their first bytes."""
    key = (group, len(tools))
    out = _GROUP_TOOLS.get(key)
    if out is None:
        out = _GROUP_TOOLS[key] = [
            {**t, "function": {**t["function"], "description": f"{t['function'].get('description', '')} "
                                                              f"(product {group})"}} for t in tools]
    return out


_HEADS: dict[tuple, tuple[bytes, int]] = {}  # the body prefix and the tools' tokens, per settings


def _head(cfg: ConversationConfig, model: str, tools: list[dict[str, Any]], api: Any = _chat) -> tuple[bytes, int]:
    """'{...' (every field but the system prompt and the messages, serialised once; the API's own
    shape, `apis`) and the tools' token count: one bytes object for every conversation with the
    same settings and tools. The tokens are counted on chat's form whatever the API (one estimate,
    the mock's too)."""
    key = (api.NAME, model, cfg.max_tokens, cfg.stream, cfg.include_usage, orjson.dumps(cfg.tool_choice_json()),
           orjson.dumps(tools) if tools else b"", cfg.responses_chain)
    got = _HEADS.get(key)
    if got is None:
        got = (orjson.dumps(api.head(cfg, model, tools))[:-1], text_tokens(key[6].decode()) if tools else 0)
        if len(_HEADS) >= 64:  # settings seen in one process: a handful; never unbounded
            _HEADS.clear()
        _HEADS[key] = got
    return got


class Conversation:
    """Messages of one agent, with their serialised form and token estimate kept in step."""

    last_round = 0  # the round it ends after (0: agents.rounds decides); a replayed conversation sets its own

    __slots__ = ("group", "cfg", "model", "rng", "tools", "_tools_tokens", "_body", "_head_len", "n_messages",
                 "tokens", "agent", "round", "_latency_s", "_user_tokens", "_pending", "_in_body", "_packed",
                 "_enc", "_head", "_chained")

    def __init__(self, cfg: ConversationConfig, model: str, rng: np.random.Generator | random.Random, agent: int,
                 tools: list[dict[str, Any]] | None = None, api: str = "chat"):
        if isinstance(rng, random.Random):  # the runner's canaries hand a random.Random: seed a Generator from it
            rng = np.random.default_rng(rng.getrandbits(64))
        self.cfg = cfg
        self.model = model
        self.rng = rng
        self.agent = agent
        self.round = 0
        self.tools = tools if tools is not None else tool_schemas(cfg.tools)
        self.group = _draw_group(cfg, rng) if cfg.prefix_groups else None
        if self.group is not None and self.tools:
            self.tools = group_tools(self.tools, self.group)
        mod = apis.get(api)
        head, self._tools_tokens = _head(cfg, model, self.tools, mod)
        # Messages appended since the body was last made: joined into it once, when it is next
        # asked for (a round appends 2-3 messages; each join copies the whole history). Chat's are
        # serialised as they come; another API's (`_enc`, its module) are kept as they came and
        # encoded when joined (the tool results of a round may become one item: Messages' user turn).
        self._pending: list[Any] = []
        self._enc = None if mod is _chat else mod
        self._chained: str | None = None  # responses_chain: the id of the answer the next request follows
        self._in_body = 0  # messages in _body
        self._packed: bytes | None = None  # the body while parked (`park`): zlib, _body empty
        self.n_messages = 0
        self.tokens = self._tools_tokens
        # A constant draws nothing from the generator: its value, taken once per conversation
        # (None: drawn at each use).
        lat, ut = cfg.tool_latency_ms, cfg.user_tokens
        self._latency_s = lat.sample(rng) / 1000.0 if lat.kind == "constant" else None
        self._user_tokens = max(1, ut.sample_int(rng)) if ut.kind == "constant" else None
        sys_text, user_texts = self.opening(rng)
        system = {"role": "system", "content": sys_text}
        if self._enc is None:
            head += b"," + mod.ITEMS  # '{...,"messages":[' + the messages, comma-separated + ']}'
        else:  # the system prompt is a field of its own ("system", "instructions"), before the items
            self.n_messages += 1
            self.tokens += message_tokens(system)
            head += b"," + mod.SYSTEM + orjson.dumps(sys_text) + b"," + mod.ITEMS
        self._head = head
        self._head_len = len(head)
        self._body = head + b"]}"
        if self._enc is None:
            self.append(system)
        for text in user_texts:
            self.append({"role": "user", "content": text})

    def opening(self, rng: np.random.Generator) -> tuple[str, list[str]]:
        """The system prompt and the first user turn(s): the agent's own text, after its prefix group's
        shared prompt if it has one (a replayed trace with shared prefixes: its blocks',
        `agentload.run.replay`)."""
        sys_text = synthetic_text(rng, self.cfg.system_tokens.sample_int(rng))
        if self.group is not None and self.cfg.shared_system_tokens:
            shared = group_text(self.group, self.cfg.shared_system_tokens)
            sys_text = shared + " " + sys_text if sys_text else shared
        return sys_text, [synthetic_text(rng, max(1, self.cfg.user_tokens.sample_int(rng)))]

    def append(self, message: dict[str, Any], tokens: int | None = None) -> None:
        """Add a message (`tokens`: its `message_tokens`, when the caller knows them already)."""
        self._pending.append(orjson.dumps(message) if self._enc is None else message)
        self.n_messages += 1
        self.tokens += message_tokens(message) if tokens is None else tokens

    def chain(self, response_id: str | None) -> None:
        """`[conversation] responses_chain`: the server keeps the context up to and including the
        answer `response_id` (appended already): from now on the body carries only what comes
        after it, with `previous_response_id` (None: no id came, so the next request sends the whole
        input again, as a stateless one does)."""
        if response_id is None:
            self._chained = None
            return
        self.body()
        self._chained = response_id
        head = self._head
        at = head.rindex(b"," + self._enc.ITEMS)  # type: ignore[union-attr]
        self._body = b"".join((head[:at], b',"previous_response_id":', orjson.dumps(response_id), head[at:], b"]}"))
        self._head_len = len(self._body) - 2
        self._in_body = 0

    def body(self) -> bytes:
        """The request body (the same bytes object until the next message is appended)."""
        if self._packed is not None:
            self._body = zlib.decompress(self._packed)
            self._packed = None
        pending = self._pending
        if pending:
            if self._enc is not None:
                pending = self._enc.encode(pending)
                self._pending.clear()
            new = pending[0] if len(pending) == 1 else b",".join(pending)
            self._body = b"".join((memoryview(self._body)[:-2], b"," if self._in_body else b"", new, b"]}"))
            self._in_body = self.n_messages
            pending.clear()
        return self._body

    def park(self) -> int:
        """Keep the body compressed until it is next asked for (`body()`); the bytes freed.

        For a request queued behind a full pool (`transport`): 100,000 agents waiting for a
        pool of 100 hold 1.3-1.6 GB of round-5 bodies whole; zlib level 1 keeps them at about
        2.5x less (compressing 16 KB takes ~0.1 ms, unpacking it when the request is sent ~0.04).
        Only a whole body is parked (nothing appended since it was last asked for)."""
        if self._packed is not None or self._pending:
            return 0
        body = self._body
        self._packed = zlib.compress(body, 1)
        self._body = b""
        return len(body) - len(self._packed)

    @property
    def parked(self) -> bool:
        return self._packed is not None

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The messages so far, decoded from the serialised history (a fresh list each call)."""
        return orjson.loads(b"".join((b"[", memoryview(self.body())[self._head_len:-2], b"]")))

    # ---- scripted mode: the agent decides the tool calls itself

    def scripted_assistant(self, round_no: int) -> dict[str, Any]:
        n = max(1, self.cfg.tool_calls_per_round.sample_int(self.rng)) if self.tools else 0
        calls = []
        for i in range(n):
            tool = self.tools[_below(self.rng, len(self.tools))]["function"]["name"]
            args = orjson.dumps({"query": synthetic_text(self.rng, 4), "limit": 1 + _below(self.rng, 20)}).decode()
            calls.append({"id": f"call_a{self.agent}r{round_no}n{i}", "type": "function",
                          "function": {"name": tool, "arguments": args}})
        return assistant_turn(None if calls else synthetic_text(self.rng, 8), calls, self.cfg.assistant_content)

    # ---- both modes: what the simulated tools return

    def tool_results(self, assistant: dict[str, Any]) -> list[dict[str, Any]]:
        """One `role: tool` message per tool_call_id, in the order the calls came."""
        out = []
        for call in assistant.get("tool_calls") or ():
            text = synthetic_text(self.rng, max(1, self.cfg.tool_result_tokens.sample_int(self.rng)))
            out.append({"role": "tool", "tool_call_id": call.get("id") or "", "content": text})
        return out

    def tool_latency_s(self) -> float:
        v = self._latency_s
        return v if v is not None else self.cfg.tool_latency_ms.sample(self.rng) / 1000.0

    def next_user_turn(self) -> None:
        """After an answer with no tool call, scripted agents keep going with a new user turn."""
        n = self._user_tokens
        if n is None:
            n = max(1, self.cfg.user_tokens.sample_int(self.rng))
        # n synthetic tokens are n tokens by tokens.py's rule (4n-1 bytes): not counted again
        self.append({"role": "user", "content": synthetic_text(self.rng, n)}, TOKENS_PER_MESSAGE + n)
