"""Start SGLang's model gateway (`smg`, PyPI package `smg`) on loopback in front of mock backends.

Used by tests/test_smg.py and tests/test_soak.py. Started, waited for (GET /readiness) and
stopped by `agentload.process.ChildProcess`: `stop()` SIGKILLs its process group (fine: smg keeps
no state on disk), and on Linux the router also gets PR_SET_PDEATHSIG so it dies with the test
process even if pytest itself is killed.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
from pathlib import Path
from typing import Any

from agentload.process import ChildProcess, NotReady, http_get  # noqa: F401  http_get: test_soak uses it

READY_TIMEOUT_S = 45.0


def executable(name: str) -> str | None:
    """The console script `name` next to this interpreter (skips pyenv's slow shim), else on PATH."""
    sibling = Path(sys.executable).parent / name
    if sibling.is_file() and os.access(sibling, os.X_OK):
        return str(sibling)
    return shutil.which(name)


def smg_executable() -> str | None:
    return executable("smg")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RouterProcess:
    """A router (smg, or its kin vllm-router) on two free loopback ports (API, Prometheus) in front of
    `worker_urls`; a subclass says its executable and its command line."""

    NAME = "router"
    IN_USE = "in use"  # what its log says when a port was taken between probing and binding

    def __init__(self, child: ChildProcess, port: int, prom_port: int, log_path: Path, argv: list[str]):
        self.child = child
        self.proc = child.proc
        self.port = port
        self.prom_port = prom_port
        self.log_path = log_path
        self.argv = argv

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """The OpenAI base URL agentload's `--endpoint` takes."""
        return self.base + "/v1"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.prom_port}/metrics"

    @classmethod
    def command(cls, exe: str, port: int, prom: int, worker_urls: list[str], extra: list[str]) -> list[str]:
        raise TypeError(f"{cls.__name__} must say its command line")

    @classmethod
    def start(cls, worker_urls: list[str], log_path: Path, extra: list[str] | None = None,
              ready_timeout_s: float = READY_TIMEOUT_S):
        exe = executable(cls.NAME)
        if exe is None:
            raise FileNotFoundError(f"{cls.NAME} executable not found (pip install {cls.NAME})")
        last_err = ""
        for _ in range(3):  # a free port can be taken between probing and binding: try again, bounded
            port, prom = free_port(), free_port()
            argv = cls.command(exe, port, prom, worker_urls, list(extra or []))
            with open(log_path, "ab") as log:
                child = ChildProcess.start(argv, name=cls.NAME, stdout=log, stderr=log, die_with_parent=True)
            me = cls(child, port, prom, log_path, argv)
            try:
                me.wait_ready(len(worker_urls), ready_timeout_s)
                return me
            except RuntimeError as e:
                last_err = str(e)
                me.stop()
                if cls.IN_USE not in me.log_tail():
                    break
        raise RuntimeError(f"{cls.NAME} did not become ready: {last_err}")

    def wait_ready(self, workers: int, timeout_s: float) -> dict[str, Any]:
        """Poll /readiness (not /health: that is liveness, 200 even with no worker), bounded."""
        def ready(status: int, body: bytes) -> dict[str, Any] | None:
            if status != 200:
                return None
            doc = json.loads(body)
            return doc if doc.get("healthy_workers", 0) >= workers else None

        try:
            got = self.child.wait_url(self.base + "/readiness", timeout_s, ready)
            self.child.wait_url(self.metrics_url, timeout_s)  # the Prometheus listener is separate
            return got
        except NotReady as e:
            if e.exited:
                raise RuntimeError(f"{self.NAME} exited with status {e.returncode}: {self.log_tail()}") from None
            raise RuntimeError(f"{self.NAME} not ready within {timeout_s:g} s (last: {e.last}); "
                               f"log: {self.log_tail()}") from None

    def metrics_text(self) -> str:
        return http_get(self.metrics_url)[1].decode()

    def log_tail(self, limit: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-limit:]
        except OSError:
            return ""

    def stop(self) -> int | None:
        """SIGKILL its process group (a router keeps no state; a launcher and its router both go) and
        reap. Idempotent."""
        return self.child.kill()


class SmgProcess(RouterProcess):
    NAME = "smg"
    IN_USE = "Address already in use"

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
