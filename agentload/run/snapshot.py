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

from agentload.records.phases import PHASES, PROGRESS_STAMPS, phase_at

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

LOOP_LAG_PROBE_S = 0.1
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
    t: int  # perf_counter_ns when taken (samples.jsonl `t`)
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
    """The one pass over the in-flight registry of a tick, and the snapshot it makes.

    With `after_ns` and `give_up_ns` (the watchdog) it also acts on each request: no progress for
    after_ns marks it stalled in its current phase, for give_up_ns fires its give-up timeout.
    Every pass counts the stalled requests; a `full` one also each request's phase, the oldest
    request, the agents and the pool (else those come from `prev`, the last full snapshot's).
    Reading only, apart from the watchdog's marks."""
    now = _now()
    acting = after_ns is not None and give_up_ns is not None
    loop = None
    stalled: dict[tuple[int, str], int] = {}
    by_round: dict[tuple[int, str], int] = {}  # (round, phase) -> agent requests: full passes only
    canaries = 0
    o_tr = None
    o_start = 0
    o_phase = ""
    for tr in list(ctx.inflight.values()):  # a copy: the give-ups below must not meet a resized dict
        t = tr.t
        # Trace.progress_ns() and, where needed, Trace.phase() in one look at the stamps
        for k in PROGRESS_STAMPS:
            if k in t:
                prog = tr.last_token if k == "first_token" else t[k]
                break
        else:
            k, prog = None, 0
        ph = None
        if acting and now - prog >= after_ns:
            if tr.stalled_phase is None:
                tr.stalled_phase = ph = (_PHASE_AFTER_REUSED if tr.reused else _PHASE_AFTER)[k]
                tr.stalled_at = now
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
    lag = getattr(ctx, "loop_lag", None)
    if full:
        phases = dict.fromkeys(PHASES, 0)
        for (_, ph), n in by_round.items():
            phases[ph] += n
        inflight = _ro({p: n for p, n in phases.items() if n})
        oldest = None if o_tr is None else Oldest(o_tr.agent, o_tr.round, o_phase, (now - o_start) / 1e9,
                                                  o_tr.request_id, o_tr.stalled_phase is not None)
        agents, rounds, finished = _count_agents(ctx, by_round)
        try:
            pool: dict[str, Any] = ctx.transport.pool_state()
        except Exception:  # the pool's internals must never stop a snapshot
            pool = {}
        full_t = now
        agents_m, rounds_m, finished_m, pool_m = _ro(agents), _ro(rounds), _ro(finished), _ro(pool)
    else:
        p = prev or EMPTY
        inflight, oldest, full_t = p.inflight, p.oldest, p.full_t
        agents_m, rounds_m, finished_m, pool_m = p.agents, p.rounds, p.finished, p.pool
    return InflightSnapshot(
        seq, now, full, _ro(dict(sorted(stalled.items()))), canaries, _ro(dict(ctx.counts)),
        lag.window_ms if lag is not None else 0.0, lag.max_ms if lag is not None else 0.0,
        getattr(ctx, "crash_count", 0), full_t, inflight, oldest, agents_m, rounds_m, finished_m, pool_m)


def _count_agents(ctx: Any, by_round: dict[tuple[int, str], int]) -> tuple[dict, dict, dict]:
    """Agents per round and what they wait for; conversations ended. An agent in a request is
    counted by its request's phase (`by_round`, from the registry pass: its trace is in flight
    exactly while it is in a request); one between two attempts of a round (a retry's pause) as
    "request"; the others by their state."""
    agents = by_round
    finished: dict[str, int] = dict(getattr(ctx, "finished", None) or {})  # open loop: ended and forgotten
    for st in list(ctx.agent_states.values()):
        s = st.state
        if s == "request":
            if st.trace is None:
                k = (st.round, s)
                agents[k] = agents.get(k, 0) + 1
        elif s == "tool" or s == "waiting":
            k = (st.round, s)
            agents[k] = agents.get(k, 0) + 1
        else:
            finished[s] = finished.get(s, 0) + 1
    rounds: dict[int, int] = {}
    for (r, _), n in agents.items():
        rounds[r] = rounds.get(r, 0) + n
    return dict(sorted(agents.items())), dict(sorted(rounds.items())), dict(sorted(finished.items()))


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


class LoopLag:
    """Event-loop lag: a timer every LOOP_LAG_PROBE_S that measures how late it fires."""

    def __init__(self) -> None:
        self.window_ms = 0.0  # largest lag since the last take()
        self.max_ms = 0.0  # largest lag of the run

    async def probe(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            t = loop.time()
            await asyncio.sleep(LOOP_LAG_PROBE_S)
            lag = (loop.time() - t - LOOP_LAG_PROBE_S) * 1000.0
            if lag > self.window_ms:
                self.window_ms = lag
                if lag > self.max_ms:
                    self.max_ms = lag

    def take(self) -> float:
        """The largest lag since the last take (one sample's `loop_lag_ms`), and start a new window."""
        v, self.window_ms = self.window_ms, 0.0
        return v
