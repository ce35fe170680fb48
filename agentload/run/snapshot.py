"""One snapshot of the run per tick, shared by everything that watches it.

The watchdog is the only code that walks the in-flight registry while a run goes on: once a tick
(`stall_tick`: at most stall.after_s / 4, at most 1 s, at least 0.05 s, a whole fraction of a
second) it looks at every request once, marks the ones with no progress for stall.after_s, fires
the give-up of those past give_up_s, and in the same pass counts what the watchers need into an
`InflightSnapshot`, which it publishes on the run's `SnapshotFeed` (`ctx.snapshots`). The
sampler, the stall-wave dumps, the live view and the Prometheus exporter read snapshots and never
walk the registry themselves: with 100,000 requests queued in the pool that is one pass per tick
instead of one per watcher (and the pass looks the phase table up instead of evaluating it).

Every tick counts the stalled requests by round and phase (the stall waves look at each one).
The first tick of every second is a *full* one: it also counts the requests in flight by phase,
finds the oldest, counts the agents (per round, by what they wait for, the conversations that
ended) and reads the client pool, which only the once-a-second watchers show; the ticks between
carry those over. The sampler writes one line of samples.jsonl per full snapshot, the live view
redraws on each, the exporter serves the latest.

The agent dump (SIGUSR1, a new stall wave) is rare and walks the agents itself (`dump.py`).

The watchdog's pass is `scan_sliced`: over a large registry (100,000 requests and as many agents:
~60-90 ms of CPU) it gives the loop back every few ms, so it no longer stalls the run's requests;
a snapshot's `t` is when its pass began. The watchdog's ticks and the event-loop lag probe
(`LoopLag`) share one time grid (`TimeGrid`), so an idle run wakes the loop 4 times a second for
both rather than 11.

This module imports nothing of the run path (the context imports it): the watchers pass the
run's context in, duck-typed.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Mapping, NamedTuple

from agentload.records.phases import PHASES, PROGRESS_STAMPS, SERVER_PHASES, phase_at

_now = time.perf_counter_ns

# The phase a request is in, from the latest of its progress stamps present (None: none yet) and
# whether its connection was reused: the phase table's `phase_at`, evaluated here once per kind
# of request rather than row by row for every request every tick (Trace.phase() plus
# Trace.progress_ns() cost ~8x this per request; with 100,000 requests queued that is most of a
# tick). It holds as long as every stamp that shows a request entered a phase is a progress
# stamp, which the table makes so (each phase's opening stamp); tests/test_snapshot.py checks it
# for every combination of stamps.
_PHASE_AFTER = {k: phase_at({k: 0} if k else {}, False) for k in (*PROGRESS_STAMPS, None)}
_PHASE_AFTER_REUSED = {k: phase_at({k: 0} if k else {}, True) for k in (*PROGRESS_STAMPS, None)}

LOOP_LAG_PROBE_S = 0.25  # the longest time between two lag probes (see LoopLag)
_EMPTY: Mapping[Any, Any] = MappingProxyType({})


def stall_tick(after_s: float) -> float:
    """The watchdog's tick: no longer than before this module (max(0.05, min(1.0, after_s / 4)))
    and a whole fraction of a second, so the once-a-second watchers get a snapshot every N ticks."""
    raw = max(0.05, min(1.0, after_s / 4))
    return 1.0 / math.ceil(round(1.0 / raw, 9))


class Oldest(NamedTuple):
    """The oldest agent request in flight at a full tick."""

    agent: int
    round: int
    phase: str
    age_s: float
    request_id: str
    stalled: bool


@dataclass(frozen=True, slots=True)
class InflightSnapshot:
    """What the watchdog saw at one tick. Read-only (the mappings are read-only views).

    The fields down to `crashes` are of this tick. Those from `full_t` on, which only the
    once-a-second watchers show, are counted at full ticks and carried over by the ticks between
    (`full_t`: when). In `ctx.snapshots.latest_full` every field is of one instant."""

    seq: int  # 1, 2, ... per snapshot taken in this run; 0: none yet
    t: int  # perf_counter_ns when its pass began (samples.jsonl `t`; a sliced pass spans several loop steps)
    full: bool  # everything counted at this tick (the first tick of each second)
    stalled: Mapping[tuple[int, str], int]  # (round, stalled phase) -> stalled agent requests in flight
    canaries: int  # canary requests in flight (counted nowhere else)
    counts: Mapping[str, int]  # ctx.counts: requests, ok, error, stalled, cut_short, output_tokens
    lag_ms: float  # largest event-loop lag since the last sample
    max_lag_ms: float  # largest event-loop lag of the run so far
    crashes: int  # crashes of agentload itself so far
    # counted at the last full tick (`full_t`)
    full_t: int
    inflight: Mapping[str, int]  # phase -> agent requests in flight (PHASES order, only phases with some)
    oldest: Oldest | None  # the oldest agent request in flight (age at full_t)
    agents: Mapping[tuple[int, str], int]  # (round, phase of its request, or waiting/tool) -> agents working
    rounds: Mapping[int, int]  # round -> agents working in it
    finished: Mapping[str, int]  # done / stalled / error / cut_short / crashed -> conversations ended
    pool: Mapping[str, Any]  # the client pool's state (Transport.pool_state)
    # an agent request that stalled past the pool at this tick (the first the pass met), for the
    # stall wave's probes (agentload.run.probes): they replay it without a walk of their own
    new_stall: Any = None

    @property
    def inflight_total(self) -> int:
        return sum(self.inflight.values())

    @property
    def stalled_total(self) -> int:
        return sum(self.stalled.values())

    @property
    def stalled_by(self) -> dict[str, int]:
        """samples.jsonl `stalled_by`: "round/phase" -> count."""
        return {f"{r}/{p}": n for (r, p), n in self.stalled.items()}


EMPTY = InflightSnapshot(0, 0, False, _EMPTY, 0, _EMPTY, 0.0, 0.0, 0, 0, _EMPTY, None, _EMPTY, _EMPTY, _EMPTY, _EMPTY)


def _ro(d: dict) -> Mapping:
    return MappingProxyType(d)


def scan(ctx: Any, *, seq: int = 1, full: bool = True, prev: InflightSnapshot | None = None,
         after_ns: int | None = None, give_up_ns: int | None = None) -> InflightSnapshot:
    """The one pass over the in-flight registry of a tick, and the snapshot it makes, in one step.

    With `after_ns` and `give_up_ns` (the watchdog) it also acts on each request: no progress for
    after_ns marks it stalled in its current phase, for give_up_ns fires its give-up timeout.
    Every pass counts the stalled requests; a `full` one also each request's phase, the oldest
    request, the agents and the pool (else those come from `prev`, the last full snapshot's).
    Reading only, apart from the watchdog's marks. The watchdog itself uses `scan_sliced`."""
    p = _Pass(ctx, full, after_ns, give_up_ns)
    p.requests(list(ctx.inflight.values()), None)  # a copy: the give-ups must not meet a resized dict
    if full:
        p.agents(p.begin_agents(ctx))
    return p.snapshot(ctx, seq, prev)


# A pass over a large registry (100,000 requests and agents: ~60-90 ms in one go) gives the loop
# back between slices: it walks SLICE_CHUNK entries at a time and yields once it has run for
# SLICE_NS, so no loop step spends much more than that on it, and a small registry is still walked
# in one step.
SLICE_CHUNK = 1024
SLICE_NS = 2_000_000


async def scan_sliced(ctx: Any, *, seq: int = 1, full: bool = True, prev: InflightSnapshot | None = None,
                      after_ns: int | None = None, give_up_ns: int | None = None) -> InflightSnapshot:
    """`scan`, in slices of about SLICE_NS with the loop running in between (the watchdog's pass).

    It walks lists of the registry's and the agents' values taken when it starts, and reads the
    pool's state then too (the pass's clock, the snapshot's `t`, is that moment), so the dicts may
    change meanwhile: a request that ended between slices (no longer in `ctx.inflight`) is not acted
    on, but still counted, in the phase it had reached: it was in flight at `t`, and the pool's
    connections at `t` are to be compared with the requests in flight at `t` (counting only those
    still in flight would show more connections in use than requests using them: a false leak). One
    that started is left for the next tick. An agent's state is read when its slice comes, so a
    request that ends during the pass may count both as in flight and its agent by its new state."""
    p = _Pass(ctx, full, after_ns, give_up_ns)
    t0 = p.now  # the copies below count in the first slice (100,000 entries: ~0.7 ms)
    live = ctx.inflight
    trs = list(live.values())
    check = None  # until the first yield nothing can have ended
    for i in range(0, len(trs), SLICE_CHUNK):
        p.requests(trs[i:i + SLICE_CHUNK], check)
        if _now() - t0 >= SLICE_NS:
            await asyncio.sleep(0)
            check, t0 = live, _now()
    if full:
        states = p.begin_agents(ctx)
        for i in range(0, len(states), SLICE_CHUNK):
            p.agents(states[i:i + SLICE_CHUNK])
            if _now() - t0 >= SLICE_NS:
                await asyncio.sleep(0)
                t0 = _now()
    return p.snapshot(ctx, seq, prev)


class _Pass:
    """What one pass has counted so far (`scan` in one step, `scan_sliced` in several)."""

    __slots__ = ("acting", "after_ns", "by_round", "canaries", "finished", "full", "give_up_ns", "new_stall", "now",
                 "o_phase", "o_start", "o_tr", "pool", "stalled", "waiting")

    def __init__(self, ctx: Any, full: bool, after_ns: int | None, give_up_ns: int | None) -> None:
        self.now = _now()
        self.full = full
        self.acting = after_ns is not None and give_up_ns is not None
        self.after_ns = after_ns or 0
        self.give_up_ns = give_up_ns or 0
        self.stalled: dict[tuple[int, str], int] = {}
        self.by_round: dict[tuple[int, str], int] = {}  # (round, phase) -> agent requests: full passes only
        self.canaries = 0
        self.new_stall: Any = None
        self.o_tr: Any = None
        self.o_start = 0
        self.o_phase = ""
        self.waiting: dict[tuple[int, str], int] = {}  # (round, request/tool/waiting) -> agents not in a request
        self.finished: dict[str, int] = {}
        self.pool: dict[str, Any] = {}
        if full:  # at the pass's start, with the registry's copy
            try:
                self.pool = ctx.transport.pool_state()
            except Exception:  # the pool's internals must never stop a snapshot
                pass

    def requests(self, trs: list, live: Mapping[str, Any] | None) -> None:
        """Count each request of `trs`; with `live` (a sliced pass, after a yield) act only on those
        still in it, the registry (one that ended since the pass began is counted as it was left)."""
        now, full, acting, after_ns, give_up_ns = self.now, self.full, self.acting, self.after_ns, self.give_up_ns
        stalled, by_round, canaries = self.stalled, self.by_round, self.canaries
        o_tr, o_start, o_phase = self.o_tr, self.o_start, self.o_phase
        loop = None
        for tr in trs:
            t = tr.t
            # Trace.progress_ns() and, where needed, Trace.phase() in one look at the stamps
            for k in PROGRESS_STAMPS:
                if k in t:
                    prog = tr.last_token if k == "first_token" else t[k]
                    break
            else:
                k, prog = None, 0
            ph = None
            if acting and now - prog >= after_ns and (live is None or live.get(tr.request_id) is tr):
                if tr.stalled_phase is None:
                    tr.stalled_phase = ph = (_PHASE_AFTER_REUSED if tr.reused else _PHASE_AFTER)[k]
                    tr.stalled_at = now
                    if self.new_stall is None and ph in SERVER_PHASES and tr.kind == "agent":
                        self.new_stall = tr
                if now - prog >= give_up_ns and not tr.gave_up and tr.timeout_cm is not None:
                    tr.gave_up = True
                    loop = loop or asyncio.get_running_loop()
                    tr.timeout_cm.reschedule(loop.time())
            if tr.kind != "agent":
                canaries += 1
                continue
            sp = tr.stalled_phase
            if sp is not None:
                key = (tr.round, sp)
                stalled[key] = stalled.get(key, 0) + 1
            if full:
                if ph is None:
                    ph = (_PHASE_AFTER_REUSED if tr.reused else _PHASE_AFTER)[k]
                key = (tr.round, ph)
                by_round[key] = by_round.get(key, 0) + 1
                start = t.get("start", now)
                if o_tr is None or start < o_start:
                    o_tr, o_start, o_phase = tr, start, ph
        self.canaries = canaries
        self.o_tr, self.o_start, self.o_phase = o_tr, o_start, o_phase

    def begin_agents(self, ctx: Any) -> list:
        """The agents to count, and the conversations ended and forgotten (open loop), read in one
        step: an agent that ends later is in the list and counted once, by its state."""
        self.finished = dict(getattr(ctx, "finished", None) or {})
        return list(ctx.agent_states.values())

    def agents(self, states: list) -> None:
        """Agents per round and what they wait for; conversations ended. An agent in a request is
        counted by its request's phase (`by_round`, from the registry pass: its trace is in flight
        exactly while it is in a request); one between two attempts of a round (a retry's pause) as
        "request"; the others by their state."""
        waiting, finished = self.waiting, self.finished
        for st in states:
            s = st.state
            if s == "request":
                if st.trace is None:
                    k = (st.round, s)
                    waiting[k] = waiting.get(k, 0) + 1
            elif s == "tool" or s == "waiting":
                k = (st.round, s)
                waiting[k] = waiting.get(k, 0) + 1
            else:
                finished[s] = finished.get(s, 0) + 1

    def snapshot(self, ctx: Any, seq: int, prev: InflightSnapshot | None) -> InflightSnapshot:
        now = self.now
        lag = getattr(ctx, "loop_lag", None)
        if self.full:
            phases = dict.fromkeys(PHASES, 0)
            for (_, ph), n in self.by_round.items():
                phases[ph] += n
            agents = dict(self.by_round)
            for k, n in self.waiting.items():
                agents[k] = agents.get(k, 0) + n
            rounds: dict[int, int] = {}
            for (r, _), n in agents.items():
                rounds[r] = rounds.get(r, 0) + n
            inflight = _ro({p: n for p, n in phases.items() if n})
            o_tr = self.o_tr
            oldest = None if o_tr is None else Oldest(o_tr.agent, o_tr.round, self.o_phase, (now - self.o_start) / 1e9,
                                                      o_tr.request_id, o_tr.stalled_phase is not None)
            pool = self.pool
            full_t = now
            agents_m, rounds_m = _ro(dict(sorted(agents.items()))), _ro(dict(sorted(rounds.items())))
            finished_m, pool_m = _ro(dict(sorted(self.finished.items()))), _ro(pool)
        else:
            p = prev or EMPTY
            inflight, oldest, full_t = p.inflight, p.oldest, p.full_t
            agents_m, rounds_m, finished_m, pool_m = p.agents, p.rounds, p.finished, p.pool
        return InflightSnapshot(
            seq, now, self.full, _ro(dict(sorted(self.stalled.items()))), self.canaries, _ro(dict(ctx.counts)),
            lag.window_ms if lag is not None else 0.0, lag.max_ms if lag is not None else 0.0,
            getattr(ctx, "crash_count", 0), full_t, inflight, oldest, agents_m, rounds_m, finished_m, pool_m,
            self.new_stall)


class SnapshotFeed:
    """The latest snapshot of a run, and a way to wait for the next one."""

    def __init__(self) -> None:
        self.latest: InflightSnapshot = EMPTY
        self.latest_full: InflightSnapshot = EMPTY
        self.tick_s: float | None = None  # set by the watchdog
        self._event: asyncio.Event | None = None

    def publish(self, snap: InflightSnapshot) -> None:
        self.latest = snap
        if snap.full:
            self.latest_full = snap
        ev, self._event = self._event, None
        if ev is not None:
            ev.set()

    def next_seq(self) -> int:
        return self.latest.seq + 1

    async def newer_than(self, seq: int, full: bool = False) -> InflightSnapshot:
        """The latest (full) snapshot once there is one newer than `seq`."""
        while True:
            snap = self.latest_full if full else self.latest
            if snap.seq > seq:
                return snap
            if self._event is None:
                self._event = asyncio.Event()
            await self._event.wait()


async def follow(feed: SnapshotFeed, fn: Callable[[InflightSnapshot], Any], *, full: bool = False) -> None:
    """Call fn with every new snapshot (with `full`: once a second, with every full one), for as
    long as the task runs. A snapshot published while fn ran is not lost: the next call gets the
    latest one."""
    seen = (feed.latest_full if full else feed.latest).seq
    while True:
        snap = await feed.newer_than(seen, full)
        seen = snap.seq
        fn(snap)


def current(ctx: Any, full: bool = False) -> InflightSnapshot:
    """The run's latest snapshot (with `full`: the latest full one, every field of one instant);
    a context with no feed (one built by hand) gets one taken now."""
    feed = getattr(ctx, "snapshots", None)
    if feed is None:
        return scan(ctx)
    return feed.latest_full if full else feed.latest


class TimeGrid:
    """One time grid for the run's periodic timers, the watchdog's ticks and the lag probe, so that
    they wake the loop together: each wake-up of an idle loop costs ~150-190 us of CPU on a small
    VM, and two timers a few ms apart are two wake-ups.

    A point of the grid is origin + n / per_s seconds of loop time (per_s points a second, an
    integer), kept in whole microseconds, so the same instant reached with two rates (n / 2 and
    2n / 4) is the same point; every waiter for one point shares one loop timer. The origin is
    the loop time when the first user started (the watchdog: its full ticks come 1, 2, ... s
    after it)."""

    def __init__(self) -> None:
        self.origin_us: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._due: dict[int, list[Any]] = {}  # point (us) -> [its timer handle, waiters' futures...]

    def start(self) -> asyncio.AbstractEventLoop:
        """Bind to the running loop (the origin, if not yet set, is now); returns the loop."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # a new loop (another asyncio.run): its clock, its timers
            self._loop, self._due, self.origin_us = loop, {}, None
        if self.origin_us is None:
            self.origin_us = round(loop.time() * 1e6)
        return loop

    def point_after(self, per_s: int, t: float) -> int:
        """n of the first point (per_s a second) strictly after loop time t."""
        assert self.origin_us is not None, "start() sets the origin"
        d = round(t * 1e6) - self.origin_us + 1
        return -(-d * per_s // 1_000_000)

    def point_us(self, n: int, per_s: int) -> int:
        """Point n (per_s a second) in whole microseconds of loop time: one key per instant."""
        assert self.origin_us is not None, "start() sets the origin"
        return self.origin_us + n * 1_000_000 // per_s

    async def wait(self, n: int, per_s: int, first: bool = False) -> float:
        """Sleep until point n (per_s a second); returns its loop time. `first`: resumed before the
        other waiters of that point (the lag probe, so it does not measure the watchdog's pass)."""
        loop = self.start()
        key = self.point_us(n, per_s)
        entry = self._due.get(key)
        if entry is None:
            entry = self._due[key] = [loop.call_at(key / 1e6, self._fire, key)]
        fut = loop.create_future()
        if first:
            entry.insert(1, fut)
        else:
            entry.append(fut)
        try:
            await fut
        finally:
            if not fut.done() or fut.cancelled():  # the waiter was cancelled: the timer goes if no one is left
                if fut in entry:
                    entry.remove(fut)
                if len(entry) == 1 and self._due.get(key) is entry:
                    entry[0].cancel()
                    del self._due[key]
        return key / 1e6

    def _fire(self, key: int) -> None:
        for fut in self._due.pop(key, [None])[1:]:
            if not fut.done():
                fut.set_result(None)


def lag_probe_per_s(tick: float) -> int:
    """Lag probes a second: on every watchdog tick (no wake-up of its own), and on points between
    them for ticks longer than LOOP_LAG_PROBE_S (1 s, 0.5 s: every 0.25 s; 1/3 s: every 1/6 s)."""
    per_tick = math.ceil(round(tick / LOOP_LAG_PROBE_S, 9))
    return round(per_tick / tick)


class LoopLag:
    """Event-loop lag: how late a timer fires, on the run's time grid (`TimeGrid`, shared with the
    watchdog: the probe wakes the loop no more often than the watchdog already does, or at most
    every LOOP_LAG_PROBE_S when its ticks are longer; see `lag_probe_per_s`).

    At most LOOP_LAG_PROBE_S (0.25 s) between probes: a loop stall of 250 ms or more is always
    seen, as at least its length less that period; a shorter one only when it covers a probe's due
    time (a 150 ms stall is seen in 60% of cases with probes every 0.25 s, and measured as the part
    of it after the due time). A sustained lag (a saturated loop: every due time late) is seen in
    every probe."""

    def __init__(self) -> None:
        self.window_ms = 0.0  # largest lag since the last take()
        self.max_ms = 0.0  # largest lag of the run
        self.grid = TimeGrid()
        self.per_s = lag_probe_per_s(1.0)  # until the watchdog says its tick (`follow_tick`)

    def follow_tick(self, tick: float) -> None:
        """Probe on the watchdog's ticks (of `tick` s, on this grid) and between them if need be."""
        self.per_s = lag_probe_per_s(tick)

    async def probe(self) -> None:
        loop = self.grid.start()
        due = loop.time()
        while True:
            per_s = self.per_s
            # the next point ahead: a probe woken late skips the ones it missed, and one woken
            # a little early (timers round to the loop's clock) does not take its point twice
            due = await self.grid.wait(self.grid.point_after(per_s, max(loop.time(), due)), per_s, first=True)
            lag = (loop.time() - due) * 1000.0
            if lag > self.window_ms:
                self.window_ms = lag
                if lag > self.max_ms:
                    self.max_ms = lag

    def take(self) -> float:
        """The largest lag since the last take (one sample's `loop_lag_ms`), and start a new window."""
        v, self.window_ms = self.window_ms, 0.0
        return v
