"""What the mock answers a request, decided before a byte is sent.

`plan_answer`: tool calls (when tools are offered and `tool_choice`, `tool_call_rounds` and
`tool_call_rate` let it; arguments from `schema_values.gen_value`) or text (`output_tokens` words,
cut by max_tokens with finish_reason "length"), pre-encoded as the deltas of chat's token chunks
and as the unary message. The request's own seeded stream draws it, so an answer is the same
every time its request is sent.

The latency model (`first_token_s`, `decode_s`) and the config's per-request faults (`Faults`:
a stall after headers, a stall mid-stream, a drop, drawn from the server's fault stream) are
decided here too; the handler (mock/handler.py) then paces and faults the answer's writes.
"""

from __future__ import annotations

import os
import random
from typing import Any

import orjson

from agentload.mock.config import MockConfig, StallMidStream
from agentload.mock.schema_values import gen_value
from agentload.tokens import _WORDS, text_tokens

_dumps = orjson.dumps


class Plan:
    """What to answer, pre-encoded: the deltas of the token chunks and the unary message."""

    __slots__ = ("deltas", "tokens", "finish", "completion_tokens", "message")

    def __init__(self) -> None:
        self.deltas: list[bytes] = []  # JSON of each token chunk's delta
        self.tokens: list[int] = []  # tokens carried by each of those chunks
        self.finish = "stop"
        self.completion_tokens = 0
        self.message: dict[str, Any] = {}


def plan_answer(cfg: MockConfig, body: dict[str, Any], round_: int, rng: random.Random,
                stream: bool) -> Plan:
    """The answer to a chat body (`stream`: with chat's chunk deltas)."""
    offered = _offered_tools(body.get("tools"))
    choice = body.get("tool_choice")
    if _calls_a_tool(cfg, offered, choice, round_, rng):
        if isinstance(choice, dict):
            wanted = (choice.get("function") or {}).get("name")
            offered = [t for t in offered if t[0] == wanted] or offered
        return _tool_calls(cfg, offered, rng, stream)
    return _text(cfg, body, rng, stream)


def _offered_tools(tools: Any) -> list[tuple[str, Any]]:
    out = []
    if isinstance(tools, list):
        for t in tools:
            fn = t.get("function") if isinstance(t, dict) else None
            if isinstance(fn, dict) and isinstance(fn.get("name"), str) and fn["name"]:
                out.append((fn["name"], fn.get("parameters")))
    return out


def _calls_a_tool(cfg: MockConfig, offered: list[tuple[str, Any]], choice: Any, round_: int,
                  rng: random.Random) -> bool:
    """tool_choice "required" or a named tool forces a call and "none" forbids it; otherwise the
    config's rounds and rate decide (the rate's draw only when it is needed)."""
    return bool(offered) and choice != "none" and (
        choice == "required" or isinstance(choice, dict)
        or ((cfg.tool_call_rounds == 0 or round_ <= cfg.tool_call_rounds)
            and (cfg.tool_call_rate >= 1.0 or rng.random() < cfg.tool_call_rate)))


def _tool_calls(cfg: MockConfig, offered: list[tuple[str, Any]], rng: random.Random, stream: bool) -> Plan:
    """`tool_calls_per_response` calls; streamed as a chunk with each call's name, then its
    arguments in pieces of `chunk_tokens` tokens."""
    plan = Plan()
    sglang = cfg.style == "sglang"
    calls = []
    step = 4 * cfg.chunk_tokens  # arguments are ASCII: 4 chars per token
    for index in range(cfg.tool_calls_per_response):
        name, params = rng.choice(offered)
        args = _dumps(gen_value(params if params is not None else {"type": "object"}, rng)).decode()
        cid = "call_" + os.urandom(12).hex()
        calls.append({"id": cid, "type": "function", "function": {"name": name, "arguments": args}})
        if not stream:
            plan.completion_tokens += text_tokens(name) + text_tokens(args)
            continue
        first = {"index": index, "id": cid, "type": "function", "function": {"name": name, "arguments": ""}}
        head = {"role": None, "content": None, "reasoning_content": None} if sglang else {}
        plan.deltas.append(_dumps({**head, "tool_calls": [first]}))
        plan.tokens.append(text_tokens(name))
        for pos in range(0, len(args), step):
            piece = args[pos:pos + step]
            if sglang:
                frag = {"id": None, "index": index, "type": None, "function": {"name": None, "arguments": piece}}
            else:
                frag = {"index": index, "function": {"arguments": piece}}
            plan.deltas.append(_dumps({**head, "tool_calls": [frag]}))
            plan.tokens.append(text_tokens(piece))
    if stream:
        plan.completion_tokens = sum(plan.tokens)
    plan.finish = "tool_calls"
    plan.message = {"role": "assistant", "content": None, "tool_calls": calls}
    return plan


def _text(cfg: MockConfig, body: dict[str, Any], rng: random.Random, stream: bool) -> Plan:
    """`output_tokens` words (one token each), cut by max_completion_tokens / max_tokens."""
    plan = Plan()
    sglang = cfg.style == "sglang"
    n = cfg.output_tokens
    cap = body.get("max_completion_tokens")
    if not isinstance(cap, int) or isinstance(cap, bool):
        cap = body.get("max_tokens")
    if isinstance(cap, int) and not isinstance(cap, bool) and cap < n:
        n, plan.finish = max(cap, 0), "length"
    words = rng.choices(_WORDS, k=n)  # same alphabet as tokens.synthetic_text: 1 word = 1 token
    plan.completion_tokens = n
    plan.message = {"role": "assistant", "content": " ".join(words)}
    if not sglang:
        plan.message["tool_calls"] = []  # vLLM sends an empty list
    if stream:
        c = cfg.chunk_tokens
        pre, post = (b'{"role":null,"content":', b',"reasoning_content":null,"tool_calls":null}') if sglang \
            else (b'{"content":', b"}")
        for i in range(0, n, c):
            piece = " ".join(words[i:i + c])
            plan.deltas.append(pre + _dumps(piece if i == 0 else " " + piece) + post)
            plan.tokens.append(len(words[i:i + c]))
    return plan


def usage(ptoks: int, plan: Plan, cached: int | None) -> dict[str, Any]:
    """The answer's usage; `cached` None: no prefix cache, so no prompt_tokens_details (as vLLM)."""
    out: dict[str, Any] = {"prompt_tokens": ptoks, "completion_tokens": plan.completion_tokens,
                           "total_tokens": ptoks + plan.completion_tokens}
    if cached is not None:
        out["prompt_tokens_details"] = {"cached_tokens": cached}
    return out


# ---------------------------------------------------------------- latency model and faults


def first_token_s(cfg: MockConfig, ptoks: int, cached: int, slow: float) -> float:
    """Seconds from admission to the first token: the base latency and the prefill of the prompt's
    uncached tokens, both `slow` times slower while a live "slow" fault lasts."""
    return cfg.base_latency_ms * slow / 1000.0 + (
        (ptoks - cached) * slow / cfg.prefill_tokens_per_s if cfg.prefill_tokens_per_s else 0.0)


def decode_s(cfg: MockConfig, tokens: int, slow: float) -> float:
    """Seconds to decode `tokens` tokens (0 without a decode rate)."""
    return tokens * slow / cfg.decode_tokens_per_s if cfg.decode_tokens_per_s else 0.0


class Faults:
    """The config's faults for one admitted request: a stall after headers (until `hang_s`), a
    stall mid-stream (`mid`, None if not this request's), a drop half-way through the body."""

    __slots__ = ("stall_after_headers", "mid", "drop")

    def __init__(self, stall_after_headers: bool, mid: StallMidStream | None, drop: bool):
        self.stall_after_headers = stall_after_headers
        self.mid = mid
        self.drop = drop


def draw_faults(cfg: MockConfig, ptoks: int, fault_rng: random.Random) -> Faults:
    """The prompt size decides the stalls; the drop is drawn from the server's fault stream."""
    stall_after_headers = (cfg.stall_after_headers_above_tokens is not None
                           and ptoks >= cfg.stall_after_headers_above_tokens)
    mid = cfg.stall_mid_stream
    if mid is not None and ptoks < mid.above_tokens:
        mid = None
    drop = cfg.drop_mid_stream_rate > 0 and fault_rng.random() < cfg.drop_mid_stream_rate
    return Faults(stall_after_headers, mid, drop)
