"""Runs a scenario in this process: the agents' arrivals (`arrivals`), the watchdog, canaries, samplers,
a bounded shutdown.

`InProcess` is the executor (`agentload.run.executor`) of a prepared run on this event loop, and
of every part of a run in worker processes or Ray shards; `OneShard` is `run --shard I/N`.

Every wait here is bounded by the scenario: the run ends by itself at the latest
`stall.give_up_s` plus a grace period after it stops starting rounds, and whatever was in
flight then is recorded as cut short.

It fails closed: a crash of an agent, of a background task (watchdog, sampler, canary, the
observers, the live view) or of the run loop itself is a crash entry in run.json's `crashes`
(where, agent, round, error, message, traceback), written the moment it happens, so a run
killed later still has it; the verdict then blames agentload. A crashed background task is
restarted (a short pause, at most BACKGROUND_RESTARTS times); a watchdog that keeps crashing
stops the run, since without it no request would be given up and the run would no longer be
bounded by `give_up_s`.

The watchdog is also the only task that walks the in-flight registry while the run goes on: once
a tick it marks stalls, fires give-ups and publishes the tick's snapshot (`agentload.run.snapshot`,
`ctx.snapshots`), which the sampler, the stall waves, the live view and the exporter read.

How a run ended, in run.json: `ended_by` "finished" (every agent done), "duration"
(`agents.duration_s`), "interrupted" (a signal) or "crashed" (agentload stopped it), with
`stop_reason`; `cut_short` is true only when requests in flight were cut, the run was
interrupted or agentload stopped it, never for a normal end at `duration_s`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import gc
import itertools
import secrets
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable, Coroutine

from agentload.records import RecordWriter, Trace
from agentload.run import dump, server_props
from agentload.run.agent import attempt
from agentload.run.arrivals import arrivals
from agentload.run.context import RunContext
from agentload.run.conversation import tool_schemas
from agentload.run.executor import PreparedRun, RunOutcome
from agentload.run.observers import start_observers
from agentload.run.probes import Prober, short_conversation
from agentload.run.replay import load_plans
from agentload.run.sampler import Sampler
from agentload.run.scenario import Scenario
from agentload.run.snapshot import TimeGrid, follow, scan, scan_sliced, stall_tick

_now = time.perf_counter_ns

SHUTDOWN_GRACE_S = 3.0
BACKGROUND_RESTARTS = 3  # a crashed background task is restarted this often, then left dead (the watchdog: the run stops)
RESTART_PAUSE_S = 0.1
# The run loop wakes on its events (an agent task set empty, a stop, the arrivals' end) and at
# duration_s; this poll only bounds its wait. Each wake of an idle loop costs ~0.15 ms of CPU on a
# VM: at 0.5 s this poll was a tenth of an idle run's background CPU.
RUN_LOOP_POLL_S = 5.0


# The collector's full passes walk every live object and stop the event loop meanwhile (about
# 1 us per object: 10,000 agents hold ~150k objects). For the run: what start-up created is
# frozen (never walked again), and young passes run less often, so objects of finished requests
# (freed by refcounting anyway) are rarely promoted and full passes are rare. Measured with 10,000
# agents: the longest pause went from ~400 ms (4-9 full passes) to ~40 ms (none).
GC_THRESHOLD = (5000, 10, 100)


def pace_collector() -> None:
    """Once a second after a start-up froze the agents: collect the young generations, then freeze
    what survived. The collector counts allocations minus deallocations, and the frozen objects of
    the agents' first requests die as the agents go on: their deaths offset the new requests'
    allocations, so the new objects piled up in generation 0 without a pass being due. 100,000
    agents (docs/memory.md's run B) then had young passes over hundreds of thousands of objects, 60-310 ms
    each. Collected each second, the young generations hold one second of survivors (a few ms). A
    reference cycle that becomes garbage after it was frozen waits for the run's end, as at start-up:
    the ones a run makes over and over are broken where they are made (`errors.drop_tracebacks` for
    failed requests and scrapes, the interval log's replaced histograms)."""
    gc.collect(1)
    gc.freeze()


def use_uvloop() -> None:
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:  # optional: the default loop works, a little slower
        pass


def gc_for_run() -> Callable[[], None]:
    old = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLD)

    def restore() -> None:
        gc.set_threshold(*old)
        gc.unfreeze()

    return restore


def default_out_dir(sc: Scenario, base: Path = Path("reports"), name: str | None = None) -> Path:
    name = name or Path(sc.source.split(" ")[0]).name.removesuffix(".toml") or "run"
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return base / f"{stamp}-{name}-{secrets.token_hex(2)}"


async def watchdog(ctx: RunContext) -> None:
    """The one walk of the in-flight registry per tick: marks requests with no progress for
    stall.after_s, fires the give-up after give_up_s, and publishes the tick's snapshot
    (`ctx.snapshots`) that the sampler, the stall waves, the live view and the exporter read.

    Ticks are on a grid (`stall_tick`: never coarser than after_s / 4, at most 1 s); a walk that
    runs late skips the ticks it missed rather than run back to back. The first tick of each
    second is a full snapshot (agents and pool counted too). The grid is the one the lag probe
    uses too (`ctx.loop_lag.grid`), so both wake the loop at once. The walk is `scan_sliced`: a
    large registry is walked in slices of a few ms, the loop running in between (each snapshot's
    `t` is when its pass began)."""
    after = int(ctx.scenario.stall.after_s * 1e9)
    give_up = int(ctx.scenario.stall.give_up_s * 1e9)
    tick = stall_tick(ctx.scenario.stall.after_s)
    per_second = round(1.0 / tick)
    feed = ctx.snapshots
    feed.tick_s = tick
    lag = getattr(ctx, "loop_lag", None)
    grid = lag.grid if lag is not None else TimeGrid()
    if lag is not None:
        lag.follow_tick(tick)
    loop = grid.start()
    n = grid.point_after(per_second, loop.time())
    second = (n - 1) // per_second  # the second it starts in: its first full tick is the next one's first
    while True:
        due = await grid.wait(n, per_second)
        full = n // per_second > second
        if full:
            second = n // per_second
        feed.publish(await scan_sliced(ctx, seq=feed.next_seq(), full=full, prev=feed.latest_full,
                                       after_ns=after, give_up_ns=give_up))
        if full and ctx.pace_collector:
            pace_collector()
        # the next tick ahead: late by more than a tick, go on from the next tick still ahead
        n = grid.point_after(per_second, max(loop.time(), due))


async def canaries(ctx: RunContext, counter: "itertools.count[int] | None" = None) -> None:
    """A short single-round request on its own fresh connection every canary.every_s.

    `counter` numbers the canaries across restarts of this task (request ids stay unique)."""
    counter = counter if counter is not None else itertools.count()
    cfg = ctx.scenario.canary
    session = ctx.transport.canary_session(cfg.timeout_s)
    sc = ctx.scenario
    try:
        while not ctx.stopping:
            n = next(counter)
            conv = short_conversation(sc, n)
            body = conv.body()
            trace = Trace("canary", -1, 1, n, f"{ctx.run_id}-canary-{n}", conv.n_messages, len(body), conv.tokens)
            await attempt(ctx, session, trace, body)
            await ctx.sleep(cfg.every_s)
    finally:
        await session.close()


async def _supervise(ctx: RunContext, name: str, job: Callable[[], Awaitable[Any]],
                     restarts: int = BACKGROUND_RESTARTS) -> None:
    """Run a background job; if it crashes, record it (run.json at once) and start it again after a
    short pause, at most `restarts` times. The watchdog is what gives up stalled requests and so
    bounds the run: when it has crashed once more than that, the run stops (ended_by "crashed")
    rather than go on without stall detection."""
    crashes = 0
    while True:
        try:
            await job()
            return
        except asyncio.CancelledError:
            raise
        except Exception as e:
            crashes += 1
            task = asyncio.current_task()
            stopping = task is not None and task.cancelling() > 0  # it failed while being cancelled
            ctx.record_crash(name, e, restarted=crashes <= restarts and not stopping)
            if stopping:
                raise asyncio.CancelledError from e
            if crashes > restarts:
                if name == "watchdog":
                    ctx.stop(f"agentload's watchdog crashed {crashes} times: no stall detection", by="crashed")
                return
            await asyncio.sleep(RESTART_PAUSE_S)


@dataclass
class InProcess:
    """The executor that runs a prepared run (or its part) on this process's event loop; every
    worker process and Ray shard runs its part with it.

    `on_tick(ctx, sampler)`: with every full snapshot, once a second (the live view; with
    `run.live` and no on_tick, the live line). `gate()`: awaited before the agents start, returns
    the common start (perf_counter_ns) of all parts. `on_context(ctx)` gets the run's context (a
    Ray shard stops its run through it). `on_started(meta)` is called once run.json is written,
    before any agent starts (the fault schedule starts its clock there). `drive(ctx)` replaces the
    agents' arrivals: the requests come from elsewhere (`agentload proxy`: a harness's own); it
    returns once the run stops, and gets give_up_s to let its requests in flight end before it is
    cancelled."""

    on_tick: Callable[[RunContext, Sampler], None] | None = None
    gate: Callable[[], Awaitable[int]] | None = None
    on_context: Callable[[RunContext], None] | None = None
    on_started: Callable[[dict[str, Any]], None] | None = None
    drive: Callable[[RunContext], Coroutine[Any, Any, None]] | None = None

    def execute(self, run: PreparedRun) -> RunOutcome:
        from agentload.run.live import LiveLine

        use_uvloop()
        view = LiveLine(run_dir=str(run.run_dir)) if run.live and self.on_tick is None else None
        try:  # (the view's clock starts with the run)
            return asyncio.run((self if view is None else dataclasses.replace(self, on_tick=view)).run(run))
        finally:
            if view is not None:
                view.close()

    async def run(self, run: PreparedRun) -> RunOutcome:
        """Run it on the running event loop: run.json, records, samples (and target_metrics.jsonl
        with [target] metrics_urls, intervals.hlog always); with run.metrics_port, agentload's live
        state is served in Prometheus format on 127.0.0.1."""
        running = await _Running.open(run, self)
        await running.start()
        try:
            await running.until_stopped()
            await running.wind_down()
        except Exception as e:  # agentload's run loop itself failed: record it, stop, still write every file
            await running.abort(e)
        finally:
            await running.close()
        return run.outcome(running.interrupts > 0)


@dataclass
class OneShard:
    """The executor of `run --shard I/N`: in-process, only the agents i with i % N == I; the files
    keep their plain names and run.json says `shard` (`agentload merge` joins the folders)."""

    index: int
    count: int
    in_process: InProcess = dataclasses.field(default_factory=InProcess)

    def execute(self, run: PreparedRun) -> RunOutcome:
        run.meta["shard"] = [self.index, self.count]
        return self.in_process.execute(dataclasses.replace(run, shard=(self.index, self.count)))


class _Running:
    """One in-process run from its files' opening to run.json's last write, in named steps."""

    def __init__(self, run: PreparedRun, how: InProcess, ctx: RunContext, transport: Any, writer: RecordWriter):
        self.run, self.how, self.ctx = run, how, ctx
        self.meta = run.meta
        self.transport, self.writer = transport, writer
        self.sampler = Sampler(ctx, run.path("samples"))
        self.extras: Any = None
        self.interrupts = 0
        self.hard_stop = asyncio.Event()  # a second signal: in-flight requests are not waited for
        self.agent_tasks: set[asyncio.Task] = set()
        self.background: list[asyncio.Task] = []
        self.prober: Prober | None = None
        self.arrivals: asyncio.Task | None = None
        self.cut_short = False  # requests in flight were cut
        self.runner_crashed = False
        self.signals_installed = False
        self.gc_restore: Callable[[], None] | None = None
        self.waits: list[asyncio.Task] = []

    @classmethod
    async def open(cls, run: PreparedRun, how: InProcess) -> _Running:
        """Transport, record writer, context, observers: nothing sent yet."""
        from agentload.run.transport import Transport

        sc = run.scenario
        plans = load_plans(sc.replay.source, sc.replay.format) if sc.replay.source else None  # a bad capture: no run
        transport = Transport(sc.client, sc.target, run.base_url)  # first: a missing secret leaves no half-made run
        run.write_meta()
        writer = RecordWriter(run.path("records"), loop=asyncio.get_running_loop())
        ctx = RunContext(sc, run.run_id, transport.url, transport, writer, tool_schemas(sc.conversation.tools))
        ctx.replay_plans = plans
        ctx.shard = run.shard
        if how.on_context is not None:
            how.on_context(ctx)
        self = cls(run, how, ctx, transport, writer)
        ctx.on_crash = self.write_crashes
        try:
            self.extras = await start_observers(ctx, run.run_dir, run.meta, run.metrics_port)
        except BaseException:  # e.g. --metrics-port already taken: nothing was sent yet
            self.sampler.close()
            writer.close()
            await transport.close()
            raise
        return self

    def write_crashes(self) -> None:
        """The moment a crash happens: a run killed later still has it."""
        self.meta["crashes"] = list(self.ctx.crashes)
        self.meta["crash_count"] = self.ctx.crash_count
        self.run.write_meta()

    async def start(self) -> None:
        """What the server says of itself, signals, the background jobs; then the agents (or the drive)."""
        run, ctx = self.run, self.ctx
        if not run.embedded_mock and "fleet" not in self.meta and run.first:
            # what the server says of itself (llama.cpp's /props: slots, n_ctx per slot, tool calls), bounded
            self.meta["server_props"] = await server_props.fetch(run.base_url, self.transport.headers,
                                                                 run.scenario.client.connect_timeout_s)
            run.write_meta()
        if self.how.on_started is not None:
            self.how.on_started(self.meta)
        if run.install_signals:
            self.install_signals()
        self.background = [asyncio.create_task(_supervise(ctx, name, job), name=name) for name, job in self.jobs()]
        if self.how.gate is not None:
            ctx.arrivals_t0 = await self.how.gate()  # every part's agents start at the same moment
        drive = self.how.drive
        self.arrivals = asyncio.create_task(drive(ctx) if drive is not None else arrivals(ctx, self.agent_tasks),
                                            name="arrivals")

    def install_signals(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.on_signal, sig.name)
        loop.add_signal_handler(signal.SIGUSR1, dump.on_sigusr1, self.ctx, self.run.run_dir, self.meta["t0_ns"])
        self.signals_installed = True

    def on_signal(self, signame: str) -> None:
        self.interrupts += 1
        ctx = self.ctx
        if self.interrupts == 1 and not ctx.stopping:
            ctx.stop(f"interrupted ({signame})", by="interrupted")
            print(f"\nagentload: {signame}: no new rounds; in-flight requests get up to give_up_s="
                  f"{ctx.scenario.stall.give_up_s:g} s, then the full report (signal again to stop now)",
                  file=sys.stderr, flush=True)
        elif not self.hard_stop.is_set():  # a second signal, or one while already winding down: stop now
            self.hard_stop.set()
            print(f"\nagentload: {signame}: stopping now; writing what was recorded", file=sys.stderr, flush=True)

    def jobs(self) -> list[tuple[str, Callable[[], Awaitable[Any]]]]:
        """Every background job; each runs supervised (a crash is recorded and the job restarted, see _supervise)."""
        ctx, sampler, run = self.ctx, self.sampler, self.run
        jobs: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
            ("watchdog", functools.partial(watchdog, ctx)),
            ("sampler", sampler.run),
            ("lag", sampler.probe_lag),
            ("stall-dumps", functools.partial(dump.watch_stalls, ctx, run.run_dir, self.meta["t0_ns"]))]
        if run.scenario.canary.every_s > 0 and run.first:
            jobs.append(("canary", functools.partial(canaries, ctx, itertools.count())))
        self.prober = Prober(ctx) if run.scenario.stall.probes and run.first else None
        if self.prober is not None:  # a stall wave's probes (agentload.run.probes)
            jobs.append(("probes", self.prober.run))
        jobs.extend(self.extras.jobs())
        on_tick = self.how.on_tick
        if on_tick is not None:
            async def ticker() -> None:  # with every full snapshot: once a second
                await follow(ctx.snapshots, lambda snap: on_tick(ctx, sampler), full=True)
            jobs.append(("live", ticker))
        return jobs

    async def until_stopped(self) -> None:
        """Phase 1: run until every agent is done, the duration is over, or a signal comes.

        One waiter for "no agent left" and one for "stop", not a callback on every agent task per
        wake-up: with 10,000 agents that would cost O(agents) each time one of them ends."""
        ctx, arrivals, tasks = self.ctx, self.arrivals, self.agent_tasks
        assert arrivals is not None
        duration = ctx.scenario.agents.duration_s
        started = time.monotonic()
        ctx.agents_idle.set()
        idle_wait = asyncio.create_task(ctx.agents_idle.wait())
        stop_wait = asyncio.create_task(ctx.stop_event.wait())
        self.waits = [idle_wait, stop_wait]
        self.gc_restore = gc_for_run()
        arrivals_checked = False
        while True:
            if arrivals.done() and not arrivals_checked:
                arrivals_checked = True
                exc = None if arrivals.cancelled() else arrivals.exception()
                if exc is not None:  # agents that were due never started: the run is not what was asked
                    ctx.record_crash("arrivals", exc)
                    ctx.stop("agentload crashed: the arrivals task", by="crashed")
                    break
            if arrivals.done() and not tasks:
                break
            timeout = RUN_LOOP_POLL_S
            if duration is not None:
                left = duration - (time.monotonic() - started)
                if left <= 0:
                    ctx.stop("duration reached", by="duration")
                    break
                timeout = min(timeout, left)
            if ctx.stopping:
                break
            if idle_wait.done() and tasks:
                idle_wait = asyncio.create_task(ctx.agents_idle.wait())
                self.waits.append(idle_wait)
            await asyncio.wait([w for w in (arrivals, idle_wait, stop_wait) if not w.done()] or [stop_wait],
                               timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        ctx.stop(ctx.stop_reason or "all agents finished")

    async def wind_down(self) -> None:
        """Phase 2: in-flight requests get give_up_s (plus grace) to end; a second signal ends it now."""
        ctx, arrivals = self.ctx, self.arrivals
        assert arrivals is not None
        if self.agent_tasks:
            idle = asyncio.create_task(ctx.agents_idle.wait())
            await self.bounded(idle)
            idle.cancel()
        if self.how.drive is not None and not arrivals.done():  # its requests in flight: up to give_up_s to end
            await self.bounded(arrivals)
            if not arrivals.done():
                self.cut_short = True
        if await self.cancel_agents():
            self.cut_short = True
        prober = self.prober
        if prober is not None and not prober.idle.is_set() and not self.hard_stop.is_set():
            # a stall wave's experiment in progress: its answer is the verdict's evidence (same bound)
            idle = asyncio.create_task(prober.idle.wait())
            await self.bounded(idle)
            idle.cancel()
        if not arrivals.done():
            arrivals.cancel()

    async def bounded(self, waiting: asyncio.Future) -> None:
        """Wait for `waiting` at most give_up_s plus the grace period; the hard stop ends the wait now."""
        hard = asyncio.create_task(self.hard_stop.wait())
        try:
            await asyncio.wait([waiting, hard], timeout=self.ctx.scenario.stall.give_up_s + SHUTDOWN_GRACE_S,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            hard.cancel()

    async def cancel_agents(self) -> bool:
        """Cancel the agent tasks still running (their requests are recorded cut short); True if any were."""
        still = [t for t in self.agent_tasks if not t.done()]
        for t in still:
            t.cancel()
        if still:
            await asyncio.wait(still, timeout=SHUTDOWN_GRACE_S)
        return bool(still)

    async def abort(self, e: Exception) -> None:
        """The run loop itself failed: a crash entry, the run stopped, every agent cancelled."""
        self.runner_crashed = True
        self.ctx.record_crash("runner", e)
        self.ctx.stop("agentload crashed: the run loop", by="crashed")
        if self.arrivals is not None:
            self.arrivals.cancel()
        await self.cancel_agents()

    async def close(self) -> None:
        """Stop the background jobs, close every file and the transport, write run.json's end."""
        for w in self.waits:
            w.cancel()
        await self.stop_background()
        # Each closing step on its own: one that fails is a crash entry, the others still run and
        # run.json is still written.
        for name, step in (("snapshot", functools.partial(_final_snapshot, self.ctx)),
                           ("sampler", self.sampler.sample), ("sampler", self.sampler.close),
                           ("observers", self.extras.close), ("transport", self.transport.close),
                           ("writer", self.writer.close)):
            try:
                r = step()
                if asyncio.iscoroutine(r):
                    await r
            except Exception as e:
                self.ctx.record_crash(name, e)
        if self.signals_installed:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
                loop.remove_signal_handler(sig)
        self.write_end()
        if self.gc_restore is not None:
            self.gc_restore()

    async def stop_background(self) -> None:
        ctx = self.ctx
        for t in self.background:
            t.cancel()
        # bounded: a job that swallowed its cancel must not keep the run from writing its files
        if not self.background:
            return
        done, pending = await asyncio.wait(self.background, timeout=SHUTDOWN_GRACE_S)
        for t in done:
            exc = None if t.cancelled() else t.exception()
            if exc is not None:  # _supervise records; this is a fault in it
                ctx.record_crash(t.get_name(), exc)
        for t in pending:
            ctx.record_crash(t.get_name(), RuntimeError(f"background task {t.get_name()} did not stop "
                                                        f"within {SHUTDOWN_GRACE_S:g} s of its cancel"))

    def write_end(self) -> None:
        """run.json's last write: how the run ended and what it did."""
        ctx = self.ctx
        interrupted = self.interrupts > 0
        if self.runner_crashed or ctx.stopped_by == "crashed":
            ended_by = "crashed"
        elif interrupted:
            ended_by = "interrupted"
        else:
            ended_by = ctx.stopped_by or "finished"
        # Cut short: requests in flight were cut (their cut_short records), a signal stopped the run,
        # or agentload stopped it. Agents that start no further round at duration_s are not: that
        # is how a run with a duration ends.
        cut_short = self.cut_short or interrupted or ended_by == "crashed" or ctx.counts["cut_short"] > 0
        self.meta.update({"ended": True, "ended_normally": not interrupted and ended_by != "crashed",
                          "cut_short": cut_short, "ended_by": ended_by,
                          "stop_reason": ctx.stop_reason, "t_end_ns": _now(), "t_end_unix": time.time(),
                          "records": self.writer.count, "max_loop_lag_ms": round(ctx.loop_lag.max_ms, 3),
                          # request bodies kept compressed while they waited for the pool (client.park_queued_bodies_mb)
                          "parked_bodies": ctx.transport.queued_bodies.parked,
                          "gated_requests": ctx.transport.gated_requests(),
                          # agents.count's share of this process, those started, those due and never started
                          "agents_asked": ctx.agents_asked, "agents_started": ctx.agents_started,
                          "agents_due_unstarted": ctx.agents_due_unstarted,
                          "crashes": list(ctx.crashes), "crash_count": ctx.crash_count})
        self.run.write_meta()


def _final_snapshot(ctx: RunContext) -> None:
    """The run's state at its end, for the last sample (the watchdog is stopped by then)."""
    ctx.snapshots.publish(scan(ctx, seq=ctx.snapshots.next_seq(), full=True))
