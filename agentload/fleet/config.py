"""The scenario's `[fleet]`, `[router]` and `[[schedule]]` tables.

    [fleet]                      # N mock backends, each a real agentload mock process
    count = 3                    # b0..b2 with the scenario's [mock] settings, or list them:
    [[fleet.backends]]
    name = "b0"
    role = "worker"              # "prefill" / "decode" with mode = "pd"
    mock = { hang_above_tokens = 6000 }   # [mock] keys over the scenario's [mock]

    [router]                     # the router under test, started from a command template
    command = "smg launch --host 127.0.0.1 --port {port} --worker-urls {backend_urls} --policy {policy}"
    policy = "cache_aware"

    [[schedule]]                 # faults applied to a live backend
    at_s = 60
    backend = 2                  # index or name
    fault = "hang"               # hang | slow | errors | drop (the mock's control endpoint)
    for_s = 30                   # | stop (SIGTERM) | kill (SIGKILL), restarted on its port after for_s

A leaf of the fleet layer: it imports only the mock's config model and the validation mechanism.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any, Literal, Optional

from agentload.mock.config import ERROR_STATUSES, MockConfig
from agentload.validate import (
    At,
    Check,
    Choice,
    Either,
    Items,
    Model,
    Number,
    Opt,
    Text,
    Whole,
    build,
    setting,
)

FAULTS = ("hang", "slow", "errors", "drop", "stop", "kill")
LIVE_FAULTS = ("hang", "slow", "errors", "drop")  # applied through the mock's POST /mock/fault
ROLES = ("worker", "prefill", "decode")
# Placeholders a router command may use; the list ones expand to several arguments.
LIST_PLACEHOLDERS = ("{backend_urls}", "{prefill_urls}", "{decode_urls}", "{prefill_args}", "{decode_args}")
PLACEHOLDERS = ("{port}", "{metrics_port}", "{policy}", "{model}", "{run_dir}") + LIST_PLACEHOLDERS


class _MockOverrides(Check):
    """A table of [mock] keys: checked now (unknown keys, bad values) by building a MockConfig from it."""

    expected = "a table of [mock] settings"

    def __call__(self, value: Any, at: At) -> dict[str, Any]:
        if not isinstance(value, dict):
            at.fail(self.expected, value)
        build(MockConfig, value, at)
        return dict(value)


class _Template(Check):
    """A router command template: splits like a shell line, uses only known placeholders."""

    expected = "a command line (placeholders: " + ", ".join(PLACEHOLDERS) + ")"

    def __call__(self, value: Any, at: At) -> str | None:
        if value is False or value == "":  # `--set router.command=false`: the router runs already
            return None
        if not isinstance(value, str) or not value.strip():
            at.fail(self.expected, value)
        try:
            argv = shlex.split(value)
        except ValueError as e:
            at.fail(f"a command line that splits like a shell's ({e})", value)
        for arg in argv:
            rest = arg
            for p in PLACEHOLDERS:
                rest = rest.replace(p, "")
            if "{" in rest or "}" in rest:
                at.fail(f"only the placeholders {', '.join(PLACEHOLDERS)}", arg)
            for p in LIST_PLACEHOLDERS:
                if p in arg and arg != p:
                    at.fail(f"{p} as an argument of its own (it expands to several)", arg)
        return value


@dataclass(frozen=True)
class BackendConfig:
    """One mock backend of the fleet, a `[[fleet.backends]]` table."""

    # in reports, the schedule (`backend = "b2"`) and system_fingerprint; default b0, b1, ... by position
    name: Optional[str] = setting(None, Opt(Text("a backend name (letters, digits, - and _)", nonblank=True)))
    role: Literal["worker", "prefill", "decode"] = "worker"  # prefill / decode with [fleet] mode = "pd"
    mock: dict = setting({}, _MockOverrides())  # [mock] keys for this backend, over the scenario's [mock]
    port: Optional[int] = setting(None, Opt(Whole(1)))  # fixed port (for a router started elsewhere); else free
    bootstrap_port: Optional[int] = setting(None, Opt(Whole(1)))  # PD prefill: smg's `--prefill URL PORT`

    def _validate(self, at: At) -> None:
        if self.name is not None and not all(c.isalnum() or c in "-_" for c in self.name):
            (at / "name").fail("a backend name of letters, digits, - and _", self.name)


@dataclass(frozen=True)
class FleetConfig:
    """Mock backends agentload starts for a router soak: `count` alike, or each one listed in
    `[[fleet.backends]]`; each a real mock process on a free loopback port."""

    count: int = setting(0, Whole(0))  # N workers b0..b{N-1} with the [mock] settings (when backends is empty)
    mode: Literal["plain", "pd"] = "plain"  # "pd": prefill and decode backends (smg --pd-disaggregation)
    backends: tuple = setting((), Items(Model(BackendConfig), into=tuple, expected="a list of [[fleet.backends]] tables"))
    ready_timeout_s: float = setting(15.0, Number(0, above=True))  # for each mock backend to start and listen
    # seconds the agents wait after everything is ready (lets a router's first health checks pass)
    settle_s: float = setting(0.0, Number(0))

    def _validate(self, at: At) -> None:
        if self.backends and self.count and self.count != len(self.backends):
            (at / "count").fail(f"{len(self.backends)} (the number of [[fleet.backends]]) or no count", self.count)
        names = [b.name or f"b{i}" for i, b in enumerate(self.backends)]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            (at / "backends").error(f"expected each backend name once; {sorted(dup)[0]!r} is used twice")
        roles = {b.role for b in self.backends}
        if self.mode == "pd":
            if not self.backends or not {"prefill", "decode"} <= roles or "worker" in roles:
                (at / "backends").error("expected, with mode = \"pd\", [[fleet.backends]] with role = \"prefill\" "
                                        "and role = \"decode\" (at least one of each, no \"worker\")")
        elif roles - {"worker"}:
            (at / "mode").error("expected mode = \"pd\" for backends with role prefill/decode")

    @property
    def enabled(self) -> bool:
        return bool(self.count or self.backends)

    def resolved(self) -> list[BackendConfig]:
        """Every backend with its name (b0, b1, ... by position when not named)."""
        if self.backends:
            return [b if b.name else BackendConfig(f"b{i}", b.role, b.mock, b.port, b.bootstrap_port)
                    for i, b in enumerate(self.backends)]
        return [BackendConfig(f"b{i}") for i in range(self.count)]

    def names(self) -> list[str]:
        """Every backend's name, as `resolved` gives them."""
        return [b.name or f"b{i}" for i, b in enumerate(self.resolved())]


@dataclass(frozen=True)
class RouterConfig:
    """The router under test, started in front of the fleet from a command template, or already
    running at `[target] endpoint`."""

    # the command that starts the router (see PLACEHOLDERS); None: the router runs already at
    # [target] endpoint (backends then need fixed ports in [[fleet.backends]] port)
    command: Optional[str] = setting(None, Opt(_Template()))
    kind: Optional[str] = None  # shown in reports; default: the command's program name
    # the command's {policy}, and shown in reports (`--vary router.policy=round_robin,cache_aware`)
    policy: Optional[str] = setting(None, Opt(Text("a routing policy name", nonblank=True, one_line=True)))
    endpoint: str = setting("http://127.0.0.1:{port}/v1", Text("a URL template", nonblank=True))  # the agents' target
    # answers 200 when the router can route (a JSON body with "healthy_workers" must also count every backend)
    ready_url: str = setting("http://127.0.0.1:{port}/readiness", Text("a URL template", nonblank=True))
    # the router's Prometheus endpoint, scraped into target_metrics.jsonl
    metrics_url: Optional[str] = setting(None, Opt(Text("a URL template", nonblank=True)))
    ready_timeout_s: float = setting(60.0, Number(0, above=True))  # for ready_url (and metrics_url) to answer
    stop_timeout_s: float = setting(5.0, Number(0, above=True))  # seconds from SIGTERM at the end to SIGKILL


@dataclass(frozen=True)
class ScheduledFault:
    """A fault applied to one backend of the fleet at `at_s`, undone after `for_s`."""

    at_s: float = setting(check=Number(0))  # seconds from the run's start (run.json t0_ns)
    backend: int | str = setting(check=Either(Whole(0), Text("a backend name", nonblank=True),
                                              expected="a backend index (0, 1, ...) or name"))
    # hang, slow, errors, drop: live, through the mock's POST /mock/fault; stop (SIGTERM), kill
    # (SIGKILL): the process, restarted on its own port after for_s
    fault: str = setting(check=Choice(*FAULTS))
    for_s: Optional[float] = setting(None, Opt(Number(0, above=True)))  # None: until the run ends
    slow_factor: float = setting(10.0, Number(1, above=True))  # fault = "slow": latencies x this
    error_status: int = setting(503, Choice(*ERROR_STATUSES))  # fault = "errors"


SCHEDULE = Items(Model(ScheduledFault), into=tuple, expected="a list of [[schedule]] tables")


def check_fleet(fleet: FleetConfig, router: RouterConfig, schedule: tuple, has_endpoint: bool, at: At) -> None:
    """What spans the three tables (called from the scenario's own check)."""
    if not fleet.enabled:
        if router.command is not None:
            (at / "router" / "command").error("expected a [fleet] for the router to route to (fleet.count = N "
                                              "or [[fleet.backends]])")
        if schedule:
            (at / "schedule").error("expected a [fleet]: scheduled faults are applied to its backends")
        return
    if router.command is None and not has_endpoint:
        (at / "router" / "command").error("expected the command that starts the router, or [target] endpoint "
                                          "of a router already running")
    names = fleet.names()
    if router.command is None:
        for i, b in enumerate(fleet.resolved()):
            if b.port is None:
                (at / "fleet" / "backends" / i / "port").error(
                    "expected a fixed port for each backend when the router runs already (no [router] command)")
    for i, f in enumerate(schedule):
        if isinstance(f.backend, int):
            if f.backend >= len(names):
                (at / "schedule" / i / "backend").fail(f"a backend index below {len(names)}", f.backend)
        elif f.backend not in names:
            (at / "schedule" / i / "backend").fail(f"a backend of the fleet ({', '.join(names)})", f.backend)


def backend_name(fleet: FleetConfig, ref: int | str) -> str:
    return fleet.names()[ref] if isinstance(ref, int) else ref
