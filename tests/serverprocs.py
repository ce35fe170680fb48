"""What the tests' server helpers share: a server started on a free loopback port and waited for by
`agentload.process.start_listening` (`Server`), mock backends with a router in front of them
(`RouterStack`, and `router_stack`, the fixture the router suites build from it), and a server
paused with SIGSTOP once a run has finished a given round (`paused_after_round`).

    class LlamaServer(Server): ...               # its command line, its readiness URL
    stack = router_stack(lambda tmp_path, worker_urls, *a, **kw: SmgProcess.start(worker_urls, ...))
    def test_x(stack):
        router, (a, b) = stack([MockConfig(), MockConfig()], FLAGS)
"""

from __future__ import annotations

import functools
import signal
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import orjson
import pytest

from agentload.mock.config import MockConfig
from agentload.mock.process import MockProcess
from agentload.process import ChildProcess, Listening


class Server:
    """One server process a test started (`start_listening`); `url` is the OpenAI base URL
    agentload's `--endpoint` takes. `stop()` kills its process group (SIGKILL, reaped; `STOP_GRACE_S`
    above 0: SIGTERM first) and is idempotent; `with` stops it too."""

    STOP_GRACE_S = 0.0  # a server that keeps no state worth a clean exit

    def __init__(self, started: Listening):
        self.started = started
        self.child = started.child
        self.port = started.port
        self.log_path = started.log_path
        self.argv = started.argv

    @property
    def pid(self) -> int:
        return self.child.pid

    @property
    def base(self) -> str:
        return self.started.base

    @property
    def url(self) -> str:
        return self.base + "/v1"

    def log_tail(self, limit: int = 3000) -> str:
        return self.started.log_tail(limit)

    def alive(self) -> bool:
        return self.child.poll() is None

    def stop(self) -> int | None:
        return self.child.stop(self.STOP_GRACE_S)

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.base} {self.child!r}>"


class RouterStack:
    """Mock backends (real `agentload.mock` processes) with a router in front:
    `start(backends, *args, **kw)` starts one mock per config, then
    `start_router([mock.base ...], *args, **kw)`, and returns (router, mocks). `stop()` stops
    everything started, last first, also what a start that failed half-way had started."""

    def __init__(self, start_router: Callable[..., Any]):
        self.start_router = start_router
        self.started: list[Any] = []

    def start(self, backends: list[MockConfig], *args: Any, **kw: Any) -> tuple[Any, list[MockProcess]]:
        mocks = []
        for cfg in backends:
            m = MockProcess.start(cfg)
            self.started.append(m)
            mocks.append(m)
        router = self.start_router([m.base for m in mocks], *args, **kw)
        self.started.append(router)
        return router, mocks

    def stop(self) -> None:
        while self.started:
            self.started.pop().stop()

    def __enter__(self) -> "RouterStack":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def router_stack(start_router: Callable[..., Any]) -> Any:
    """A `stack` fixture for a router suite: `stack(backends, *args, **kw) -> (router, mocks)`
    (RouterStack.start) with `start_router(tmp_path, worker_urls, *args, **kw)`; all of it is
    stopped at teardown."""

    @pytest.fixture
    def stack(tmp_path):
        with RouterStack(functools.partial(start_router, tmp_path)) as s:
            yield s.start

    return stack


def _agent_round(line: bytes) -> int | None:
    """The round of an agent record line (None: a canary, a blank or a torn line)."""
    try:
        d = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    return d.get("round") if d.get("kind") == "agent" else None


@contextmanager
def paused_after_round(child: ChildProcess, records: Path, round_: int = 1,
                       within_s: float = 120.0) -> Iterator[threading.Event]:
    """SIGSTOP `child` as soon as `records` (a run's records.jsonl, polled every 20 ms, for at most
    `within_s`) holds an agent record of round `round_`; the Event yielded is set once it is
    stopped. On leaving the block: SIGCONT (the caller stops the server)."""
    stopped, done = threading.Event(), threading.Event()

    def watch() -> None:
        deadline = time.monotonic() + within_s
        while not done.is_set() and time.monotonic() < deadline:
            try:
                lines = records.read_bytes().splitlines()
            except OSError:
                lines = []
            if any(_agent_round(ln) == round_ for ln in lines):
                child.send_signal(signal.SIGSTOP)
                stopped.set()
                return
            time.sleep(0.02)

    watcher = threading.Thread(target=watch, daemon=True, name="pause-after-round")
    watcher.start()
    try:
        yield stopped
    finally:
        done.set()
        watcher.join(5)
        child.send_signal(signal.SIGCONT)
