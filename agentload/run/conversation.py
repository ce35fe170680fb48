"""One agent's growing conversation: messages, tool schemas, tool calls and their results.

The history only grows, so each message is serialised once, appended to one growing buffer of
the messages so far, and the request body is a fixed prefix + that buffer + a fixed suffix:
appending a message never re-serialises the history. That buffer is the only copy of the
history kept (`messages` decodes it on demand): not one bytes object per message (orjson returns
each result in an allocation of at least 4 KiB: gigabytes for 10,000 long conversations), and no
dict per message (fewer objects for the garbage collector to walk: shorter pauses).

Every size, count and text is drawn from the agent's own numpy Generator (`agent_rng`): a
stream of its own, the same for the same seed whatever the number of agents.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import orjson

from agentload.run.chat_stream import assistant_turn
from agentload.run.scenario import ConversationConfig
from agentload.tokens import _WORDS, message_tokens, text_tokens

# The synthetic-text words with their trailing space: 4 bytes each, so one uint32 per word.
_WORD_CELLS = np.frombuffer("".join(w + " " for w in _WORDS).encode("ascii"), dtype=np.uint32)


def agent_rng(seed: int, agent: int) -> np.random.Generator:
    """Agent `agent`'s stream: a child of `seed` (SeedSequence spawn key), whatever the agent count."""
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(agent,)))


def synthetic_text(rng: np.random.Generator, tokens: int) -> str:
    """Text of exactly `tokens` tokens by tokens.py's rule (4-byte words, no trailing space),
    drawn in one batch: a few us for 300 words, where random.choices took 24."""
    if tokens <= 0:
        return ""
    # floor(u * 420) of a 53-bit u: uniform over the words to 1e-13
    cells = _WORD_CELLS[(rng.random(tokens) * len(_WORD_CELLS)).astype(np.intp)]
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


class Conversation:
    """Messages of one agent, with their serialised form and token estimate kept in step."""

    __slots__ = ("cfg", "model", "rng", "tools", "_tools_tokens", "_head", "_msgs", "n_messages",
                 "tokens", "agent", "round")

    def __init__(self, cfg: ConversationConfig, model: str, rng: np.random.Generator | random.Random, agent: int,
                 tools: list[dict[str, Any]] | None = None):
        if isinstance(rng, random.Random):  # the runner's canaries hand a random.Random: seed a Generator from it
            rng = np.random.default_rng(rng.getrandbits(64))
        self.cfg = cfg
        self.model = model
        self.rng = rng
        self.agent = agent
        self.round = 0
        self.tools = tools if tools is not None else tool_schemas(cfg.tools)
        body: dict[str, Any] = {"model": model, "max_tokens": cfg.max_tokens, "stream": cfg.stream}
        if cfg.stream and cfg.include_usage:
            body["stream_options"] = {"include_usage": True}
        if self.tools:
            body["tools"] = self.tools
            choice = cfg.tool_choice_json()
            if choice is not None:
                body["tool_choice"] = choice
        # '{...,"messages":[' : everything but the messages, serialised once.
        self._head = orjson.dumps(body)[:-1] + b',"messages":['
        self._tools_tokens = text_tokens(orjson.dumps(self.tools).decode()) if self.tools else 0
        self._msgs = bytearray()  # the serialised messages so far, comma-separated
        self.n_messages = 0
        self.tokens = self._tools_tokens
        sys_text = synthetic_text(rng, cfg.system_tokens.sample_int(rng))
        user_text = synthetic_text(rng, max(1, cfg.user_tokens.sample_int(rng)))
        self.append({"role": "system", "content": sys_text})
        self.append({"role": "user", "content": user_text})

    def append(self, message: dict[str, Any]) -> None:
        self.n_messages += 1
        if self._msgs:
            self._msgs += b","
        self._msgs += orjson.dumps(message)
        self.tokens += message_tokens(message)

    def body(self) -> bytes:
        return b"".join((self._head, self._msgs, b"]}"))

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The messages so far, decoded from the serialised history (a fresh list each call)."""
        return orjson.loads(b"".join((b"[", self._msgs, b"]")))

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
        return self.cfg.tool_latency_ms.sample(self.rng) / 1000.0

    def next_user_turn(self) -> None:
        """After an answer with no tool call, scripted agents keep going with a new user turn."""
        self.append({"role": "user", "content": synthetic_text(self.rng, max(1, self.cfg.user_tokens.sample_int(self.rng)))})
