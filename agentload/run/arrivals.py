"""The agents' arrivals: this process's share of `agents.count`, started on the scenario's schedule.

Closed loop: every agent at once, or spread over the ramp (`agents.start`). Open loop: new
conversations at `agents.rate_per_s` (poisson or uniform gaps, or a replayed trace's own arrival
times), whatever the server does. With a shard (I, N) only the agents i with i % N == I start here;
every part draws the whole schedule, so an agent starts at the same moment whichever part runs it.

Agents start in slices of at most ARRIVAL_SLICE per event-loop step (each agent allocates its
state when its task first runs): 100,000 agents starting "all" at once must not freeze the loop
long enough to fake connect timeouts. An agent's task is kept only while it runs (`_track`), and
however the arrivals end, the agents that were due but never started are counted
(`ctx.agents_due_unstarted`).
"""

from __future__ import annotations

import asyncio
import functools
import gc
import random
import time

from agentload.run.agent import run_agent
from agentload.run.context import RunContext
from agentload.run.replay import arrival_of

_now = time.perf_counter_ns

ARRIVAL_SLICE = 64  # agents started per event-loop step at most; each first step costs ~0.3 ms (64: ~20 ms)
# Closed loop: after every this many agents started, what exists is frozen for the collector (gc.freeze:
# moved out of every generation at once, never walked again until the run's end unfreezes it). The
# agents' long-lived objects (tasks, conversations, generators) would otherwise be walked by every
# full collection while they pile up: 100,000 agents queued at once, a 3.3 s pause at 70,000. Only
# garbage in reference cycles made before a freeze waits for the run's end (young collections
# during such runs find none).
FREEZE_EVERY_AGENTS = 10_000


def _track(ctx: RunContext, tasks: set[asyncio.Task], task: asyncio.Task) -> None:
    """Keep a live agent's task; forget it once it ends, so hours of open-loop arrivals hold only
    the conversations in progress (an ended one leaves its count in ctx.finished, its lines on disk)."""
    tasks.add(task)
    ctx.agents_idle.clear()
    agent = int(task.get_name().rpartition("-")[2])
    # a partial, not a closure: fewer objects per live agent for the garbage collector to walk
    task.add_done_callback(functools.partial(_agent_done, ctx, tasks, agent))


def _agent_done(ctx: RunContext, tasks: set[asyncio.Task], agent: int, t: asyncio.Task) -> None:
    tasks.discard(t)
    if not tasks:
        ctx.agents_idle.set()
    exc = None if t.cancelled() else t.exception()
    if exc is not None:
        st = ctx.agent_states.get(agent)
        if st is not None:
            st.state = "crashed"
        ctx.record_crash("agent", exc, agent=agent, round=(st.round or None) if st is not None else None)
    if ctx.scenario.agents.arrival == "open":
        st = ctx.agent_states.pop(agent, None)
        if st is not None:
            state = "cut_short" if t.cancelled() else st.state
            ctx.finished[state] = ctx.finished.get(state, 0) + 1


async def arrivals(ctx: RunContext, tasks: set[asyncio.Task]) -> None:
    """Start this process's agents on their schedule; however it ends (the run stopped first, a
    cancel), count the agents that never started and were due by then (`_count_unstarted`)."""
    a = ctx.scenario.agents
    mine, workers = ctx.shard
    ctx.agents_asked = len(range(mine, a.count, workers))
    loop_start = ctx.arrivals_t0 or _now()
    pos = [0, loop_start, False]  # the next agent to start, the last due time drawn (open loop), drawn for it?
    rng = random.Random(a.seed)
    try:
        await _arrive(ctx, tasks, loop_start, pos, rng)
    finally:
        ctx.agents_due_unstarted = _count_unstarted(ctx, loop_start, pos, rng, _now())


def _count_unstarted(ctx: RunContext, loop_start: int, pos: list, rng: random.Random, now: int) -> int:
    """This process's agents, from `pos` on, that were due at `now` but never started. `pos`: the
    next agent not started, its due time (open loop: the last drawn) and whether that was drawn."""
    a = ctx.scenario.agents
    mine, workers = ctx.shard
    i, due, drawn = pos
    if i >= a.count:
        return 0
    if a.arrival == "closed":
        ramp = 0.0 if a.start == "all" else float(a.start)
        last = a.count - 1
        if ramp > 0 and a.count > 1:  # agent j is due at loop_start + ramp * j / (n - 1)
            last = min(last, (now - loop_start) * (a.count - 1) // int(ramp * 1e9))
        return len(range(i + (mine - i) % workers, last + 1, workers)) if last >= i else 0
    n = 0  # open loop: the rest of the schedule, drawn as the arrivals would have, up to now
    plans = ctx.replay_plans
    while i < a.count:
        if not drawn:
            at = arrival_of(plans, i) if plans else None
            if at is not None:  # a replayed trace's own arrival time
                due = loop_start + int(at / ctx.scenario.replay.speed * 1e9)
            else:
                due += int((rng.expovariate(a.rate_per_s) if a.rate_dist == "poisson" else 1.0 / a.rate_per_s) * 1e9)
        if due > now:
            break
        n += i % workers == mine
        i += 1
        drawn = False
    return n


async def _arrive(ctx: RunContext, tasks: set[asyncio.Task], loop_start: int, pos: list,
                  rng: random.Random) -> None:
    # Agents started since the loop last ran: at most ARRIVAL_SLICE, then yield, so the new agents'
    # first steps (building a conversation, asking the pool) and every socket event in between run
    # before the next slice. 100,000 agents at once froze the loop 12-22 s (false connect timeouts).
    if ctx.scenario.agents.arrival == "closed":
        await _arrive_closed(ctx, tasks, loop_start, pos)
    else:
        await _arrive_open(ctx, tasks, loop_start, pos, rng)


async def _arrive_closed(ctx: RunContext, tasks: set[asyncio.Task], loop_start: int, pos: list) -> None:
    """Closed loop: every agent at once, or spread over the ramp (`agents.start`), each one
    conversation after another until its rounds are done."""
    a = ctx.scenario.agents
    mine, workers = ctx.shard
    started = 0  # since the loop last ran
    own = 0  # agents this process started
    n = a.count
    ramp = 0.0 if a.start == "all" else float(a.start)
    for i in range(n):
        pos[0] = i
        if ctx.stopping:
            return
        if i % workers != mine:  # another worker process's agent
            continue
        if ramp > 0 and n > 1:
            due = loop_start + int(ramp * 1e9 * i / (n - 1))
            delay = (due - _now()) / 1e9
            if delay > 0:
                await ctx.sleep(delay)
                started = 0
                if ctx.stopping:
                    return
        if started >= ARRIVAL_SLICE:
            await asyncio.sleep(0)
            started = 0
            if ctx.stopping:
                return
        _track(ctx, tasks, asyncio.create_task(run_agent(ctx, i), name=f"agent-{i}"))
        pos[0] = i + 1
        ctx.agents_started += 1
        started += 1
        own += 1
        if own % FREEZE_EVERY_AGENTS == 0:
            gc.freeze()
    pos[0] = n
    if own >= FREEZE_EVERY_AGENTS:  # the last slice's agents, once their first step has run
        await asyncio.sleep(0)
        gc.freeze()
        ctx.pace_collector = True


async def _arrive_open(ctx: RunContext, tasks: set[asyncio.Task], loop_start: int, pos: list,
                       rng: random.Random) -> None:
    """Open loop: new conversations start at a rate, whatever the server does; each first request
    carries the time it should have started, so latency counts the lateness too."""
    sc = ctx.scenario
    a = sc.agents
    mine, workers = ctx.shard
    started = 0  # since the loop last ran
    due = loop_start
    for i in range(a.count):
        pos[0], pos[1], pos[2] = i, due, False
        if ctx.stopping:
            return
        at = arrival_of(ctx.replay_plans, i) if ctx.replay_plans else None
        if at is not None:  # a replayed trace: its own arrival times (/ replay.speed)
            due = loop_start + int(at / sc.replay.speed * 1e9)
        else:
            gap = (rng.expovariate(a.rate_per_s) if a.rate_dist == "poisson" else 1.0 / a.rate_per_s)
            due += int(gap * 1e9)
        pos[1], pos[2] = due, True
        if i % workers != mine:  # every worker draws the whole schedule, and starts its own agents
            continue
        # a loop timer may fire up to its clock resolution early: never start before the intended time
        while (delay := (due - _now()) / 1e9) > 0:
            await ctx.sleep(delay)
            started = 0
            if ctx.stopping:
                return
        if started >= ARRIVAL_SLICE:  # far behind schedule: still a slice per loop step
            await asyncio.sleep(0)
            started = 0
            if ctx.stopping:
                return
        _track(ctx, tasks, asyncio.create_task(run_agent(ctx, i, intended_start=due), name=f"agent-{i}"))
        pos[0], pos[2] = i + 1, False
        ctx.agents_started += 1
        started += 1
    pos[0] = a.count
