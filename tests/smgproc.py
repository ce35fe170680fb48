"""Start SGLang's model gateway (`smg`, PyPI package `smg`) on loopback in front of mock backends.

Used by tests/test_smg.py and tests/test_soak.py. Everything it starts is stopped by PID in
`stop()` (SIGKILL is fine: smg keeps no state on disk), and on Linux the router also gets
PR_SET_PDEATHSIG so it dies with the test process even if pytest itself is killed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

READY_TIMEOUT_S = 45.0
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback only, never a proxy


def smg_executable() -> str | None:
    """The `smg` console script next to this interpreter (skips pyenv's slow shim), else on PATH."""
    sibling = Path(sys.executable).parent / "smg"
    if sibling.is_file() and os.access(sibling, os.X_OK):
        return str(sibling)
    return shutil.which("smg")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def http_get(url: str, timeout_s: float = 5.0) -> tuple[int, bytes]:
    try:
        with _OPENER.open(url, timeout=timeout_s) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


class SmgProcess:
    def __init__(self, proc: subprocess.Popen, port: int, prom_port: int, log_path: Path, argv: list[str]):
        self.proc = proc
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
    def start(cls, worker_urls: list[str], log_path: Path, extra: list[str] | None = None,
              ready_timeout_s: float = READY_TIMEOUT_S) -> "SmgProcess":
        exe = smg_executable()
        if exe is None:
            raise FileNotFoundError("smg executable not found")
        last_err = ""
        for _ in range(3):  # a free port can be taken between probing and binding: try again, bounded
            port, prom = free_port(), free_port()
            argv = [exe, "launch", "--host", "127.0.0.1", "--port", str(port),
                    "--worker-urls", *worker_urls, "--policy", "round_robin",
                    "--prometheus-host", "127.0.0.1", "--prometheus-port", str(prom),
                    # re-check a worker that failed its first health check every second, not every 30 s
                    "--worker-startup-check-interval", "1",
                    # nothing to drain in a test: exit fast on SIGTERM (default grace: 180 s)
                    "--shutdown-grace-period-secs", "1",
                    "--log-level", "warn", *(extra or [])]
            log = open(log_path, "ab")
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True, preexec_fn=_die_with_parent)
            log.close()
            me = cls(proc, port, prom, log_path, argv)
            try:
                me.wait_ready(len(worker_urls), ready_timeout_s)
                return me
            except RuntimeError as e:
                last_err = str(e)
                me.stop()
                if "Address already in use" not in me.log_tail():
                    break
        raise RuntimeError(f"smg did not become ready: {last_err}")

    def wait_ready(self, workers: int, timeout_s: float) -> dict[str, Any]:
        """Poll /readiness (not /health: that is liveness, 200 even with no worker), bounded."""
        deadline = time.monotonic() + timeout_s
        last = ""
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"smg exited with status {self.proc.returncode}: {self.log_tail()}")
            try:
                status, body = http_get(self.base + "/readiness", timeout_s=2.0)
                last = f"{status} {body[:200]!r}"
                if status == 200:
                    doc = json.loads(body)
                    if doc.get("healthy_workers", 0) >= workers:
                        return doc
            except (OSError, ValueError) as e:
                last = repr(e)
            time.sleep(0.1)
        raise RuntimeError(f"smg not ready within {timeout_s:g} s (last /readiness: {last}); log: {self.log_tail()}")

    def metrics_text(self) -> str:
        return http_get(self.metrics_url)[1].decode()

    def log_tail(self, limit: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-limit:]
        except OSError:
            return ""

    def stop(self) -> int | None:
        """SIGKILL by PID (smg keeps no state) and reap. Idempotent."""
        if self.proc.poll() is None:
            self.proc.kill()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        return self.proc.returncode
