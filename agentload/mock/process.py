"""The mock server as a separate OS process, so it never shares the load generator's event loop
(a busy client loop would otherwise distort the very latencies it measures). Started, waited for
and stopped by `agentload.process.ChildProcess`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from agentload.mock.config import MockConfig
from agentload.mock.serve import READY_PREFIX
from agentload.process import ChildProcess, NotReady

# The child must import this very package, also when it is not pip-installed.
_PKG_PARENT = str(Path(__file__).resolve().parents[2])


class MockProcess:
    def __init__(self, child: ChildProcess, cfg: MockConfig, host: str, port: int, stderr_file: Any):
        self.child = child
        self.cfg = cfg
        self.host = host
        self.port = port
        self._stderr = stderr_file

    @property
    def proc(self) -> subprocess.Popen:
        return self.child.proc

    @property
    def pid(self) -> int:
        return self.child.pid

    @property
    def base(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def url(self) -> str:
        return self.base + "/v1"

    @classmethod
    def start(cls, cfg: MockConfig | None = None, host: str = "127.0.0.1", port: int = 0,
              timeout_s: float = 15.0, bind_retry_s: float = 1.0) -> "MockProcess":
        """Start the mock; `port` 0 picks a free one. A given port that is in use is tried again
        for `bind_retry_s` (restarting a stopped backend on its port), then it is an error."""
        cfg = cfg or MockConfig()
        cmd = [sys.executable, "-m", "agentload.mock", "--host", host, "--port", str(port),
               "--config-json", json.dumps(cfg.to_dict()), "--watch-stdin"]
        if port and bind_retry_s > 0:
            cmd += ["--bind-retry-s", str(bind_retry_s)]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_PKG_PARENT, env.get("PYTHONPATH")) if p)
        # stderr goes to a file, not a pipe nobody drains: a chatty child must never block on it.
        err = tempfile.TemporaryFile()
        # stdin stays open as a lifeline: the child exits when it reads EOF, i.e. when we die.
        # Own session: a Ctrl-C in the terminal reaches agentload, which then stops in order;
        # the mock must keep serving the in-flight requests until agentload stops it.
        child = ChildProcess.start(cmd, name="mock server", env=env, lifeline=True, stderr=err)
        try:
            line = child.wait_line(READY_PREFIX + " port=", timeout_s)
        except BaseException as exc:
            child.stop(2.0)
            tail = _tail(err)
            err.close()
            if isinstance(exc, NotReady):
                raise RuntimeError(f"{exc}; mock stderr: {tail}") from None
            raise
        return cls(child, cfg, host, int(line.split("port=", 1)[1].split()[0]), err)

    def stats(self, timeout_s: float = 5.0) -> dict[str, Any]:
        return self._call("GET", "/mock/stats", timeout_s)

    def reset_stats(self, timeout_s: float = 5.0) -> dict[str, Any]:
        return self._call("POST", "/mock/reset", timeout_s)

    def set_fault(self, fault: str, for_s: float | None = None, timeout_s: float = 5.0,
                  **params: Any) -> dict[str, Any]:
        """Set the live fault ("hang", "slow", "errors", "drop"; "none" clears) for `for_s`
        seconds (None: until changed); `params`: slow_factor, error_status. Returns the fault
        state (see get_fault); a value the mock refuses is a ValueError with its one-line reason."""
        body = {"fault": fault, "for_s": for_s, **params}
        try:
            return self._call("POST", "/mock/fault", timeout_s, body)
        except urllib.error.HTTPError as e:
            if e.code != 400:
                raise
            try:
                reason = json.loads(e.read())["error"]
            except (ValueError, KeyError, TypeError):
                reason = f"HTTP 400 from {self.base}/mock/fault"
            raise ValueError(reason) from None

    def get_fault(self, timeout_s: float = 5.0) -> dict[str, Any]:
        """{"fault": name or None, "since_s_ago": s or None, "remaining_s": s or None, "applied": n}"""
        return self._call("GET", "/mock/fault", timeout_s)

    def _call(self, method: str, path: str, timeout_s: float, body: Any = None) -> dict[str, Any]:
        # no proxies: the mock is always on loopback
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        data = json.dumps(body).encode() if body is not None else (b"" if method == "POST" else None)
        req = urllib.request.Request(self.base + path, method=method, data=data,
                                     headers={"Content-Type": "application/json"} if body is not None else {})
        with opener.open(req, timeout=timeout_s) as resp:
            return json.loads(resp.read())

    def stop(self, timeout_s: float = 5.0) -> int | None:
        """SIGTERM, then SIGKILL after timeout_s. Returns the exit code. Idempotent."""
        code = self.child.stop(grace_s=timeout_s)
        if not self._stderr.closed:
            self._stderr.close()
        return code

    def __enter__(self) -> "MockProcess":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<MockProcess pid={self.pid} {self.url} {self.child.state}>"


def _tail(f: Any, limit: int = 2000) -> str:
    try:
        f.flush()
        f.seek(0)
        data = f.read()
    except (OSError, ValueError):
        return ""
    text = data.decode(errors="replace").strip()
    return text[-limit:] if text else "(empty)"
