"""The one process supervisor (agentload.process.ChildProcess) and the one atomic writer
(agentload.atomic.write_atomic), on their own; the mock, --workers, smg and bench suites run them
for real.

- Ready by a stdout line (several children at once too) or by a URL answering; a child that exits
  first or never gets ready gives one line naming it, and is stopped.
- stop(): SIGTERM to the process group, SIGKILL after a bounded grace; a grandchild goes too; the
  `with` block stops the child when the test body fails; a child nobody stopped is killed when
  the parent interpreter exits.
- repr() shows pid, state and command.
- start_listening: a server on a free port, ready when its URL answers, its output in a log file;
  a port taken by another process before the child binds it means a new start on a new port
  (whether the child's log says "address already in use" or it just exits), bounded; any other
  failure is one error naming the child, its exit or its wait, and its log's tail, at once.
- write_atomic: the whole new content or the old file, never a temporary file left over; the
  file's mode is kept.
"""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

import agentload.process as process
from agentload.atomic import write_atomic
from agentload.process import (
    ChildProcess,
    NotReady,
    free_port,
    start_listening,
    wait_lines,
)

PY = sys.executable


def _py(code: str) -> list[str]:
    return [PY, "-c", textwrap.dedent(code)]


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_ready_line_repr_and_a_clean_stop():
    c = ChildProcess.start(_py("""
        import signal, sys, time
        signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
        print("noise", flush=True)
        print("READY port=4242", flush=True)
        time.sleep(60)
    """), name="demo child")
    assert repr(c).startswith(f"<ChildProcess demo child pid={c.pid} starting: {PY} -c")
    assert c.wait_line("READY port=", 10) == "READY port=4242"
    assert f"pid={c.pid} running:" in repr(c) and c.poll() is None
    t0 = time.monotonic()
    assert c.stop(grace_s=5) == 0  # exited on SIGTERM, not killed
    assert time.monotonic() - t0 < 5
    assert "exited 0" in repr(c) and c.stop() == 0  # idempotent


def test_sigkill_after_the_grace_when_sigterm_is_ignored_and_grandchildren_go_too():
    c = ChildProcess.start(_py("""
        import signal, subprocess, sys, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        g = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"])
        print(f"READY {g.pid}", flush=True)
        time.sleep(60)
    """), name="stubborn")
    grandchild = int(c.wait_line("READY ", 10).split()[1])
    t0 = time.monotonic()
    assert c.stop(grace_s=0.3) == -9
    assert 0.3 <= time.monotonic() - t0 < 5
    assert "killed by SIGKILL" in repr(c)
    deadline = time.monotonic() + 5
    while not _gone(grandchild):
        assert time.monotonic() < deadline, "the grandchild outlived stop()"
        time.sleep(0.05)


def test_exit_before_ready_and_timeout_are_one_line():
    c = ChildProcess.start(_py("import sys; sys.exit(3)"), name="quitter")
    with pytest.raises(NotReady) as info:
        c.wait_line("READY", 10)
    assert str(info.value) == "quitter exited with status 3" and info.value.exited and info.value.returncode == 3
    c.stop()
    c = ChildProcess.start(_py("import time; time.sleep(60)"), name="sleeper")
    with pytest.raises(NotReady) as info:
        c.wait_line("READY", 0.3)
    assert str(info.value) == "sleeper not ready within 0.3 s" and not info.value.exited
    assert c.stop(grace_s=5) == -15


def test_several_children_at_once():
    kids = [ChildProcess.start(_py(f"import time; time.sleep({0.1 * i}); print('UP {i}', flush=True); "
                                   "time.sleep(60)"), name=f"kid {i}") for i in range(3)]
    try:
        assert wait_lines(kids, "UP", 10) == ["UP 0", "UP 1", "UP 2"]
    finally:
        for k in kids:
            k.kill()
    kids = [ChildProcess.start(_py("import time; time.sleep(60)"), name=f"late {i}") for i in range(2)]
    try:
        with pytest.raises(NotReady) as info:
            wait_lines(kids, "UP", 0.3)
        assert info.value.pending == 2
    finally:
        for k in kids:
            k.kill()


def test_ready_by_url():
    c = ChildProcess.start([PY, "-m", "http.server", "--bind", "127.0.0.1", "0"], name="http.server",
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    with c:
        port = int(c.wait_line("Serving HTTP on", 10).split(" port ")[1].split()[0])
        assert c.wait_url(f"http://127.0.0.1:{port}/", 10) is True
        with pytest.raises(NotReady) as info:  # answers, but never as wanted
            c.wait_url(f"http://127.0.0.1:{port}/nothing-here", 0.3)
        assert info.value.last.startswith("404") and "not ready within 0.3 s" in str(info.value)
    assert c.stopped and c.poll() is not None
    c = ChildProcess.start(_py("import sys; sys.exit(2)"), name="gone")
    with pytest.raises(NotReady) as info:
        c.wait_url("http://127.0.0.1:9/", 5)
    assert str(info.value) == "gone exited with status 2"
    c.stop()


def _http_server(ports):
    return [PY, "-m", "http.server", "--bind", "127.0.0.1", str(ports[0])]


def _root(ports):
    return [f"http://127.0.0.1:{ports[0]}/"]


@pytest.fixture
def held_port():
    """A port another process took between `free_port` and the child's bind: the first one
    start_listening is given is held by a listening socket of this test's own."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def _first_port_held(monkeypatch, held: int, times: int = 1) -> list[int]:
    given: list[int] = []
    real = process.free_port

    def free_port(host="127.0.0.1"):
        given.append(held if len(given) < times else real(host))
        return given[-1]

    monkeypatch.setattr(process, "free_port", free_port)
    return given


def test_start_listening_on_a_free_port_logs_and_stops(tmp_path):
    log = tmp_path / "server.log"
    srv = start_listening(_http_server, _root, name="http.server", log_path=log, timeout_s=20)
    try:
        assert srv.child.poll() is None and srv.ready is True and srv.base == f"http://127.0.0.1:{srv.port}"
        assert srv.argv[-1] == str(srv.port) and "http.server" in repr(srv.child)
        process.http_get(srv.base + "/")
        deadline = time.monotonic() + 5  # its request line reaches the log (its stderr)
        while '"GET / HTTP' not in srv.log_tail():
            assert time.monotonic() < deadline, srv.log_tail()
            time.sleep(0.05)
    finally:
        srv.stop(grace_s=5)
    assert srv.child.stopped and srv.child.returncode is not None and _gone(srv.child.pid)
    with socket.socket() as s:  # the port is free again
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", srv.port))


def test_a_port_taken_before_the_child_binds_it_is_a_new_start_on_a_new_port(tmp_path, monkeypatch, held_port):
    given = _first_port_held(monkeypatch, held_port)
    log = tmp_path / "server.log"
    srv = start_listening(_http_server, _root, name="http.server", log_path=log, timeout_s=20)
    try:
        assert given[0] == held_port and srv.port == given[1] != held_port
        assert "address already in use" in log.read_text().lower()  # the first start's own words
        assert srv.ready is True
    finally:
        srv.stop()


def test_a_child_that_exits_while_its_port_is_held_elsewhere_starts_again_a_bounded_number_of_times(
        tmp_path, monkeypatch, held_port):
    """No "address already in use" in its log (llama-server words it otherwise): its port held by
    another process after it exited says the same. Never more than `attempts` starts."""
    given = _first_port_held(monkeypatch, held_port, times=99)
    starts = []

    def quits(ports):
        starts.append(ports)
        return _py("import sys; print('could not bind', flush=True); sys.exit(1)")

    with pytest.raises(NotReady) as info:
        start_listening(quits, _root, name="quitter", log_path=tmp_path / "q.log", timeout_s=20, attempts=3)
    assert len(starts) == 3 and given == [held_port] * 3
    msg = str(info.value)
    assert msg.startswith("quitter exited with status 1 (its port was taken 3 times); q.log: could not bind"), msg
    assert info.value.exited and info.value.child.stopped


def test_any_other_failure_is_one_error_with_the_log_at_once(tmp_path):
    starts = []

    def broken(ports):
        starts.append(ports)
        return _py("import sys; print('bad config line 3', file=sys.stderr); sys.exit(2)")

    with pytest.raises(NotReady) as info:
        start_listening(broken, _root, name="broken", log_path=tmp_path / "b.log", timeout_s=20)
    assert len(starts) == 1
    assert str(info.value) == "broken exited with status 2; b.log: bad config line 3", str(info.value)

    def silent(ports):  # listens on nothing, never answers: bounded, then killed
        return _py("import time; time.sleep(60)")

    with pytest.raises(NotReady) as info:
        start_listening(silent, _root, name="silent", log_path=tmp_path / "s.log", timeout_s=0.5)
    assert not info.value.exited and "silent not ready within 0.5 s" in str(info.value)
    assert info.value.child.stopped and _gone(info.value.child.pid)


def test_free_port_is_one_nothing_listens_on():
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_the_with_block_stops_the_child_when_the_body_fails():
    with pytest.raises(ZeroDivisionError):
        with ChildProcess.start(_py("import time; time.sleep(60)"), name="victim") as c:
            1 / 0  # noqa: B018 (the error raised inside the block is the point)
    assert c.stopped and _gone(c.pid)


def test_a_child_nobody_stopped_dies_with_the_parent_interpreter(tmp_path):
    """The parent fails with an exception and never calls stop(): atexit still stops the child."""
    pid_file = tmp_path / "pid"
    p = subprocess.run(_py(f"""
        import sys, time
        from agentload.process import ChildProcess
        c = ChildProcess.start([sys.executable, "-c", "import time; time.sleep(60)"], name="orphan")
        open({str(pid_file)!r}, "w").write(str(c.pid))
        raise SystemExit("the parent failed")
    """), capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and "the parent failed" in p.stderr
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while not _gone(pid):
        assert time.monotonic() < deadline, f"child {pid} outlived its parent"
        time.sleep(0.05)


def test_write_atomic_replaces_whole_and_keeps_the_mode(tmp_path):
    f = tmp_path / "run.json"
    write_atomic(f, b"one")
    assert f.read_bytes() == b"one"
    f.chmod(0o640)
    write_atomic(f, b"two" * 100_000, fsync=True)
    assert f.read_bytes() == b"two" * 100_000
    assert stat.S_IMODE(f.stat().st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]  # no temporary file left


def test_write_atomic_leaves_the_old_file_when_it_fails(tmp_path, monkeypatch):
    f = tmp_path / "summary.json"
    write_atomic(f, b"old")

    def boom(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        write_atomic(f, b"new")
    assert f.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]
