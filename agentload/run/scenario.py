"""The scenario: what the agents do, how the HTTP client is set up, and where it points.

Loaded from TOML, overridden by `--set section.key=value`, validated before any traffic by
the fields' own checks (agentload.validate: one mechanism for the scenario and the mock's
config). Every limit and timeout is explicit here (none falls back to a library default) and
the effective scenario is copied into the run's metadata.
"""

from __future__ import annotations

import dataclasses
import hashlib
import ssl
import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal, Optional
from urllib.parse import urlsplit

import orjson

from agentload.endpoint import endpoint_problem
from agentload.errors import ScenarioError
from agentload.fleet.config import SCHEDULE, FleetConfig, RouterConfig, check_fleet
from agentload.mock.config import MockConfig
from agentload.run.dist import Dist, dist
from agentload.validate import (
    At,
    Check,
    Choice,
    Either,
    Items,
    Number,
    Opt,
    Table,
    Text,
    Whole,
    apply_sets,
    build,
    relabel,
    setting,
)

TOOL_CHOICES = ("auto", "required", "none")


# ---------------------------------------------------------------- checks of the scenario's own kinds


class _Endpoint(Check):
    """The target's endpoint: a base URL or the API's full URL (agentload.endpoint says what is refused,
    for the scenario's API: `TargetConfig._validate`)."""

    expected = "an http:// or https:// URL"

    def __call__(self, url: Any, at: At) -> str:
        if not isinstance(url, str):
            at.fail(self.expected, url)
        return url


class _Url(Check):
    expected = "an http:// or https:// URL"

    def __call__(self, url: Any, at: At) -> str:
        if not isinstance(url, str):
            at.fail(self.expected, url)
        if "@" in url.split("://", 1)[-1].split("/", 1)[0]:  # checked first: the message must not repeat them
            at.fail("a URL without credentials (user:password@ would be copied into run.json and reports): "
                    "give them with [target] api_key_env or headers_env")
        if not url.startswith(("http://", "https://")):
            at.fail(self.expected, url)
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 (raises on a port out of range)
        except ValueError as e:
            at.fail(f"a valid http:// or https:// URL ({e})", url)
        if not parts.hostname:
            at.fail("a URL with a host", url)
        return url


class _CaFile(Check):
    """A CA bundle (PEM) an SSL context can load; stored as an absolute path (workers and shards read
    the scenario back from run.json, maybe in another folder)."""

    expected = "the path of a CA bundle file (PEM)"

    def __call__(self, value: Any, at: At) -> str:
        if not isinstance(value, str) or not value.strip():
            at.fail(self.expected, value)
        path = Path(value).expanduser()
        if not path.is_file():
            at.fail(f"{self.expected}; no such file", value)
        try:
            ssl.create_default_context(cafile=str(path))
        except (OSError, ssl.SSLError, ValueError) as e:
            at.fail(f"{self.expected} that loads ({getattr(e, 'reason', None) or e.__class__.__name__})", value)
        return str(path.resolve())


# Header names that carry credentials: refused as literal `headers` (the scenario is copied into
# run.json and onto `--workers` command lines); `headers_env` takes them from the environment.
_SECRET_HEADER_WORDS = ("auth", "key", "token", "secret", "password", "cookie")
_TOKEN_CHARS = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


class _HeaderName(Check):
    expected = "a header name (letters, digits and !#$%&'*+-.^_`|~)"

    def __init__(self, literal_value: bool):
        self.literal_value = literal_value  # the value is written in the scenario: no secret

    def __call__(self, name: Any, at: At) -> str:
        if not name or not set(name) <= _TOKEN_CHARS:
            at.fail(self.expected, name)
        if self.literal_value and any(w in name.lower() for w in _SECRET_HEADER_WORDS):
            at.fail(f"no credential in the scenario (it is copied into run.json): put it in an environment "
                    f"variable and name that in headers_env = {{\"{name}\" = \"MY_VAR\"}}")
        return name


class _EnvName(Check):
    expected = "the name of an environment variable"

    def __call__(self, name: Any, at: At) -> str:
        if not isinstance(name, str) or not name or "=" in name or "\0" in name or name.isspace():
            at.fail(self.expected, name)
        return name


class _RequestIdHeader(Check):
    expected = "a header name for the request id, or \"\" / false to send none"

    def __call__(self, value: Any, at: At) -> str:
        if value is False or value == "":
            return ""
        if not isinstance(value, str):
            at.fail(self.expected, value)
        return _HeaderName(literal_value=False)(value, at)


_TIMEOUT = Number(0, above=True, why="every timeout is explicit; none is unlimited")


# ---------------------------------------------------------------- the sections


@dataclass(frozen=True)
class TargetConfig:
    # a base URL (requests go to <endpoint>/chat/completions, before its query string) or the full URL
    # ending in /chat/completions; None: start the embedded mock server
    endpoint: Optional[str] = setting(None, Opt(_Endpoint()))
    model: str = setting("mock-model", Text("a model name", nonblank=True))
    # the API the agents speak: OpenAI's Chat Completions (`<endpoint>/chat/completions`), Anthropic's
    # Messages (`<endpoint>/messages`: what Claude Code sends) or OpenAI's Responses (`<endpoint>/responses`:
    # what Codex and the Agents SDK send); the same seeded conversation in each API's own shape
    api: Literal["chat", "messages", "responses"] = "chat"
    api_key_env: Optional[str] = setting(None, Opt(_EnvName()))  # name of the env var; the key itself is never stored
    # static, non-secret headers (copied into run.json)
    headers: dict[str, str] = setting({}, Table(Text("a header value (a string on one line)", one_line=True),
                                                keys=_HeaderName(literal_value=True)))
    # header name -> name of the env var holding its value, e.g. {"api-key" = "AZURE_KEY"}: for
    # secrets other than a bearer token; values are read at run time and never stored
    headers_env: dict[str, str] = setting({}, Table(_EnvName(), keys=_HeaderName(literal_value=False)))
    metrics_urls: list[str] = setting([], Items(_Url()))  # Prometheus endpoints scraped during the run
    metrics_every_s: float = setting(5.0, Number(0.2))
    # name of the env var whose value the scraper sends as `Authorization: Bearer` to metrics_urls only
    # (LiteLLM's proxy serves /metrics behind its master key); the value is never stored
    metrics_api_key_env: Optional[str] = setting(None, Opt(_EnvName()))
    metrics_series: list[str] = setting([])  # names/prefixes to chart (default: router/engine gauges)
    # the header each request's id goes in ("" or false: none is sent); the id sent is a UUID derived
    # from the readable `<run>-a<agent>-r<round>-c<call>` (servers such as llama-cpp-python answer 400 to
    # any other X-Request-ID), or that readable id itself; records keep both (request_id, id_sent)
    request_id_header: str = setting("X-Request-ID", _RequestIdHeader())
    request_id_format: Literal["uuid", "readable"] = "uuid"
    # a header naming the conversation, for routers' session affinity (smg's X-SMG-Routing-Key, ...):
    # its value is "<run>-a<agent>-k<conversation>", or "<run>-g<group>" with session_scope = "group"
    session_header: Optional[str] = setting(None, Opt(_HeaderName(literal_value=False)))
    session_scope: Literal["conversation", "group"] = "conversation"
    # W3C trace context on every request (`traceparent`: a trace per conversation, a span per
    # request), so a router's and an engine's traces join agentload's records
    traceparent: bool = True
    # https endpoints: a CA bundle (PEM) the certificate is verified against instead of the system's
    # (SSL_CERT_FILE in the environment replaces the system's for every https client, agentload too)
    tls_ca_file: Optional[str] = setting(None, Opt(_CaFile()))
    # false: the endpoint's certificate is not verified at all (every report says so)
    tls_verify: bool = True

    def _validate(self, at: At) -> None:
        problem = endpoint_problem(self.endpoint, self.api) if self.endpoint is not None else None
        if problem:
            (at / "endpoint").error(problem)
        tls = "tls_ca_file" if self.tls_ca_file is not None else "tls_verify" if not self.tls_verify else None
        if tls is not None and not (self.endpoint or "").lower().startswith("https://"):
            (at / tls).error(f"expected an https:// endpoint for {at.key}.{tls}, got "
                             f"{'the embedded mock (http://)' if self.endpoint is None else self.endpoint}")
        if self.tls_ca_file is not None and not self.tls_verify:
            (at / "tls_verify").error(f"expected tls_verify = true with {at.key}.tls_ca_file (a CA bundle verifies the "
                                      f"certificate; tls_verify = false skips verifying it): leave one out")
        seen: dict[str, str] = {}
        if self.request_id_header:
            seen[self.request_id_header.lower()] = f"{at.key}.request_id_header"
        if self.api_key_env is not None:  # (Anthropic's Messages API takes the key as x-api-key)
            seen["x-api-key" if self.api == "messages" else "authorization"] = f"{at.key}.api_key_env"
        for table in ("headers", "headers_env"):
            for name in getattr(self, table):
                key = at / table / name
                if name.lower() in seen:
                    also = seen[name.lower()]
                    hint = (f" (each request gets its own id there; {at.key}.request_id_header = \"\" sends none, "
                            f"and then this header is sent as written)") if also.endswith(".request_id_header") else ""
                    key.error(f"expected each header once; {name!r} is also set by {also}{hint}")
                seen[name.lower()] = key.key


@dataclass(frozen=True)
class AgentsConfig:
    count: int = setting(8, Whole(1))
    rounds: int = setting(5, Whole(1))
    start: str | float = setting("all", Either(Choice("all"), Number(0),  # "all" at once, or a ramp over this many seconds
                                               expected="'all' or a ramp length in seconds (a number >= 0)"))
    seed: int = 1
    duration_s: Optional[float] = setting(None, Opt(Number(0, above=True, why="leave it out to run every round")))  # stop starting new rounds after this
    arrival: Literal["closed", "open"] = "closed"
    rate_per_s: float = setting(1.0, Number(0, above=True))  # open loop: new conversations per second
    rate_dist: Literal["constant", "poisson"] = "poisson"
    error_retries: int = setting(3, Whole(0))  # an HTTP or connection error (not a 429) is retried this often, then the agent stops
    # an HTTP 429 (rate limited) is retried this often, after the wait its Retry-After asks for
    # (seconds or an HTTP date), then the agent stops
    rate_limit_retries: int = setting(3, Whole(0))
    # the longest wait before a retry: a Retry-After asking for more is waited this long (and said so);
    # without Retry-After, 0.2 s times the retry's number
    retry_after_max_s: float = setting(30.0, Number(0, above=True, why="every wait is bounded"))
    # closed loop: an agent that finished its conversation starts a new one (round 1 again) until
    # duration_s, so a soak of hours keeps its prompt sizes instead of growing them all run long
    restart: bool = False

    def _validate(self, at: At) -> None:
        if self.restart and self.duration_s is None:
            (at / "restart").error("expected agents.duration_s with restart = true (agents would never finish)")
        if self.restart and self.arrival == "open":
            (at / "restart").error("expected restart = false with arrival = \"open\" (open-loop arrivals start "
                                   "new conversations on their schedule already)")


@dataclass(frozen=True)
class ConversationConfig:
    mode: Literal["scripted", "model"] = "scripted"
    system_tokens: Dist = dist(400)
    user_tokens: Dist = dist(100)
    tools: int = 4
    tool_calls_per_round: Dist = dist(1)
    tool_result_tokens: Dist = dist(300)
    tool_latency_ms: Dist = dist(20)
    max_tokens: int = setting(64, Whole(1))
    stream: bool = True
    include_usage: bool = True
    # an assistant turn with tool calls and no text is sent with "content": "" (empty), null, or no
    # content key (omit); "" is what vLLM, SGLang, llama.cpp and OpenAI all accept (llama-cpp-python
    # refuses null)
    assistant_content: Literal["empty", "null", "omit"] = "empty"
    # OpenAI's tool_choice: "auto", "required", "none" or the name of an offered tool (tool_0, ...);
    # None: not sent (the server's default)
    tool_choice: Optional[str] = setting(None, Opt(Text("'auto', 'required', 'none' or a tool name",
                                                         nonblank=True)))
    # target.api = "responses" only: send each round only its new input items with the previous
    # answer's `previous_response_id` (and `store: true`), so the context grows on the server, as a
    # stateful Responses client does; false (the default): the whole input every round, `store: false`
    responses_chain: bool = False
    # Prefix groups (several products side by side, many agents each): each agent is drawn into one of
    # prefix_groups groups (0: none, every agent its own prompt); a group's agents share a system
    # prompt of shared_system_tokens and their tool list (described per group), before each agent's
    # own system_tokens; group_weights: each group's share of the agents (default: equal)
    prefix_groups: int = setting(0, Whole(0))
    shared_system_tokens: int = setting(0, Whole(0))
    group_weights: list[float] = setting([], Items(Number(0, above=True)))

    def _validate(self, at: At) -> None:
        if self.group_weights and len(self.group_weights) != self.prefix_groups:
            (at / "group_weights").error(f"expected one weight per group ({at.key}.prefix_groups = "
                                         f"{self.prefix_groups}), got {len(self.group_weights)}")
        if self.shared_system_tokens and not self.prefix_groups:
            (at / "shared_system_tokens").error(f"expected {at.key}.prefix_groups >= 1 with a shared system "
                                                f"prompt (0 groups: every agent has its own)")
        choice = self.tool_choice
        if choice is None:
            return
        names = [f"tool_{i}" for i in range(self.tools)]
        if not names:
            (at / "tool_choice").error(f"expected no tool_choice: the conversation offers no tools "
                                       f"({at.key}.tools = 0), got {choice!r}")
        if choice not in TOOL_CHOICES and choice not in names:
            shown = ", ".join(names[:3]) + (f", ..., {names[-1]}" if len(names) > 4 else
                                            "".join(f", {n}" for n in names[3:]))
            (at / "tool_choice").fail(f"'auto', 'required', 'none' or an offered tool's name ({shown})", choice)

    def tool_call_asked(self) -> bool:
        """Does every request ask the server for a tool call (tool_choice "required" or a tool's name)?"""
        return self.tools > 0 and self.tool_choice is not None and self.tool_choice not in ("auto", "none")

    def tool_choice_json(self) -> Any:
        """tool_choice as the request body carries it (None: not sent)."""
        c = self.tool_choice
        if c is None or c in TOOL_CHOICES:
            return c
        return {"type": "function", "function": {"name": c}}


@dataclass(frozen=True)
class ClientConfig:
    limit: int = 100  # aiohttp TCPConnector(limit); 0 = unlimited
    limit_per_host: int = 0
    keepalive_timeout: float = 15.0
    force_close: bool = False  # a fresh connection per request
    session: Literal["shared", "per_agent"] = "shared"
    pool_timeout_s: float = setting(60.0, _TIMEOUT)  # waiting for a pool slot plus connecting (aiohttp `connect`)
    connect_timeout_s: float = setting(10.0, _TIMEOUT)  # DNS+TCP+TLS of a new connection (aiohttp `sock_connect`)
    read_timeout_s: float = setting(120.0, _TIMEOUT)  # idle between two reads (aiohttp `sock_read`); bytes, not tokens
    total_timeout_s: float = setting(900.0, _TIMEOUT)  # whole request, body included (aiohttp `total`)
    # Past this many MB of request bodies waiting for a pool connection, a body that starts to wait
    # is kept compressed until it is sent (100,000 agents queued on a pool of 100); 0: every one.
    park_queued_bodies_mb: float = setting(256.0, Number(0))
    # Requests let wait inside aiohttp's pool at once (a shared session with a limit); more wait in
    # agentload's own queue, a future each, before aiohttp builds their request (~6 KB each): the
    # same pool_wait phase and pool timeout. 0: no queue of agentload's own.
    aiohttp_waiters_max: int = setting(256, Whole(0))


@dataclass(frozen=True)
class StallConfig:
    # no progress (tokens, not bytes) in a phase for this long: stalled
    after_s: float = setting(10.0, Number(0, above=True, why="0 would count every request as stalled"))
    give_up_s: float = setting(60.0, Number(0, above=True))  # then abort the request and record it as stalled
    on_give_up: Literal["stop_agent", "retry", "next_round"] = "stop_agent"
    max_retries: int = 2  # on_give_up = "retry": tries of one round after the first; then stop the agent
    # once per stall wave, requests that change one factor at a time (the stalled body on a fresh
    # connection, a short prompt on a reused one): the verdict reads the cause from them
    # (agentload.run.probes); false: the cause rests on correlation
    probes: bool = True

    def _validate(self, at: At) -> None:
        if self.give_up_s < self.after_s:
            (at / "give_up_s").fail(f"a number >= {at.key}.after_s ({self.after_s:g})", self.give_up_s)


@dataclass(frozen=True)
class CanaryConfig:
    every_s: float = 5.0  # 0 turns canaries off
    prompt_tokens: int = setting(32, Whole(1))
    max_tokens: int = setting(8, Whole(1))
    timeout_s: float = setting(10.0, Number(0, above=True, why="0 would be no timeout to aiohttp"))


@dataclass(frozen=True)
class ClusterConfig:
    """Where the agents run: this process (`local`), or shards on a Ray cluster (`--ray` overrides)."""

    engine: Literal["local", "ray"] = "local"
    address: str = setting("local", Text("a Ray address: host:port, 'auto' or 'local'", nonblank=True, one_line=True))
    shards: int = setting(2, Whole(1))
    # instead of shards: this many agents per shard (shards = ceil(agents.count / agents_per_shard))
    agents_per_shard: Optional[int] = setting(None, Opt(Whole(1)))
    cpus_per_shard: float = setting(1.0, Number(0, above=True))

    def shard_count(self, agents: int) -> int:
        if self.agents_per_shard:
            return max(1, -(-agents // self.agents_per_shard))
        return self.shards


@dataclass(frozen=True)
class ReplayConfig:
    """Agents that replay captured conversations (`agentload replay`) instead of drawing new ones."""

    # a capture: an `agentload proxy` run folder (or its records.jsonl), or an OpenAI-style
    # conversation JSONL file (one conversation a line: `messages`, optional `tools`)
    source: Optional[str] = setting(None, Opt(Text("a path to a capture", nonblank=True, one_line=True)))
    # auto: a folder or records.jsonl is a proxy capture; a JSONL file whose lines carry input_length /
    # hash_ids is a Mooncake-style trace (arrival times, shared prefix blocks), any other an openai one
    format: Literal["auto", "proxy", "openai", "mooncake"] = "auto"
    speed: float = setting(1.0, Number(0, above=True))  # think times between rounds divided by this


@dataclass(frozen=True)
class ExportConfig:
    """Where the run's requests go as spans once it is written (agentload.report.otlp; the `otlp` extra)."""

    # an OTLP/HTTP collector (e.g. http://127.0.0.1:4318; /v1/traces is appended unless the URL ends
    # with it): each request is sent as a span with its phases, once the run's reports are written;
    # left out: nothing is sent (`--otlp-endpoint URL` on the command line sets it)
    otlp_endpoint: Optional[str] = setting(None, Opt(_Url()))
    otlp_timeout_s: float = setting(10.0, _TIMEOUT)  # each POST of a batch of spans, whole


def otlp_endpoint_arg(url: str, source: str = "--otlp-endpoint") -> str:
    """A collector URL given on the command line, checked as [export] otlp_endpoint is."""
    return _Url()(url, At(source, "export.otlp_endpoint"))


@dataclass(frozen=True)
class Scenario:
    source: str = setting(internal=True)
    target: TargetConfig = TargetConfig()
    agents: AgentsConfig = AgentsConfig()
    conversation: ConversationConfig = ConversationConfig()
    client: ClientConfig = ClientConfig()
    stall: StallConfig = StallConfig()
    canary: CanaryConfig = CanaryConfig()
    mock: MockConfig = MockConfig()
    fleet: FleetConfig = FleetConfig()  # mock backends started for a router soak (agentload.fleet)
    router: RouterConfig = RouterConfig()
    schedule: tuple = setting((), SCHEDULE)  # [[schedule]]: faults applied to fleet backends during the run
    cluster: ClusterConfig = ClusterConfig()  # [cluster] engine = "ray": shards on a Ray cluster
    replay: ReplayConfig = ReplayConfig()  # [replay]: captured conversations instead of synthetic ones
    export: ExportConfig = ExportConfig()  # [export]: the run's requests as OTLP spans
    description: str = ""

    def _validate(self, at: At) -> None:
        check_fleet(self.fleet, self.router, self.schedule, self.target.endpoint is not None, at)
        if self.replay.source and self.conversation.mode != "scripted":
            (at / "replay" / "source").error("expected conversation.mode = \"scripted\" with a replay (the capture "
                                             "decides each round's tool calls, not the model)")
        if self.conversation.responses_chain:
            key = at / "conversation" / "responses_chain"
            if self.target.api != "responses":
                key.error(f"expected responses_chain = true only with target.api = \"responses\" (previous_response_id "
                          f"is the Responses API's), got target.api = {self.target.api!r}")
            if self.conversation.mode != "model":
                key.error("expected conversation.mode = \"model\" with responses_chain = true: the server keeps its own "
                          "answers, so the next round must answer the tool calls the model made, not scripted ones")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"source": self.source, "description": self.description}
        for name in SECTIONS:
            sec = getattr(self, name)
            out[name] = sec.to_dict() if name == "mock" else _section_to_dict(sec)
        out["schedule"] = [dataclasses.asdict(f) for f in self.schedule]
        return out

    def workload_fingerprint(self) -> str:
        """Hash of what decides the bytes agents send: equal fingerprints, comparable runs.

        The client and stall sections are left out on purpose: they are what a
        comparison varies. The target endpoint is left out too (same workload, other server).
        """
        d = self.to_dict()
        keep = {k: d[k] for k in ("agents", "conversation", "mock")}
        if self.replay.source:  # (left out otherwise: fingerprints of runs without it stay as they were)
            keep["replay"] = d["replay"]
        keep["model"] = d["target"]["model"]
        return hashlib.sha256(orjson.dumps(keep, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]

    def with_overrides(self, overrides: list[str], label: str = "--set") -> "Scenario":
        raw = self.to_dict()
        written = apply_overrides(raw, overrides)
        try:
            return parse_scenario(raw, self.source)
        except ScenarioError as e:
            raise relabel(e, written, label) from None


SECTIONS = ("target", "agents", "conversation", "client", "stall", "canary", "mock", "fleet", "router", "cluster",
            "replay", "export")


def _section_to_dict(sec: Any) -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(sec):
        v = getattr(sec, f.name)
        if isinstance(v, Dist):
            v = v.to_json()
        elif isinstance(v, tuple) and v and dataclasses.is_dataclass(v[0]):  # fleet.backends
            v = [dataclasses.asdict(x) for x in v]
        out[f.name] = v
    return out


def parse_scenario(raw: dict[str, Any], source: str) -> Scenario:
    """The scenario from its TOML table (`source` names the file in errors); `source` keys are skipped."""
    return build(Scenario, {k: v for k, v in raw.items() if k != "source"}, At(source), source=source)


# ---------------------------------------------------------------- overrides and loading


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> list[str]:
    """Apply `section.key=value` items (TOML values) onto the raw scenario; the paths written."""
    return apply_sets(raw, overrides, form="section.key=value, e.g. client.limit=20", depth=2,
                      whole=("schedule",))


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
            raise ScenarioError(str(p), "(file)", f"expected a readable UTF-8 TOML file ({e.__class__.__name__})") from e
    name = p.name[:-5] if p.name.endswith(".toml") else p.name
    res = resources.files("agentload.scenarios").joinpath(f"{name}.toml")
    if res.is_file() and (p.parent == Path(".") or not p.exists()):
        return f"{name}.toml (packaged)", res.read_text(encoding="utf-8")
    raise ScenarioError(str(p), "(file)", f"no such scenario file; packaged scenarios: {', '.join(packaged_scenarios())}")


def load_scenario(path_or_name: str | None = None, overrides: list[str] | None = None,
                  label: str = "--set") -> Scenario:
    """Load, override and validate; an error in a value an override wrote names `label`, not the file."""
    source, text = resolve_path(path_or_name)
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ScenarioError(source, "(syntax)", f"expected valid TOML: {e}") from e
    written = apply_overrides(raw, overrides or [])
    try:
        return parse_scenario(raw, source)
    except ScenarioError as e:
        raise relabel(e, written, label) from None
