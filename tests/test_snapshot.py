"""Issue 11: one in-flight snapshot per tick, shared by everything that watches the run.

The watchdog walks the in-flight registry once a tick (marking stalls, firing give-ups) and
publishes what it counted; the sampler, the stall waves, the live view and the exporter read that
snapshot and never walk the registry themselves. Checked on a real run against the mock with
counting wrappers (walks of the registry and of the agent states, Trace.phase() calls), and by
comparing what each watcher shows with the snapshot it was given.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from types import SimpleNamespace

import aiohttp
import orjson
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import agentload.run.runner as runner
from agentload.mock.process import MockProcess
from agentload.process import free_port
from agentload.records import Trace, phases
from agentload.run import dump
from agentload.run.context import AgentState, RunContext
from agentload.run.executor import prepare
from agentload.run.exporter import LiveCollector
from agentload.run.live import Rates, plain_line
from agentload.run.scenario import load_scenario
from agentload.run.snapshot import SnapshotFeed, scan, stall_tick

RUN_BOUND_S = 60  # a guard against a hang, never a measured threshold
STAMPS = phases.STAMPS  # every stamp the phase table knows


# ---------------------------------------------------------------- the one pass over the registry


def _ctx(traces=(), states=None, **kw):
    return SimpleNamespace(inflight={tr.request_id: tr for tr in traces}, agent_states=states or {},
                           counts={"requests": 0, "ok": 0, "error": 0, "stalled": 0, "cut_short": 0,
                                   "output_tokens": 0},
                           transport=SimpleNamespace(pool_state=lambda: {"in_use": 1, "limit": 4}), **kw)


def test_scan_sees_the_phase_and_the_progress_the_trace_itself_reports():
    """The pass reads phase and last progress in one look at the stamps (the phase table looked up,
    not evaluated per request): for every combination of stamps, reused or not, it agrees with
    Trace.phase() and Trace.progress_ns()."""
    cases = 0
    for n in range(len(STAMPS) + 1):
        for keys in itertools.combinations(STAMPS, n):
            for reused in (None, False, True):
                now = time.perf_counter_ns()  # per case: the whole loop may take seconds on a loaded machine
                tr = Trace("agent", 0, 2, 0, "r-a0-r2-c0", 3, 100, 10)
                # each stamp a different second in the past, later stamps more recent
                tr.t.update({k: now - (30 - i) * 1_000_000_000 for i, k in enumerate(STAMPS) if k in keys})
                tr.last_token = now - 5_500_000_000 if "first_token" in keys else 0
                tr.reused = reused
                want_phase, idle = tr.phase(), now - tr.progress_ns()
                snap = scan(_ctx([tr]), after_ns=idle + 500_000_000, give_up_ns=10**15)
                assert dict(snap.inflight) == {want_phase: 1}, (keys, reused)
                assert tr.stalled_phase is None, (keys, reused)
                snap = scan(_ctx([tr]), after_ns=max(0, idle - 500_000_000), give_up_ns=10**15)
                assert tr.stalled_phase == want_phase, (keys, reused)
                assert dict(snap.stalled) == {(2, want_phase): 1}
                cases += 1
    assert cases == 2 ** len(STAMPS) * 3


def test_scan_marks_stalls_fires_give_ups_and_counts_for_every_watcher():
    now = time.perf_counter_ns()
    fired = []

    def req(agent, rnd, kind="agent", **stamps):
        tr = Trace(kind, agent, rnd, 0, f"r-a{agent}-r{rnd}-c0", 3, 100, 10)
        tr.t.update({k: now - v for k, v in stamps.items()})
        tr.timeout_cm = SimpleNamespace(reschedule=lambda when, tr=tr: fired.append(tr.request_id))
        return tr

    hung = req(0, 3, start=9_000_000_000, queued_start=9_000_000_000, conn_start=8_900_000_000,
               conn_end=8_800_000_000, sent=8_700_000_000)  # 8.7 s in ttfb: past give_up_s
    slow = req(1, 2, start=3_000_000_000, queued_start=3_000_000_000)  # 3 s in pool_wait: stalled
    fresh = req(2, 2, start=100_000_000, queued_start=100_000_000)
    canary = req(-1, 1, kind="canary", start=9_500_000_000, sent=9_500_000_000)
    states = {0: AgentState(0, round=3, state="request", trace=hung),
              1: AgentState(1, round=2, state="request", trace=slow),
              2: AgentState(2, round=2, state="request", trace=fresh), 3: AgentState(3, round=2, state="tool"),
              4: AgentState(4, round=1, state="request"),  # between two attempts (a retry's pause)
              5: AgentState(5, round=5, state="done")}
    ctx = _ctx([hung, slow, fresh, canary], states, finished={"done": 7}, crash_count=1)

    async def watchdog_pass():  # a give-up reschedules the request's timeout on the running loop
        return scan(ctx, seq=3, after_ns=2_000_000_000, give_up_ns=5_000_000_000)

    snap = asyncio.run(watchdog_pass())
    assert (snap.seq, snap.full) == (3, True)
    assert (hung.stalled_phase, hung.gave_up) == ("ttfb", True)
    assert (slow.stalled_phase, slow.gave_up) == ("pool_wait", False)
    assert fresh.stalled_phase is None
    assert canary.stalled_phase == "ttfb" and canary.gave_up  # the watchdog looks after canaries too
    assert sorted(fired) == ["r-a-1-r1-c0", "r-a0-r3-c0"]
    # counts: agent requests only; the canary on its own
    assert dict(snap.inflight) == {"pool_wait": 2, "ttfb": 1} and snap.canaries == 1
    assert dict(snap.stalled) == {(2, "pool_wait"): 1, (3, "ttfb"): 1} and snap.stalled_total == 2
    assert snap.stalled_by == {"2/pool_wait": 1, "3/ttfb": 1}
    assert snap.oldest.agent == 0 and snap.oldest.phase == "ttfb" and snap.oldest.stalled
    assert 8.9 < snap.oldest.age_s < 60
    assert dict(snap.rounds) == {1: 1, 2: 3, 3: 1}
    assert dict(snap.agents) == {(1, "request"): 1, (2, "pool_wait"): 2, (2, "tool"): 1, (3, "ttfb"): 1}
    assert dict(snap.finished) == {"done": 8}  # forgotten (open loop) and still in agent_states
    assert dict(snap.pool) == {"in_use": 1, "limit": 4} and snap.crashes == 1
    # a tick that is not full counts the stalled requests anew and carries the rest over
    ctx.inflight.pop(hung.request_id)
    ctx.agent_states[3].state = "done"
    ctx.transport = None  # not read
    nxt = scan(ctx, seq=4, full=False, prev=snap)
    assert dict(nxt.stalled) == {(2, "pool_wait"): 1} and nxt.canaries == 1 and not nxt.full
    assert nxt.inflight is snap.inflight and nxt.oldest is snap.oldest and nxt.agents is snap.agents
    assert nxt.rounds is snap.rounds and nxt.pool is snap.pool and nxt.full_t == snap.full_t == snap.t < nxt.t


def test_stall_tick_is_never_coarser_than_before_and_divides_a_second():
    for after_s in (0.01, 0.1, 0.2, 0.3, 0.5, 1.0, 1.4, 2.0, 3.0, 5.0, 10.0, 600.0):
        before = max(0.05, min(1.0, after_s / 4))
        tick = stall_tick(after_s)
        assert 0.05 - 1e-12 <= tick <= before + 1e-12, after_s
        assert abs(1.0 / tick - round(1.0 / tick)) < 1e-9, after_s
    assert stall_tick(1.0) == 0.25 and stall_tick(5.0) == 1.0 and stall_tick(0.1) == 0.05


def test_watchdog_publishes_a_snapshot_every_tick_and_a_full_one_each_second():
    now = time.perf_counter_ns()
    tr = Trace("agent", 0, 1, 0, "r-a0-r1-c0", 3, 100, 10)
    tr.t.update(start=now, queued_start=now, conn_start=now, conn_end=now, sent=now)
    stall = SimpleNamespace(after_s=0.2, give_up_s=60)
    ctx = _ctx([tr], snapshots=SnapshotFeed(), scenario=SimpleNamespace(stall=stall))
    got = []
    real = ctx.snapshots.publish
    ctx.snapshots.publish = lambda s: (got.append(s), real(s))

    async def main():
        task = asyncio.create_task(runner.watchdog(ctx))
        await asyncio.sleep(1.2)
        task.cancel()

    asyncio.run(main())
    assert ctx.snapshots.tick_s == 0.05
    assert [s.seq for s in got] == list(range(1, len(got) + 1)) and 10 <= len(got) <= 25
    assert [s.t for s in got] == sorted(s.t for s in got)
    full = [s for s in got if s.full]
    assert len(full) == 1 and full[0].t - now >= 0.9e9  # the first tick of second 1
    assert tr.stalled_phase == "ttfb"  # 0.2 s with no progress: marked within a tick or so
    assert got[-1].stalled == {(1, "ttfb"): 1} and ctx.snapshots.latest is got[-1]


# ---------------------------------------------------------------- a real run: one walk per tick


class CountingDict(dict):
    """A dict that counts how often it is walked (values, items, keys, iteration)."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.walks = 0

    def values(self):
        self.walks += 1
        return super().values()

    def items(self):
        self.walks += 1
        return super().items()

    def keys(self):
        self.walks += 1
        return super().keys()

    def __iter__(self):
        self.walks += 1
        return super().__iter__()


class RecordingFeed(SnapshotFeed):
    def __init__(self):
        super().__init__()
        self.published = []

    def publish(self, snap):
        self.published.append(snap)
        super().publish(snap)


def _metric_values(collector) -> dict:
    reg = CollectorRegistry()
    reg.register(collector)
    out = {}
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_a_real_run_walks_the_registry_once_per_tick_and_every_watcher_shows_that_snapshot(tmp_path, monkeypatch):
    # 20 agents through a pool of 8 against a mock that pauses every stream 1.2 s (> stall.after_s
    # = 1): requests queued in the pool, in ttfb, streaming and stalled, across several ticks.
    sc = load_scenario("demo", ["agents.count=20", "agents.rounds=1", "client.limit=8", "stall.after_s=1",
                                "stall.give_up_s=20", "conversation.tool_latency_ms=0", "canary.every_s=0.5",
                                "mock.stall_mid_stream={ after_tokens = 2, for_s = 1.2, above_tokens = 0 }"])
    holder = {}

    class CountingContext(RunContext):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.inflight = CountingDict()
            self.agent_states = CountingDict()
            self.snapshots = RecordingFeed()
            holder["ctx"] = self

    monkeypatch.setattr(runner, "RunContext", CountingContext)
    phase_calls = {"tick": 0, "dump": 0}
    in_dump = [False]
    real_phase = Trace.phase

    def phase(self):
        phase_calls["dump" if in_dump[0] else "tick"] += 1
        return real_phase(self)

    monkeypatch.setattr(Trace, "phase", phase)
    dump_walks = {"inflight": 0, "agents": 0}
    real_registries, real_sliced = dump._registries, dump.format_dump_sliced

    def registries(ctx):  # the rare event that may walk (a stall wave's dump): counted apart
        before = ctx.inflight.walks, ctx.agent_states.walks
        try:
            return real_registries(ctx)
        finally:
            dump_walks["inflight"] += ctx.inflight.walks - before[0]
            dump_walks["agents"] += ctx.agent_states.walks - before[1]

    async def format_dump_sliced(ctx, *a, **k):  # its phase reads too (it pauses: the ticks read none)
        in_dump[0] = True
        try:
            return await real_sliced(ctx, *a, **k)
        finally:
            in_dump[0] = False

    monkeypatch.setattr(dump, "_registries", registries)
    monkeypatch.setattr(dump, "format_dump_sliced", format_dump_sliced)

    ticks = []

    def on_tick(ctx, sampler):  # the live view's hook: the live view and the exporter on the snapshot
        snap = ctx.snapshots.latest_full
        walks = ctx.inflight.walks, ctx.agent_states.walks
        view = Rates().snapshot(ctx, sampler)
        plain_line(view)
        metrics = _metric_values(LiveCollector(ctx))
        assert (ctx.inflight.walks, ctx.agent_states.walks) == walks  # neither walked anything
        ticks.append((snap, view, metrics))

    port = free_port()
    scrapes = []
    mock = MockProcess.start(sc.mock)
    try:
        async def scrape(done: asyncio.Event):
            async with aiohttp.ClientSession() as s:
                while not done.is_set():
                    try:
                        async with s.get(f"http://127.0.0.1:{port}/metrics") as r:
                            if r.status == 200:
                                scrapes.append(await r.text())
                    except aiohttp.ClientError:
                        pass
                    await asyncio.sleep(0.2)

        async def main():
            done = asyncio.Event()
            scraper = asyncio.create_task(scrape(done))
            try:
                run = runner.InProcess(on_tick=on_tick).run(prepare(
                    sc, tmp_path, mock.url, embedded_mock=False, install_signals=False, metrics_port=port))
                return await asyncio.wait_for(run, RUN_BOUND_S)
            finally:
                done.set()
                await scraper

        outcome = asyncio.run(main())
    finally:
        mock.stop()
    ctx = holder["ctx"]
    feed = ctx.snapshots
    meta = orjson.loads((tmp_path / "run.json").read_bytes())
    assert meta["crashes"] == [] and outcome.ended_by == "finished"
    snaps = feed.published
    assert [s.seq for s in snaps] == list(range(1, len(snaps) + 1)) and len(snaps) >= 8
    full = [s for s in snaps if s.full]
    # the registry: walked once per snapshot (every watchdog tick, plus the last one at the end),
    # by nobody else, though the sampler, the stall waves, the live view and real scrapes read it
    assert ctx.inflight.walks - dump_walks["inflight"] == len(snaps)
    # the agent states: once per full snapshot (once a second)
    assert ctx.agent_states.walks - dump_walks["agents"] == len(full)
    assert phase_calls["tick"] == 0  # the pass reads phases from the stamps itself
    assert len(ticks) >= 2 and len(scrapes) >= 3
    assert any(s.stalled for s in snaps) and any(s.inflight.get("pool_wait") for s in snaps)

    # the sampler: one line per full snapshot (one published as the run stops may go unwritten),
    # with that snapshot's numbers
    samples = [orjson.loads(ln) for ln in (tmp_path / "samples.jsonl").read_bytes().splitlines()]
    by_t = {s.t: s for s in full}
    assert len(full) - 1 <= len(samples) <= len(full) and samples[-1]["t"] == snaps[-1].t
    ts = [line["t"] for line in samples]
    assert ts == sorted(set(ts)) and all(t in by_t for t in ts)
    for line in samples:
        snap = by_t[line["t"]]
        assert set(line) == {"t", "pool", "inflight", "stalled", "stalled_by", "loop_lag_ms", "counts", "proc"}
        assert line["inflight"] == dict(snap.inflight) and line["stalled"] == snap.stalled_total
        assert line["stalled_by"] == snap.stalled_by and line["pool"] == dict(snap.pool)
        assert line["counts"] == dict(snap.counts)
    assert any(line["stalled"] for line in samples)
    assert samples[-1]["inflight"] == {} and samples[-1]["counts"]["requests"] == 20

    # the live view and the exporter: the snapshot's numbers
    for snap, view, m in ticks:
        assert view.inflight == dict(snap.inflight) and view.stalled == dict(snap.stalled)
        assert view.rounds == dict(snap.rounds) and view.finished == dict(snap.finished)
        assert view.pool == dict(snap.pool) and view.requests == snap.counts["requests"]
        assert (view.oldest is None) == (snap.oldest is None)
        if snap.oldest is not None:
            assert view.oldest["request_id"] == snap.oldest.request_id
        for ph, n in snap.inflight.items():
            assert m[("agentload_requests_in_flight", (("phase", ph),))] == n
        assert sum(v for (name, _), v in m.items() if name == "agentload_requests_in_flight") == snap.inflight_total
        for (rnd, ph), n in snap.stalled.items():
            assert m[("agentload_requests_stalled", (("phase", ph), ("round", str(rnd))))] == n
        for (rnd, ph), n in snap.agents.items():
            assert m[("agentload_agents", (("phase", ph), ("round", str(rnd))))] == n
        assert m[("agentload_requests_total", (("outcome", "ok"),))] == snap.counts["ok"]
        if "in_use" in snap.pool:
            assert m[("agentload_pool_connections", (("state", "in_use"),))] == snap.pool["in_use"]
    assert any(snap.stalled for snap, _, _ in ticks)
