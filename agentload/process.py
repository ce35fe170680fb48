"""One small supervisor for the child processes agentload, its tests and its benchmark start.

Used by the embedded mock server (`agentload.mock.process`), `--workers` (`agentload.cluster.processes`),
the fleet's router (`agentload.fleet`), the servers the tests start (routers, proxies, llama.cpp)
and the benchmark's server (`bench/run.py`):

    child = ChildProcess.start(cmd, name="mock server", lifeline=True, stderr=errfile)
    line = child.wait_line("AGENTLOAD_MOCK_READY port=", timeout_s=15)   # or child.wait_url(url, ...)
    ...
    child.stop(grace_s=5)          # SIGTERM to its process group, SIGKILL after grace_s; reaped

- Every child gets its own session, so its own process group: a Ctrl-C in the terminal reaches
  only the parent (which stops its children in order), and `stop()` signals the whole group, so a
  grandchild (a shell, `taskset`, a launcher) goes too.
- Readiness: a line on the child's stdout that starts with a given prefix (`wait_line`,
  `wait_lines` for several children at once), or a URL that answers as wanted (`wait_url`, on
  loopback, never through a proxy). Both are bounded and notice a child that exits first; they
  raise `NotReady`, a RuntimeError whose message is one line (`<name> not ready within 15 s`,
  `<name> exited with status 1`) and whose fields let the caller word its own.
- Never a leak: `stop()` is idempotent and bounded (SIGTERM, `grace_s`, SIGKILL, then reap); the
  `with` block stops the child however it ends; a child never stopped is killed when the
  interpreter exits (atexit); `lifeline=True` keeps a pipe on the child's stdin whose EOF tells
  it the parent is gone (the child must watch it), and `die_with_parent=True` asks Linux to
  SIGKILL it when the parent dies (PR_SET_PDEATHSIG).
- A server on free ports: `start_listening(command, ready_urls, ...)` picks free loopback ports
  (`free_port`), starts `command(ports)` with its output appended to a log file, and waits until
  its readiness URLs answer. A port found free can be taken by another process before the child
  binds it: a child that then fails (its log says "address already in use", or it exited and its
  port is held by someone else) is started again on new ports, a bounded number of times.
- The child is reaped only in `stop()` (`poll()` and `wait_exit()` look without reaping where
  the OS allows it), so its process group id cannot be reused before `stop()` has signalled it.

A leaf module: imports nothing of agentload.
"""

from __future__ import annotations

import atexit
import os
import selectors
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable, Sequence

__all__ = ["ChildProcess", "Listening", "NotReady", "free_port", "log_tail", "start_listening", "wait_lines"]

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback only, never a proxy
_WAITID = hasattr(os, "waitid") and hasattr(os, "WNOWAIT")
_CMD_REPR = 100  # characters of the command shown by repr()


class NotReady(RuntimeError):
    """A child did not become ready: it exited first (`exited`, `returncode`) or the time ran out
    (`timeout_s`; `last` is the last answer a readiness URL gave, `pending` how many children of
    a `wait_lines` were still not ready)."""

    def __init__(self, message: str, child: "ChildProcess", *, exited: bool, timeout_s: float,
                 last: str | None = None, pending: int = 1):
        super().__init__(message)
        self.child = child
        self.exited = exited
        self.returncode = child.poll() if exited else None
        self.timeout_s = timeout_s
        self.last = last
        self.pending = pending


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


class ChildProcess:
    """One command in its own process group; see the module docstring."""

    def __init__(self, proc: subprocess.Popen, name: str, cmd: Sequence[str]):
        self.proc = proc
        self.name = name
        self.cmd = list(cmd)
        self.ready = False
        self.stopped = False
        self._buf = b""  # stdout read while looking for the ready line, past the last full line
        self._lock = threading.RLock()  # one stop at a time (atexit, a signal handler, the main path)
        _LIVE.add(self)

    @classmethod
    def start(cls, cmd: Sequence[str], *, name: str, env: dict[str, str] | None = None, cwd: Any = None,
              lifeline: bool = False, stdout: int | IO[Any] | None = subprocess.PIPE,
              stderr: int | IO[Any] | None = None, die_with_parent: bool = False) -> "ChildProcess":
        """Start `cmd` in a new session (its own process group). `lifeline`: stdin is a pipe kept
        open (`self.stdin`) until stop(), else /dev/null. `stdout` must stay a pipe for
        `wait_line`; `stderr` None inherits the parent's."""
        proc = subprocess.Popen(list(cmd), stdin=subprocess.PIPE if lifeline else subprocess.DEVNULL,
                                stdout=stdout, stderr=stderr, env=env, cwd=cwd, start_new_session=True,
                                preexec_fn=_die_with_parent if die_with_parent else None)
        return cls(proc, name, cmd)

    # ------------------------------------------------------------ state

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def stdin(self) -> IO[bytes] | None:
        return self.proc.stdin

    @property
    def returncode(self) -> int | None:
        return self.poll()

    def poll(self) -> int | None:
        """The exit status if the child has exited (negative: killed by that signal), else None.
        Does not reap it (where the OS allows), so its group id stays reserved until stop()."""
        if self.proc.returncode is not None:
            return self.proc.returncode
        if not _WAITID:
            return self.proc.poll()
        try:
            info = os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:  # reaped by someone else (os.wait in the parent): ask Popen
            return self.proc.poll()
        if info is None or info.si_pid == 0:
            return None
        return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status

    @property
    def state(self) -> str:
        code = self.poll()
        if code is None:
            return "running" if self.ready else "starting"
        if code < 0:
            try:
                return f"killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exited {code}"

    def __repr__(self) -> str:
        cmd = " ".join(self.cmd)
        if len(cmd) > _CMD_REPR:
            cmd = cmd[:_CMD_REPR - 3] + "..."
        return f"<ChildProcess {self.name} pid={self.pid} {self.state}: {cmd}>"

    # ------------------------------------------------------------ readiness

    def wait_line(self, prefix: str, timeout_s: float) -> str:
        """Wait for a stdout line that starts with `prefix`; return that line (stripped)."""
        return wait_lines([self], prefix, timeout_s)[0]

    def _lines(self, data: bytes) -> list[str]:
        self._buf += data
        *lines, self._buf = self._buf.split(b"\n")
        return [ln.decode(errors="replace").strip() for ln in lines]

    def wait_url(self, url: str, timeout_s: float, ok: Callable[[int, bytes], Any] | None = None,
                 every_s: float = 0.1, probe_timeout_s: float = 2.0) -> Any:
        """Poll `url` (GET) until `ok(status, body)` is truthy (default: status 200); return what
        `ok` returned. An `OSError` or `ValueError` from the probe or from `ok` is a failed probe."""
        check = ok or (lambda status, body: status == 200)
        deadline = time.monotonic() + timeout_s
        last = "no answer"
        while True:
            if self.poll() is not None:
                raise NotReady(f"{self.name} exited with status {self.poll()}", self, exited=True,
                               timeout_s=timeout_s, last=last)
            try:
                status, body = http_get(url, timeout_s=min(probe_timeout_s, max(0.1, deadline - time.monotonic())))
                last = f"{status} {body[:200]!r}"
                got = check(status, body)
                if got:
                    self.ready = True
                    return got
            except (OSError, ValueError) as e:
                last = repr(e)
            if time.monotonic() >= deadline:
                raise NotReady(f"{self.name} not ready within {timeout_s:g} s (last {url}: {last})", self,
                               exited=False, timeout_s=timeout_s, last=last)
            time.sleep(every_s)

    # ------------------------------------------------------------ signals and stop

    def _signal_group(self, sig: int) -> None:
        """Signal the child's process group; only while the child is unreaped (its id is ours)."""
        if self.proc.returncode is not None:
            return
        try:
            if hasattr(os, "killpg"):
                os.killpg(self.proc.pid, sig)
            else:  # pragma: no cover - no process groups
                os.kill(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def send_signal(self, sig: int) -> None:
        """Signal the child itself (not its group), if it has not exited."""
        if self.poll() is None:
            try:
                os.kill(self.proc.pid, sig)
            except ProcessLookupError:
                pass

    def wait_exit(self, timeout_s: float) -> int | None:
        """Wait up to timeout_s for the child to exit, without reaping it; its status or None."""
        deadline = time.monotonic() + timeout_s
        pause = 0.005
        while True:
            code = self.poll()
            if code is not None:
                return code
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            if not _WAITID:
                try:
                    return self.proc.wait(timeout=left)
                except subprocess.TimeoutExpired:
                    return None
            time.sleep(min(pause, left))
            pause = min(pause * 2, 0.05)

    def stop(self, grace_s: float = 5.0) -> int | None:
        """SIGTERM to the process group, SIGKILL after grace_s (at once with grace_s=0), then
        SIGKILL to whatever is left in the group, reap, close the pipes. Returns the exit status
        (negative: the signal that killed it). Idempotent, bounded, safe from any thread."""
        with self._lock:
            if self.proc.returncode is None:
                if self.poll() is None and grace_s > 0:
                    self._signal_group(signal.SIGTERM)
                    self.wait_exit(grace_s)
                if self.poll() is None:
                    self._signal_group(signal.SIGKILL)
                    self.wait_exit(5.0)
                self._signal_group(signal.SIGKILL)  # stragglers: the group id is still the child's
                try:
                    self.proc.wait(timeout=5.0)
                except subprocess.TimeoutExpired:  # unkillable (uninterruptible sleep): nothing more to do
                    pass
            for f in (self.proc.stdin, self.proc.stdout):
                if f is not None:
                    try:
                        f.close()
                    except OSError:
                        pass
            self.stopped = True
            _LIVE.discard(self)
            return self.proc.returncode

    def kill(self) -> int | None:
        """SIGKILL now (stop with no grace)."""
        return self.stop(grace_s=0)

    def __enter__(self) -> "ChildProcess":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def wait_lines(children: Sequence[ChildProcess], prefix: str, timeout_s: float) -> list[str]:
    """Wait until every child printed a stdout line starting with `prefix`; return those lines in
    the children's order. Raises NotReady for the first child that exits before it (`child`), or
    when the time runs out (`pending`: how many were still not ready)."""
    lines: dict[int, str] = {}
    pending = {c.proc.stdout.fileno(): c for c in children if c.proc.stdout is not None}
    if len(pending) < len(children):
        raise ValueError("wait_lines needs children started with stdout=subprocess.PIPE")
    deadline = time.monotonic() + timeout_s
    with selectors.DefaultSelector() as sel:
        for fd in pending:
            sel.register(fd, selectors.EVENT_READ)
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                first = next(iter(pending.values()))
                raise NotReady(f"{first.name} not ready within {timeout_s:g} s", first, exited=False,
                               timeout_s=timeout_s, pending=len(pending))
            for key, _ in sel.select(timeout=min(left, 0.5)):
                fd = key.fd
                c = pending[fd]
                data = os.read(fd, 4096)
                if not data:  # stdout closed: the child is exiting
                    if c.wait_exit(max(0.1, deadline - time.monotonic())) is None:
                        raise NotReady(f"{c.name} not ready within {timeout_s:g} s", c, exited=False,
                                       timeout_s=timeout_s, pending=len(pending))
                    raise NotReady(f"{c.name} exited with status {c.poll()}", c, exited=True,
                                   timeout_s=timeout_s, pending=len(pending))
                for line in c._lines(data):
                    if line.startswith(prefix):
                        lines[id(c)] = line
                        c.ready = True
                        sel.unregister(fd)
                        del pending[fd]
                        break
            for c in list(pending.values()):
                if c.poll() is not None:
                    raise NotReady(f"{c.name} exited with status {c.poll()}", c, exited=True,
                                   timeout_s=timeout_s, pending=len(pending))
    return [lines[id(c)] for c in children]


def http_get(url: str, timeout_s: float = 5.0) -> tuple[int, bytes]:
    """GET without any proxy; (status, body), also for an HTTP error status."""
    try:
        with _OPENER.open(url, timeout=timeout_s) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


# ------------------------------------------------------------ a server on free ports

IN_USE = "address already in use"  # how servers (Rust, C, Python) word a port taken under them
START_ATTEMPTS = 3


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on at this moment (bound to port 0, read, closed). Another
    process can take it before a child binds it: `start_listening` starts again on a new one."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _port_held(host: str, port: int) -> bool:
    """Someone listens on `port` (SO_REUSEADDR: a closed connection's TIME_WAIT does not count)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def log_tail(path: Path | str, limit: int = 3000, start: int = 0) -> str:
    """The last `limit` characters of a log file from byte `start` on ("" if it cannot be read)."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(start, size - 4 * limit))
            return f.read().decode(errors="replace")[-limit:]
    except OSError:
        return ""


@dataclass
class Listening:
    """A server `start_listening` started and saw ready: its process, the ports it was given (the
    first is `port`), its command line and what the first readiness check returned."""

    child: ChildProcess
    ports: tuple[int, ...]
    argv: list[str]
    log_path: Path
    ready: Any
    host: str = "127.0.0.1"

    @property
    def port(self) -> int:
        return self.ports[0]

    @property
    def base(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def log_tail(self, limit: int = 3000) -> str:
        return log_tail(self.log_path, limit)

    def stop(self, grace_s: float = 5.0) -> int | None:
        """SIGTERM to its process group, SIGKILL after `grace_s` (at once with 0); idempotent."""
        return self.child.stop(grace_s)


def start_listening(command: Callable[[tuple[int, ...]], Sequence[str]],
                    ready_urls: Callable[[tuple[int, ...]], Sequence[str]], *, name: str, log_path: Path | str,
                    timeout_s: float, ports: int = 1, ok: Callable[[int, bytes], Any] | None = None,
                    env: dict[str, str] | None = None, cwd: Any = None, every_s: float = 0.1,
                    probe_timeout_s: float = 2.0, host: str = "127.0.0.1",
                    describe_log: Callable[[], str] | None = None,
                    attempts: int = START_ATTEMPTS) -> Listening:
    """Start `command(ports)` on `ports` free ports of `host`, its stdout and stderr appended to
    `log_path`, and wait until each of `ready_urls(ports)` answers in turn (the first as `ok` says,
    default status 200; the others 200), each within `timeout_s`, or the child exits.

    A child whose port was taken between `free_port` and its bind (its log since this start says
    "address already in use", or it exited and one of its ports is now held by another process) is
    killed and started again on new ports, at most `attempts` starts in all. Anything else that
    keeps it from getting ready is not tried again. Either way it is killed and NotReady raised:
    `<why>; <log file name>: <the log's tail>` (`describe_log()` in place of that tail if given).
    The caller stops the returned server: `.child.stop(grace_s)` (SIGTERM, then SIGKILL)."""
    log_path = Path(log_path)
    for attempt in range(1, attempts + 1):
        got = tuple(free_port(host) for _ in range(ports))
        argv = list(command(got))
        try:
            offset = log_path.stat().st_size
        except OSError:
            offset = 0
        with open(log_path, "ab") as log:
            child = ChildProcess.start(argv, name=name, stdout=log, stderr=log, env=env, cwd=cwd,
                                       die_with_parent=True)
        try:
            urls = list(ready_urls(got))
            ready = child.wait_url(urls[0], timeout_s, ok, every_s=every_s, probe_timeout_s=probe_timeout_s)
            for url in urls[1:]:
                child.wait_url(url, timeout_s, every_s=every_s, probe_timeout_s=probe_timeout_s)
            return Listening(child, got, argv, log_path, ready, host)
        except BaseException as e:
            child.kill()
            if not isinstance(e, NotReady):
                raise
            taken = (IN_USE in log_tail(log_path, start=offset).lower()
                     or (e.exited and any(_port_held(host, p) for p in got)))
            if taken and attempt < attempts:
                continue
            why = f"{e} (its port was taken {attempt} times)" if taken else str(e)
            tail = describe_log() if describe_log is not None else log_tail(log_path)
            raise NotReady(f"{why}; {log_path.name}: {tail.strip()}", child, exited=e.exited,
                           timeout_s=timeout_s, last=e.last) from None
    raise AssertionError("unreachable")  # (the loop returns or raises)


_LIVE: set[ChildProcess] = set()


@atexit.register
def _stop_leftovers() -> None:
    """At interpreter exit, no child outlives the parent: SIGTERM them all, 1 s, SIGKILL."""
    left = [c for c in list(_LIVE) if c.poll() is None]
    for c in left:
        c._signal_group(signal.SIGTERM)
    deadline = time.monotonic() + 1.0
    for c in left:
        c.wait_exit(max(0.0, deadline - time.monotonic()))
    for c in list(_LIVE):
        c.stop(grace_s=0)
