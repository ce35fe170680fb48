"""agentload's own queue in front of aiohttp's pool (`client.aiohttp_waiters_max`, `PoolGate`).

Over real HTTP against the mock, on a pool of one connection with one aiohttp waiter allowed:
- the rest wait in agentload's queue; the pool's state counts them as waiters (and says how many
  are `gated`); first come, first served; each request's pool_wait is its whole wait (agentload's
  queue, then aiohttp's), so the last of six waits for the five before it;
- a pool timeout in agentload's queue is the same error as aiohttp's (connect_timeout, still queued:
  no `queued_end`), and the timeout is the pool's, not twice it;
- a waiter cancelled (the watchdog giving up) passes on nothing it did not have: every place comes back;
- a whole run of the pool-starvation scenario through the queue gets the same verdict.
"""

from __future__ import annotations

import asyncio

import orjson
import pytest

import agentload.run.request as rq
from agentload.mock import MockConfig, MockProcess
from agentload.records import Trace, load_records
from agentload.run.scenario import ClientConfig, TargetConfig
from agentload.run.transport import Transport
from helpers import run_scenario

BODY = orjson.dumps({"model": "mock-model", "stream": True, "max_tokens": 4,
                     "messages": [{"role": "user", "content": "hello"}]})


def _transport(url: str, **client) -> Transport:
    cfg = dict(limit=1, aiohttp_waiters_max=1, read_timeout_s=10, total_timeout_s=20)
    cfg.update(client)
    return Transport(ClientConfig(**cfg), TargetConfig(), url)


def _trace(i: int) -> Trace:
    return Trace("agent", i, 1, 0, f"gate-a{i}-r1-c0", 1, len(BODY), 5)


async def _send(tr: Transport, trace: Trace):
    try:
        return await rq.send(tr.session_for(0), tr.url, BODY, trace)
    except Exception as e:  # as agent.attempt records it
        return rq.classify_exception(e)


async def _arrive_in_order(tr: Transport, traces: list[Trace], gap_s: float = 0.005) -> list[asyncio.Task]:
    """One send task per trace, `gap_s` apart: a known order of arrival."""
    tasks = []
    for t in traces:
        tasks.append(asyncio.create_task(_send(tr, t)))
        await asyncio.sleep(gap_s)
    return tasks


ANSWER_MS = 250  # each answer's time: the checks made while the first is in flight have this long (a loaded machine)


@pytest.fixture(scope="module")
def slow_mock():
    with MockProcess.start(MockConfig(base_latency_ms=ANSWER_MS, decode_tokens_per_s=0, output_tokens=4)) as m:
        yield m


async def test_waiters_past_the_limit_queue_in_agentload_first_come_first_served(slow_mock):
    tr = _transport(slow_mock.url)
    try:
        traces = [_trace(i) for i in range(6)]
        tasks = await _arrive_in_order(tr, traces)
        await asyncio.sleep(0.02)
        pool = tr.pool_state()
        assert pool["gated"] == 4 and pool["waiters"] == 5 and pool["in_use"] == 1, pool
        results = await asyncio.wait_for(asyncio.gather(*tasks), 30)
        assert [r.error for r in results] == [None] * 6, results
        pool = tr.pool_state()
        assert "gated" not in pool and pool["waiters"] == 0
        gate = tr.session_for(0).connector.gate
        assert gate.room == 2 and gate.n_waiting == 0  # every place came back
        ends = [t.t["end"] for t in traces]
        assert ends == sorted(ends)  # served in the order they came
        for t in traces[1:]:
            assert t.t["start"] <= t.t["queued_start"] < t.t["queued_end"] <= t.t["sent"]
        # the whole wait, agentload's queue and aiohttp's: the last waited for the five before it
        last = traces[-1].t
        assert (last["queued_end"] - last["queued_start"]) / 1e6 >= 5 * ANSWER_MS * 0.9
    finally:
        await tr.close()


async def test_a_pool_timeout_in_agentloads_queue_is_a_pool_timeout_of_the_whole_wait():
    # answers take 1.2 s, the pool timeout is 2 s: #0 is answered at 1.2 s, #1 (in aiohttp's queue)
    # at 2.4 s. #2 leaves agentload's queue at 1.2 s for aiohttp's: 0.8 s of its timeout left, so it
    # times out at 2 s, before #1's connection is free (with a fresh 2 s it would have been served);
    # #3 times out in agentload's queue.
    with MockProcess.start(MockConfig(base_latency_ms=1200, decode_tokens_per_s=0, output_tokens=4)) as m:
        tr = _transport(m.url, pool_timeout_s=2.0)
        try:
            traces = [_trace(i) for i in range(4)]
            tasks = await _arrive_in_order(tr, traces, 0.02)
            results = await asyncio.wait_for(asyncio.gather(*tasks), 30)
        finally:
            await tr.close()
    assert results[0].error is None and results[1].error is None, results
    for res, t in zip(results[2:], traces[2:]):
        assert res[0] == "connect_timeout", res
        assert "queued_start" in t.t and "queued_end" not in t.t  # still queued when it timed out
        assert "sent" not in t.t


async def test_a_cancelled_waiter_gives_its_place_back(slow_mock):
    tr = _transport(slow_mock.url)
    try:
        traces = [_trace(i) for i in range(5)]
        tasks = await _arrive_in_order(tr, traces)
        await asyncio.sleep(0.01)
        tasks[3].cancel()  # waiting in agentload's queue: given up
        results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)
        assert isinstance(results[3], asyncio.CancelledError)
        assert [r.error for i, r in enumerate(results) if i != 3] == [None] * 4
        gate = tr.session_for(0).connector.gate
        assert gate.room == 2 and gate.n_waiting == 0
        assert "queued_end" not in traces[3].t
        # and the queue goes on serving
        more = await asyncio.wait_for(asyncio.gather(*(_send(tr, _trace(9 + i)) for i in range(3))), 30)
        assert [r.error for r in more] == [None] * 3 and gate.room == 2
    finally:
        await tr.close()


def test_pool_starvation_through_agentloads_queue_gets_the_pools_verdict(tmp_path):
    run_scenario("pool-starvation", tmp_path, ["agents.rounds=1", "canary.every_s=0",
                                                "client.aiohttp_waiters_max=2"])
    summary = orjson.loads((tmp_path / "summary.json").read_bytes())
    v = summary["verdict"]
    assert (v["kind"], v["phase"], v["first_round"]) == ("client_pool", "pool_wait", 1), v["summary"]
    run = orjson.loads((tmp_path / "run.json").read_bytes())
    assert run["scenario"]["client"]["aiohttp_waiters_max"] == 2
    recs = load_records(tmp_path / "records.jsonl").records
    assert len(recs) == 40 and all(r.outcome == "ok" for r in recs)
    # 40 agents at once on 4 connections and 2 of aiohttp's waiters: the other 34 queued in agentload's
    assert run["gated_requests"] == 34
    # every request that waited has its whole wait: it ends where its connection was handed over
    for r in recs:
        if "queued_start" in r.t:
            assert r.t["start"] <= r.t["queued_start"] < r.t["queued_end"] <= r.t["sent"]
