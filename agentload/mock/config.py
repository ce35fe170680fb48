"""Settings of the mock server: latency model and fault injection.

The `[mock]` table of a scenario, `agentload mock --set key=value`, and the JSON handed to
the mock subprocess all go through `MockConfig.from_dict`, which checks every field with the
checks declared on it (agentload.validate, the scenario's mechanism too), so a bad value fails
the same way, on one line naming the source, the key, what was expected and what was given.
`LiveFault`, the body of the server's POST /mock/fault, is checked by the same mechanism.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from agentload.validate import (
    At,
    Choice,
    Items,
    Model,
    Number,
    Opt,
    Text,
    Whole,
    build,
    setting,
)

STYLES = ("vllm", "sglang")
ERROR_STATUSES = (429, 500, 503)
LIVE_FAULTS = ("hang", "slow", "errors", "drop", "none")
# aiohttp 3.14's own default is 3630 s; real servers use far less (uvicorn 5 s, nginx 75 s).
DEFAULT_KEEPALIVE_S = 75.0

_RATE = Number(0, hi=1.0)
# a zero ping period would spin; a zero keep-alive would close every connection at once;
# a stall of 0 s is no fault at all
_POSITIVE = Number(0, above=True)


@dataclass(frozen=True)
class StallMidStream:
    after_tokens: int
    for_s: float = setting(check=_POSITIVE)
    above_tokens: int = 0


@dataclass(frozen=True)
class MockConfig:
    # latency model (fields without a check take their annotation's: a number or whole number >= 0, ...)
    base_latency_ms: float = 5.0
    prefill_tokens_per_s: float = 50000.0  # 0 = no prefill delay
    decode_tokens_per_s: float = 500.0  # 0 = no delay between chunks
    output_tokens: int = 32
    chunk_tokens: int = setting(1, Whole(1))
    tool_call_rounds: int = 0  # 0 = tool calls in every round
    tool_calls_per_response: int = setting(1, Whole(1))
    # share of answers that call a tool (when tools are offered and tool_choice does not decide it):
    # 0 plays a small model that never calls one (it answers with text, finish_reason "length"
    # when max_tokens cuts it); drawn from each request's own seeded stream
    tool_call_rate: float = setting(1.0, _RATE)
    style: str = setting("vllm", Choice(*STYLES))
    seed: int = 0
    models: tuple[str, ...] = setting(("mock-model",), Items(Text("a model name", nonblank=True), nonempty=True,
                                                            one_ok=True, into=tuple,
                                                            expected="a non-empty list of model names"))
    # faults
    hang_above_tokens: int | None = None
    stall_after_headers_above_tokens: int | None = None
    stall_mid_stream: StallMidStream | None = setting(None, Opt(Model(
        StallMidStream, "a table {after_tokens = K, for_s = S, above_tokens = N}")))
    ping_while_stalled_s: float | None = setting(None, Opt(_POSITIVE))
    max_running: int | None = setting(None, Opt(Whole(1)))
    error_rate: float = setting(0.0, _RATE)
    error_status: int = setting(500, Choice(*ERROR_STATUSES))
    error_at_round: int | None = setting(None, Opt(Whole(1)))
    drop_mid_stream_rate: float = setting(0.0, _RATE)
    keepalive_timeout_s: float | None = setting(None, Opt(_POSITIVE))
    hang_s: float | None = None  # None = forever (until the client goes)
    reject_protocol_violations: bool = False
    # a fleet behind a router: the name goes out as system_fingerprint and x-mock-backend, so a
    # client (or the request log) can tell which backend answered
    name: str = setting("mock", Text("a backend name (non-blank, one line)", nonblank=True, one_line=True))
    # automatic prefix caching as vLLM/SGLang do it: capacity in tokens (0 = no cache, and no
    # prompt_tokens_details in usage), hits counted in whole blocks
    prefix_cache_tokens: int = 0
    prefix_block_tokens: int = setting(16, Whole(1))
    # a file every chat request appends one JSON line to when it ends (see mock/server.py)
    request_log: str | None = setting(None, Opt(Text("a file path", nonblank=True, one_line=True)))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None, source: str) -> "MockConfig":
        return cls() if d is None else build(cls, d, At(source, "mock"))

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["models"] = list(self.models)
        return out


@dataclass(frozen=True)
class LiveFault:
    """The body of POST /mock/fault: a fault that replaces the live one, for `for_s` seconds
    (None: until the next POST); "none" clears it. Parameters of other faults are ignored."""

    fault: str = setting(check=Choice(*LIVE_FAULTS))
    for_s: float | None = setting(None, Opt(_POSITIVE))
    slow_factor: float = setting(10.0, Number(1))  # below 1 it would be a speed-up, not a fault
    error_status: int = setting(503, Choice(*ERROR_STATUSES))
