"""The watchdog's pass in slices, and its timers on one grid with the lag probe.

A pass over 100,000 requests and agents takes ~60-90 ms of CPU: `scan_sliced` walks it a slice at
a time with the loop running in between, and must come to what the one-step `scan` does (marks,
give-ups, counts), except for requests that ended meanwhile, which it leaves alone. The watchdog
and the lag probe wake the loop on one grid (`TimeGrid`), and the probe, now at most every 0.25 s,
must still see a frozen loop.
"""

from __future__ import annotations

import asyncio
import os
import time
from types import SimpleNamespace

import pytest

import agentload.run.runner as runner
from agentload.process import free_port
from agentload.records import Trace
from agentload.run import snapshot
from agentload.run.context import AgentState
from agentload.run.snapshot import (
    LoopLag,
    SnapshotFeed,
    TimeGrid,
    lag_probe_per_s,
    scan,
    scan_sliced,
    stall_tick,
)

S = 1_000_000_000
AFTER, GIVE_UP = 2 * S, 5 * S


def _loops():
    yield pytest.param(asyncio.new_event_loop, id="asyncio")
    try:
        import uvloop
    except ImportError:
        return
    yield pytest.param(uvloop.new_event_loop, id="uvloop")


def _run(coro, loop_factory=asyncio.new_event_loop):
    with asyncio.Runner(loop_factory=loop_factory) as r:
        return r.run(coro)


def _registry(n=300, now=None):
    """n requests in every phase, stalled or not, past give-up or not, canaries among them, and
    their agents plus some between requests, in a tool call, done; their ages counted back from `now`."""
    now = time.perf_counter_ns() if now is None else now
    fired: list[str] = []
    inflight, states = {}, {}
    phases = [dict(start=1, queued_start=1), dict(start=1, queued_start=1, queued_end=1, conn_start=1),
              dict(start=1, queued_start=1, conn_start=1, conn_end=1, sent=1),
              dict(start=1, queued_start=1, conn_start=1, conn_end=1, sent=1, headers=1),
              dict(start=1, queued_start=1, conn_start=1, conn_end=1, sent=1, headers=1, first_token=1)]
    ages = [0.1 * S, 3 * S, 8 * S]  # fresh, stalled, past give-up
    for i in range(n):
        kind = "canary" if i % 17 == 0 else "agent"
        tr = Trace(kind, i if kind == "agent" else -1, 1 + i % 4, 0, f"r-a{i}-c0", 3, 100, 10)
        age = ages[i % 3]
        tr.t.update({k: now - int(age) - (10 - j) * 1000 for j, k in enumerate(phases[i % 5])})
        tr.t["start"] = now - int(age) - 5 * S - i  # a distinct oldest
        tr.last_token = now - int(age) if "first_token" in tr.t else 0
        tr.reused = (None, True, False)[i % 3 if i % 2 else 0]
        tr.timeout_cm = SimpleNamespace(reschedule=lambda when, tr=tr: fired.append(tr.request_id))
        inflight[tr.request_id] = tr
        if kind == "agent":
            states[i] = AgentState(i, round=tr.round, state="request", trace=tr)
    for j, st in enumerate(("request", "tool", "waiting", "done", "stalled", "error")):
        for k in range(5):
            a = 10_000 + 10 * j + k
            states[a] = AgentState(a, round=1 + k % 3, state=st)
    ctx = SimpleNamespace(inflight=inflight, agent_states=states, finished={"done": 3},
                          counts={"requests": 9, "ok": 7, "error": 0, "stalled": 2, "cut_short": 0, "output_tokens": 5},
                          transport=SimpleNamespace(pool_state=lambda: {"in_use": 3, "limit": 8}), crash_count=0)
    return ctx, fired


def _sliced_pass_while(ctx, meanwhile):
    """The watchdog's sliced pass over ctx, with `meanwhile()` running in the loop beside it."""
    async def main():
        t = asyncio.create_task(meanwhile())
        snap = await scan_sliced(ctx, after_ns=AFTER, give_up_ns=GIVE_UP)
        await t
        return snap

    return _run(main())


def _scan(ctx, **kw):
    """The one-step pass, on a running loop (a give-up reschedules a timeout on it)."""
    async def main():
        return scan(ctx, **kw)
    return _run(main())


def _marks(ctx):
    return {rid: (tr.stalled_phase, tr.gave_up) for rid, tr in ctx.inflight.items()}


def _same_snapshot(a, b):
    for f in ("full", "stalled", "canaries", "counts", "inflight", "agents", "rounds", "finished", "pool"):
        assert getattr(a, f) == getattr(b, f), f
    assert a.oldest[:3] + a.oldest[4:] == b.oldest[:3] + b.oldest[4:]  # all but its age


@pytest.fixture
def small_slices(monkeypatch):
    """Slices of 7 entries, a yield after every one."""
    monkeypatch.setattr(snapshot, "SLICE_CHUNK", 7)
    monkeypatch.setattr(snapshot, "SLICE_NS", 0)


@pytest.mark.parametrize("full", [True, False])
def test_a_sliced_pass_comes_to_what_the_one_step_pass_does(small_slices, full):
    one, fired_one = _registry()
    sliced, fired_sliced = _registry()
    steps = [0]

    async def other_work():  # runs between the slices
        while True:
            steps[0] += 1
            await asyncio.sleep(0)

    async def main():
        a = scan(one, seq=2, full=full, after_ns=AFTER, give_up_ns=GIVE_UP)
        t = asyncio.create_task(other_work())
        b = await scan_sliced(sliced, seq=2, full=full, after_ns=AFTER, give_up_ns=GIVE_UP)
        t.cancel()
        return a, b

    a, b = _run(main())
    assert steps[0] >= 300 // 7  # the loop ran between the slices
    assert _marks(one) == _marks(sliced)
    assert sorted(fired_one) == sorted(fired_sliced) and fired_one
    assert sum(1 for s, _ in _marks(one).values() if s) > len(fired_one)  # stalled, not all given up
    if full:
        _same_snapshot(a, b)
        assert b.oldest is not None and b.inflight and b.agents and dict(b.finished)["done"] == 8
    else:
        assert (a.stalled, a.canaries, a.counts) == (b.stalled, b.canaries, b.counts)


def test_a_request_that_ended_between_slices_is_left_alone_and_a_new_one_waits(small_slices):
    ctx, fired = _registry()
    trs = list(ctx.inflight.values())
    ended = [tr for tr in trs[100:] if tr.kind == "agent" and tr.t["start"] < time.perf_counter_ns() - 12 * S][:3]
    assert len(ended) == 3  # past give-up: the pass would give them up if they were still in flight
    new = Trace("agent", 99_999, 1, 0, "r-new", 3, 100, 10)
    new.t.update(start=1, queued_start=1)  # long stalled, but started after the pass began
    new.timeout_cm = SimpleNamespace(reschedule=lambda when: fired.append("r-new"))

    async def requests_go_on():  # after the pass's first slice: three requests end, one starts
        await asyncio.sleep(0)
        for tr in ended:
            del ctx.inflight[tr.request_id]  # (its give-up timeout still set: only the registry tells)
        ctx.inflight[new.request_id] = new

    snap = _sliced_pass_while(ctx, requests_go_on)
    for tr in ended:
        assert tr.request_id not in fired and not tr.gave_up and tr.stalled_phase is None
    assert "r-new" not in fired and new.stalled_phase is None  # the next tick's
    assert fired  # the others were given up
    # They are counted as in flight, as they were at the pass's start, but not as stalled (not acted on):
    # the counts of a one-step pass over the registry at the start, the marks of one over what was left
    whole, _ = _registry()
    ref_all = _scan(whole, after_ns=AFTER, give_up_ns=GIVE_UP)
    left, _ = _registry()
    for tr in ended:
        del left.inflight[tr.request_id]
    ref_left = _scan(left, after_ns=AFTER, give_up_ns=GIVE_UP)
    assert snap.inflight == ref_all.inflight and snap.canaries == ref_all.canaries
    assert snap.stalled == ref_left.stalled


def test_the_pool_is_read_with_the_registry_so_a_busy_pool_shows_no_false_leak(small_slices):
    # every request in flight holds a connection; while the pass runs, requests end and others take their
    # connections. The pool read at the end (when more are in use than the pass counted) showed a leak.
    ctx, _ = _registry()
    for tr in ctx.inflight.values():
        tr.t.update(queued_end=tr.t["start"], conn_start=tr.t["start"], conn_end=tr.t["start"],
                    sent=tr.t["start"])
    ctx.transport = SimpleNamespace(pool_state=lambda: {"in_use": len(ctx.inflight), "waiters": 4, "limit": 1000})

    async def requests_go_on():
        await asyncio.sleep(0)
        for tr in list(ctx.inflight.values())[:20]:
            del ctx.inflight[tr.request_id]
        for i in range(40):
            new = Trace("agent", 50_000 + i, 1, 0, f"r-new{i}", 3, 100, 10)
            new.t.update(start=1, queued_start=1, queued_end=1, conn_start=1, conn_end=1, sent=1)
            ctx.inflight[new.request_id] = new

    snap = _sliced_pass_while(ctx, requests_go_on)
    holding = sum(n for ph, n in snap.inflight.items() if ph != "pool_wait") + snap.canaries
    assert snap.pool["in_use"] == 300 == holding  # both of the pass's start


def test_a_small_registry_is_still_walked_in_one_step():
    ctx, _ = _registry(50)

    async def main():
        steps = [0]

        async def other_work():
            while True:
                steps[0] += 1
                await asyncio.sleep(0)

        t = asyncio.create_task(other_work())
        await scan_sliced(ctx, after_ns=AFTER, give_up_ns=GIVE_UP)
        n = steps[0]
        t.cancel()
        return n

    assert _run(main()) == 0


@pytest.mark.parametrize("loop_factory", _loops())
def test_the_watchdog_walks_a_large_registry_in_slices_and_publishes_the_same(monkeypatch, loop_factory):
    monkeypatch.setattr(snapshot, "SLICE_NS", 0)  # a yield after each chunk, however fast
    # Both registries aged from one instant, and every pass sees that instant as its now: building 6,000
    # requests twice, the reference pass and the watchdog's second of waiting took over 1.9 s on a loaded
    # CI machine, and the fresh third of the requests had turned stalled by the watchdog's full pass.
    now = time.perf_counter_ns()
    monkeypatch.setattr(snapshot, "_now", lambda: now)
    ctx, fired = _registry(6000, now)
    ref, ref_fired = _registry(6000, now)
    want = _scan(ref, seq=1, after_ns=AFTER, give_up_ns=GIVE_UP)
    ctx.snapshots, ctx.loop_lag = SnapshotFeed(), LoopLag()
    ctx.scenario = SimpleNamespace(stall=SimpleNamespace(after_s=AFTER / S, give_up_s=GIVE_UP / S))
    steps = [0]
    seen = []  # other_work's steps so far at each slice of the agents (full passes only)
    real_agents = snapshot._Pass.agents
    monkeypatch.setattr(snapshot._Pass, "agents", lambda p, states: (seen.append(steps[0]), real_agents(p, states)))

    async def main():
        async def other_work():
            while True:
                steps[0] += 1
                await asyncio.sleep(0)

        t = asyncio.create_task(other_work())
        wd = asyncio.create_task(runner.watchdog(ctx))
        full = await asyncio.wait_for(ctx.snapshots.newer_than(0, full=True), 10)  # a guard, not a measure
        wd.cancel()
        t.cancel()
        return full

    full = _run(main(), loop_factory)
    assert stall_tick(AFTER / S) == 0.5 and full.seq == 2  # a plain tick, then the full one at 1 s
    _same_snapshot(full, want)
    assert sorted(fired) == sorted(ref_fired) and _marks(ctx) == _marks(ref)
    # the loop ran between every two slices of the full pass
    assert len(seen) > 6000 // snapshot.SLICE_CHUNK and seen == sorted(set(seen))


# ---------------------------------------------------------------- one grid for the probe and the watchdog


def test_the_probe_rides_on_the_watchdog_ticks_and_probes_at_least_4_times_a_second():
    for after_s in (0.1, 0.2, 0.3, 0.5, 0.8, 1.0, 1.2, 1.4, 2.0, 3.0, 5.0, 10.0, 600.0):
        tick = stall_tick(after_s)
        per_tick = round(1 / tick)
        per_s = lag_probe_per_s(tick)
        assert per_s % per_tick == 0, after_s  # every tick is a probe point: no wake-up of its own
        assert 1 / per_s <= snapshot.LOOP_LAG_PROBE_S + 1e-12, after_s
        assert per_s == per_tick or per_s <= 6, after_s  # between ticks only when they are long


def test_one_grid_point_is_one_timer_whatever_rate_reaches_it():
    async def main():
        g = TimeGrid()
        loop = g.start()
        n2 = g.point_after(2, loop.time())
        n6 = g.point_after(6, g.point_us(n2, 2) / 1e6 - 1e-6)
        assert g.point_us(n6, 6) == g.point_us(n2, 2)  # 1/2 s and 3/6 s: the same point
        order = []

        async def waiter(name, n, per_s, first=False):
            await g.wait(n, per_s, first)
            order.append(name)

        tasks = [asyncio.create_task(waiter("watchdog", n2, 2)), asyncio.create_task(waiter("probe", n6, 6, True))]
        await asyncio.sleep(0)
        assert len(g._due) == 1  # one loop timer for both
        await asyncio.gather(*tasks)
        assert order == ["probe", "watchdog"] and not g._due
        # a waiter cancelled alone takes its point's timer with it
        t = asyncio.create_task(g.wait(g.point_after(4, loop.time()), 4))
        await asyncio.sleep(0)
        assert len(g._due) == 1
        t.cancel()
        await asyncio.gather(t, return_exceptions=True)
        assert not g._due

    _run(main())


@pytest.mark.parametrize("loop_factory", _loops())
def test_the_watchdog_and_the_probe_wake_the_loop_together(loop_factory):
    ctx, _ = _registry(10)
    ctx.snapshots, ctx.loop_lag = SnapshotFeed(), LoopLag()
    ctx.scenario = SimpleNamespace(stall=SimpleNamespace(after_s=10.0, give_up_s=60.0))  # tick 1 s, probe 4/s
    fires = []
    grid = ctx.loop_lag.grid
    real = grid._fire

    def fire(key):
        fires.append((key, len(grid._due[key]) - 1))
        real(key)

    grid._fire = fire

    async def main():
        wd = asyncio.create_task(runner.watchdog(ctx))  # first, as in the run: it sets the grid's origin
        probe = asyncio.create_task(ctx.loop_lag.probe())
        await asyncio.wait_for(ctx.snapshots.newer_than(0, full=True), 10)
        await asyncio.sleep(0.3)
        wd.cancel()
        probe.cancel()

    _run(main(), loop_factory)
    assert ctx.loop_lag.per_s == 4
    keys = [k - grid.origin_us for k, _ in fires]
    assert keys == sorted(set(keys)) and all(k % 250_000 == 0 for k in keys)  # one timer per point, 4 a second
    both = [k for k, n in zip(keys, [n for _, n in fires]) if n == 2]
    assert 1_000_000 in both and all(k % 1_000_000 == 0 for k in both)  # the watchdog's tick: with the probe


@pytest.mark.parametrize("loop_factory", _loops())
def test_the_probe_still_sees_a_frozen_loop(loop_factory):
    async def main():
        lag = LoopLag()
        probe = asyncio.create_task(lag.probe())
        loop = asyncio.get_running_loop()
        await asyncio.sleep(0.3)
        time.sleep(0.4)  # anywhere: a probe's due time falls in its first 0.25 s
        await asyncio.sleep(0.05)
        anywhere = lag.take()
        # 0.15 s after a probe, 0.1 s before the next: that one is 0.3 s late
        due = await lag.grid.wait(lag.grid.point_after(lag.per_s, loop.time()), lag.per_s)
        await asyncio.sleep(0.15 - (loop.time() - due))
        time.sleep(0.4)
        await asyncio.sleep(0.05)
        probe.cancel()
        return anywhere, lag.take(), lag.max_ms

    anywhere, aligned, max_ms = _run(main(), loop_factory)
    assert anywhere >= 150 - 2  # (timers round to the loop's clock: a ms either way)
    assert aligned >= 300 - 2 and max_ms >= aligned


def test_after_a_frozen_start_up_the_watchdog_keeps_the_young_generations_short(tmp_path, monkeypatch):
    # A closed loop big enough to freeze its start-up (here 4 agents: the bar lowered) then has the
    # young generations collected and frozen once a second: right after each pass they are empty,
    # and the run's end gives the collector back as it was.
    import gc

    from agentload.mock import MockConfig, MockProcess
    from agentload.run import arrivals, runner
    from helpers import run_scenario

    monkeypatch.setattr(arrivals, "FREEZE_EVERY_AGENTS", 4)
    passes = []

    def pace():
        runner_pace()
        passes.append((len(gc.get_objects(0)), len(gc.get_objects(1))))

    runner_pace = runner.pace_collector
    monkeypatch.setattr(runner, "pace_collector", pace)
    threshold = gc.get_threshold()
    with MockProcess.start(MockConfig(base_latency_ms=200, decode_tokens_per_s=0, output_tokens=4)) as mock:
        run_scenario("demo", tmp_path, [f'target.endpoint="{mock.url}"', "agents.count=8", "agents.rounds=12",
                                        "conversation.tool_latency_ms=0", "canary.every_s=0"])
    assert len(passes) >= 1
    assert all(p == (0, 0) for p in passes), passes
    assert gc.get_threshold() == threshold and gc.get_freeze_count() == 0


def test_failed_requests_scrapes_and_past_intervals_leave_nothing_in_the_frozen_generation(tmp_path, monkeypatch):
    # Once a second the paced collector freezes what is alive, the older objects of requests in
    # flight among them. A request that then fails makes a reference cycle (its exception's
    # traceback -> its frames -> aiohttp's reader -> the exception) through those frozen objects:
    # no collection examines frozen objects, so unless agentload lets go of the tracebacks such
    # cycles stay until the run's end (a soak of hours kept ~2 KB per failed request). So would the
    # interval log's past histograms (hdrh's histogram and encoder refer to each other) and failed
    # scrapes of the target's metrics. At the end of the run, everything frozen is unfrozen and
    # collected, and nothing of a request, an interval histogram or a scrape may be among the garbage.
    import gc

    from hdrh.histogram import HdrHistogram

    from agentload.mock import MockConfig, MockProcess
    from agentload.records import Trace
    from agentload.records.interval_log import IntervalLog
    from agentload.run import arrivals, runner
    from helpers import run_scenario

    monkeypatch.setattr(arrivals, "FREEZE_EVERY_AGENTS", 4)
    paces = []
    runner_pace = runner.pace_collector
    monkeypatch.setattr(runner, "pace_collector", lambda: (runner_pace(), paces.append(1)))
    leaked: dict[str, int] = {}
    histograms: list = []
    scrapes: list = []
    gc_for_run = runner.gc_for_run
    monkeypatch.setattr(IntervalLog.__init__, "__defaults__", (0.5,))  # an interval every 0.5 s

    def watched_gc_for_run():
        restore = gc_for_run()

        def restore_and_count():
            gc.collect()  # what any collection could free, freed
            gc.set_debug(gc.DEBUG_SAVEALL)
            try:
                gc.unfreeze()
                gc.collect()
                for obj in gc.garbage:
                    if isinstance(obj, Trace):
                        leaked[obj.request_id] = 1
                    elif isinstance(obj, HdrHistogram):  # the interval log's, one per tag and interval
                        histograms.append(obj)
                    elif type(obj).__name__ == "traceback" and obj.tb_frame.f_code.co_filename.endswith(
                            os.path.join("run", "scraper.py")):  # a failed scrape's
                        scrapes.append(obj)
            finally:
                gc.set_debug(0)
                gc.garbage.clear()
                restore()
        return restore_and_count

    monkeypatch.setattr(runner, "gc_for_run", watched_gc_for_run)
    gc.collect()  # other tests' garbage, before the run's start-up freezes whatever exists
    refused = free_port()  # a port nothing listens on: every scrape of it fails
    with MockProcess.start(MockConfig(base_latency_ms=150, decode_tokens_per_s=100, output_tokens=30,
                                      drop_mid_stream_rate=0.5)) as mock:
        res = run_scenario("demo", tmp_path, [f'target.endpoint="{mock.url}"', "agents.count=8", "agents.rounds=5",
                                              "agents.restart=true", "agents.duration_s=4",
                                              "agents.error_retries=1000", "conversation.tool_latency_ms=0",
                                              "canary.every_s=0", "target.metrics_every_s=0.2",
                                              f'target.metrics_urls=["http://127.0.0.1:{refused}/metrics"]'])
    assert paces, "the paced collector never ran"
    assert res.summary["totals"]["errors"] >= 10, res.summary["totals"]
    ours = [rid for rid in leaked if rid.startswith(res.outcome.run_id + "-")]  # (not other tests' leftovers)
    assert not ours, f"{len(ours)} failed request(s) of the run left in the frozen generation"
    assert not histograms, f"{len(histograms)} interval histogram(s) left in the frozen generation"
    assert res.summary["target_metrics"][f"http://127.0.0.1:{refused}/metrics"]["failed"] >= 5
    assert not scrapes, f"{len(scrapes)} failed scrape(s)' tracebacks left in the frozen generation"
