"""The client pool beside a server stall: the requests that queued for a connection (`Waited`), the
windows in which stalled requests held the pool's connections (`StallWindows`), the pool's figures
apart from those windows (`PoolApart`, a second streamed pass), and the pool rule's test
(`pool_test`). A stall explains the queue in its windows; the pool rule judges the rest."""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

from agentload.analysis.stats import SparseHistogram, percentiles_ms
from agentload.records import Record
from agentload.records.phases import end_stamp, phase_begin, phase_ns

if TYPE_CHECKING:
    from agentload.records.rundir import RunData

# The pool explains the latency when pool_wait is this share of e2e (at p50 or p90) ...
POOL_WAIT_SHARE = 0.2
POOL_WAIT_MIN_MS = 5.0  # ... and at least this long at p90 (microseconds of queueing explain nothing)
POOL_WAITED_SHARE = 0.05  # ... and at least this share of requests waited for a connection


# Requests that queued while a server stall held connections are its consequence, unless they spent
# this many times as long queued there as the stalled requests held connections: then the pool was
# too small whatever the stall held (400 agents on a pool of 100, 50 of them hung: ~240 waiters)
POOL_BEYOND_HELD = 2.0


class Waited:
    """The requests that queued for a connection: how many, from which round, which agents."""

    __slots__ = ("n", "first_round", "agents")

    def __init__(self) -> None:
        self.n = 0
        self.first_round: int | None = None
        self.agents: set[int] = set()

    def add(self, r: Record) -> None:
        self.n += 1
        self.first_round = r.round if self.first_round is None else min(self.first_round, r.round)
        self.agents.add(r.agent)

    def __len__(self) -> int:
        return self.n


def queued_span(t: dict[str, int]) -> tuple[int, int] | None:
    """When a request waited for a connection: its last queued_start to its queued_end, or to its
    end when it was still queued then (aiohttp's connector queues a waiter again when another took
    the slot it was woken for); None when it never queued."""
    qs = t.get("queued_start")
    if qs is None:
        return None
    qe = t.get("queued_end")
    return qs, (qe if qe is not None and qe >= qs else max(qs, end_stamp(t)))


class StallWindows:
    """When requests stalled at the server held the client pool's connections: each such request
    from the moment the pool gave it a connection to its end, merged into windows. A request that
    queued for a connection inside a window waited (at least in part) for one a stalled request
    held: the stall explains that queue, up to as many requests as it held connections."""

    def __init__(self, stalled: Iterable[Record]) -> None:
        spans = sorted((phase_begin(r.t, "send") or r.t.get("start", 0), end_stamp(r.t)) for r in stalled if r.t)
        self.held_ns = sum(b - a for a, b in spans)  # connection-time the stalled requests held
        self.lo: list[int] = []
        self.hi: list[int] = []
        for a, b in spans:
            if self.hi and a <= self.hi[-1]:
                self.hi[-1] = max(self.hi[-1], b)
            else:
                self.lo.append(a)
                self.hi.append(b)
        events = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans], key=lambda x: (x[0], x[1]))
        self.max_held = run = 0  # the most connections they held at once
        for _, d in events:
            run += d
            self.max_held = max(self.max_held, run)

    @property
    def total_ns(self) -> int:
        return sum(b - a for a, b in zip(self.lo, self.hi))

    def __len__(self) -> int:
        return len(self.lo)

    def overlap_ns(self, a: int, b: int) -> int:
        """How long [a, b] lies inside the windows."""
        i = max(0, bisect.bisect_right(self.lo, a) - 1)
        out = 0
        while i < len(self.lo) and self.lo[i] <= b:
            out += max(0, min(b, self.hi[i]) - max(a, self.lo[i]))
            i += 1
        return out

    def touches(self, a: int, b: int) -> bool:
        """Whether [a, b] meets a window (a point in one counts)."""
        i = bisect.bisect_right(self.lo, b) - 1
        return i >= 0 and self.hi[i] >= a


class PoolApart:
    """The pool rule's figures over the requests a server stall does not explain, from a second
    streaming pass over the records (made only when the run had both server stalls and requests
    that queued for a connection; bounded: two histograms, counts, the agents that waited).

    A request whose wait for a connection met a stall window (or, without a wait, that started in
    one) belongs to the stall; the others (`outside`) are judged as any run's requests. `queued_ns`:
    the time requests spent queued inside the windows, to set against the connection-time the stalled
    requests held there (a queue far longer than what they held was not theirs alone)."""

    def __init__(self, data: RunData, windows: StallWindows) -> None:
        self.pool_wait = SparseHistogram()
        self.e2e_ok = SparseHistogram()
        self.n = 0  # agent requests outside the windows
        self.waited = Waited()  # ... those that queued
        self.behind = Waited()  # requests that queued inside the windows
        self.queued_ns = 0  # queued time inside the windows, all requests
        for r in data.iter_records():
            if r.kind != "agent" or not r.t:
                continue
            t = r.t
            q = queued_span(t)
            if q is not None:
                inside = windows.touches(*q)
                self.queued_ns += windows.overlap_ns(*q)
            else:
                s = t.get("start")
                inside = s is not None and windows.touches(s, s)
            if inside:
                if q is not None:
                    self.behind.add(r)
                continue
            self.n += 1
            if q is not None:
                self.waited.add(r)
            ns = phase_ns(t, "pool_wait", r.reused)
            if ns is not None:
                self.pool_wait.record_ns(ns)
            if r.outcome == "ok":
                ns = phase_ns(t, "e2e")
                if ns is not None:
                    self.e2e_ok.record_ns(ns)


@dataclass
class PoolJudgement:
    """What the pool rule found, over the requests it judges (`scope`): the whole run ("run"); beside
    a server stall, the requests outside its windows ("apart"), or every request when the queue in
    the windows was far longer than what the stalled requests held ("beyond")."""

    scope: str
    pw50: float | None
    pw90: float | None
    e50: float | None
    e90: float | None
    share50: bool
    waited: Waited
    n: int
    stalls: list[Record]  # requests stalled in pool_wait that are the pool's own
    timeouts: list[Record]  # ... and those that timed out queued


def pool_test(scope: str, pool_wait: SparseHistogram, e2e_ok: SparseHistogram, waited: Waited, n: int,
              stalls: list[Record], timeouts: list[Record]) -> PoolJudgement | None:
    """The pool rule's test on one set of requests: pool_wait a large share of e2e, long enough to
    matter, met by enough of them; or requests that stalled or timed out queued."""
    pct = percentiles_ms(pool_wait, (50, 90)) or {}
    pw50, pw90 = pct.get(50), pct.get(90)
    pct = percentiles_ms(e2e_ok, (50, 90)) or {}
    e50, e90 = pct.get(50), pct.get(90)
    share50 = bool(pw50 is not None and e50 and pw50 >= POOL_WAIT_SHARE * e50)
    share_ok = share50 or bool(pw90 is not None and e90 and pw90 >= POOL_WAIT_SHARE * e90)
    slow = share_ok and (pw90 or 0) >= POOL_WAIT_MIN_MS and len(waited) >= POOL_WAITED_SHARE * n
    if not (stalls or timeouts or slow):
        return None
    return PoolJudgement(scope, pw50, pw90, e50, e90, share50, waited, n, stalls, timeouts)
