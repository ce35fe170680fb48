"""The agent dump: what every agent is doing right now, as a text file in the run folder.

Written on `SIGUSR1` (`kill -USR1 <pid>`) and once per stall wave (the count of stalled
requests going from 0 to more than 0). For each agent: round, state and phase, seconds in
that phase and since its last progress, the request id in flight, and whether it went out
on a reused keep-alive connection or a new one. Reads the in-flight registry only; never
blocks the run for more than the time it takes to format and write the file.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Generator

from agentload.records import phases
from agentload.run.snapshot import current

if TYPE_CHECKING:
    from agentload.records import Trace
    from agentload.run.context import RunContext
    from agentload.run.snapshot import InflightSnapshot

_now = time.perf_counter_ns


def phase_since(tr: "Trace") -> int:
    """When the request entered the phase it is in now (perf_counter_ns), by the phase table."""
    return phases.phase_since(tr.t, tr.reused)


def _conn(tr: "Trace | None") -> str:
    if tr is None or tr.reused is None:
        return "-"
    return "reused" if tr.reused else "new"


# Agents formatted per loop step when a stall wave's dump is written while the run goes on: each
# line costs ~2-3 us, so 100,000 agents in one step froze the loop ~250 ms (run A's first wave).
DUMP_SLICE = 2000


def _registries(ctx: "RunContext") -> tuple[list["Trace"], list[tuple[int, Any]]]:
    """The dump's one walk of each registry: copies, so that formatting them can pause."""
    return list(ctx.inflight.values()), sorted(ctx.agent_states.items())


def _format(ctx: "RunContext", reason: str, now: int, t0_ns: int | None, traces: list["Trace"],
            states: list[tuple[int, Any]]) -> Generator[None, None, str]:
    """The dump's text, pausing (a bare `yield`) every DUMP_SLICE items; an agent's line is read
    when it is formatted (between pauses the run goes on)."""
    agents_tr = []
    by_agent: dict[int, "Trace"] = {}
    canaries = []
    phases: Counter[str] = Counter()
    stalled: Counter[tuple[int, str]] = Counter()
    oldest, oldest_start = None, now
    for i, tr in enumerate(traces):
        if i % DUMP_SLICE == DUMP_SLICE - 1:
            yield
        if tr.kind != "agent":
            canaries.append(tr)
            continue
        agents_tr.append(tr)
        by_agent[tr.agent] = tr
        phases[tr.phase()] += 1
        if tr.stalled_phase:
            stalled[(tr.round, tr.stalled_phase)] += 1
        start = tr.t.get("start", now)
        if oldest is None or start < oldest_start:
            oldest, oldest_start = tr, start
    rows = []
    state_counts: Counter[str] = Counter()
    for i, (agent, st) in enumerate(states):
        if i % DUMP_SLICE == DUMP_SLICE - 1:
            yield
        state_counts[st.state] += 1
        its = st.trace if st.trace is not None else by_agent.get(agent)
        if st.state == "request" and its is not None:
            phase = its.phase()
            in_phase = (now - phase_since(its)) / 1e9
            idle = f"{(now - its.progress_ns()) / 1e9:8.3f}"
            rid = its.request_id
            stall = its.stalled_phase or "-"
        else:
            phase, in_phase, idle, rid, stall = "-", (now - st.since) / 1e9, f"{'-':>8}", "-", "-"
        rows.append(f"{agent:>6} {st.round:>5} {st.state:<9} {phase:<9} {in_phase:>10.3f} {idle} "
                    f"{stall:<9} {_conn(its if st.state == 'request' else None):<6} {st.rounds_completed:>9}  {rid}")
    lines = [f"agentload agent dump  run {ctx.run_id}  reason: {reason}",
             f"written {time.strftime('%Y-%m-%d %H:%M:%S')}"
             + (f"  elapsed {(now - t0_ns) / 1e9:.1f} s" if t0_ns else "")
             + (f"  stopping ({ctx.stop_reason})" if ctx.stopping else "")]
    try:
        pool = ctx.transport.pool_state()
        lines.append("pool: " + " ".join(f"{k} {v}" for k, v in pool.items()))
    except Exception as e:  # the dump must never fail because of the pool's internals
        lines.append(f"pool: unavailable ({e.__class__.__name__})")
    lines.append(f"in flight: {len(agents_tr)}" + (" (" + ", ".join(f"{p} {n}" for p, n in sorted(phases.items()))
                                                   + ")" if phases else ""))
    lines.append(f"stalled: {sum(stalled.values())}" + (
        " (" + ", ".join(f"round {r} {p} {n}" for (r, p), n in sorted(stalled.items())) + ")" if stalled else ""))
    if oldest is not None:
        lines.append(f"oldest in flight: agent {oldest.agent} round {oldest.round} {oldest.phase()} "
                     f"{(now - oldest_start) / 1e9:.1f} s  {oldest.request_id}")
    lines.append("agents: " + ", ".join(f"{k} {n}" for k, n in sorted(state_counts.items())))
    lines.append("counts: " + " ".join(f"{k} {v}" for k, v in ctx.counts.items()))
    if getattr(ctx, "crash_count", 0):
        lines.append(f"agentload crashes: {ctx.crash_count} (run.json crashes)")
    lines.append("")
    lines.append(f"{'agent':>6} {'round':>5} {'state':<9} {'phase':<9} {'in_phase_s':>10} {'idle_s':>8} "
                 f"{'stalled':<9} {'conn':<6} {'rounds_ok':>9}  request_id")
    lines.extend(rows)
    if canaries:
        lines.append("")
        lines.append("canaries in flight:")
        for tr in canaries:
            lines.append(f"  {tr.request_id} {tr.phase()} {(now - tr.t.get('start', now)) / 1e9:.3f} s "
                         f"conn {_conn(tr)}" + (f" stalled in {tr.stalled_phase}" if tr.stalled_phase else ""))
    return "\n".join(lines) + "\n"


def format_dump(ctx: "RunContext", reason: str, now_ns: int | None = None, t0_ns: int | None = None) -> str:
    """The dump's text, in one go (SIGUSR1: the run waits for it)."""
    gen = _format(ctx, reason, now_ns if now_ns is not None else _now(), t0_ns, *_registries(ctx))
    try:
        while True:
            next(gen)
    except StopIteration as done:
        return done.value


async def format_dump_sliced(ctx: "RunContext", reason: str, t0_ns: int | None = None) -> str:
    """The dump's text, formatted DUMP_SLICE agents per loop step (a stall wave's: the run goes on)."""
    gen = _format(ctx, reason, _now(), t0_ns, *_registries(ctx))
    try:
        while True:
            next(gen)
            await asyncio.sleep(0)
    except StopIteration as done:
        return done.value


def dump_path(out_dir: Path) -> Path:
    t = time.time()
    stem = f"dump-{time.strftime('%Y%m%d-%H%M%S', time.localtime(t))}-{int(t * 1000) % 1000:03d}"
    path = Path(out_dir) / f"{stem}.txt"
    n = 1
    while path.exists():
        n += 1
        path = Path(out_dir) / f"{stem}-{n}.txt"
    return path


def write_dump(ctx: "RunContext", out_dir: Path, reason: str, t0_ns: int | None = None,
               text: str | None = None) -> Path:
    """The dump written to a new file in out_dir (`text`: already formatted, else formatted now)."""
    path = dump_path(out_dir)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text if text is not None else format_dump(ctx, reason, t0_ns=t0_ns), encoding="utf-8")
    os.replace(tmp, path)
    return path


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def on_sigusr1(ctx: "RunContext", out_dir: Path, t0_ns: int | None = None,
               log: Callable[[str], None] = _stderr) -> Path | None:
    """The SIGUSR1 handler (installed with loop.add_signal_handler, so it runs on the loop)."""
    try:
        path = write_dump(ctx, out_dir, "SIGUSR1", t0_ns)
    except OSError as e:
        log(f"agentload: could not write the agent dump: {e}")
        return None
    log(f"agentload: agent dump (SIGUSR1) written to {path}")
    return path


class StallWaves:
    """Writes one dump per stall wave: when the stalled count goes from 0 to more than 0.

    Reads the stalled counts of the run's snapshots (`check` with each one the watchdog
    publishes), never the in-flight registry; only the dump of a new wave walks the agents."""

    def __init__(self, ctx: "RunContext", out_dir: Path, t0_ns: int | None = None,
                 log: Callable[[str], None] = _stderr):
        self.ctx = ctx
        self.out_dir = Path(out_dir)
        self.t0_ns = t0_ns
        self.log = log
        self.stalled_before = 0
        self.waves = 0
        self.paths: list[Path] = []

    def new_wave(self, snap: "InflightSnapshot | None" = None) -> str | None:
        """The reason line of a new wave in `snap` (default: the run's latest snapshot), else None."""
        where = (snap if snap is not None else current(self.ctx)).stalled
        n = sum(where.values())
        before, self.stalled_before = self.stalled_before, n
        if n == 0 or before > 0:
            return None
        self.waves += 1
        return (f"stall wave {self.waves}: {n} request(s) stalled ("
                + ", ".join(f"round {r} {p} {c}" for (r, p), c in sorted(where.items())) + ")")

    def _write(self, reason: str, text: str | None) -> Path | None:
        try:
            path = write_dump(self.ctx, self.out_dir, reason, self.t0_ns, text)
        except OSError as e:
            self.log(f"agentload: could not write the agent dump: {e}")
            return None
        self.paths.append(path)
        self.log(f"agentload: {reason}; agent dump written to {path}")
        return path

    def check(self, snap: "InflightSnapshot | None" = None) -> Path | None:
        """A new wave in `snap`? Then its dump, written in one go."""
        reason = self.new_wave(snap)
        return None if reason is None else self._write(reason, None)

    async def check_sliced(self, snap: "InflightSnapshot | None" = None) -> Path | None:
        """`check`, with the dump formatted a slice of agents per loop step (what a run does)."""
        reason = self.new_wave(snap)
        if reason is None:
            return None
        return self._write(reason, await format_dump_sliced(self.ctx, reason, self.t0_ns))


async def watch_stalls(ctx: "RunContext", out_dir: Path, t0_ns: int | None = None,
                       log: Callable[[str], None] = _stderr) -> None:
    """Background task of a run: looks for a new stall wave in every snapshot the watchdog publishes
    (one published while a dump is formatted is not lost: the next look gets the latest)."""
    waves = StallWaves(ctx, out_dir, t0_ns, log)
    feed = ctx.snapshots
    seen = feed.latest.seq
    while True:
        snap = await feed.newer_than(seen, False)
        seen = snap.seq
        await waves.check_sliced(snap)
