"""Connections over real HTTP (tests/fakeserver.py on 127.0.0.1): how each request got its
connection (new or reused, and how long a reused one had sat idle), the run's reuse rate, and
why a reused connection was closed under its request (issue 27, case 6).

llama.cpp's llama-server closes its connection right after every streamed answer although its
response headers say keep-alive; a client that sends its next request before it has read that
close loses the POST. The fake server here does the same, a little later (CLOSE_AFTER_S), so that
the client's next request (after a tool time shorter than that) always lands in the close: the
race llama-server makes on a busy machine, made certain.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
from aiohttp import web

from agentload.launch import run_to_dir
from agentload.records import load_records
from agentload.run.scenario import load_scenario
from fakeserver import DONE, FakeServer, chunk

CLOSE_AFTER_S = 0.15  # the server closes the connection this long after each streamed answer
THINK_S = 0.4  # ... takes this long before its response headers
TOOL_S = 0.02  # ... and the agents send their next round this soon after theirs


def _answer() -> list[str]:
    return [chunk({"role": "assistant"}), chunk({"content": "hello"}),
            chunk(finish_reason="stop", usage={"prompt_tokens": 10, "completion_tokens": 1}), DONE]


async def close_after_each_answer(request: web.Request) -> web.StreamResponse:
    await asyncio.sleep(THINK_S)
    resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream",
                                                   "Connection": "keep-alive", "Keep-Alive": "timeout=5, max=100"})
    await resp.prepare(request)
    for ev in _answer():
        await resp.write(ev.encode())
    await resp.write_eof()
    transport = request.transport
    if transport is not None:
        asyncio.get_running_loop().call_later(CLOSE_AFTER_S, transport.close)
    return resp


def _run(url: str, out: Path, *overrides: str):
    sc = load_scenario("demo", [f'target.endpoint="{url}"', "canary.every_s=0", "agents.count=2", "agents.rounds=3",
                                'agents.start="all"', "agents.error_retries=2", "conversation.tools=0",
                                f"conversation.tool_latency_ms={int(TOOL_S * 1000)}", "stall.after_s=10",
                                "stall.give_up_s=20", *overrides])
    return run_to_dir(sc, out, live=False, install_signals=False, log=lambda m: None)


def test_a_server_that_closes_after_each_answer_is_named_so_not_a_short_keepalive_timeout(tmp_path):
    with FakeServer(close_after_each_answer) as srv:
        res = _run(srv.url, tmp_path)
    v = res.summary["verdict"]
    recs = [r for r in load_records(tmp_path / "records.jsonl").records if r.kind == "agent"]
    failed = [r for r in recs if r.outcome == "error"]
    # every round after the first: the reuse fails, its retry opens a new connection and completes
    assert failed and all(r.reused and "headers" not in r.t and r.round > 1 for r in failed), recs
    assert all(r.idle_ns is not None and r.idle_ns < CLOSE_AFTER_S * 1e9 for r in failed), [r.idle_ns for r in failed]
    assert all(r.outcome == "ok" and r.reused is False and r.idle_ns is None
               for r in recs if r not in failed), recs
    assert v["kind"] == "disconnects", res.text
    ev = "\n".join(v["evidence"])
    assert "idle in the pool before the failed reuse" in ev, ev
    assert "no reused connection ever got an answer" in ev and "closes its connection after each answer" in ev, ev
    assert "force_close = true" in ev, ev
    assert "keep-alive timeout is shorter" not in ev and "keep-alive timeout lies between" not in ev, ev
    conns = res.summary["connections"]
    assert conns["reused"] == len(failed) and conns["new"] == len(recs) - len(failed), conns
    assert conns["failed_reuses"] == len(failed) and conns["failed_reuse_idle_ms"]["n"] == len(failed), conns
    assert conns["failed_reuse_idle_ms"]["max"] < CLOSE_AFTER_S * 1000, conns
    assert conns["answered_reuse_idle_max_ms"] is None, conns
    assert "connections: " in res.text and f"{conns['failed_reuses']} reuse(s) closed by the other side" in res.text


def test_force_close_avoids_it_and_reports_a_reuse_rate_of_zero(tmp_path):
    with FakeServer(close_after_each_answer) as srv:
        res = _run(srv.url, tmp_path, "client.force_close=true")
    assert res.summary["verdict"]["kind"] == "healthy", res.text
    conns = res.summary["connections"]
    assert (conns["new"], conns["reused"], conns["reuse_rate"], conns["failed_reuses"]) == (6, 0, 0.0, 0), conns
    assert "connections: 6 new, 0 reused (reuse rate 0%)" in res.text, res.text


def test_a_keepalive_server_reports_its_reuse_rate_and_idle_times(tmp_path):
    async def ok(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for ev in _answer():
            await resp.write(ev.encode())
        await resp.write_eof()
        return resp

    with FakeServer(ok) as srv:
        res = _run(srv.url, tmp_path)
    assert res.summary["verdict"]["kind"] == "healthy", res.text
    recs = [r for r in load_records(tmp_path / "records.jsonl").records if r.kind == "agent"]
    reused = [r for r in recs if r.reused]
    # (idle: from the end of the answer to the next request, across the tool time; asyncio's timer may
    # wake a little early, so only its order of magnitude is asserted)
    assert len(reused) == 4 and all(r.idle_ns is not None and r.idle_ns >= TOOL_S * 0.5e9 for r in reused), \
        [r.idle_ns for r in reused]
    conns = res.summary["connections"]
    assert (conns["new"], conns["reused"], conns["failed_reuses"]) == (2, 4, 0), conns
    assert conns["reuse_rate"] == round(4 / 6, 4) and conns["answered_reuse_idle_max_ms"] >= TOOL_S * 500, conns


# ---------------------------------------------------------------- what the server says of itself


LLAMA_OVERFLOW = {"error": {"code": 400, "message": "request (900 tokens) exceeds the available context size (512 "
                                                    "tokens), try increasing it",
                            "type": "exceed_context_size_error", "n_prompt_tokens": 900, "n_ctx": 512}}


def test_a_context_overflow_is_not_retried_and_told_in_the_servers_numbers_with_props(tmp_path):
    """Issue 27 case 11, as llama-server answers: a 400 with its own prompt count and n_ctx, and
    /props saying n_ctx is one of two slots' share. error_retries = 2: none is spent on it."""
    async def overflow_in_round_2(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if len(body["messages"]) > 2:
            return web.json_response(LLAMA_OVERFLOW, status=400)
        resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for ev in _answer():
            await resp.write(ev.encode())
        await resp.write_eof()
        return resp

    async def props(request: web.Request) -> web.Response:
        return web.json_response({"total_slots": 2, "default_generation_settings": {"n_ctx": 512},
                                  "chat_template_caps": {"supports_tool_calls": True}, "endpoint_metrics": False,
                                  "model_path": "/secret/path/model.gguf", "chat_template": "{{ x }}"})

    with FakeServer(overflow_in_round_2, gets={"/props": props}) as srv:
        res = _run(srv.url, tmp_path)
        posts = len(srv.requests)
    recs = [r for r in load_records(tmp_path / "records.jsonl").records if r.kind == "agent"]
    failed = [r for r in recs if r.outcome == "error"]
    assert len(failed) == 2 and posts == 4, (posts, recs)  # one overflow per agent, not retried
    assert all(r.round == 2 and r.status == 400 and r.server_prompt_tokens == 900 for r in failed), failed
    meta = orjson.loads((tmp_path / "run.json").read_bytes())
    sp = meta["server_props"]
    assert sp == {"url": srv.url.removesuffix("/v1") + "/props", "total_slots": 2, "n_ctx_per_slot": 512,
                  "supports_tool_calls": True, "endpoint_metrics": False, "has_tool_template": False}, sp
    v = res.summary["verdict"]
    assert (v["kind"], v["first_round"]) == ("server_errors", 2), res.text
    ev = "\n".join(v["evidence"])
    assert "the server counted 900 prompt tokens against its n_ctx of 512 (its own numbers" in ev, ev
    assert "not retried" in ev and "total_slots = 2 split the context (2 x 512 = 1,024 tokens" in ev, ev


def test_a_server_without_props_is_recorded_as_such(tmp_path):
    with FakeServer(close_after_each_answer) as srv:
        _run(srv.url, tmp_path, "agents.rounds=1", "agents.count=1")
    sp = orjson.loads((tmp_path / "run.json").read_bytes())["server_props"]
    assert sp == {"url": srv.url.removesuffix("/v1") + "/props", "error": "HTTP 404"}, sp
