"""Settings of the mock server: latency model and fault injection.

The `[mock]` table of a scenario, `agentload mock --set key=value`, and the JSON handed to
the mock subprocess all go through `MockConfig.from_dict`, so a bad value fails the same way,
on one line naming the source, the key and what was expected.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Mapping

from agentload.errors import ScenarioError

STYLES = ("vllm", "sglang")
ERROR_STATUSES = (429, 500, 503)
# aiohttp 3.14's own default is 3630 s; real servers use far less (uvicorn 5 s, nginx 75 s).
DEFAULT_KEEPALIVE_S = 75.0


@dataclass(frozen=True)
class StallMidStream:
    after_tokens: int
    for_s: float
    above_tokens: int = 0


@dataclass(frozen=True)
class MockConfig:
    # latency model
    base_latency_ms: float = 5.0
    prefill_tokens_per_s: float = 50000.0  # 0 = no prefill delay
    decode_tokens_per_s: float = 500.0  # 0 = no delay between chunks
    output_tokens: int = 32
    chunk_tokens: int = 1
    tool_call_rounds: int = 0  # 0 = tool calls in every round
    tool_calls_per_response: int = 1
    style: str = "vllm"
    seed: int = 0
    models: tuple[str, ...] = ("mock-model",)
    # faults
    hang_above_tokens: int | None = None
    stall_after_headers_above_tokens: int | None = None
    stall_mid_stream: StallMidStream | None = None
    ping_while_stalled_s: float | None = None
    max_running: int | None = None
    error_rate: float = 0.0
    error_status: int = 500
    error_at_round: int | None = None
    drop_mid_stream_rate: float = 0.0
    keepalive_timeout_s: float | None = None
    hang_s: float | None = None  # None = forever (until the client goes)
    reject_protocol_violations: bool = False

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None, source: str) -> "MockConfig":
        if d is None:
            return cls()
        if not isinstance(d, Mapping):
            raise ScenarioError(source, "mock", f"expected a table, got {_show(d)}")
        known = {f.name for f in dataclasses.fields(cls)}
        for key in d:
            if key not in known:
                raise ScenarioError(source, f"mock.{key}", "unknown key; expected one of: " + ", ".join(sorted(known)))
        kw: dict[str, Any] = {}
        for key, value in d.items():
            kw[key] = _CHECKS[key](source, f"mock.{key}", value)
        return cls(**kw)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["models"] = list(self.models)
        return out


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _num(source: str, key: str, value: Any, *, minimum: float = 0.0, strict: bool = False,
         maximum: float | None = None) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = ok and value < math.inf  # NaN and inf fail too: an infinite latency or hang is no setting
    ok = ok and (value > minimum if strict else value >= minimum)
    ok = ok and (maximum is None or value <= maximum)
    if not ok:
        rel = ">" if strict else ">="
        want = f"a number {rel} {minimum:g}" + (f" and <= {maximum:g}" if maximum is not None else "")
        raise ScenarioError(source, key, f"expected {want}, got {_show(value)}")
    return float(value)


def _int(source: str, key: str, value: Any, *, minimum: int = 0) -> int:
    # TOML/JSON may hand us 5.0 for 5; accept integral floats, refuse 5.5 and booleans.
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ScenarioError(source, key, f"expected an integer >= {minimum}, got {_show(value)}")
    return value


def _optional(check):
    def wrapped(source: str, key: str, value: Any):
        return None if value is None else check(source, key, value)
    return wrapped


def _choice(options: tuple):
    def check(source: str, key: str, value: Any):
        if value not in options or isinstance(value, bool):
            raise ScenarioError(source, key, f"expected one of {', '.join(map(str, options))}, got {_show(value)}")
        return value
    return check


def _models(source: str, key: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if (not isinstance(value, (list, tuple)) or not value
            or not all(isinstance(v, str) and v for v in value)):
        raise ScenarioError(source, key, f"expected a non-empty list of model names, got {_show(value)}")
    return tuple(value)


def _bool(source: str, key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ScenarioError(source, key, f"expected true or false, got {_show(value)}")
    return value


def _stall_mid_stream(source: str, key: str, value: Any) -> StallMidStream:
    if isinstance(value, StallMidStream):
        return value
    if not isinstance(value, Mapping):
        raise ScenarioError(source, key, f"expected a table {{after_tokens = K, for_s = S, above_tokens = N}}, got {_show(value)}")
    allowed = ("after_tokens", "for_s", "above_tokens")
    for k in value:
        if k not in allowed:
            raise ScenarioError(source, f"{key}.{k}", "unknown key; expected one of: " + ", ".join(allowed))
    for k in ("after_tokens", "for_s"):
        if k not in value:
            raise ScenarioError(source, f"{key}.{k}", "missing; expected " + ("an integer >= 0" if k == "after_tokens" else "a number > 0"))
    return StallMidStream(
        after_tokens=_int(source, f"{key}.after_tokens", value["after_tokens"]),
        for_s=_num(source, f"{key}.for_s", value["for_s"], strict=True),  # a stall of 0 s is no fault at all
        above_tokens=_int(source, f"{key}.above_tokens", value.get("above_tokens", 0)),
    )


def _nonneg(s, k, v):
    return _num(s, k, v)


def _positive(s, k, v):
    return _num(s, k, v, strict=True)


def _rate(s, k, v):
    return _num(s, k, v, maximum=1.0)


def _int0(s, k, v):
    return _int(s, k, v)


def _int1(s, k, v):
    return _int(s, k, v, minimum=1)


_CHECKS = {
    "base_latency_ms": _nonneg,
    "prefill_tokens_per_s": _nonneg,
    "decode_tokens_per_s": _nonneg,
    "output_tokens": _int0,
    "chunk_tokens": _int1,
    "tool_call_rounds": _int0,
    "tool_calls_per_response": _int1,
    "style": _choice(STYLES),
    "seed": _int0,
    "models": _models,
    "hang_above_tokens": _optional(_int0),
    "stall_after_headers_above_tokens": _optional(_int0),
    "stall_mid_stream": _optional(_stall_mid_stream),
    # a zero ping period would spin; a zero keep-alive would close every connection at once
    "ping_while_stalled_s": _optional(_positive),
    "max_running": _optional(_int1),
    "error_rate": _rate,
    "error_status": _choice(ERROR_STATUSES),
    "error_at_round": _optional(_int1),
    "drop_mid_stream_rate": _rate,
    "keepalive_timeout_s": _optional(_positive),
    "hang_s": _optional(_nonneg),
    "reject_protocol_violations": _bool,
}
assert set(_CHECKS) == {f.name for f in dataclasses.fields(MockConfig)}
