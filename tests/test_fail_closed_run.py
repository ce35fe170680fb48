"""Issue 10, the run path: a crash of agentload itself is recorded and never silent; start-up of
many agents never freezes the loop; an end at duration_s is not "cut short".

Every run here goes to tests/fakeserver.py on 127.0.0.1 and is bounded (RUN_BOUND_S is a guard
against a hang, never a measured threshold). Crashes that no real input produces any more are
made in-process with monkeypatch.
"""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from pathlib import Path

import orjson
import pytest
from aiohttp import web

import agentload.run.agent as agent_mod
import agentload.run.arrivals as arrivals
import agentload.run.runner as runner
from agentload.cluster.shards import merge_meta
from agentload.records import load_records
from agentload.report.build import write_reports
from agentload.run.executor import prepare
from agentload.run.scenario import load_scenario
from fakeserver import DONE, FakeServer, chunk, sse_response

RUN_BOUND_S = 60


def _answer(usage=None):
    extra = {} if usage is None else {"usage": usage}
    return [chunk({"role": "assistant"}), chunk({"content": "hello"}), chunk({"content": " there"}),
            chunk(finish_reason="stop", **extra), DONE]


async def ok_handler(request: web.Request) -> web.StreamResponse:
    return await sse_response(request, _answer({"prompt_tokens": 10, "completion_tokens": 2}))


def _slow(delay_s: float):
    async def handler(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(delay_s)
        return await sse_response(request, _answer({"prompt_tokens": 10, "completion_tokens": 2}))
    return handler


def _scenario(url: str, *overrides: str):
    return load_scenario("demo", [f'target.endpoint="{url}"', "canary.every_s=0", "conversation.tool_latency_ms=0",
                                  *overrides])


def _run(sc, out: Path, on_tick=None):
    """The in-process executor, bounded; returns (outcome, run.json)."""
    async def main():
        return await asyncio.wait_for(
            runner.InProcess(on_tick=on_tick).run(prepare(sc, out, sc.target.endpoint, embedded_mock=False,
                                                         install_signals=False)),
            RUN_BOUND_S)
    outcome = asyncio.run(main())
    return outcome, orjson.loads((out / "run.json").read_bytes())


def _agent_records(out: Path):
    per = defaultdict(list)
    for r in load_records(out / "records.jsonl").records:
        if r.kind == "agent":
            per[r.agent].append(r)
    for v in per.values():
        v.sort(key=lambda r: (r.round, r.call))
    return per


def _check_entry(c: dict, where: str, error: str):
    assert set(c) >= {"where", "agent", "round", "error", "message", "traceback"}, c
    assert c["where"] == where and c["error"] == error, c
    assert "\n" not in c["message"] and len(c["message"]) <= 300
    assert 0 < len(c["traceback"].splitlines()) <= 8


# ---------------------------------------------------------------- case 5: agents


def test_usage_that_is_not_an_object_is_no_crash_and_every_round_is_recorded(tmp_path):
    async def handler(request):
        return await sse_response(request, _answer("n/a"))

    with FakeServer(handler) as srv:
        _, meta = _run(_scenario(srv.url, "agents.count=2", "agents.rounds=4"), tmp_path)
    per = _agent_records(tmp_path)
    assert sorted(per) == [0, 1]
    for rs in per.values():  # before: 1 of 4 rounds, then the agent died reading usage
        assert [r.round for r in rs] == [1, 2, 3, 4] and all(r.outcome == "ok" for r in rs)
        assert all(r.server_prompt_tokens is None and r.output_tokens is None for r in rs)
    assert meta["crashes"] == [] and meta["ended_by"] == "finished" and not meta["cut_short"]


def test_agent_crash_is_in_run_json_at_once_and_its_requests_keep_their_records(tmp_path, monkeypatch):
    real = agent_mod.Conversation.tool_results
    crashed = []

    def tool_results(self, assistant):  # agent 1, after its round-1 answer: outside any request
        if self.agent == 1 and not crashed:
            crashed.append(1)
            raise RuntimeError("tool results exploded\nsecond line")
        return real(self, assistant)

    monkeypatch.setattr(agent_mod.Conversation, "tool_results", tool_results)
    snapshots = []

    def tick(ctx, sampler):  # once a second while the run goes on: what a kill now would leave
        snapshots.append(orjson.loads((tmp_path / "run.json").read_bytes()))

    with FakeServer(_slow(0.25)) as srv:
        outcome, meta = _run(_scenario(srv.url, "agents.count=3", "agents.rounds=8"), tmp_path, on_tick=tick)
    [c] = meta["crashes"]
    _check_entry(c, "agent", "RuntimeError")
    assert c["agent"] == 1 and c["round"] == 1 and c["message"] == "tool results exploded second line"
    assert "tool_results" in c["traceback"] and meta["crash_count"] == 1
    # written when it happened, while the run was still going
    assert any(not s["ended"] and s["crashes"] == [c] for s in snapshots), snapshots
    per = _agent_records(tmp_path)
    assert [(r.round, r.outcome) for r in per[1]] == [(1, "ok")]  # the request before the crash is kept
    assert all([r.round for r in per[a]] == list(range(1, 9)) for a in (0, 2))
    assert meta["ended_by"] == "finished" and outcome.ended_by == "finished"
    summary, _ = write_reports(tmp_path)
    assert summary["verdict"]["kind"] == "agentload_error"  # the lead's rule over run.json crashes


def test_answer_agentload_cannot_read_becomes_an_error_record_and_a_crash_entry(tmp_path, monkeypatch):
    real = agent_mod._record
    failed = []

    def record(ctx, trace, result):
        if trace.agent == 0 and trace.round == 2 and trace.call == 0:
            failed.append(trace.request_id)
            raise TypeError("'str' object has no attribute 'get'")
        return real(ctx, trace, result)

    monkeypatch.setattr(agent_mod, "_record", record)
    with FakeServer(ok_handler) as srv:
        _, meta = _run(_scenario(srv.url, "agents.count=2", "agents.rounds=3"), tmp_path)
    per = _agent_records(tmp_path)
    a0 = [(r.round, r.call, r.outcome) for r in per[0]]
    assert a0 == [(1, 0, "ok"), (2, 0, "error"), (2, 1, "ok"), (3, 0, "ok")], a0
    bad = per[0][1]
    assert bad.error == "TypeError" and bad.error_msg.startswith("agentload could not read the response")
    assert bad.t["end"] >= bad.t["start"] and bad.token_chunks == 2  # what was measured is kept
    [c] = meta["crashes"]
    _check_entry(c, "agent", "TypeError")
    assert (c["agent"], c["round"], c["request_id"]) == (0, 2, failed[0])


# ---------------------------------------------------------------- case 5: background tasks


@pytest.mark.slow
def test_watchdog_crash_is_recorded_restarted_and_stalls_are_still_given_up(tmp_path, monkeypatch):
    real = runner.watchdog
    calls = []

    async def watchdog(ctx):
        calls.append(1)
        if len(calls) == 1:
            await asyncio.sleep(0.05)
            raise RuntimeError("watchdog bug")
        await real(ctx)

    async def hang(request):  # no headers for longer than give_up_s (bounded: the server thread must stop)
        await asyncio.sleep(4)
        return await sse_response(request, _answer())

    monkeypatch.setattr(runner, "watchdog", watchdog)
    with FakeServer(hang) as srv:
        _, meta = _run(_scenario(srv.url, "agents.count=2", "agents.rounds=2", "stall.after_s=0.3",
                                 "stall.give_up_s=1"), tmp_path)
    [c] = meta["crashes"]
    _check_entry(c, "watchdog", "RuntimeError")
    assert c["agent"] is None and c["round"] is None and c["restarted"] is True
    assert len(calls) == 2
    recs = [r for rs in _agent_records(tmp_path).values() for r in rs]
    # the restarted watchdog still saw the stall and gave the requests up
    assert len(recs) == 2 and all(r.outcome == "stalled" and r.stalled_phase == "ttfb" for r in recs)
    summary, _ = write_reports(tmp_path)
    assert summary["verdict"]["kind"] != "healthy"


def test_a_watchdog_that_keeps_crashing_stops_the_run(tmp_path, monkeypatch):
    async def watchdog(ctx):
        await asyncio.sleep(0.01)
        raise KeyError("trace")

    monkeypatch.setattr(runner, "watchdog", watchdog)
    with FakeServer(ok_handler) as srv:  # endless agents: only the stop ends this run
        outcome, meta = _run(_scenario(srv.url, "agents.count=2", "agents.rounds=100000"), tmp_path)
    crashes = meta["crashes"]
    assert [c["where"] for c in crashes] == ["watchdog"] * (runner.BACKGROUND_RESTARTS + 1)
    assert [c["restarted"] for c in crashes] == [True] * runner.BACKGROUND_RESTARTS + [False]
    assert meta["ended_by"] == "crashed" and outcome.ended_by == "crashed"
    assert meta["cut_short"] and not meta["ended_normally"] and "watchdog" in meta["stop_reason"]
    recs = [r for rs in _agent_records(tmp_path).values() for r in rs]
    assert recs and all(r.outcome == "ok" for r in recs)  # the requests in flight were answered


def test_canary_and_sampler_crashes_are_recorded_and_the_run_still_writes_everything(tmp_path, monkeypatch):
    async def attempt(ctx, session, trace, body):
        raise ValueError("canary bug")

    def sample(self):
        raise ZeroDivisionError("sampler bug")

    monkeypatch.setattr(runner, "attempt", attempt)  # the canaries' attempt; agents use agent.attempt
    monkeypatch.setattr(runner.Sampler, "sample", sample)
    monkeypatch.setattr(runner, "RESTART_PAUSE_S", 0.01)
    with FakeServer(_slow(0.1)) as srv:
        _, meta = _run(_scenario(srv.url, "agents.count=2", "agents.rounds=8", "canary.every_s=0.05"), tmp_path)
    where = Counter(c["where"] for c in meta["crashes"])
    assert where["canary"] == runner.BACKGROUND_RESTARTS + 1, meta["crashes"]
    assert where["sampler"] >= 1  # at least the last sample, taken while the run ends
    assert meta["ended"] and meta["ended_by"] == "finished"
    per = _agent_records(tmp_path)
    assert all([r.round for r in per[a]] == list(range(1, 9)) for a in (0, 1))


def test_run_loop_crash_stops_cuts_and_still_writes_run_json(tmp_path, monkeypatch):
    async def broken(*a, **k):
        raise AssertionError("shutdown bug")

    monkeypatch.setattr(runner._Running, "bounded", broken)  # the wait for in-flight requests to end
    with FakeServer(_slow(2.0)) as srv:
        outcome, meta = _run(_scenario(srv.url, "agents.count=3", "agents.duration_s=0.5"), tmp_path)
    [c] = meta["crashes"]
    _check_entry(c, "runner", "AssertionError")
    assert meta["ended"] and meta["ended_by"] == "crashed" and meta["cut_short"]
    recs = [r for rs in _agent_records(tmp_path).values() for r in rs]
    assert len(recs) == 3 and all(r.outcome == "cut_short" for r in recs)


def test_arrivals_crash_stops_the_run(tmp_path, monkeypatch):
    real = arrivals._track

    def track(ctx, tasks, task):
        if len(tasks) == 2:
            task.cancel()
            raise RuntimeError("arrivals bug")
        real(ctx, tasks, task)

    monkeypatch.setattr(arrivals, "_track", track)
    with FakeServer(ok_handler) as srv:
        _, meta = _run(_scenario(srv.url, "agents.count=5", "agents.rounds=100000"), tmp_path)
    [c] = meta["crashes"]
    _check_entry(c, "arrivals", "RuntimeError")
    assert meta["ended_by"] == "crashed" and "arrivals" in meta["stop_reason"]
    assert sorted(_agent_records(tmp_path)) == [0, 1]


def test_workers_merge_keeps_every_workers_crashes():
    crash = {"where": "agent", "agent": 3, "round": 2, "error": "RuntimeError", "message": "x", "traceback": "tb"}
    m0 = {"ended": True, "ended_normally": True, "cut_short": False, "stop_reason": "duration reached",
          "ended_by": "duration", "crashes": [], "crash_count": 0, "records": 5}
    m1 = dict(m0, crashes=[crash], crash_count=1)
    out = merge_meta({}, [m0, m1], [0, 0], False)
    assert out["crashes"] == [dict(crash, worker=1)] and out["crash_count"] == 1
    assert out["ended_by"] == "duration" and not out["cut_short"]
    # a worker process that died of an exception is a crash too
    out = merge_meta({}, [m0, None], [0, 1], False)
    assert [(c["where"], c["worker"], c["error"]) for c in out["crashes"]] == [("worker", 1, "WorkerExit")]
    assert out["ended_by"] == "crashed" and out["cut_short"]


# ---------------------------------------------------------------- case 10: start-up


def test_agents_start_in_slices_not_all_in_one_loop_step(tmp_path, monkeypatch):
    """Each new agent's first step runs in the loop iteration after its task was created: count
    the agents whose first step ran in each iteration."""
    monkeypatch.setattr(arrivals, "ARRIVAL_SLICE", 8)
    n = 60
    tick = [0]
    ticks: list[int] = []
    real = arrivals.run_agent

    def count_iterations():
        tick[0] += 1
        if len(ticks) < n:
            asyncio.get_running_loop().call_soon(count_iterations)  # once per loop iteration

    async def run_agent(ctx, agent, intended_start=None):
        if not ticks:
            asyncio.get_running_loop().call_soon(count_iterations)
        ticks.append(tick[0])
        return await real(ctx, agent, intended_start)

    monkeypatch.setattr(arrivals, "run_agent", run_agent)
    with FakeServer(ok_handler) as srv:
        _, meta = _run(_scenario(srv.url, f"agents.count={n}", "agents.rounds=1"), tmp_path)
    per_step = Counter(ticks)
    assert len(ticks) == n and max(per_step.values()) <= 8, per_step
    assert len(per_step) >= n // 8
    assert len(_agent_records(tmp_path)) == n and meta["crashes"] == []


# ---------------------------------------------------------------- case 11: how a run ended


@pytest.mark.slow
def test_end_at_duration_is_not_cut_short_but_cut_requests_are(tmp_path, monkeypatch):
    with FakeServer(_slow(0.05)) as srv:
        _, meta = _run(_scenario(srv.url, "agents.count=3", "agents.rounds=100000", "agents.duration_s=0.6"),
                       tmp_path / "dur")
    assert meta["ended_by"] == "duration" and meta["stop_reason"] == "duration reached"
    assert not meta["cut_short"] and meta["ended_normally"] and meta["crashes"] == []
    assert all(r.outcome == "ok" for rs in _agent_records(tmp_path / "dur").values() for r in rs)

    # Requests still in flight when the shutdown's wait runs out are cut: then it is cut short.
    # (The watchdog would give them up before; here it does nothing, the wait is short.)
    async def idle_watchdog(ctx):
        await asyncio.sleep(3600)

    monkeypatch.setattr(runner, "watchdog", idle_watchdog)
    monkeypatch.setattr(runner, "SHUTDOWN_GRACE_S", 0.2)
    with FakeServer(_slow(4.0)) as srv:
        _, meta = _run(_scenario(srv.url, "agents.count=2", "agents.duration_s=0.3", "stall.after_s=0.3",
                                 "stall.give_up_s=0.3"),
                       tmp_path / "cut")
    assert meta["ended_by"] == "duration" and meta["stop_reason"] == "duration reached" and meta["cut_short"]
    recs = [r for rs in _agent_records(tmp_path / "cut").values() for r in rs]
    assert len(recs) == 2 and all(r.outcome == "cut_short" for r in recs)


def test_live_view_and_dump_say_agentload_crashed():
    from types import SimpleNamespace

    from agentload.run.context import AgentState
    from agentload.run.dump import format_dump
    from agentload.run.live import Rates, plain_line

    ctx = SimpleNamespace(run_id="r", counts={"requests": 1, "ok": 1, "error": 0, "stalled": 0, "cut_short": 0,
                                              "output_tokens": 3},
                          agent_states={0: AgentState(0, round=2, state="crashed")}, inflight={}, stopping=False,
                          stop_reason=None, crash_count=2, transport=SimpleNamespace(pool_state=lambda: {}))
    snap = Rates().snapshot(ctx)
    assert snap.finished == {"crashed": 1} and "AGENTLOAD CRASHES 2" in plain_line(snap)
    assert "agentload crashes: 2" in format_dump(ctx, "test")
