"""The scenario: what the agents do, how the HTTP client is set up, and where it points.

Loaded from TOML, overridden by `--set section.key=value`, validated before any traffic.
Every limit and timeout is explicit here (none falls back to a library default) and the
effective scenario is copied into the run's metadata.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import random
import tomllib
import typing
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal, Optional

import orjson

from agentload.errors import ScenarioError
from agentload.mock.config import MockConfig

DIST_KINDS = ("constant", "uniform", "normal", "lognormal", "exponential")


@dataclass(frozen=True)
class Dist:
    """A constant, or a distribution drawn from the agent's own seeded RNG."""

    kind: str = "constant"
    value: float = 0.0  # constant
    mean: float = 0.0
    sigma: float = 0.0
    min: float | None = None
    max: float | None = None

    def sample(self, rng: random.Random) -> float:
        k = self.kind
        if k == "constant":
            x = self.value
        elif k == "uniform":
            x = rng.uniform(self.min or 0.0, self.max if self.max is not None else self.mean)
        elif k == "normal":
            x = rng.gauss(self.mean, self.sigma)
        elif k == "lognormal":
            # `mean` is the distribution's median-ish scale: exp(mu) = mean.
            x = rng.lognormvariate(math.log(self.mean), self.sigma) if self.mean > 0 else 0.0
        else:  # exponential
            x = rng.expovariate(1.0 / self.mean) if self.mean > 0 else 0.0
        if self.min is not None and x < self.min:
            x = self.min
        if self.max is not None and x > self.max:
            x = self.max
        return max(x, 0.0)

    def sample_int(self, rng: random.Random) -> int:
        return int(round(self.sample(rng)))

    def to_json(self) -> Any:
        if self.kind == "constant":
            return self.value
        if self.kind == "uniform":
            return {"dist": "uniform", "min": self.min, "max": self.max}
        d: dict[str, Any] = {"dist": self.kind, "mean": self.mean}
        if self.kind in ("normal", "lognormal"):
            d["sigma"] = self.sigma
        if self.min is not None:
            d["min"] = self.min
        if self.max is not None:
            d["max"] = self.max
        return d


def const(v: float) -> Dist:
    return Dist(kind="constant", value=float(v))


@dataclass(frozen=True)
class TargetConfig:
    endpoint: Optional[str] = None  # None: start the embedded mock server
    model: str = "mock-model"
    api_key_env: Optional[str] = None  # name of the env var; the key itself is never stored
    headers: dict[str, str] = field(default_factory=dict)  # static, non-secret headers (copied into run.json)
    # header name -> name of the env var holding its value, e.g. {"api-key" = "AZURE_KEY"}: for
    # secrets other than a bearer token; values are read at run time and never stored
    headers_env: dict[str, str] = field(default_factory=dict)
    metrics_urls: list[str] = field(default_factory=list)  # Prometheus endpoints scraped during the run
    metrics_every_s: float = 5.0
    metrics_series: list[str] = field(default_factory=list)  # names/prefixes to chart (default: router/engine gauges)


@dataclass(frozen=True)
class AgentsConfig:
    count: int = 8
    rounds: int = 5
    start: str | float = "all"  # "all" at once, or a ramp over this many seconds
    seed: int = 1
    duration_s: Optional[float] = None  # stop starting new rounds after this
    arrival: Literal["closed", "open"] = "closed"
    rate_per_s: float = 1.0  # open loop: new conversations per second
    rate_dist: Literal["constant", "poisson"] = "poisson"
    error_retries: int = 3  # an HTTP or connection error is retried this often (Retry-After honoured), then the agent stops


@dataclass(frozen=True)
class ConversationConfig:
    mode: Literal["scripted", "model"] = "scripted"
    system_tokens: Dist = const(400)
    user_tokens: Dist = const(100)
    tools: int = 4
    tool_calls_per_round: Dist = const(1)
    tool_result_tokens: Dist = const(300)
    tool_latency_ms: Dist = const(20)
    max_tokens: int = 64
    stream: bool = True
    include_usage: bool = True


@dataclass(frozen=True)
class ClientConfig:
    limit: int = 100  # aiohttp TCPConnector(limit); 0 = unlimited
    limit_per_host: int = 0
    keepalive_timeout: float = 15.0
    force_close: bool = False  # a fresh connection per request
    session: Literal["shared", "per_agent"] = "shared"
    pool_timeout_s: float = 60.0  # waiting for a pool slot plus connecting (aiohttp `connect`)
    connect_timeout_s: float = 10.0  # DNS+TCP+TLS of a new connection (aiohttp `sock_connect`)
    read_timeout_s: float = 120.0  # idle between two reads (aiohttp `sock_read`); bytes, not tokens
    total_timeout_s: float = 900.0  # whole request, body included (aiohttp `total`)


@dataclass(frozen=True)
class StallConfig:
    after_s: float = 10.0  # no progress (tokens, not bytes) in a phase for this long: stalled
    give_up_s: float = 60.0  # then abort the request and record it as stalled
    on_give_up: Literal["stop_agent", "retry", "next_round"] = "stop_agent"
    max_retries: int = 2  # on_give_up = "retry": tries of one round after the first; then stop the agent


@dataclass(frozen=True)
class CanaryConfig:
    every_s: float = 5.0  # 0 turns canaries off
    prompt_tokens: int = 32
    max_tokens: int = 8
    timeout_s: float = 10.0


@dataclass(frozen=True)
class Scenario:
    source: str
    target: TargetConfig = TargetConfig()
    agents: AgentsConfig = AgentsConfig()
    conversation: ConversationConfig = ConversationConfig()
    client: ClientConfig = ClientConfig()
    stall: StallConfig = StallConfig()
    canary: CanaryConfig = CanaryConfig()
    mock: MockConfig = MockConfig()
    description: str = ""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"source": self.source, "description": self.description}
        for name in SECTIONS:
            sec = getattr(self, name)
            out[name] = sec.to_dict() if name == "mock" else _section_to_dict(sec)
        return out

    def workload_fingerprint(self) -> str:
        """Hash of what decides the bytes agents send: equal fingerprints, comparable runs.

        The client and stall sections are left out on purpose: they are what a
        comparison varies. The target endpoint is left out too (same workload, other server).
        """
        d = self.to_dict()
        keep = {k: d[k] for k in ("agents", "conversation", "mock")}
        keep["model"] = d["target"]["model"]
        return hashlib.sha256(orjson.dumps(keep, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]

    def with_overrides(self, overrides: list[str]) -> "Scenario":
        raw = self.to_dict()
        apply_overrides(raw, overrides, self.source)
        return parse_scenario(raw, self.source)


SECTIONS = ("target", "agents", "conversation", "client", "stall", "canary", "mock")
_SECTION_TYPES = {
    "target": TargetConfig,
    "agents": AgentsConfig,
    "conversation": ConversationConfig,
    "client": ClientConfig,
    "stall": StallConfig,
    "canary": CanaryConfig,
}


def _section_to_dict(sec: Any) -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(sec):
        v = getattr(sec, f.name)
        out[f.name] = v.to_json() if isinstance(v, Dist) else v
    return out


# ---------------------------------------------------------------- validation


# Numeric fields whose floor is not "a number >= 0": key -> (minimum, strictly above it, why).
# A zero timeout is no timeout to aiohttp, a zero stall threshold marks every request stalled.
_BOUNDS: dict[str, tuple[float, bool, str]] = {
    "agents.count": (1, False, ""),
    "agents.rounds": (1, False, ""),
    "agents.duration_s": (0, True, " (leave it out to run every round)"),
    "agents.rate_per_s": (0, True, ""),
    "conversation.max_tokens": (1, False, ""),
    "client.pool_timeout_s": (0, True, " (every timeout is explicit; none is unlimited)"),
    "client.connect_timeout_s": (0, True, " (every timeout is explicit; none is unlimited)"),
    "client.read_timeout_s": (0, True, " (every timeout is explicit; none is unlimited)"),
    "client.total_timeout_s": (0, True, " (every timeout is explicit; none is unlimited)"),
    "stall.after_s": (0, True, " (0 would count every request as stalled)"),
    "stall.give_up_s": (0, True, ""),
    "canary.prompt_tokens": (1, False, ""),
    "canary.max_tokens": (1, False, ""),
    "canary.timeout_s": (0, True, " (0 would be no timeout to aiohttp)"),
    "target.metrics_every_s": (0.2, False, ""),
}


def _bound_text(key: str, whole: bool) -> str:
    lo, strict, why = _BOUNDS.get(key, (0, False, ""))
    return f"{'a whole number' if whole else 'a number'} {'>' if strict else '>='} {lo:g}{why}"


def _in_bounds(key: str, v: float) -> bool:
    lo, strict, _ = _BOUNDS.get(key, (0, False, ""))
    return v > lo if strict else v >= lo


def _type_name(v: Any) -> str:
    return repr(v) if not isinstance(v, (dict, list)) else type(v).__name__


def _parse_dist(v: Any, source: str, key: str) -> Dist:
    if isinstance(v, bool):
        raise ScenarioError(source, key, f"expected a number or {{ dist = ..., mean = ... }}, got {v!r}")
    if isinstance(v, (int, float)):
        if not (0 <= v < math.inf):
            raise ScenarioError(source, key, f"expected a number >= 0, got {v!r}")
        return const(v)
    if isinstance(v, dict):
        allowed = {"dist", "mean", "sigma", "min", "max", "value"}
        for k in v:
            if k not in allowed:
                raise ScenarioError(source, f"{key}.{k}", f"unknown key; expected one of: {', '.join(sorted(allowed))}")
        kind = v.get("dist", "constant")
        if kind not in DIST_KINDS:
            raise ScenarioError(source, f"{key}.dist", f"expected one of {', '.join(DIST_KINDS)}, got {kind!r}")
        nums = {}
        for k in ("mean", "sigma", "min", "max", "value"):
            if k in v:
                x = v[k]
                if isinstance(x, bool) or not isinstance(x, (int, float)) or not (0 <= x < math.inf):
                    raise ScenarioError(source, f"{key}.{k}", f"expected a number >= 0, got {_type_name(x)}")
                nums[k] = float(x)
        if "min" in nums and "max" in nums and nums["min"] > nums["max"]:
            raise ScenarioError(source, f"{key}.max", f"expected a number >= {key}.min ({nums['min']:g}), got {nums['max']:g}")
        if kind == "constant":
            return const(nums.get("value", nums.get("mean", 0.0)))
        if kind == "uniform":
            if "min" not in nums or "max" not in nums:
                raise ScenarioError(source, key, "expected a uniform distribution with min <= max")
        elif "mean" not in nums or (kind in ("lognormal", "exponential") and nums["mean"] <= 0):
            raise ScenarioError(source, f"{key}.mean", f"expected a number > 0 for dist = {kind!r}")
        return Dist(kind=kind, mean=nums.get("mean", 0.0), sigma=nums.get("sigma", 0.0),
                    min=nums.get("min"), max=nums.get("max"))
    raise ScenarioError(source, key, f"expected a number or {{ dist = ..., mean = ... }}, got {_type_name(v)}")


def _coerce(v: Any, typ: Any, source: str, key: str) -> Any:
    origin = typing.get_origin(typ)
    args = typing.get_args(typ)
    if typ is Dist:
        return _parse_dist(v, source, key)
    if origin is typing.Union or (origin is not None and str(origin) == "<class 'types.UnionType'>"):
        if v is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(v, a, source, key)
            except ScenarioError as e:
                errors.append(e.expected)
        raise ScenarioError(source, key, " or ".join(dict.fromkeys(errors)))
    if origin is Literal:
        if v not in args:
            raise ScenarioError(source, key, f"expected one of {', '.join(repr(a) for a in args)}, got {_type_name(v)}")
        return v
    if typ is bool:
        if not isinstance(v, bool):
            raise ScenarioError(source, key, f"expected true or false, got {_type_name(v)}")
        return v
    if typ is int:
        if isinstance(v, bool) or not isinstance(v, int) or not _in_bounds(key, v):
            raise ScenarioError(source, key, f"expected {_bound_text(key, True)}, got {_type_name(v)}")
        return v
    if typ is float:
        # NaN and inf fail too: an infinite timeout is no timeout
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (_in_bounds(key, v) and v < math.inf):
            raise ScenarioError(source, key, f"expected {_bound_text(key, False)}, got {_type_name(v)}")
        return float(v)
    if typ is str:
        if not isinstance(v, str):
            raise ScenarioError(source, key, f"expected a string, got {_type_name(v)}")
        return v
    if origin is dict:
        if not isinstance(v, dict) or not all(isinstance(x, str) for x in v.values()):
            raise ScenarioError(source, key, f"expected a table of strings, got {_type_name(v)}")
        return dict(v)
    if origin is list:
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise ScenarioError(source, key, f"expected a list of strings, got {_type_name(v)}")
        return list(v)
    raise AssertionError(f"unhandled type {typ} for {key}")


def _parse_section(cls: type, raw: Any, source: str, name: str) -> Any:
    if not isinstance(raw, dict):
        raise ScenarioError(source, name, f"expected a table [{name}], got {_type_name(raw)}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for k, v in raw.items():
        if k not in hints:
            raise ScenarioError(source, f"{name}.{k}", f"unknown key; expected one of: {', '.join(names)}")
        kwargs[k] = _coerce(v, hints[k], source, f"{name}.{k}")
    return cls(**kwargs)


def _check(sc: Scenario) -> None:
    s = sc.source
    # (numeric floors are checked per field in _coerce, see _BOUNDS)
    if sc.stall.give_up_s < sc.stall.after_s:
        raise ScenarioError(s, "stall.give_up_s", f"expected a number >= stall.after_s ({sc.stall.after_s:g}), got {sc.stall.give_up_s:g}")
    if isinstance(sc.agents.start, str) and sc.agents.start != "all":
        raise ScenarioError(s, "agents.start", f"expected \"all\" or a ramp length in seconds, got {sc.agents.start!r}")
    if not sc.target.model.strip():
        raise ScenarioError(s, "target.model", "expected a model name, got an empty string")
    ep = sc.target.endpoint
    if ep is not None:
        _check_url(s, "target.endpoint", ep)
    for i, u in enumerate(sc.target.metrics_urls):
        _check_url(s, f"target.metrics_urls[{i}]", u)
    _check_headers(sc.target, s)


# Header names that carry credentials: refused as literal `headers` (the scenario is copied into
# run.json and onto `--workers` command lines); `headers_env` takes them from the environment.
_SECRET_HEADER_WORDS = ("auth", "key", "token", "secret", "password", "cookie")
_TOKEN_CHARS = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


def _check_url(s: str, key: str, url: str) -> None:
    from urllib.parse import urlsplit

    if "@" in url.split("://", 1)[-1].split("/", 1)[0]:  # checked first: the message must not repeat them
        raise ScenarioError(s, key, "expected a URL without credentials (user:password@ would be copied into "
                                    "run.json and reports): give them with [target] api_key_env or headers_env")
    if not (url.startswith("http://") or url.startswith("https://")):
        raise ScenarioError(s, key, f"expected an http:// or https:// URL, got {url!r}")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (raises on a port out of range)
    except ValueError as e:
        raise ScenarioError(s, key, f"expected a valid http:// or https:// URL ({e}), got {url!r}")
    if not parts.hostname:
        raise ScenarioError(s, key, f"expected a URL with a host, got {url!r}")


def _check_headers(t: TargetConfig, s: str) -> None:
    seen: dict[str, str] = {}
    if t.api_key_env is not None:
        if not _env_name_ok(t.api_key_env):
            raise ScenarioError(s, "target.api_key_env", f"expected the name of an environment variable, got {t.api_key_env!r}")
        seen["authorization"] = "target.api_key_env"
    for table, items in (("headers", t.headers), ("headers_env", t.headers_env)):
        for name, value in items.items():
            key = f"target.{table}.{name}"
            if not name or not set(name) <= _TOKEN_CHARS:
                raise ScenarioError(s, key, "expected a header name (letters, digits and !#$%&'*+-.^_`|~)")
            low = name.lower()
            if low in seen:
                raise ScenarioError(s, key, f"expected each header once; {name!r} is also set by {seen[low]}")
            seen[low] = key
            if table == "headers":
                if any(w in low for w in _SECRET_HEADER_WORDS):
                    raise ScenarioError(s, key, f"expected no credential in the scenario (it is copied into run.json): "
                                                f"put it in an environment variable and name that in "
                                                f"headers_env = {{\"{name}\" = \"MY_VAR\"}}")
                if "\r" in value or "\n" in value:
                    raise ScenarioError(s, key, "expected a header value on one line")
            elif not _env_name_ok(value):
                raise ScenarioError(s, key, f"expected the name of an environment variable, got {value!r}")


def _env_name_ok(name: str) -> bool:
    return bool(name) and "=" not in name and "\0" not in name and not name.isspace()


def parse_scenario(raw: dict[str, Any], source: str) -> Scenario:
    kwargs: dict[str, Any] = {}
    for k, v in raw.items():
        if k in ("source",):
            continue
        if k == "description":
            if not isinstance(v, str):
                raise ScenarioError(source, "description", "expected a string")
            kwargs["description"] = v
        elif k == "mock":
            if not isinstance(v, dict):
                raise ScenarioError(source, "mock", f"expected a table [mock], got {_type_name(v)}")
            kwargs["mock"] = MockConfig.from_dict(v, source)
        elif k in _SECTION_TYPES:
            kwargs[k] = _parse_section(_SECTION_TYPES[k], v, source, k)
        else:
            raise ScenarioError(source, k, f"unknown section; expected one of: description, {', '.join(SECTIONS)}")
    sc = Scenario(source=source, **kwargs)
    _check(sc)
    return sc


# ---------------------------------------------------------------- overrides and loading


def parse_value(text: str) -> Any:
    """A --set value is a TOML value (number, bool, string, inline table); else a bare string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_overrides(raw: dict[str, Any], overrides: list[str], source: str) -> None:
    for item in overrides:
        if "=" not in item:
            raise ScenarioError("--set", item, "expected section.key=value")
        path, _, text = item.partition("=")
        parts = [p.strip() for p in path.strip().split(".") if p.strip()]
        if len(parts) < 2:
            raise ScenarioError("--set", path, "expected section.key=value, e.g. client.limit=20")
        node = raw
        for p in parts[:-1]:
            nxt = node.get(p)
            if nxt is None:
                nxt = node[p] = {}
            if not isinstance(nxt, dict):
                raise ScenarioError("--set", path, f"{p} is not a table")
            node = nxt
        node[parts[-1]] = parse_value(text.strip())


def packaged_scenarios() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files("agentload.scenarios").iterdir() if p.name.endswith(".toml"))


def resolve_path(path_or_name: str | None) -> tuple[str, str]:
    """Returns (source label, TOML text). A bare name finds a packaged scenario."""
    if path_or_name is None:
        path_or_name = "demo"
    p = Path(path_or_name)
    if p.is_file():
        try:
            return str(p), p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ScenarioError(str(p), "(file)", f"expected a readable UTF-8 TOML file ({e.__class__.__name__})")
    name = p.name[:-5] if p.name.endswith(".toml") else p.name
    res = resources.files("agentload.scenarios").joinpath(f"{name}.toml")
    if res.is_file() and (p.parent == Path(".") or not p.exists()):
        return f"{name}.toml (packaged)", res.read_text(encoding="utf-8")
    raise ScenarioError(str(p), "(file)", f"no such scenario file; packaged scenarios: {', '.join(packaged_scenarios())}")


def load_scenario(path_or_name: str | None = None, overrides: list[str] | None = None) -> Scenario:
    source, text = resolve_path(path_or_name)
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ScenarioError(source, "(syntax)", f"expected valid TOML: {e}")
    apply_overrides(raw, overrides or [], source)
    return parse_scenario(raw, source)
