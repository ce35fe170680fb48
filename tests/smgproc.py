"""Start SGLang's model gateway (`smg`, PyPI package `smg`) on loopback in front of mock backends.

Used by tests/test_smg.py and tests/test_soak.py. Started on free ports and waited for (GET
/readiness, then its /metrics) by `agentload.process.start_listening`: `stop()` SIGKILLs its
process group (fine: smg keeps no state on disk), and on Linux the router also gets
PR_SET_PDEATHSIG so it dies with the test process even if pytest itself is killed.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

from agentload.fleet.fleet import router_ready
from agentload.process import start_listening
from serverprocs import Server

READY_TIMEOUT_S = 45.0


def executable(name: str) -> str | None:
    """The console script `name` next to this interpreter (skips pyenv's slow shim), else on PATH."""
    sibling = Path(sys.executable).parent / name
    if sibling.is_file() and os.access(sibling, os.X_OK):
        return str(sibling)
    return shutil.which(name)


def smg_executable() -> str | None:
    return executable("smg")


class RouterProcess(Server):
    """A router (smg, or its kin vllm-router) on two free loopback ports (API, Prometheus) in front of
    `worker_urls`, ready when /readiness counts every worker healthy (not /health: that is liveness,
    200 even with no worker) and its Prometheus listener answers; a subclass says its executable and
    its command line."""

    NAME = "router"

    @property
    def prom_port(self) -> int:
        return self.started.ports[1]

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.prom_port}/metrics"

    @classmethod
    def command(cls, exe: str, port: int, prom: int, worker_urls: list[str], extra: list[str]) -> list[str]:
        raise TypeError(f"{cls.__name__} must say its command line")

    @classmethod
    def start(cls, worker_urls: list[str], log_path: Path, extra: list[str] | None = None,
              ready_timeout_s: float = READY_TIMEOUT_S) -> Any:
        exe = executable(cls.NAME)
        if exe is None:
            raise FileNotFoundError(f"{cls.NAME} executable not found (pip install {cls.NAME})")
        return cls(start_listening(
            lambda ports: cls.command(exe, *ports, worker_urls, list(extra or [])),
            lambda ports: [f"http://127.0.0.1:{ports[0]}/readiness", f"http://127.0.0.1:{ports[1]}/metrics"],
            name=cls.NAME, log_path=log_path, ports=2, timeout_s=ready_timeout_s, ok=router_ready(len(worker_urls))))

    def wait_ready(self, workers: int, timeout_s: float) -> bool:
        """Wait (bounded) until /readiness counts `workers` healthy workers."""
        return self.child.wait_url(self.base + "/readiness", timeout_s, router_ready(workers))


class SmgProcess(RouterProcess):
    NAME = "smg"

    @classmethod
    def command(cls, exe: str, port: int, prom: int, worker_urls: list[str], extra: list[str]) -> list[str]:
        return [exe, "launch", "--host", "127.0.0.1", "--port", str(port),
                "--worker-urls", *worker_urls, "--policy", "round_robin",
                "--prometheus-host", "127.0.0.1", "--prometheus-port", str(prom),
                # re-check a worker that failed its first health check every second, not every 30 s
                "--worker-startup-check-interval", "1",
                # nothing to drain in a test: exit fast on SIGTERM (default grace: 180 s)
                "--shutdown-grace-period-secs", "1",
                "--log-level", "warn", *extra]
