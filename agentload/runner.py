"""Runs a scenario: agent arrivals, the watchdog, canaries, samplers, a bounded shutdown.

Every wait here is bounded by the scenario: the run ends by itself at the latest
`stall.give_up_s` plus a grace period after it stops starting rounds, and whatever was in
flight then is recorded as cut short.
"""

from __future__ import annotations

import asyncio
import os
import platform
import random
import secrets
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import aiohttp
import orjson

from agentload import __version__
from agentload.agent import AgentState, attempt, run_agent
from agentload.conversation import Conversation, tool_schemas
from agentload.records import Record, RecordWriter, Trace
from agentload.scenario import Scenario, const

_now = time.perf_counter_ns

SHUTDOWN_GRACE_S = 3.0
SAMPLE_EVERY_S = 1.0
LOOP_LAG_PROBE_S = 0.1


@dataclass
class RunContext:
    scenario: Scenario
    run_id: str
    url: str
    transport: Any
    writer: RecordWriter
    tools: list[dict[str, Any]]
    inflight: dict[str, Trace] = field(default_factory=dict)
    agent_states: dict[int, AgentState] = field(default_factory=dict)
    stopping: bool = False
    stop_reason: str | None = None
    stop_event: asyncio.Event = field(default_factory=asyncio.Event)
    listeners: list[Callable[[Record], None]] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=lambda: {"requests": 0, "ok": 0, "error": 0, "stalled": 0,
                                                             "cut_short": 0, "output_tokens": 0})

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
        """A sleep that ends early when the run stops."""
        if seconds <= 0 or self.stopping:
            return
        try:
            await asyncio.wait_for(self.stop_event.wait(), timeout=seconds)
        except TimeoutError:
            pass

    def stop(self, reason: str) -> None:
        if not self.stopping:
            self.stopping = True
            self.stop_reason = reason
            self.stop_event.set()


@dataclass
class RunOutcome:
    out_dir: Path
    run_id: str
    cut_short: bool
    stop_reason: str | None
    interrupted: bool


def default_out_dir(sc: Scenario, base: Path = Path("reports")) -> Path:
    name = Path(sc.source.split(" ")[0]).name.removesuffix(".toml") or "run"
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return base / f"{stamp}-{name}-{secrets.token_hex(2)}"


def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
    os.replace(tmp, path)


def run_metadata(sc: Scenario, run_id: str, endpoint: str, embedded_mock: bool) -> dict[str, Any]:
    return {
        "run": run_id,
        "version": __version__,
        "record_version": 1,
        "scenario": sc.to_dict(),
        "fingerprint": sc.workload_fingerprint(),
        "endpoint": endpoint,
        "embedded_mock": embedded_mock,
        "client": sc.to_dict()["client"],
        "stall": sc.to_dict()["stall"],
        "versions": {"python": platform.python_version(), "aiohttp": aiohttp.__version__,
                     "platform": platform.platform()},
        "argv": sys.argv,
        "pid": os.getpid(),
        "t0_ns": _now(),
        "t0_unix": time.time(),
        "ended": False,
        "ended_normally": False,
        "cut_short": False,
    }


class Sampler:
    """Pool state, in-flight counts and event-loop lag over time -> samples.jsonl."""

    def __init__(self, ctx: RunContext, path: Path):
        self.ctx = ctx
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.max_lag_ms = 0.0
        self.lag_ms = 0.0

    async def probe_lag(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            t = loop.time()
            await asyncio.sleep(LOOP_LAG_PROBE_S)
            lag = (loop.time() - t - LOOP_LAG_PROBE_S) * 1000.0
            self.lag_ms = max(self.lag_ms, lag)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(SAMPLE_EVERY_S)
            self.sample()

    def sample(self) -> None:
        ctx = self.ctx
        phases: dict[str, int] = {}
        stalled = 0
        for tr in list(ctx.inflight.values()):
            if tr.kind != "agent":
                continue
            p = tr.phase()
            phases[p] = phases.get(p, 0) + 1
            stalled += tr.stalled_phase is not None
        s = {"t": _now(), "pool": ctx.transport.pool_state(), "inflight": phases, "stalled": stalled,
             "loop_lag_ms": round(self.lag_ms, 3), "counts": dict(ctx.counts)}
        self.max_lag_ms = max(self.max_lag_ms, self.lag_ms)
        self.lag_ms = 0.0
        os.write(self.fd, orjson.dumps(s, option=orjson.OPT_APPEND_NEWLINE))

    def close(self) -> None:
        os.close(self.fd)


async def watchdog(ctx: RunContext) -> None:
    """Marks requests with no progress for stall.after_s; fires the give-up after give_up_s."""
    after = int(ctx.scenario.stall.after_s * 1e9)
    give_up = int(ctx.scenario.stall.give_up_s * 1e9)
    tick = max(0.05, min(1.0, ctx.scenario.stall.after_s / 4))
    while True:
        await asyncio.sleep(tick)
        now = _now()
        for tr in list(ctx.inflight.values()):
            idle = now - tr.progress_ns()
            if idle >= after and tr.stalled_phase is None:
                tr.stalled_phase = tr.phase()
                tr.stalled_at = now
            if idle >= give_up and not tr.gave_up and tr.timeout_cm is not None:
                tr.stalled_phase = tr.stalled_phase or tr.phase()
                tr.gave_up = True
                tr.timeout_cm.reschedule(asyncio.get_running_loop().time())


async def canaries(ctx: RunContext) -> None:
    """A short single-round request on its own fresh connection every canary.every_s."""
    cfg = ctx.scenario.canary
    session = ctx.transport.canary_session(cfg.timeout_s)
    sc = ctx.scenario
    conv_cfg = sc.conversation.__class__(
        mode="scripted", system_tokens=const(0), user_tokens=const(cfg.prompt_tokens), tools=0,
        max_tokens=cfg.max_tokens, stream=sc.conversation.stream, include_usage=sc.conversation.include_usage)
    n = 0
    try:
        while not ctx.stopping:
            conv = Conversation(conv_cfg, sc.target.model, random.Random(n), -1, tools=[])
            body = conv.body()
            trace = Trace("canary", -1, 1, n, f"{ctx.run_id}-canary-{n}", len(conv.messages), len(body), conv.tokens)
            await attempt(ctx, session, trace, body)
            n += 1
            await ctx.sleep(cfg.every_s)
    finally:
        await session.close()


async def _arrivals(ctx: RunContext, tasks: set[asyncio.Task]) -> None:
    sc = ctx.scenario
    a = sc.agents
    loop_start = _now()
    if a.arrival == "closed":
        n = a.count
        ramp = 0.0 if a.start == "all" else float(a.start)
        for i in range(n):
            if ctx.stopping:
                return
            if ramp > 0 and n > 1:
                due = loop_start + int(ramp * 1e9 * i / (n - 1))
                delay = (due - _now()) / 1e9
                if delay > 0:
                    await ctx.sleep(delay)
                    if ctx.stopping:
                        return
            tasks.add(asyncio.create_task(run_agent(ctx, i), name=f"agent-{i}"))
        return
    # Open loop: new conversations start at a rate, whatever the server does; each first
    # request carries the time it should have started, so latency counts the lateness too.
    rng = random.Random(a.seed)
    due = loop_start
    for i in range(a.count):
        if ctx.stopping:
            return
        gap = (rng.expovariate(a.rate_per_s) if a.rate_dist == "poisson" else 1.0 / a.rate_per_s)
        due += int(gap * 1e9)
        delay = (due - _now()) / 1e9
        if delay > 0:
            await ctx.sleep(delay)
            if ctx.stopping:
                return
        tasks.add(asyncio.create_task(run_agent(ctx, i, intended_start=due), name=f"agent-{i}"))


async def execute(sc: Scenario, out_dir: Path, base_url: str, *, embedded_mock: bool,
                  on_tick: Callable[[RunContext, "Sampler"], None] | None = None,
                  install_signals: bool = True) -> RunOutcome:
    """Run the scenario against base_url, writing run.json, records.jsonl and samples.jsonl."""
    from agentload.transport import Transport

    out_dir.mkdir(parents=True, exist_ok=True)
    run_id = secrets.token_hex(4)
    meta = run_metadata(sc, run_id, base_url, embedded_mock)
    _write_json(out_dir / "run.json", meta)
    writer = RecordWriter(out_dir / "records.jsonl")
    transport = Transport(sc.client, sc.target, base_url)
    ctx = RunContext(sc, run_id, transport.url, transport, writer, tool_schemas(sc.conversation.tools))
    sampler = Sampler(ctx, out_dir / "samples.jsonl")
    loop = asyncio.get_running_loop()
    interrupts = 0
    hard_stop = asyncio.Event()

    def on_signal(signame: str) -> None:
        nonlocal interrupts
        interrupts += 1
        if interrupts == 1:
            ctx.stop(f"interrupted ({signame})")
        else:
            hard_stop.set()

    if install_signals:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal, sig.name)

    agent_tasks: set[asyncio.Task] = set()
    background = [asyncio.create_task(watchdog(ctx), name="watchdog"),
                  asyncio.create_task(sampler.run(), name="sampler"),
                  asyncio.create_task(sampler.probe_lag(), name="lag")]
    if sc.canary.every_s > 0:
        background.append(asyncio.create_task(canaries(ctx), name="canary"))
    if on_tick is not None:
        async def ticker() -> None:
            while True:
                await asyncio.sleep(1.0)
                on_tick(ctx, sampler)
        background.append(asyncio.create_task(ticker(), name="live"))

    arrivals = asyncio.create_task(_arrivals(ctx, agent_tasks), name="arrivals")
    duration = sc.agents.duration_s
    started = time.monotonic()
    cut_short = False
    try:
        # Phase 1: run until every agent is done, the duration is over, or a signal comes.
        while True:
            live = [t for t in agent_tasks if not t.done()]
            if arrivals.done() and not live:
                break
            timeout = 0.5
            if duration is not None:
                left = duration - (time.monotonic() - started)
                if left <= 0:
                    ctx.stop("duration reached")
                    break
                timeout = min(timeout, left)
            if ctx.stopping:
                break
            await asyncio.wait(live + ([arrivals] if not arrivals.done() else []) or [ctx.stop_event.wait()],
                               timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        ctx.stop(ctx.stop_reason or "all agents finished")
        # Phase 2: in-flight requests get give_up_s (plus grace) to end; a second signal ends it now.
        live = [t for t in agent_tasks if not t.done()]
        if live:
            hard = asyncio.create_task(hard_stop.wait())
            await _wait_all_or(live, hard, sc.stall.give_up_s + SHUTDOWN_GRACE_S)
            hard.cancel()
        still = [t for t in agent_tasks if not t.done()]
        if still:
            cut_short = True
            for t in still:
                t.cancel()
            await asyncio.wait(still, timeout=SHUTDOWN_GRACE_S)
        if not arrivals.done():
            arrivals.cancel()
    finally:
        for t in background:
            t.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        sampler.sample()
        sampler.close()
        await transport.close()
        writer.close()
        if install_signals:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
        interrupted = interrupts > 0
        cut_short = cut_short or interrupted or any(
            st.state == "cut_short" for st in ctx.agent_states.values())
        meta.update({"ended": True, "ended_normally": not interrupted, "cut_short": cut_short,
                     "stop_reason": ctx.stop_reason, "t_end_ns": _now(), "t_end_unix": time.time(),
                     "records": writer.count, "max_loop_lag_ms": round(sampler.max_lag_ms, 3)})
        _write_json(out_dir / "run.json", meta)
    return RunOutcome(out_dir, run_id, cut_short, ctx.stop_reason, interrupts > 0)


async def _wait_all_or(tasks: list[asyncio.Task], hard: asyncio.Task, timeout: float) -> None:
    """Wait until all tasks end, the hard-stop fires, or the timeout passes."""
    deadline = time.monotonic() + timeout
    pending = set(tasks)
    while pending:
        left = deadline - time.monotonic()
        if left <= 0 or hard.done():
            return
        done, pending = await asyncio.wait(pending | {hard}, timeout=left, return_when=asyncio.FIRST_COMPLETED)
        pending.discard(hard)
