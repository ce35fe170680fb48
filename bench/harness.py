"""What the benchmark scripts share: the bench server as a child process, one client run to its end,
CPU pinning, process-tree CPU time, the machine line and small figures. Imported by bench.run and its
side tables (scale, peers, ab, idle, callgrind, cluster, proxy); it imports none of them.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
import psutil

from agentload.process import ChildProcess, NotReady

REPO = Path(__file__).resolve().parents[1]
READY = "BENCH_SERVER_LISTENING"


def cpus() -> tuple[str | None, str | None]:
    """taskset CPU lists for the server and the client, or None where pinning is not possible."""
    n = os.cpu_count() or 1
    if n < 2 or shutil.which("taskset") is None:
        return None, None
    try:
        allowed = sorted(os.sched_getaffinity(0))
    except AttributeError:
        allowed = list(range(n))
    if len(allowed) < 2:
        return None, None
    return str(allowed[0]), ",".join(str(c) for c in allowed[1:])


def pinned(cmd: list[str], cpu: str | None) -> list[str]:
    return (["taskset", "-c", cpu] + cmd) if cpu is not None else cmd


def bench_env(code: Path | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in (code, REPO, env.get("PYTHONPATH")) if p)
    return env


class Server:
    """bench/server.py as a child process (agentload.process.ChildProcess); its stdin is a
    lifeline (EOF: it exits)."""

    def __init__(self, cpu: str | None, ttft_ms: float, chunks: int, interval_ms: float, timeout_s: float = 15.0):
        cmd = pinned([sys.executable, "-m", "bench.server", "--port", "0", "--ttft-ms", str(ttft_ms),
                       "--chunks", str(chunks), "--interval-ms", str(interval_ms)], cpu)
        self.child = ChildProcess.start(cmd, name="bench server", env=bench_env(), cwd=REPO, lifeline=True,
                                        stderr=subprocess.DEVNULL)
        try:
            self.port = int(self.child.wait_line(READY + " port=", timeout_s).split("port=")[1])
        except BaseException as e:
            self.stop()
            if isinstance(e, NotReady):
                raise RuntimeError("bench server did not start") from None
            raise
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.ps = psutil.Process(self.child.pid)

    def cpu_s(self) -> float:
        t = self.ps.cpu_times()
        return t.user + t.system

    def stop(self) -> None:
        self.child.stop(grace_s=5)

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def client(module: str, args: list[str], cpu: str | None, timeout_s: float, server: Server,
           code: Path | None = None) -> dict[str, Any]:
    """Run one benchmark client (bench.baseline or bench.agentload_client) to its end and return
    its result. The result goes through a file (`--result`), read whole after the child exits: at
    512 streams x 40 requests it holds 20,480 timing errors, a few hundred KB, and a line read
    from a pipe must not be where it gets cut. `code`: a folder holding another copy of the
    agentload package, imported instead of this one (the client runs there; bench/ is this one)."""
    with tempfile.TemporaryDirectory(prefix="agentload-bench-result-") as tmp:
        result = Path(tmp) / "result.json"
        cmd = pinned([sys.executable, "-m", module, *args, "--result", str(result)], cpu)
        s0, t0 = server.cpu_s(), time.perf_counter()
        p = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           env=bench_env(code), cwd=code or REPO, timeout=timeout_s, check=False)
        s1, t1 = server.cpu_s(), time.perf_counter()
        err = p.stderr.decode(errors="replace")[-2000:]
        if p.returncode != 0:
            raise RuntimeError(f"{module} failed ({p.returncode}): {err}")
        try:
            res = orjson.loads(result.read_bytes())
        except (OSError, orjson.JSONDecodeError) as e:
            raise RuntimeError(f"{module} exited 0 but left no readable result ({e}): {err}") from None
    # the server's CPU over the client's whole process lifetime (its load window is a bit shorter)
    res["server_cpu"] = (s1 - s0) / max(t1 - t0, 1e-9)
    return res


def pct(values: list[int] | list[float], q: float) -> float | None:
    if not values:
        return None
    v = sorted(values)
    return float(v[min(len(v) - 1, int(q * len(v)))])


def took(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def machine() -> str:
    model = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import aiohttp

    try:
        import uvloop

        uv = uvloop.__version__
    except ImportError:
        uv = "none"
    return (f"{os.cpu_count()} CPUs, {model or 'unknown CPU'}; Python {platform.python_version()}, "
            f"aiohttp {aiohttp.__version__}, uvloop {uv}; {platform.platform()}")


TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_s(pid: int) -> float:
    """utime + stime of one process so far (its threads included), seconds."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        rest = f.read().rsplit(b")", 1)[1].split()
    return (int(rest[11]) + int(rest[12])) / TICK


def proc_cpu(pid: int) -> float:
    """utime + stime + cutime + cstime of one process (its reaped children included), seconds."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        rest = f.read().rsplit(b")", 1)[1].split()
    return (int(rest[11]) + int(rest[12]) + int(rest[13]) + int(rest[14])) / TICK


def descendants(pid: int) -> list[int]:
    """pid and its descendants, from /proc/<pid>/task/<tid>/children (psutil where that is missing)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for tid in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{tid}/children", "rb") as f:
                    todo.extend(int(c) for c in f.read().split())
        except FileNotFoundError:
            if p == pid and not os.path.exists(f"/proc/{p}/task/{p}/children") and os.path.exists(f"/proc/{p}"):
                import psutil

                try:
                    return [pid] + [c.pid for c in psutil.Process(pid).children(recursive=True)]
                except psutil.Error:
                    return [pid]
        except (OSError, ValueError):
            pass
    return out


def tree_cpu(pid: int) -> float:
    """CPU seconds of a process and all its descendants (a child that exited and was reaped is in
    its parent's cutime/cstime, so the sum does not drop when one goes)."""
    total = 0.0
    for p in descendants(pid):
        try:
            total += proc_cpu(p)
        except (OSError, IndexError, ValueError):
            pass
    return total
