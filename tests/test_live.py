"""The live view (plain and rich), the agent dump and stall waves, on a hand-built in-flight state
(the snapshot the watchdog would take of it); and the Chromium checker itself catching a broken page."""

from __future__ import annotations

import io
import time
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from rich.console import Console

from agentload.records import Trace
from agentload.run import dump
from agentload.run.context import AgentState
from agentload.run.dump import StallWaves, format_dump, format_dump_sliced
from agentload.run.exporter import LiveCollector
from agentload.run.live import (
    LiveLine,
    PlainLive,
    Rates,
    RichLive,
    plain_line,
    rich_view,
)
from agentload.run.snapshot import SnapshotFeed, scan
from devtools import check_page_sync, find_chromium


def _ctx():
    now = time.perf_counter_ns()
    tr = Trace("agent", 0, 3, 0, "run1-a0-r3-c0", 7, 9000, 2100)
    tr.t.update(start=now - 4_000_000_000, sent=now - 3_000_000_000)
    tr.reused = True
    tr.stalled_phase = "ttfb"
    tr2 = Trace("agent", 1, 2, 0, "run1-a1-r2-c0", 5, 7000, 1500)
    tr2.t.update(start=now - 1_000_000_000, sent=now - 900_000_000, headers=now - 800_000_000,
                 first_token=now - 700_000_000)
    tr2.last_token = now - 100_000_000
    tr2.reused = False
    states = {0: AgentState(0, round=3, state="request", trace=tr, rounds_completed=2),
              1: AgentState(1, round=2, state="request", trace=tr2, rounds_completed=1),
              2: AgentState(2, round=2, state="tool", rounds_completed=2),
              3: AgentState(3, round=5, state="done", rounds_completed=5)}
    return SimpleNamespace(
        run_id="run1", counts={"requests": 10, "ok": 8, "error": 1, "stalled": 1, "cut_short": 0, "output_tokens": 400},
        agent_states=states, inflight={tr.request_id: tr, tr2.request_id: tr2}, stopping=False, stop_reason=None,
        transport=SimpleNamespace(pool_state=lambda: {"pools": 1, "in_use": 2, "idle": 1, "waiters": 0,
                                                      "limit": 100, "opened": 3}))


def test_plain_line_has_every_fact_and_stays_short():
    snap = Rates().snapshot(_ctx())
    line = plain_line(snap)
    for part in ("r2:2 r3:1", "done:1", "fly 2 ttfb:1 stream:1", "STALL 1 r3/ttfb:1",
                 "oldest a0 r3 ttfb 4.0s run1-a0-r3-c0", "req/s", "tok/s", "err 1 gaveup 1", "pool 2/100 w0"):
        assert part in line, (part, line)
    assert len(line) < 200


def test_rich_view_renders():
    buf = io.StringIO()
    Console(file=buf, width=120, color_system=None).print(rich_view(Rates().snapshot(_ctx()), "reports/x"))
    out = buf.getvalue()
    assert "oldest in flight" in out and "run1-a0-r3-c0" in out and "stalled requests in flight" in out


def test_live_view_is_plain_unless_the_stream_is_a_terminal():
    assert isinstance(LiveLine(io.StringIO()), PlainLive)
    tty = io.StringIO()
    tty.isatty = lambda: True
    view = LiveLine(tty)
    assert isinstance(view, RichLive)
    view(_ctx(), None)
    view.close()
    assert "oldest in flight" in tty.getvalue()


def test_dump_lists_every_agent_with_round_phase_time_request_and_connection():
    text = format_dump(_ctx(), "test")
    assert "reason: test" in text and "stalled: 1 (round 3 ttfb 1)" in text
    rows = {int(ln.split()[0]): ln.split() for ln in text.splitlines() if ln.strip()[:1].isdigit()}
    assert sorted(rows) == [0, 1, 2, 3]
    a0 = rows[0]
    assert a0[1:4] == ["3", "request", "ttfb"] and a0[6:8] == ["ttfb", "reused"] and a0[-1] == "run1-a0-r3-c0"
    assert 2.9 < float(a0[4]) < 60  # in ttfb since `sent`, 3 s ago
    a1 = rows[1]
    assert a1[3] == "stream" and a1[7] == "new" and float(a1[5]) < float(a1[4])  # idle since the last token
    assert rows[2][2:4] == ["tool", "-"] and rows[3][2] == "done"


async def test_a_stall_waves_dump_of_many_agents_lets_the_loop_run_between_slices():
    # 10,000 agents: formatted DUMP_SLICE per loop step (in one step, 100,000 froze a run ~250 ms)
    import asyncio

    ctx = _ctx()
    base = ctx.agent_states
    ctx.agent_states = {a: AgentState(a, round=1, state="tool", rounds_completed=0) for a in range(4, 10_000)}
    ctx.agent_states.update(base)
    steps = 0

    async def other_task():
        nonlocal steps
        while True:
            steps += 1
            await asyncio.sleep(0)

    ticker = asyncio.create_task(other_task())
    await asyncio.sleep(0)
    before = steps
    text = await format_dump_sliced(ctx, "test")
    ticker.cancel()
    assert steps - before >= 10_000 // dump.DUMP_SLICE - 1  # the loop ran between slices
    rows = [ln.split() for ln in text.splitlines() if ln.strip()[:1].isdigit()]
    assert [int(r[0]) for r in rows] == list(range(10_000))  # every agent, in order
    sync = format_dump(ctx, "test")  # the same text in one go (but for the clock's columns)
    def cols(t):
        return [ln.split()[:4] for ln in t.splitlines() if not ln.startswith("written")]

    assert cols(sync) == cols(text)
    assert "agents: done 1, request 2, tool 9997" in text and "stalled: 1 (round 3 ttfb 1)" in text


def test_one_dump_per_stall_wave(tmp_path):
    ctx = _ctx()
    logs: list[str] = []
    waves = StallWaves(ctx, tmp_path, log=logs.append)
    first = waves.check(scan(ctx))  # the watchdog's snapshot of each tick
    assert first is not None and "stall wave 1" in first.read_text()
    assert "stall wave 1: 1 request(s) stalled (round 3 ttfb 1)" in logs[0]
    assert waves.check(scan(ctx)) is None  # still the same wave
    stalled = ctx.inflight.pop("run1-a0-r3-c0")
    assert waves.check(scan(ctx)) is None  # the wave is over
    ctx.inflight[stalled.request_id] = stalled
    second = waves.check(scan(ctx))
    assert second is not None and second != first and "stall wave 2" in second.read_text()
    assert len(list(tmp_path.glob("dump-*.txt"))) == 2 and len(logs) == 2 and str(second) in logs[1]


class _NoWalks(dict):
    """An in-flight registry (or agent states) that fails the test when anything walks it."""

    def _walked(self, *a):
        raise AssertionError("walked the registry outside the watchdog's pass")

    values = items = keys = __iter__ = _walked


def test_live_view_and_exporter_read_the_published_snapshot_not_the_registry():
    ctx = _ctx()
    feed = SnapshotFeed()
    feed.publish(scan(ctx, seq=1))  # what the watchdog does once a tick
    ctx.snapshots = feed
    ctx.inflight, ctx.agent_states = _NoWalks(ctx.inflight), _NoWalks(ctx.agent_states)
    ctx.scenario = SimpleNamespace(source="demo.toml", agents=SimpleNamespace(arrival="closed"))
    ctx.transport = None  # the pool too comes from the snapshot
    line = plain_line(Rates().snapshot(ctx))
    for part in ("r2:2 r3:1", "fly 2 ttfb:1 stream:1", "STALL 1 r3/ttfb:1", "oldest a0 r3 ttfb", "pool 2/100 w0"):
        assert part in line, (part, line)
    reg = CollectorRegistry()
    reg.register(LiveCollector(ctx))
    text = generate_latest(reg).decode()
    assert 'agentload_requests_stalled{phase="ttfb",round="3"} 1.0' in text
    assert 'agentload_agents{phase="stream",round="2"} 1.0' in text
    assert 'agentload_agents{phase="tool",round="2"} 1.0' in text


@pytest.mark.slow
def test_chromium_check_catches_console_errors_exceptions_and_network(tmp_path):
    chromium = find_chromium()
    if chromium is None:
        pytest.skip("chromium is not installed (apt-get install chromium; .ci/run installs it)")
    page = tmp_path / "broken.html"
    page.write_text("<!DOCTYPE html><html><body data-figures='1'><div id='x'></div>"
                    "<img src='http://127.0.0.1:9/nothing.png'>"
                    "<script>console.error('boom'); throw new Error('kaput');</script></body></html>")
    res = check_page_sync(page, chromium=chromium, timeout=3)
    assert not res.ok
    text = "\n".join(res.problems())
    assert "0 of 1 figures drawn" in text and "boom" in text and "kaput" in text and "127.0.0.1:9" in text
