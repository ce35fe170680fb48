"""agentload's own health over time: resident memory, open file descriptors, sockets by state.

Sampled once a second by the runner's Sampler into samples.jsonl (key `proc`), so an hours-long
soak can show that the load generator itself stayed flat, and a verdict can tell a leaking
client from a hanging server. RSS, fds and threads cost a few /proc reads per sample; socket
states are scanned in a worker thread every SOCKETS_EVERY_S (their cost grows with the host's sockets).
"""

from __future__ import annotations

import os
import time
from collections import Counter
from typing import Any

import psutil

# /proc/net/tcp state codes
_TCP_STATES = {"01": "ESTABLISHED", "02": "SYN_SENT", "03": "SYN_RECV", "04": "FIN_WAIT1", "05": "FIN_WAIT2",
               "06": "TIME_WAIT", "07": "CLOSE", "08": "CLOSE_WAIT", "09": "LAST_ACK", "0A": "LISTEN",
               "0B": "CLOSING"}
# Reading /proc/net/tcp costs ~6.6 ms here whatever the number of sockets (the kernel walks its whole
# connection table, sized by RAM): every 10 s that was a quarter of an idle run's CPU. Socket states
# are for trends over a soak (a CLOSE_WAIT leak), which a scan a minute shows.
SOCKETS_EVERY_S = 60.0


def socket_states(pid: int | None = None) -> dict[str, int]:
    """This process's TCP sockets by state. Linux: its socket inodes (/proc/PID/fd) matched against
    /proc/PID/net/tcp{,6}; elsewhere psutil. Costs time proportional to the host's TCP sockets
    (tens of ms with thousands), so the Sampler runs it in a worker thread every SOCKETS_EVERY_S."""
    base = f"/proc/{pid or 'self'}"
    if not os.path.isdir(base + "/net"):
        conns = psutil.Process(pid or os.getpid()).net_connections(kind="tcp")
        return dict(sorted(Counter(c.status for c in conns).items()))
    inodes = set()
    for e in os.scandir(base + "/fd"):
        try:
            link = os.readlink(e.path)
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    out: Counter[str] = Counter()
    if inodes:
        for name in ("tcp", "tcp6"):
            try:
                with open(f"{base}/net/{name}", encoding="ascii") as f:
                    next(f, None)
                    for line in f:
                        parts = line.split(None, 10)
                        if len(parts) > 9 and parts[9] in inodes:
                            out[_TCP_STATES.get(parts[3], parts[3])] += 1
            except OSError:
                continue
    return dict(sorted(out.items()))


class ProcessHealth:
    """This process's RSS, fds and threads (cheap, every sample) and TCP sockets by state (scanned
    in a worker thread every SOCKETS_EVERY_S; each sample carries the latest scan)."""

    def __init__(self, pid: int | None = None, sockets_every_s: float = SOCKETS_EVERY_S):
        self.pid = pid
        self.proc = psutil.Process(pid or os.getpid())
        self.sockets_every_s = sockets_every_s
        self.sockets: dict[str, int] | None = None
        self._scanning = False
        self._last_scan = -1e18
        self.sockets_ok = True

    def _scan_done(self, fut) -> None:
        self._scanning = False
        try:
            self.sockets = fut.result()
        except Exception:
            self.sockets_ok = False  # e.g. /proc not readable: stop trying

    def _maybe_scan(self) -> None:
        import asyncio

        now = time.monotonic()
        if not self.sockets_ok or self._scanning or now - self._last_scan < self.sockets_every_s:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            try:
                self.sockets = socket_states(self.pid)
            except Exception:
                self.sockets_ok = False
            self._last_scan = now
            return
        self._scanning = True
        self._last_scan = now
        loop.run_in_executor(None, socket_states, self.pid).add_done_callback(self._scan_done)

    def sample(self) -> dict[str, Any]:
        p = self.proc
        out: dict[str, Any] = {}
        try:
            with p.oneshot():
                out["rss_mb"] = round(p.memory_info().rss / 1048576, 2)
                out["fds"] = p.num_fds() if hasattr(p, "num_fds") else None
                out["threads"] = p.num_threads()
        except psutil.Error:
            return out
        self._maybe_scan()
        if self.sockets is not None:
            out["sockets"] = self.sockets
        return out


def flatness(samples: list[dict[str, Any]], key: str, warmup_share: float = 0.25) -> dict[str, float] | None:
    """How much `proc[key]` moved after warm-up: first-third vs last-third medians and the max.

    A pure function over samples.jsonl lines, used by the soak test and usable by reports:
    `{"warm": median of the first third after warm-up, "end": median of the last third,
    "max": max after warm-up, "growth": end - warm}`.
    """
    vals = [s["proc"][key] for s in samples
            if isinstance(s.get("proc"), dict) and isinstance(s["proc"].get(key), (int, float))]
    if len(vals) < 6:
        return None
    post = vals[int(len(vals) * warmup_share):]
    third = max(1, len(post) // 3)
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    warm, end = med(post[:third]), med(post[-third:])
    return {"warm": warm, "end": end, "max": max(post), "min": min(post), "growth": round(end - warm, 3),
            "n": len(post)}
