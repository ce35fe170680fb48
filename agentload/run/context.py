"""The state one run shares between its agents, its background tasks and whatever watches it.

`RunContext` holds the scenario, the transport, the record writer, the in-flight registry (one
Trace per request in flight), agent states, counters, the crash list, and the snapshot feed. The
agents write the registry; the watchdog alone walks it while the run goes on, and publishes one
snapshot per tick on `snapshots` (`agentload.run.snapshot`), which the sampler, the stall waves,
the live view and the exporter read; the agent dump (a rare event) reads the agent states
itself. It lives apart from the runner so that none of them has to import the runner back.
"""

from __future__ import annotations

import asyncio
import contextvars
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from agentload import redact
from agentload.records import Record, RecordWriter, Trace
from agentload.run import apis
from agentload.run.snapshot import LoopLag, SnapshotFeed

if TYPE_CHECKING:
    from agentload.run.scenario import Scenario

_now = time.perf_counter_ns

MAX_CRASH_ENTRIES = 50  # crash entries kept in run.json (all counted in crash_count)


@dataclass(slots=True)
class AgentState:
    """What the live view and the agent dump show for one agent (slots: 100,000 of them)."""

    agent: int
    round: int = 0
    state: str = "waiting"  # waiting | request | tool | done | stalled | error | cut_short | crashed
    since: int = field(default_factory=_now)
    trace: Trace | None = None
    rounds_completed: int = 0
    conversations: int = 0  # finished conversations (more than one with agents.restart)


def crash_entry(where: str, exc: BaseException, agent: int | None = None, round: int | None = None,
                **extra: Any) -> dict[str, Any]:
    """One entry of run.json's `crashes`."""
    tb = "".join(traceback.format_exception(exc)).rstrip().splitlines()
    msg = redact.redact(str(exc).replace("\r", " ").replace("\n", " ").strip()) or type(exc).__name__
    return {"where": where, "agent": agent, "round": round, "error": type(exc).__name__,
            "message": msg[:300], "traceback": redact.redact("\n".join(tb[-8:])), **extra}


@dataclass
class RunContext:
    scenario: Scenario
    run_id: str
    url: str
    transport: Any
    writer: RecordWriter
    tools: list[dict[str, Any]]
    inflight: dict[str, Trace] = field(default_factory=dict)
    replay_plans: list[Any] | None = None  # [replay]: the captured conversations agents play back (agentload.run.replay)
    agent_states: dict[int, AgentState] = field(default_factory=dict)
    # open loop: ended conversations leave agent_states (memory stays flat) and are counted here by state
    finished: dict[str, int] = field(default_factory=dict)
    stopping: bool = False
    stop_reason: str | None = None
    # the start-up froze the agents (a closed loop of FREEZE_EVERY_AGENTS or more): from then on the
    # watchdog collects the young generations once a second and freezes what survived (`pace_collector`)
    pace_collector: bool = False
    stop_event: asyncio.Event = field(default_factory=asyncio.Event)
    listeners: list[Callable[[Record], None]] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=lambda: {"requests": 0, "ok": 0, "error": 0, "stalled": 0,
                                                             "cut_short": 0, "output_tokens": 0})
    # --workers: this process runs the agents i with i % shard[1] == shard[0] (ids stay global)
    shard: tuple[int, int] = (0, 1)
    arrivals_t0: int | None = None  # a start time shared by all workers (perf_counter_ns), else now
    # this process's share of agents.count, how many of them it started, and how many of those not
    # started were due before the arrivals stopped (the rest were due after the run ended): run.json
    agents_asked: int = 0
    agents_started: int = 0
    agents_due_unstarted: int = 0
    agents_idle: asyncio.Event = field(default_factory=asyncio.Event)  # set while no agent task is live
    sleepers: set[asyncio.Future] = field(default_factory=set)  # agents in ctx.sleep(), woken by stop()
    stopped_by: str | None = None  # finished | duration | interrupted | crashed: what called stop() first
    crashes: list[dict[str, Any]] = field(default_factory=list)  # the first MAX_CRASH_ENTRIES
    crash_count: int = 0
    on_crash: Callable[[], None] | None = None  # rewrites run.json (set by the in-process run)
    snapshots: SnapshotFeed = field(default_factory=SnapshotFeed)  # the watchdog's one snapshot per tick
    loop_lag: LoopLag = field(default_factory=LoopLag)  # measured by the "lag" job
    # the reader of one answer in the scenario's API (`target.api`: apis.<api>.Stream)
    stream_cls: Any = None

    def __post_init__(self) -> None:
        if self.stream_cls is None:
            self.stream_cls = apis.get(self.scenario.target.api).Stream

    def record_crash(self, where: str, exc: BaseException, *, agent: int | None = None,
                     round: int | None = None, **extra: Any) -> None:
        """agentload itself failed (an agent, a background task, the run loop): say so on stderr and
        in run.json at once. Never raises: the run goes on with whatever still works."""
        self.crash_count += 1
        try:
            if len(self.crashes) >= MAX_CRASH_ENTRIES:
                return
            entry = crash_entry(where, exc, agent, round, **extra)
            self.crashes.append(entry)
            who = f"{where}" + (f" (agent {agent}, round {round})" if agent is not None else "")
            print(f"agentload: crash in {who}: {entry['error']}: {entry['message']}", file=sys.stderr, flush=True)
            if self.on_crash is not None:
                self.on_crash()
        except Exception as e:  # e.g. run.json not writable: the crash is still counted
            print(f"agentload: could not record a crash in {where}: {e!r}", file=sys.stderr, flush=True)

    def emit(self, rec: Record) -> None:
        self.writer.write(rec)
        if rec.kind == "agent":
            c = self.counts
            c["requests"] += 1
            c[rec.outcome] += 1
            c["output_tokens"] += rec.output_tokens or rec.token_chunks
        for fn in self.listeners:
            fn(rec)

    async def sleep(self, seconds: float) -> None:
        """A sleep that ends early when the run stops.

        One future and one timer per sleeping agent (no task, no waiter): 10,000 agents in their
        tool time are 10,000 small objects for the event loop and the garbage collector."""
        if seconds <= 0 or self.stopping:
            return
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        handle = loop.call_later(seconds, _wake, fut, context=_NO_CONTEXT)
        self.sleepers.add(fut)
        try:
            await fut
        finally:
            handle.cancel()
            self.sleepers.discard(fut)

    def stop(self, reason: str, by: str = "finished") -> None:
        if not self.stopping:
            self.stopping = True
            self.stop_reason = reason
            self.stopped_by = by
            self.stop_event.set()
            for fut in list(self.sleepers):
                _wake(fut)


_NO_CONTEXT = contextvars.Context()  # _wake reads no context variable: no copy per sleeping agent


def _wake(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)
