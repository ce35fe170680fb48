"""Start vllm-router (PyPI `vllm-router`, a Rust router; not vLLM's production-stack router) on
loopback in front of mock backends, for tests/test_vllm_router.py.

Started, waited for (GET /readiness: `healthy_workers`) and stopped by
`agentload.process.ChildProcess`. The `vllm-router` console script is a Python launcher that
runs the Rust router in a child process (`vllm::router`): `stop()` kills the whole process group,
so both go (PR_SET_PDEATHSIG covers only the launcher).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from agentload.process import ChildProcess, NotReady, http_get

from smgproc import free_port

READY_TIMEOUT_S = 45.0


def executable(name: str) -> str | None:
    """`name` next to this interpreter (skips pyenv's slow shim), else on PATH."""
    sibling = Path(sys.executable).parent / name
    if sibling.is_file() and os.access(sibling, os.X_OK):
        return str(sibling)
    return shutil.which(name)


def skip_reason(name: str, install: str) -> str | None:
    """Why a router test may skip here: only when the router is missing AND `CI` is unset (in CI
    a missing router is a failure: .ci/run installs it)."""
    if executable(name) is not None:
        return None
    if os.environ.get("CI"):
        return None  # the fixture then fails loudly
    return f"`{name}` is missing ({install}; .ci/run installs it)"


class VllmRouterProcess:
    def __init__(self, child: ChildProcess, port: int, prom_port: int, log_path: Path, argv: list[str]):
        self.child = child
        self.port = port
        self.prom_port = prom_port
        self.log_path = log_path
        self.argv = argv

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return self.base + "/v1"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.prom_port}/metrics"

    @classmethod
    def start(cls, worker_urls: list[str], log_path: Path, extra: list[str] | None = None,
              ready_timeout_s: float = READY_TIMEOUT_S) -> "VllmRouterProcess":
        exe = executable("vllm-router")
        if exe is None:
            raise FileNotFoundError("vllm-router executable not found (pip install vllm-router)")
        last_err = ""
        for _ in range(3):  # a free port can be taken between probing and binding: try again, bounded
            port, prom = free_port(), free_port()
            argv = [exe, "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *worker_urls,
                    "--policy", "round_robin", "--prometheus-host", "127.0.0.1", "--prometheus-port", str(prom),
                    "--worker-startup-check-interval", "1", "--log-level", "warning", *(extra or [])]
            with open(log_path, "ab") as log:
                child = ChildProcess.start(argv, name="vllm-router", stdout=log, stderr=log, die_with_parent=True)
            me = cls(child, port, prom, log_path, argv)
            try:
                me.wait_ready(len(worker_urls), ready_timeout_s)
                return me
            except RuntimeError as e:
                last_err = str(e)
                me.stop()
                if "in use" not in me.log_tail():
                    break
        raise RuntimeError(f"vllm-router did not become ready: {last_err}")

    def wait_ready(self, workers: int, timeout_s: float) -> dict[str, Any]:
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
                raise RuntimeError(f"vllm-router exited with status {e.returncode}: {self.log_tail()}") from None
            raise RuntimeError(f"vllm-router not ready within {timeout_s:g} s (last: {e.last}); "
                               f"log: {self.log_tail()}") from None

    def metrics_text(self) -> str:
        return http_get(self.metrics_url)[1].decode()

    def log_tail(self, limit: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-limit:]
        except OSError:
            return ""

    def stop(self) -> int | None:
        """SIGKILL its process group (launcher and router; no state kept) and reap. Idempotent."""
        return self.child.kill()
