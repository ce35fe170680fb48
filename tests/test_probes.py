"""Stall probes (agentload.run.probes) over real HTTP: the verdict names the factor the probes
reproduced, not the correlation in the records.

Four servers whose hangs look alike in the records (every stalled request is a larger prompt on
a reused keep-alive connection, from the same round on): a keep-alive bug (the second request on
any connection is never answered), a prompt-size hang (the mock's `hang_above_tokens`), a hang
that needs both (large prompts on reused connections only), and a whole-server freeze.
"""

from __future__ import annotations

import asyncio

import orjson
import pytest
from aiohttp import web

from agentload.records import PROBE_KINDS, load_records
from fakeserver import DONE, FakeServer, chunk
from helpers import run_scenario

pytestmark = pytest.mark.slow  # real runs of several seconds each

# 4 agents x 4 rounds of the long-context hang's conversation: round 1 is ~12 kB of body on a new
# connection, round 2 ~17 kB on the same connection reused
BASE = ["agents.count=4", "agents.rounds=4", "agents.start=\"all\"", "stall.after_s=1", "stall.give_up_s=4",
        "canary.every_s=0.5"]
BIG_BYTES = 14_000  # between round 1's bodies and round 2's


class Connections:
    """Requests seen per connection (by the client's address and port: unique while it is open)."""

    def __init__(self) -> None:
        self.seen: dict[object, int] = {}
        self.frozen = False

    def count(self, request: web.Request) -> int:
        key = request.transport.get_extra_info("peername") if request.transport is not None else None
        self.seen[key] = self.seen.get(key, 0) + 1
        return self.seen[key]


async def hang(request: web.Request) -> web.StreamResponse:
    """No status, no headers: until the client goes away (bounded, so the server can stop)."""
    for _ in range(600):
        if request.transport is None or request.transport.is_closing():
            break
        await asyncio.sleep(0.1)
    return web.Response(status=499)


async def answer(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(chunk({"role": "assistant", "content": ""}).encode())
    for w in ("fine", " thanks"):
        await resp.write(chunk({"content": w}).encode())
    await resp.write(chunk({}, "stop").encode())
    await resp.write(("data: " + orjson.dumps({"id": "fake-1", "object": "chat.completion.chunk", "model": "fake",
                                               "choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 2,
                                                                        "total_tokens": 3}}).decode()
                      + "\n\n").encode())
    await resp.write(DONE.encode())
    await resp.write_eof()
    return resp


def keepalive_bug() -> FakeServer:
    conns = Connections()

    async def handler(request: web.Request) -> web.StreamResponse:
        await request.read()
        return await (hang(request) if conns.count(request) >= 2 else answer(request))

    return FakeServer(handler)


def big_on_reused() -> FakeServer:
    conns = Connections()

    async def handler(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        n = conns.count(request)
        return await (hang(request) if n >= 2 and len(body) > BIG_BYTES else answer(request))

    return FakeServer(handler)


def freezes_at_round_2() -> FakeServer:
    state = Connections()

    async def handler(request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        if len(body.get("messages") or []) > 2:  # the first round-2 request: nothing is answered from here on
            state.frozen = True
        return await (hang(request) if state.frozen else answer(request))

    return FakeServer(handler)


def probes_of(out) -> dict[str, list]:
    recs = load_records(out / "records.jsonl").records
    got: dict[str, list] = {}
    for r in recs:
        if r.kind in PROBE_KINDS:
            got.setdefault(r.kind, []).append(r)
    return got


def stall_verdict(res) -> dict:
    v = res.summary["verdict"]
    assert v["kind"] == "server_stall" and v["phase"] == "ttfb" and v["first_round"] == 2, v
    return v


def test_a_keepalive_bug_is_named_as_the_connection_not_the_prompt_size(tmp_path):
    with keepalive_bug() as srv:
        res = run_scenario("long-context-hang", tmp_path, [*BASE, f'target.endpoint="{srv.url}"'])
    v = stall_verdict(res)
    assert "the hang follows the connection, not the prompt" in v["summary"], v["summary"]
    assert "prompt tokens stalled" not in v["summary"], v["summary"]  # the contradicted correlation does not lead
    thr = next(e for e in v["evidence"] if e.startswith("every request at or above"))
    assert "the probes contradict it" in thr
    p = probes_of(tmp_path)
    assert p["probe_body_fresh"][0].outcome == "ok" and p["probe_body_fresh"][0].reused is False
    assert p["probe_short_reused"][0].stalled_phase == "ttfb" and p["probe_short_reused"][0].reused is True
    assert "probe_body_reused" not in p  # only when neither factor alone hung
    # a few extra requests per wave, and the wave count bounded
    assert sum(len(x) for x in p.values()) <= 4 * len({r.call for x in p.values() for r in x})


def test_a_prompt_size_hang_is_named_as_the_content_with_its_threshold(tmp_path):
    res = run_scenario("long-context-hang", tmp_path, [*BASE, "mock.hang_above_tokens=4000"])
    v = stall_verdict(res)
    assert "every request at or above" in v["summary"] and "prompt tokens stalled" in v["summary"], v["summary"]
    assert "the hang follows the request's content" in v["summary"], v["summary"]
    p = probes_of(tmp_path)
    assert p["probe_body_fresh"][0].stalled_phase == "ttfb" and p["probe_body_fresh"][0].reused is False
    assert p["probe_short_reused"][0].outcome == "ok" and p["probe_short_reused"][0].reused is True


def test_a_hang_that_needs_both_factors_is_named_so(tmp_path):
    with big_on_reused() as srv:
        res = run_scenario("long-context-hang", tmp_path, [*BASE, f'target.endpoint="{srv.url}"'])
    v = stall_verdict(res)
    assert "the hang needs both the content and a reused connection" in v["summary"], v["summary"]
    p = probes_of(tmp_path)
    assert p["probe_body_fresh"][0].outcome == "ok"
    assert p["probe_short_reused"][0].outcome == "ok" and p["probe_short_reused"][0].reused is True
    assert p["probe_body_reused"][0].stalled_phase == "ttfb" and p["probe_body_reused"][0].reused is True


def test_a_whole_server_freeze_is_named_as_answering_no_one(tmp_path):
    with freezes_at_round_2() as srv:
        res = run_scenario("long-context-hang", tmp_path, [*BASE, f'target.endpoint="{srv.url}"'])
    v = stall_verdict(res)
    assert "the server is not answering anyone" in v["summary"], v["summary"]
    assert "prompt tokens stalled" not in v["summary"], v["summary"]
    p = probes_of(tmp_path)
    assert p["probe_short_fresh"][0].stalled_phase is not None and p["probe_body_fresh"][0].stalled_phase is not None


def test_probes_off_leave_the_cause_to_correlation_and_say_what_is_confounded(tmp_path):
    with keepalive_bug() as srv:
        res = run_scenario("long-context-hang", tmp_path, [*BASE, f'target.endpoint="{srv.url}"',
                                                           "stall.probes=false"])
    v = stall_verdict(res)
    assert not probes_of(tmp_path)
    assert orjson.loads((tmp_path / "run.json").read_bytes())["stall"]["probes"] is False  # copied to run.json
    line = next(e for e in v["evidence"] if e.startswith("probes are off"))
    assert "rests on correlation" in line and "prompt size and connection reuse are confounded" in line
