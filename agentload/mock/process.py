"""The mock server as a separate OS process, so it never shares the load generator's event loop
(a busy client loop would otherwise distort the very latencies it measures)."""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from agentload.mock.config import MockConfig
from agentload.mock.serve import READY_PREFIX

# The child must import this very package, also when it is not pip-installed.
_PKG_PARENT = str(Path(__file__).resolve().parents[2])


class MockProcess:
    def __init__(self, proc: subprocess.Popen, cfg: MockConfig, host: str, port: int, stderr_file: Any):
        self.proc = proc
        self.cfg = cfg
        self.host = host
        self.port = port
        self._stderr = stderr_file

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def base(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def url(self) -> str:
        return self.base + "/v1"

    @classmethod
    def start(cls, cfg: MockConfig | None = None, host: str = "127.0.0.1", port: int = 0,
              timeout_s: float = 15.0) -> "MockProcess":
        cfg = cfg or MockConfig()
        cmd = [sys.executable, "-m", "agentload.mock", "--host", host, "--port", str(port),
               "--config-json", json.dumps(cfg.to_dict()), "--watch-stdin"]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_PKG_PARENT, env.get("PYTHONPATH")) if p)
        # stderr goes to a file, not a pipe nobody drains: a chatty child must never block on it.
        err = tempfile.TemporaryFile()
        # stdin stays open as a lifeline: the child exits when it reads EOF, i.e. when we die.
        # Own session: a Ctrl-C in the terminal reaches agentload, which then stops in order;
        # the mock must keep serving the in-flight requests until agentload stops it.
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, env=env,
                                start_new_session=True)
        try:
            bound = _wait_ready(proc, timeout_s)
        except BaseException as exc:
            _terminate(proc, 2.0)
            tail = _tail(err)
            err.close()
            if isinstance(exc, RuntimeError):
                raise RuntimeError(f"{exc}; mock stderr: {tail}") from None
            raise
        return cls(proc, cfg, host, bound, err)

    def stats(self, timeout_s: float = 5.0) -> dict[str, Any]:
        return self._call("GET", "/mock/stats", timeout_s)

    def reset_stats(self, timeout_s: float = 5.0) -> dict[str, Any]:
        return self._call("POST", "/mock/reset", timeout_s)

    def _call(self, method: str, path: str, timeout_s: float) -> dict[str, Any]:
        # no proxies: the mock is always on loopback
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        req = urllib.request.Request(self.base + path, method=method, data=b"" if method == "POST" else None)
        with opener.open(req, timeout=timeout_s) as resp:
            return json.loads(resp.read())

    def stderr_tail(self, limit: int = 2000) -> str:
        return _tail(self._stderr, limit) if not self._stderr.closed else ""

    def stop(self, timeout_s: float = 5.0) -> int | None:
        """SIGTERM, then SIGKILL after timeout_s. Returns the exit code. Idempotent."""
        code = _terminate(self.proc, timeout_s)
        if not self._stderr.closed:
            self._stderr.close()
        return code

    def __enter__(self) -> "MockProcess":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.proc.poll() is None else f"exited {self.proc.returncode}"
        return f"<MockProcess pid={self.pid} {self.url} {state}>"


def _wait_ready(proc: subprocess.Popen, timeout_s: float) -> int:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    buf = b""
    fd = proc.stdout.fileno()
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"mock server not ready within {timeout_s:g} s")
            if not sel.select(timeout=min(left, 0.5)):
                if proc.poll() is not None:
                    raise RuntimeError(f"mock server exited with status {proc.returncode}")
                continue
            data = os.read(fd, 4096)
            if not data:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                raise RuntimeError(f"mock server exited with status {proc.returncode}")
            buf += data
            for line in buf.split(b"\n")[:-1]:
                text = line.decode(errors="replace").strip()
                if text.startswith(READY_PREFIX + " port="):
                    return int(text.split("port=", 1)[1].split()[0])


def _terminate(proc: subprocess.Popen, timeout_s: float) -> int | None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
    for stream in (proc.stdin, proc.stdout):
        if stream is not None:
            try:
                stream.close()
            except OSError:
                pass
    return proc.returncode


def _tail(f: Any, limit: int = 2000) -> str:
    try:
        f.flush()
        f.seek(0)
        data = f.read()
    except (OSError, ValueError):
        return ""
    text = data.decode(errors="replace").strip()
    return text[-limit:] if text else "(empty)"
