"""Captured conversations played back as scripted agents (`agentload replay`, `[replay]`).

A capture gives, per conversation and round, the shapes a harness produced: the request's prompt
size (tokens.py's estimate, the one every record and the mock use), the tool calls its answer
carried, and the harness's think time before its next round. A `ReplayConversation` is a scripted
conversation that reproduces them: the first request's system prompt sized so that it weighs what
the captured one did, each answer with the captured number of tool calls, and each round's tool
results (or user turn) sized so that the next request weighs what the captured next request did.
Text is synthetic (a capture keeps shapes, never text), drawn from the agent's own seeded stream.

Two formats:
- `proxy`: an `agentload proxy` run folder (or its records.jsonl): prompt sizes, tool calls and
  the think times measured between an answer's end and the next request's arrival;
- `openai`: one conversation a line, `{"messages": [...], "tools": [...]}` in chat/completions
  form (`tool_calls` on assistant messages, `role: tool` results), the shape agent trajectories
  and ShareGPT-style sets are published in: each assistant message ends a round; no think times
  (the scenario's `conversation.tool_latency_ms` is used).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import orjson

from agentload.errors import UserError
from agentload.records import iter_record_dicts
from agentload.run.apis.reader import assistant_turn
from agentload.run.conversation import Conversation, _below, synthetic_text
from agentload.run.dist import const
from agentload.run.scenario import ConversationConfig
from agentload.tokens import TOKENS_PER_MESSAGE, prompt_tokens, text_tokens


@dataclass(frozen=True, slots=True)
class RoundPlan:
    prompt_tokens: int  # the request's prompt size, tokens.py's estimate
    tool_calls: int  # tool calls in its answer (0: a text answer)
    think_s: float | None  # the harness's time from this answer to its next request (None: not known)
    body: bytes | None = None  # the request's own body (`agentload proxy --capture-bodies`), else None


@dataclass(frozen=True, slots=True)
class ConversationPlan:
    name: str  # where it came from: "conversation 3" of a proxy capture, "line 7" of a JSONL file
    rounds: tuple[RoundPlan, ...]
    # a Mooncake-style trace: when it arrived (s after the trace's first request), its prompt's prefix
    # blocks (requests with the same leading ids share that prefix), and its output length
    arrival_s: float | None = None
    blocks: tuple[int, ...] = ()
    output_tokens: int | None = None


MOONCAKE_BLOCK_TOKENS = 512  # the block size of Mooncake's published traces' hash_ids


def load_plans(source: str, fmt: str = "auto") -> list[ConversationPlan]:
    """The conversations of a capture, in order; a UserError naming the file, line and field when
    it cannot be read as one."""
    path = Path(source)
    if not path.exists():
        raise UserError(f"{source}: replay.source: expected a capture (a proxy run folder, its records.jsonl, "
                        f"or a conversation JSONL file), no such file or folder")
    if fmt == "auto":
        fmt = "proxy" if path.is_dir() or path.name.startswith("records") else _sniff(path)
    if fmt == "proxy":
        plans = _from_proxy(path / "records.jsonl" if path.is_dir() else path)
    elif fmt == "mooncake":
        plans = _from_mooncake(path)
    else:
        plans = _from_openai(path)
    if not plans:
        raise UserError(f"{source}: replay.source: expected at least one conversation with a request, found none")
    return plans


def _from_proxy(path: Path) -> list[ConversationPlan]:
    if not path.is_file():
        raise UserError(f"{path}: replay.source: expected the records.jsonl of an `agentload proxy` run")
    by_conv: dict[int, dict[int, dict[str, Any]]] = {}
    for d in iter_record_dicts(path):
        if d is None or d.get("kind") != "agent":
            continue
        try:
            a, rnd, call = int(d["agent"]), int(d["round"]), int(d.get("call") or 0)
        except (KeyError, TypeError, ValueError):
            continue
        rounds = by_conv.setdefault(a, {})
        prev = rounds.get(rnd)
        if prev is None or call >= int(prev.get("call") or 0):  # a retried round: its last attempt
            rounds[rnd] = d
    bodies = _bodies(path.parent / "bodies.jsonl")
    plans = []
    for a in sorted(by_conv):
        rounds = by_conv[a]
        out = []
        for rnd in sorted(rounds):
            d = rounds[rnd]
            nxt = rounds.get(rnd + 1)
            think = None
            end = (d.get("t") or {}).get("down_end") or (d.get("t") or {}).get("end")
            arrive = (nxt.get("t") or {}).get("down_start") if nxt is not None else None
            if end is not None and arrive is not None:
                think = max(0.0, (arrive - end) / 1e9)
            rid = d.get("request_id")
            out.append(RoundPlan(int(d.get("prompt_tokens") or 0), int(d.get("tool_calls") or 0), think,
                                 bodies.get(rid) if isinstance(rid, str) else None))
        plans.append(ConversationPlan(f"conversation {a}", tuple(out)))
    return plans


def _bodies(path: Path) -> dict[str, bytes]:
    """request_id -> body of a capture made with --capture-bodies (none without it)."""
    out: dict[str, bytes] = {}
    if not path.is_file():
        return out
    for i, line in enumerate(path.read_bytes().splitlines(), 1):
        try:
            d = orjson.loads(line)
            out[str(d["request_id"])] = orjson.dumps(d["body"])
        except (orjson.JSONDecodeError, KeyError, TypeError):
            raise UserError(f"{path}: line {i}: expected {{\"request_id\": ..., \"body\": {{...}}}} as "
                            f"`agentload proxy --capture-bodies` writes it") from None
    return out


def _sniff(path: Path) -> str:
    """A JSONL file's format by its first object: Mooncake's trace lines carry input_length / hash_ids."""
    try:
        with open(path, "rb") as f:
            for line in f:
                if line.strip():
                    d = orjson.loads(line)
                    return "mooncake" if isinstance(d, dict) and ("hash_ids" in d or "input_length" in d) else "openai"
    except (OSError, orjson.JSONDecodeError):
        pass
    return "openai"


def _json_lines(path: Path) -> Iterator[tuple[int, Any]]:
    """(line number, value) of each non-blank line of a JSONL file; a UserError naming the file
    (and line) when it cannot be read or a line is not JSON."""
    try:
        lines = path.read_bytes().splitlines()
    except OSError as e:
        raise UserError(f"{path}: replay.source: cannot read it as a JSONL file: {e.strerror or e}") from None
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield i, orjson.loads(line)
        except orjson.JSONDecodeError as e:
            raise UserError(f"{path}: line {i}: expected one JSON object a line ({e})") from None


def _from_mooncake(path: Path) -> list[ConversationPlan]:
    """Mooncake-style trace lines: `timestamp` (ms), `input_length`, `output_length`, `hash_ids` (the
    prompt's 512-token blocks: equal leading ids, a shared prefix). Each line a one-round conversation
    arriving at its time."""
    plans = []
    t0 = None
    for i, d in _json_lines(path):
        if not isinstance(d, dict):
            raise UserError(f"{path}: line {i}: expected a JSON object")
        for key in ("timestamp", "input_length"):
            v = d.get(key)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
                raise UserError(f"{path}: line {i}: {key}: expected a number >= 0, got {v!r}")
        ids = d.get("hash_ids") or []
        if not isinstance(ids, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in ids):
            raise UserError(f"{path}: line {i}: hash_ids: expected a list of whole numbers")
        out = d.get("output_length")
        if out is not None and (not isinstance(out, int) or isinstance(out, bool) or out < 1):
            raise UserError(f"{path}: line {i}: output_length: expected a whole number >= 1, got {out!r}")
        t0 = d["timestamp"] if t0 is None else t0
        plans.append(ConversationPlan(f"line {i}", (RoundPlan(int(d["input_length"]), 0, None),),
                                      arrival_s=(d["timestamp"] - t0) / 1000.0, blocks=tuple(ids), output_tokens=out))
    return plans


def arrival_of(plans: list[ConversationPlan], agent: int) -> float | None:
    """When agent `agent` starts (s after the first), for a trace with arrival times: the plans
    cycled, each cycle after the trace's span."""
    n = len(plans)
    p = plans[agent % n]
    if p.arrival_s is None:
        return None
    span = max(q.arrival_s or 0.0 for q in plans)
    step = span / max(1, n - 1) if n > 1 else 1.0
    return p.arrival_s + (agent // n) * (span + step)


def _from_openai(path: Path) -> list[ConversationPlan]:
    plans = []
    for i, d in _json_lines(path):
        msgs = d.get("messages") if isinstance(d, dict) else None
        if not isinstance(msgs, list) or not all(isinstance(m, dict) for m in msgs):
            raise UserError(f"{path}: line {i}: messages: expected a list of message objects")
        tools = d.get("tools")
        if tools is not None and not isinstance(tools, list):
            raise UserError(f"{path}: line {i}: tools: expected a list of tool schemas")
        out = []
        for j, m in enumerate(msgs):
            if m.get("role") != "assistant":
                continue
            calls = m.get("tool_calls") or []
            if not isinstance(calls, list):
                raise UserError(f"{path}: line {i}: messages[{j}].tool_calls: expected a list")
            out.append(RoundPlan(prompt_tokens(msgs[:j], tools), len(calls), None))
        if out:
            plans.append(ConversationPlan(f"line {i}", tuple(out)))
    return plans


def max_rounds(plans: list[ConversationPlan]) -> int:
    return max(len(p.rounds) for p in plans)


def _fitting_tools(tools: list[dict[str, Any]], room: int) -> list[dict[str, Any]]:
    """The scenario's tool schemas if they fit in the captured first prompt (a capture does not keep
    the harness's own), else as many minimal schemas as fit (the calls need a tool to name)."""
    if not tools or text_tokens(orjson.dumps(tools).decode()) <= room:
        return tools
    out: list[dict[str, Any]] = []
    for i in range(len(tools)):
        t = {"type": "function", "function": {"name": f"tool_{i}", "parameters": {"type": "object"}}}
        if text_tokens(orjson.dumps(out + [t]).decode()) > room:
            break
        out.append(t)
    return out


def new_conversation(cfg: ConversationConfig, model: str, rng: np.random.Generator, agent: int,
                     tools: list[dict[str, Any]] | None, plan: ConversationPlan, speed: float,
                     api: str = "chat") -> Conversation:
    """The conversation that replays `plan`: its very bodies when the capture kept them (sent as they
    are: they speak the API the harness spoke), else its shapes in `api`'s form."""
    if all(r.body is not None for r in plan.rounds):
        return VerbatimConversation(cfg, model, rng, agent, tools, plan, speed, api)
    return ReplayConversation(cfg, model, rng, agent, tools, plan, speed, api)


class ReplayConversation(Conversation):
    """A scripted conversation that reproduces one captured conversation's shapes (see the module)."""

    __slots__ = ("plan", "speed", "last_round", "_rnd", "_default_latency")

    def __init__(self, cfg: ConversationConfig, model: str, rng: np.random.Generator, agent: int,
                 tools: list[dict[str, Any]] | None, plan: ConversationPlan, speed: float = 1.0, api: str = "chat"):
        self.plan = plan  # (before Conversation's __init__: system_text reads it)
        first = plan.rounds[0].prompt_tokens
        if plan.output_tokens:
            cfg = dataclasses.replace(cfg, max_tokens=plan.output_tokens)
        # a trace of single requests (Mooncake) offers no tools: its prompts are text, answered with text
        tools = [] if plan.arrival_s is not None else _fitting_tools(tools or [], first - 2 * TOKENS_PER_MESSAGE - 2)
        tools_tokens = text_tokens(orjson.dumps(tools).decode()) if tools else 0
        user = max(1, min(cfg.user_tokens.sample_int(rng), first - tools_tokens - 2 * TOKENS_PER_MESSAGE))
        system = max(0, first - tools_tokens - 2 * TOKENS_PER_MESSAGE - user)
        super().__init__(dataclasses.replace(cfg, system_tokens=const(system), user_tokens=const(user)), model, rng,
                         agent, tools, api)
        self.speed = speed
        self.last_round = len(plan.rounds)
        self._rnd = 1
        self._default_latency = cfg.tool_latency_ms

    def opening(self, rng: np.random.Generator) -> tuple[str, list[str]]:
        """With prefix blocks (a Mooncake trace): one message per block, each block's text drawn from its
        id (the same id, the same text in every agent: a prefix cache keyed by message or by token block
        finds it), each message weighing a block with its overhead, the last one cut to the prompt's
        size; else the agent's own text."""
        blocks = self.plan.blocks
        if not blocks:
            return super().opening(rng)
        left = self.plan.rounds[0].prompt_tokens - self._tools_tokens
        per = MOONCAKE_BLOCK_TOKENS - TOKENS_PER_MESSAGE
        texts: list[str] = []
        for block in blocks:
            if left <= TOKENS_PER_MESSAGE:
                break
            n = min(per, left - TOKENS_PER_MESSAGE)
            texts.append(" ".join(synthetic_text(np.random.default_rng(block), per).split(" ")[:n]))
            left -= n + TOKENS_PER_MESSAGE
        if left > TOKENS_PER_MESSAGE or len(texts) < 2:  # prompt beyond its blocks: the rest the agent's own
            texts.append(synthetic_text(rng, max(1, left - TOKENS_PER_MESSAGE)))
        return texts[0], texts[1:]

    def scripted_assistant(self, round_no: int) -> dict[str, Any]:
        self._rnd = round_no
        n = self.plan.rounds[round_no - 1].tool_calls if round_no <= len(self.plan.rounds) else 0
        calls = []
        for i in range(n if self.tools else 0):
            tool = self.tools[_below(self.rng, len(self.tools))]["function"]["name"]
            args = orjson.dumps({"query": synthetic_text(self.rng, 4)}).decode()
            calls.append({"id": f"call_a{self.agent}r{round_no}n{i}", "type": "function",
                          "function": {"name": tool, "arguments": args}})
        return assistant_turn(None if calls else synthetic_text(self.rng, 8), calls, self.cfg.assistant_content)

    def _next_size(self, messages: int) -> int:
        """Tokens the next `messages` messages must carry so the next request weighs what the captured one did."""
        if self._rnd >= len(self.plan.rounds):
            return messages
        need = self.plan.rounds[self._rnd].prompt_tokens - self.tokens - messages * TOKENS_PER_MESSAGE
        return max(messages, need)

    def tool_results(self, assistant: dict[str, Any]) -> list[dict[str, Any]]:
        calls = assistant.get("tool_calls") or ()
        if not calls:
            return []
        total = self._next_size(len(calls))
        each, extra = divmod(total, len(calls))
        return [{"role": "tool", "tool_call_id": c.get("id") or "",
                 "content": synthetic_text(self.rng, max(1, each + (1 if k < extra else 0)))}
                for k, c in enumerate(calls)]

    def next_user_turn(self) -> None:
        self.append({"role": "user", "content": synthetic_text(self.rng, self._next_size(1))})

    def tool_latency_s(self) -> float:
        r = self.plan.rounds[self._rnd - 1] if self._rnd <= len(self.plan.rounds) else None
        if r is None or r.think_s is None:
            return self._default_latency.sample(self.rng) / 1000.0 / self.speed
        return r.think_s / self.speed


class VerbatimConversation(ReplayConversation):
    """Sends the captured bodies themselves, round by round (the model set to the scenario's): the
    harness's own text, tools and settings. What the agent appends is counted, never sent."""

    __slots__ = ("_bodies",)

    def __init__(self, cfg: ConversationConfig, model: str, rng: np.random.Generator, agent: int,
                 tools: list[dict[str, Any]] | None, plan: ConversationPlan, speed: float = 1.0, api: str = "chat"):
        super().__init__(cfg, model, rng, agent, tools, plan, speed, api)
        self._bodies = [_with_model(r.body or b"{}", model) for r in plan.rounds]
        self._round_body(0)

    def _round_body(self, i: int) -> None:
        body = self._bodies[min(i, len(self._bodies) - 1)]
        self._pending.clear()
        self._packed = None
        self._body = body
        d = orjson.loads(body)
        msgs = d.get("messages") if isinstance(d.get("messages"), list) else []
        self.n_messages = self._in_body = len(msgs)
        self.tokens = prompt_tokens([m for m in msgs if isinstance(m, dict)],
                                    d.get("tools") if isinstance(d.get("tools"), list) else None)

    def append(self, message: dict[str, Any], tokens: int | None = None) -> None:
        pass  # the next round's body is the captured one

    def body(self) -> bytes:
        if self._packed is not None:
            return super().body()
        return self._body

    def tool_results(self, assistant: dict[str, Any]) -> list[dict[str, Any]]:
        self._round_body(self._rnd)  # round _rnd was answered: the next request is the captured next body
        return []

    def next_user_turn(self) -> None:
        pass


def _with_model(body: bytes, model: str) -> bytes:
    d = orjson.loads(body)
    if isinstance(d, dict):
        d["model"] = model
    return orjson.dumps(d)
