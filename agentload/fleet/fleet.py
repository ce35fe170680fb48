"""Start a fleet of mock backends and the router under test on free loopback ports; stop them.

Everything listens on 127.0.0.1 only. Each backend is an `agentload.mock` process named by its
config (`system_fingerprint` in every answer, so records attribute requests to it) that logs every
request it gets to `fleet/<name>.requests.jsonl` in the run folder (joined to records by request
id: retries and prefill/decode pairs show there). The router's output goes to `fleet/router.log`.
A backend stopped or killed by the schedule is restarted on its own port, so the router sees the
same worker come back.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import shutil
import threading
import time
from pathlib import Path
from typing import Any, Callable

from agentload.errors import UserError
from agentload.fleet.config import BackendConfig, FleetConfig, RouterConfig
from agentload.mock.config import MockConfig
from agentload.mock.process import MockProcess
from agentload.process import ChildProcess, NotReady, start_listening
from agentload.redact import redact


def router_ready(workers: int) -> Callable[[int, bytes], bool]:
    """A router's readiness answer is ready: a 200, and where it counts healthy workers (smg's and
    vllm-router's /readiness: `healthy_workers`), all `workers` of them."""

    def ready(status: int, body: bytes) -> bool:
        if status != 200:
            return False
        try:
            doc = json.loads(body)
        except ValueError:
            return True
        healthy = doc.get("healthy_workers") if isinstance(doc, dict) else None
        return not isinstance(healthy, int) or healthy >= workers

    return ready


class Backend:
    """One mock backend: its config, port and process (None while stopped by the schedule)."""

    def __init__(self, index: int, cfg: BackendConfig, mock: MockConfig, port: int, log_path: Path):
        self.index = index
        self.name = cfg.name or f"b{index}"
        self.role = cfg.role
        self.bootstrap_port = cfg.bootstrap_port
        self.mock = mock
        self.port = port
        self.log_path = log_path
        self.proc: MockProcess | None = None
        self.lock = threading.Lock()  # the schedule thread and the fleet's stop never race on proc

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float) -> None:
        with self.lock:
            self.proc = MockProcess.start(self.mock, port=self.port, timeout_s=timeout_s)
            self.port = self.proc.port

    def stop(self, kill: bool = False) -> None:
        with self.lock:
            proc, self.proc = self.proc, None
        if proc is not None:
            if kill:
                proc.child.kill()
                proc.stop(0.5)  # closes its stderr file
            else:
                proc.stop(5.0)

    def meta(self, run_dir: Path) -> dict[str, Any]:
        return {"index": self.index, "name": self.name, "role": self.role, "url": self.base,
                "request_log": str(self.log_path.relative_to(run_dir))}


class Fleet:
    """The backends and the router of a router soak. `start()` then `stop()` (idempotent)."""

    def __init__(self, fleet: FleetConfig, router: RouterConfig, base_mock: MockConfig, model: str,
                 run_dir: Path, log: Callable[[str], None], source: str = "scenario"):
        self.source = source
        self.cfg = fleet
        self.router_cfg = router
        self.model = model
        self.run_dir = run_dir
        self.log = log
        self.dir = run_dir / "fleet"
        self.backends: list[Backend] = []
        base = base_mock.to_dict()
        for i, b in enumerate(fleet.resolved()):
            log_path = self.dir / f"{b.name}.requests.jsonl"
            # each backend's own seed: the same fault draws would otherwise hit every backend at once
            cfg = MockConfig.from_dict({**base, "seed": base_mock.seed + i, **b.mock, "name": b.name,
                                        "request_log": str(log_path)}, f"fleet.backends[{i}]")
            self.backends.append(Backend(i, b, cfg, b.port or 0, log_path))
        self.router: ChildProcess | None = None
        self.port: int | None = None
        self.metrics_port: int | None = None
        self.endpoint: str | None = None
        self.metrics_url: str | None = None
        self.argv: list[str] = []

    # ------------------------------------------------------------ start / stop

    def start(self, external_endpoint: str | None = None) -> str:
        """Start every backend, then the router; return the endpoint agents send to."""
        self.dir.mkdir(parents=True, exist_ok=True)
        if self.router_cfg.command is not None:  # before any backend starts: a typo costs nothing
            exe = shlex.split(self.router_cfg.command)[0]
            if shutil.which(exe) is None and not Path(exe).is_file():
                raise UserError(f"{self.source}: router.command: program {exe!r} not found; expected an "
                                f"installed router (e.g. pip install smg) or its path")
        try:
            for b in self.backends:
                b.start(self.cfg.ready_timeout_s)
            self.log(f"agentload: fleet: {len(self.backends)} mock backends "
                     + ", ".join(f"{b.name}{'' if b.role == 'worker' else '/' + b.role}=:{b.port}" for b in self.backends))
            if self.router_cfg.command is None:
                self.endpoint = external_endpoint
            else:
                self._start_router()
            if self.cfg.settle_s:
                time.sleep(self.cfg.settle_s)
            return self.endpoint or ""
        except BaseException:
            self.stop()
            raise

    def _start_router(self) -> None:
        rc = self.router_cfg

        def command(ports: tuple[int, ...]) -> list[str]:
            self.port, self.metrics_port = ports
            self.argv = self.command_argv()
            return self.argv

        def urls(ports: tuple[int, ...]) -> list[str]:
            # a router's Prometheus listener may come up a moment after its API: both are waited for
            return [self.fill(rc.ready_url)] + ([self.fill(rc.metrics_url)] if rc.metrics_url else [])

        try:
            started = start_listening(command, urls, name=self.kind, log_path=self.dir / "router.log", ports=2,
                                      timeout_s=rc.ready_timeout_s, ok=router_ready(len(self.backends)),
                                      every_s=0.2)
        except NotReady as e:
            raise UserError(f"{self.source}: router.command: the router did not become ready: {e}") from None
        self.router = started.child
        self.endpoint = self.fill(rc.endpoint)
        self.metrics_url = self.fill(rc.metrics_url) if rc.metrics_url else None
        self.log(f"agentload: fleet: {self.kind} ready at {self.endpoint} (policy {rc.policy or 'default'})")

    def stop(self) -> None:
        if self.router is not None:
            self.router.stop(self.router_cfg.stop_timeout_s)
        for b in self.backends:
            try:
                b.stop()
            except Exception:  # one backend that will not stop must not keep the others running
                pass

    # ------------------------------------------------------------ the command line

    @property
    def kind(self) -> str:
        if self.router_cfg.kind:
            return self.router_cfg.kind
        if self.router_cfg.command:
            return Path(shlex.split(self.router_cfg.command)[0]).name
        return "external"

    def _role_urls(self, role: str) -> list[str]:
        return [b.base for b in self.backends if b.role == role]

    def fill(self, template: str) -> str:
        return (template.replace("{port}", str(self.port)).replace("{metrics_port}", str(self.metrics_port))
                .replace("{policy}", self.router_cfg.policy or "").replace("{model}", self.model)
                .replace("{run_dir}", str(self.run_dir)))

    def command_argv(self) -> list[str]:
        lists = {
            "{backend_urls}": [b.base for b in self.backends if b.role == "worker"] or [b.base for b in self.backends],
            "{prefill_urls}": self._role_urls("prefill"),
            "{decode_urls}": self._role_urls("decode"),
            "{prefill_args}": [x for b in self.backends if b.role == "prefill"
                               for x in (["--prefill", b.base] + ([str(b.bootstrap_port)] if b.bootstrap_port else []))],
            "{decode_args}": [x for b in self.backends if b.role == "decode" for x in ("--decode", b.base)],
        }
        argv: list[str] = []
        for arg in shlex.split(self.router_cfg.command or ""):
            if arg in lists:
                argv.extend(lists[arg])
            else:
                argv.append(self.fill(arg))
        return argv

    # ------------------------------------------------------------ for run.json and the schedule

    def backend(self, ref: int | str) -> Backend:
        for b in self.backends:
            if b.index == ref or b.name == ref:
                return b
        raise KeyError(ref)

    def meta(self, schedule: tuple) -> dict[str, Any]:
        return {
            "mode": self.cfg.mode,
            "backends": [b.meta(self.run_dir) for b in self.backends],
            "router": {"kind": self.kind, "policy": self.router_cfg.policy, "endpoint": self.endpoint,
                       "metrics_url": self.metrics_url,
                       "command": [redact(a) for a in self.argv] or None},
            "schedule": [{"index": i, **dataclasses.asdict(f), "backend": self.backend(f.backend).name}
                         for i, f in enumerate(schedule)],
        }
