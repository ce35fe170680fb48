"""What the mock needs to stand as one backend of a fleet behind a router, over real sockets:
its name in every answer, a prefix cache, live faults set through POST /mock/fault, the
request log, and a restart on the same port.

Most tests serve the app in the test's own loop (start_server); the process tests use MockProcess.
Every wait is bounded: client timeouts, asyncio.timeout, or a polling deadline."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import socket
import threading
import time

import aiohttp
import orjson
import pytest

from agentload.mock import MockConfig, MockProcess
from agentload.mock.server import start_server
from agentload.tokens import message_tokens, prompt_tokens, synthetic_text, text_tokens

TP = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"  # a W3C traceparent (the spec's example)
TIMEOUT = aiohttp.ClientTimeout(total=10, sock_connect=5)
TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "read a file", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]


@contextlib.asynccontextmanager
async def served(**kw):
    """The mock in this loop; yields a session and the base URL."""
    kw.setdefault("base_latency_ms", 1)
    kw.setdefault("decode_tokens_per_s", 0)
    runner, port = await start_server(MockConfig(**kw))
    try:
        async with aiohttp.ClientSession(timeout=TIMEOUT) as s:
            yield s, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def text(tokens, seed):
    return synthetic_text(random.Random(seed), tokens)


def body(messages, stream=True, **kw):
    return {"model": "m", "messages": messages, "stream": stream, **kw}


def is_token(line):
    return line.startswith("data: {") and '"content":"' in line and '"content":""' not in line


async def read_lines(resp, out=None):
    """SSE lines of a response with their receive times."""
    out = [] if out is None else out
    async for raw in resp.content:
        line = raw.decode().rstrip("\n")
        if line:
            out.append((time.perf_counter(), line))
    return out


async def stream(s, url, payload, headers=None):
    """(status, headers, [(t, line)], t_sent) of a whole streamed answer."""
    t0 = time.perf_counter()
    async with s.post(url + "/v1/chat/completions", json=payload, headers=headers or {}) as r:
        return r.status, r.headers, await read_lines(r), t0


def chunks(lines):
    return [json.loads(line[6:]) for _, line in lines if line.startswith("data: {")]


def first_token_at(lines):
    return next(t for t, line in lines if is_token(line))


async def get_json(s, url, path):
    async with s.get(url + path) as r:
        return await r.json()


async def set_fault(s, url, **kw):
    async with s.post(url + "/mock/fault", json=kw) as r:
        assert r.status == 200, await r.text()
        return await r.json()


async def wait_for(pred, timeout_s=5.0):
    deadline = time.monotonic() + timeout_s
    while not (got := await pred()):
        assert time.monotonic() < deadline, "condition never met"
        await asyncio.sleep(0.02)
    return got


# ------------------------------------------------------------------ the backend's name


@pytest.mark.parametrize("style", ["vllm", "sglang"])
async def test_name_in_every_chunk_every_answer_and_header(style):
    async with served(name="b7", style=style, output_tokens=5) as (s, url):
        status, headers, lines, _ = await stream(s, url, body([{"role": "user", "content": "hi"}],
                                                              stream_options={"include_usage": True}))
        assert status == 200 and headers["x-mock-backend"] == "b7"
        got = chunks(lines)
        assert len(got) >= 7  # role, 5 tokens, finish (+ sglang's own finish chunk), usage
        assert got[0]["choices"][0]["delta"]["role"] == "assistant"
        assert got[-1]["choices"] == [] and got[-1]["usage"]["completion_tokens"] == 5
        assert [c.get("system_fingerprint") for c in got] == ["b7"] * len(got)

        async with s.post(url + "/v1/chat/completions", json=body([{"role": "user", "content": "hi"}], False)) as r:
            assert r.headers["x-mock-backend"] == "b7"
            assert (await r.json())["system_fingerprint"] == "b7"
        async with s.post(url + "/v1/chat/completions", data=b"not json") as r:  # errors name it too
            assert r.status == 400 and r.headers["x-mock-backend"] == "b7"
        assert (await get_json(s, url, "/mock/stats"))["backend"] == "b7"


def test_name_is_checked():
    from agentload.errors import ScenarioError

    for bad in ("", "  ", "a\nb", 5):
        with pytest.raises(ScenarioError, match="mock.name: expected a backend name"):
            MockConfig.from_dict({"name": bad}, "x")
    assert MockConfig.from_dict({"name": "b0"}, "x").name == "b0"


# ------------------------------------------------------------------ prefix cache


def usage_of(lines):
    return chunks(lines)[-1]["usage"]


def server_ttft(headers, lines):
    sent_ns = next(c["mock_sent_ns"] for c in chunks(lines) if "mock_sent_ns" in c)
    return (sent_ns - int(headers["x-mock-recv-ns"])) / 1e9


async def test_prefix_cache_two_rounds_cuts_prefill():
    rate = 2000.0  # tok/s: the prefill of ~600 tokens takes ~0.3 s, so the saving is plain to see
    system = {"role": "system", "content": text(590, 1)}
    user = {"role": "user", "content": text(7, 2)}
    r1 = [system, user]
    p1 = prompt_tokens(r1, TOOLS)
    assert p1 % 16  # so the floor to whole blocks shows
    r2 = r1 + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": text(20, 3)}]
    p2 = prompt_tokens(r2, TOOLS)
    # as big as r2, but a system prompt of its own: nothing to reuse
    other = [{"role": "system", "content": text(590, 9)}] + r2[1:]
    assert prompt_tokens(other, TOOLS) == p2
    opts = {"stream_options": {"include_usage": True}, "tools": TOOLS, "tool_choice": "none"}

    async with served(prefix_cache_tokens=100_000, prefill_tokens_per_s=rate, output_tokens=2) as (s, url):
        _, _, lines1, _ = await stream(s, url, body(r1, **opts))
        assert usage_of(lines1)["prompt_tokens"] == p1
        assert usage_of(lines1)["prompt_tokens_details"] == {"cached_tokens": 0}

        _, h2, lines2, _ = await stream(s, url, body(r2, **opts))
        cached = usage_of(lines2)["prompt_tokens_details"]["cached_tokens"]
        assert cached == p1 // 16 * 16 > 0

        _, h3, lines3, _ = await stream(s, url, body(other, **opts))
        assert usage_of(lines3)["prompt_tokens_details"] == {"cached_tokens": 0}
        # time to first token as the server saw it: from receipt to the stamped first token chunk
        ttft_cached, ttft_uncached = server_ttft(h2, lines2), server_ttft(h3, lines3)
        # the mock's schedule: ttft = 1 ms + (p2 - cached) / rate, so the saving is cached / rate (~0.3 s)
        assert ttft_uncached - ttft_cached >= 0.6 * cached / rate
        assert ttft_uncached >= p2 / rate

        # another agent with the same system prompt (and tools) shares the first node
        _, _, lines4, _ = await stream(s, url, body([system, {"role": "user", "content": "other task"}], **opts))
        shared = message_tokens(system) + text_tokens(orjson.dumps(TOOLS).decode())
        assert usage_of(lines4)["prompt_tokens_details"]["cached_tokens"] == shared // 16 * 16

        # the same prompt again: everything but the last token is there; whole blocks only
        async with s.post(url + "/v1/chat/completions", json=body(r1, stream=False, **opts)) as r:
            usage = (await r.json())["usage"]
        assert usage["prompt_tokens_details"] == {"cached_tokens": (p1 - 1) // 16 * 16}

        pc = (await get_json(s, url, "/mock/stats"))["prefix_cache"]
        assert pc["capacity_tokens"] == 100_000 and pc["lookups"] == 5 and pc["hit_requests"] == 3
        assert pc["cached_tokens_total"] == cached + shared // 16 * 16 + (p1 - 1) // 16 * 16
        assert pc["prompt_tokens_total"] == p1 + 2 * p2 + prompt_tokens(
            [system, {"role": "user", "content": "other task"}], TOOLS) + p1
        assert pc["used_tokens"] <= 100_000


async def test_prefix_cache_evicts_least_recently_used_tails_first():
    sys_a, sys_b, sys_c = ({"role": "system", "content": text(96, seed)} for seed in (11, 12, 13))
    users = [{"role": "user", "content": text(46, seed)} for seed in (21, 22, 23)]
    a, b, c = [sys_a, users[0]], [sys_b, users[1]], [sys_c, users[2]]
    size = prompt_tokens(a)
    assert size == prompt_tokens(b) == prompt_tokens(c) == 150
    # room for all three but A's tail: inserting C must evict exactly that
    capacity = 3 * size - message_tokens(users[0])

    async def cached_of(s, url, messages):
        async with s.post(url + "/v1/chat/completions", json=body(messages, stream=False)) as r:
            return (await r.json())["usage"]["prompt_tokens_details"]["cached_tokens"]

    async with served(prefix_cache_tokens=capacity, prefix_block_tokens=1) as (s, url):
        for m in (a, b, c):
            assert await cached_of(s, url, m) == 0
        pc = (await get_json(s, url, "/mock/stats"))["prefix_cache"]
        assert pc["used_tokens"] == capacity
        # A's system prompt (the root of its chain) survived, its tail did not
        assert await cached_of(s, url, [sys_a, {"role": "user", "content": "new"}]) == message_tokens(sys_a)
        assert await cached_of(s, url, c) == size - 1  # C is whole
        assert (await get_json(s, url, "/mock/stats"))["prefix_cache"]["used_tokens"] <= capacity

    async with served(prefix_cache_tokens=200, prefix_block_tokens=1) as (s, url):
        for m in (a, b):
            await cached_of(s, url, m)
        assert await cached_of(s, url, a) == 0  # B pushed all of A out


async def test_no_cache_no_prompt_tokens_details():
    async with served(output_tokens=2) as (s, url):
        _, _, lines, _ = await stream(s, url, body([{"role": "user", "content": "hi"}],
                                                   stream_options={"include_usage": True}))
        assert set(usage_of(lines)) == {"prompt_tokens", "completion_tokens", "total_tokens"}
        async with s.post(url + "/v1/chat/completions", json=body([{"role": "user", "content": "hi"}], False)) as r:
            assert "prompt_tokens_details" not in (await r.json())["usage"]
        pc = (await get_json(s, url, "/mock/stats"))["prefix_cache"]
        assert pc["capacity_tokens"] == 0 and pc["lookups"] == 0


# ------------------------------------------------------------------ live faults


async def test_hang_stops_every_stream_and_health_until_it_ends():
    async with served(output_tokens=20, decode_tokens_per_s=40) as (s, url):
        lines: list = []

        async def in_flight():
            async with s.post(url + "/v1/chat/completions", json=body([{"role": "user", "content": "go"}])) as r:
                await read_lines(r, lines)

        reader = asyncio.ensure_future(in_flight())
        await wait_for(lambda: _count(lines, 3))
        t_before = time.perf_counter()
        state = await set_fault(s, url, fault="hang", for_s=1.0)
        t_after = time.perf_counter()
        assert state["fault"] == "hang" and 0.8 < state["remaining_s"] <= 1.0 and state["applied"] == 1
        assert state["since_s_ago"] < 0.2

        # while hung: no health answer, no headers for a new request
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.3):
                async with s.get(url + "/health"):
                    pass
        late = asyncio.ensure_future(stream(s, url, body([{"role": "user", "content": "late"}])))
        done, _ = await asyncio.wait({late}, timeout=0.15)
        assert not done
        assert (await get_json(s, url, "/mock/fault"))["fault"] == "hang"

        await asyncio.wait_for(reader, 5)
        assert lines[-1][1] == "data: [DONE]"
        tokens = [t for t, line in lines if is_token(line)]
        assert len(tokens) == 20
        # nothing arrived while hung (allowing for a chunk already on its way when the POST landed)
        assert not [t for t in tokens if t_after + 0.15 < t < t_before + 0.95]
        assert max(b - a for a, b in zip(tokens, tokens[1:])) >= 0.7
        # the rest came at the decode rate again, not in a burst: the schedule moved by the hang
        after = [t for t in tokens if t >= t_before + 0.95]
        assert len(after) >= 10 and after[-1] - after[0] >= (len(after) - 1) / 40 * 0.8

        status, _, late_lines, _ = await asyncio.wait_for(late, 5)
        assert status == 200 and late_lines[-1][1] == "data: [DONE]"
        async with s.get(url + "/health") as r:
            assert r.status == 200
        state = await get_json(s, url, "/mock/fault")
        assert state["fault"] is None and state["remaining_s"] is None and state["applied"] == 1
        st = await wait_for(lambda: _stats_if(s, url, lambda st: st["in_flight"] == 0))
        assert st["fault"]["fault"] is None and st["completed"] == 2


async def _count(lines, n):
    return sum(is_token(line) for _, line in lines) >= n


async def _stats_if(s, url, pred):
    st = await get_json(s, url, "/mock/stats")
    return st if pred(st) else None


async def test_hang_released_by_none_and_a_leaving_client_cancels_the_wait():
    async with served() as (s, url):
        await set_fault(s, url, fault="hang")  # no for_s: until changed
        with pytest.raises(asyncio.TimeoutError):
            await s.post(url + "/v1/chat/completions", json=body([{"role": "user", "content": "x"}]),
                         timeout=aiohttp.ClientTimeout(total=0.3))
        st = await wait_for(lambda: _stats_if(s, url, lambda st: st["in_flight"] == 0 and st["client_gone"] == 1))
        assert st["fault"]["fault"] == "hang" and st["fault"]["remaining_s"] is None
        state = await set_fault(s, url, fault="none")
        assert state["fault"] is None and state["applied"] == 2
        status, _, lines, _ = await stream(s, url, body([{"role": "user", "content": "x"}]))
        assert status == 200 and lines[-1][1] == "data: [DONE]"


async def test_errors_fault_then_expiry():
    async with served() as (s, url):
        await set_fault(s, url, fault="errors")  # 503 by default
        async with s.post(url + "/v1/chat/completions", json=body([{"role": "user", "content": "x"}])) as r:
            assert r.status == 503 and r.headers["Retry-After"] == "1"
            assert (await r.json())["error"]["code"] == 503
        state = await set_fault(s, url, fault="errors", error_status=429, for_s=5)
        assert state["fault"] == "errors" and 4.5 < state["remaining_s"] <= 5
        async with s.post(url + "/v1/chat/completions", json=body([{"role": "user", "content": "x"}], False)) as r:
            assert r.status == 429 and r.headers["Retry-After"] == "1"
        await set_fault(s, url, fault="errors", error_status=500, for_s=0.5)  # replaces the 429 one
        async with s.post(url + "/v1/chat/completions", json=body([{"role": "user", "content": "x"}], False)) as r:
            assert r.status == 500 and "Retry-After" not in r.headers
        await asyncio.sleep(0.6)  # for_s passed: the fault ended by itself
        assert (await get_json(s, url, "/mock/fault"))["fault"] is None
        async with s.post(url + "/v1/chat/completions", json=body([{"role": "user", "content": "x"}], False)) as r:
            assert r.status == 200
        st = await get_json(s, url, "/mock/stats")
        assert st["errors_injected"] == 3 and st["by_status"] == {"200": 1, "429": 1, "500": 1, "503": 1}


async def test_drop_fault_aborts_streams_in_flight_and_new():
    async with served(output_tokens=20, decode_tokens_per_s=40) as (s, url):
        lines: list = []

        async def in_flight():
            async with s.post(url + "/v1/chat/completions", json=body([{"role": "user", "content": "x"}])) as r:
                await read_lines(r, lines)

        task = asyncio.ensure_future(in_flight())
        await wait_for(lambda: _count(lines, 3))
        await set_fault(s, url, fault="drop")
        with pytest.raises(aiohttp.ClientPayloadError):
            await asyncio.wait_for(task, 5)
        assert 3 <= sum(is_token(line) for _, line in lines) < 20
        assert not any("[DONE]" in line for _, line in lines)

        new: list = []
        with pytest.raises(aiohttp.ClientPayloadError):
            async with s.post(url + "/v1/chat/completions", json=body([{"role": "user", "content": "x"}])) as r:
                assert r.status == 200
                await asyncio.wait_for(read_lines(r, new), 5)
        assert not any(is_token(line) for _, line in new)
        with pytest.raises(aiohttp.ClientPayloadError):
            async with s.post(url + "/v1/chat/completions",
                              json=body([{"role": "user", "content": "x"}], False)) as r:
                await asyncio.wait_for(r.read(), 5)
        st = await wait_for(lambda: _stats_if(s, url, lambda st: st["in_flight"] == 0))
        assert st["dropped"] == 3 and st["completed"] == 0

        await set_fault(s, url, fault="none")
        status, _, ok, _ = await stream(s, url, body([{"role": "user", "content": "x"}]))
        assert status == 200 and ok[-1][1] == "data: [DONE]"


async def test_slow_fault_scales_latency_and_rates():
    # normal: 1 ms + 200 tok / 10000 tok/s = 21 ms to the first token, 10 tokens at 200 tok/s = 50 ms
    cfg = dict(prefill_tokens_per_s=10000, decode_tokens_per_s=200, output_tokens=10)
    payload = body([{"role": "user", "content": text(196, 5)}])
    async with served(**cfg) as (s, url):
        _, _, normal, t0 = await stream(s, url, payload)
        await set_fault(s, url, fault="slow", slow_factor=10)
        _, _, slow, t1 = await stream(s, url, payload)
        await set_fault(s, url, fault="none")
        _, _, again, t2 = await stream(s, url, payload)
    # x10: 210 ms to the first token (the mock never answers before its schedule), 500 ms of decode
    assert first_token_at(slow) - t1 >= 0.2
    slow_tokens = [t for t, line in slow if is_token(line)]
    assert slow_tokens[-1] - slow_tokens[0] >= 9 / 20 * 0.95
    assert slow[-1][0] - t1 > normal[-1][0] - t0 and slow[-1][0] - t1 > again[-1][0] - t2


async def test_bad_fault_bodies_are_400_on_one_line():
    async with served() as (s, url):
        bad = [b"not json", b"[1]", b'{"for_s": 1}', b'{"fault": "melt"}', b'{"fault": "hang", "for_s": 0}',
               b'{"fault": "errors", "error_status": 404}', b'{"fault": "slow", "slow_factor": 0.5}',
               b'{"fault": "hang", "forever": true}', b'{"fault": "hang", "for_s": "1"}']
        for raw in bad:
            async with s.post(url + "/mock/fault", data=raw) as r:
                assert r.status == 400, raw
                err = (await r.json())["error"]
                assert isinstance(err, str) and err.startswith("POST /mock/fault: ") and "\n" not in err, err
        async with s.post(url + "/mock/fault", data=b'{"fault": "melt"}') as r:
            assert "expected one of 'hang', 'slow', 'errors', 'drop', 'none', got 'melt'" in (await r.json())["error"]
        state = await get_json(s, url, "/mock/fault")
        assert state == {"fault": None, "since_s_ago": None, "remaining_s": None, "applied": 0}


# ------------------------------------------------------------------ request log


async def test_request_log_one_line_per_request(tmp_path):
    log = tmp_path / "requests.jsonl"
    ok_msgs = [{"role": "user", "content": "go"}]
    async with served(name="b1", request_log=str(log), output_tokens=3, prefix_cache_tokens=10_000) as (s, url):
        t_start = time.perf_counter_ns()
        status, _, _, _ = await stream(s, url, body(ok_msgs), {"X-Request-ID": "r-ok", "traceparent": TP})
        assert status == 200
        async with s.post(url + "/v1/chat/completions", data=b"{", headers={"X-Request-ID": "r-bad"}) as r:
            assert r.status == 400
        await set_fault(s, url, fault="errors")
        async with s.post(url + "/v1/chat/completions", json=body(ok_msgs, False), headers={"X-Request-ID": "r-err"}) as r:
            assert r.status == 503
        await set_fault(s, url, fault="hang")
        with pytest.raises(asyncio.TimeoutError):  # hung, then the client gives up
            await s.post(url + "/v1/chat/completions", json=body(ok_msgs), headers={"X-Request-ID": "r-gone"},
                         timeout=aiohttp.ClientTimeout(total=0.3))
        await set_fault(s, url, fault="drop")
        with pytest.raises(aiohttp.ClientPayloadError):
            async with s.post(url + "/v1/chat/completions", json=body(ok_msgs), headers={"X-Request-ID": "r-drop"}) as r:
                await asyncio.wait_for(r.read(), 5)
        await set_fault(s, url, fault="none")
        async with s.post(url + "/v1/chat/completions", json=body(ok_msgs, False)) as r:  # an id of the mock's own
            assert r.status == 200
            own_id = r.headers["X-Request-ID"]

        async def five_lines():
            return log.exists() and len(log.read_bytes().splitlines()) >= 6
        await wait_for(five_lines)
    t_end = time.perf_counter_ns()

    rows = [json.loads(line) for line in log.read_bytes().splitlines()]
    assert len(rows) == 6
    by_id = {r["id"]: r for r in rows}
    assert set(by_id) == {"r-ok", "r-bad", "r-err", "r-gone", "r-drop", own_id}
    keys = {"id", "backend", "recv_ns", "end_ns", "round", "prompt_tokens", "cached_tokens", "status", "outcome",
            "fault", "stream", "api", "traceparent"}
    for r in rows:
        assert set(r) == keys and r["backend"] == "b1" and r["api"] == "chat"
        # the trace context as the request carried it (only r-ok sent one here)
        assert r["traceparent"] == (TP if r["id"] == "r-ok" else None)
        assert t_start <= r["recv_ns"] <= r["end_ns"] <= t_end  # the same clock as the client's
    expect = {  # id: (outcome, status, fault at receipt, stream)
        "r-ok": ("ok", 200, None, True), "r-bad": ("rejected", 400, None, False),
        "r-err": ("error", 503, "errors", False), "r-gone": ("client_gone", None, "hang", True),
        "r-drop": ("dropped", 200, "drop", True), own_id: ("ok", 200, None, False)}
    for rid, (outcome, status, fault, streamed) in expect.items():
        r = by_id[rid]
        assert (r["outcome"], r["status"], r["fault"], r["stream"]) == (outcome, status, fault, streamed), r
    assert by_id["r-ok"]["round"] == 1 and by_id["r-ok"]["prompt_tokens"] == prompt_tokens(ok_msgs)
    assert by_id["r-ok"]["cached_tokens"] == 0 and by_id[own_id]["cached_tokens"] == 0  # 5 tokens: no whole block
    assert by_id["r-bad"]["round"] is None and by_id["r-bad"]["cached_tokens"] is None
    assert by_id["r-err"]["cached_tokens"] is None  # answered before admission


async def test_request_log_appends_and_cache_off_logs_null(tmp_path):
    log = tmp_path / "requests.jsonl"
    log.write_bytes(b'{"earlier": 1}\n')
    async with served(request_log=str(log)) as (s, url):
        async with s.post(url + "/v1/chat/completions", json=body([{"role": "user", "content": "x"}], False)) as r:
            assert r.status == 200
    rows = [json.loads(line) for line in log.read_bytes().splitlines()]
    assert rows[0] == {"earlier": 1} and len(rows) == 2
    assert rows[1]["cached_tokens"] is None and rows[1]["outcome"] == "ok"


# ------------------------------------------------------------------ processes: control and restart


def _http(port, head, payload=b""):
    """One request on its own connection (Connection: close); the raw answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(head + b"Host: x\r\nConnection: close\r\nContent-Length: " + str(len(payload)).encode()
                     + b"\r\n\r\n" + payload)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return data


def _http_get(port, path):
    return _http(port, f"GET {path} HTTP/1.1\r\n".encode())


def _chat(port, rid):
    return _http(port, b"POST /v1/chat/completions HTTP/1.1\r\nContent-Type: application/json\r\n"
                       b"X-Request-ID: " + rid.encode() + b"\r\n",
                 orjson.dumps(body([{"role": "user", "content": "x"}], False)))


def test_process_fault_control_and_restart_on_the_same_port(tmp_path):
    log = tmp_path / "log.jsonl"
    cfg = MockConfig(name="b3", base_latency_ms=1, decode_tokens_per_s=0, request_log=str(log))
    m = MockProcess.start(cfg)
    port = m.port
    try:
        state = m.set_fault("errors", for_s=30, error_status=429)
        assert state["fault"] == "errors" and 29 < state["remaining_s"] <= 30 and state["applied"] == 1
        assert m.get_fault()["fault"] == "errors"
        with pytest.raises(ValueError, match="POST /mock/fault: fault: expected one of"):
            m.set_fault("melt")
        assert m.set_fault("none")["fault"] is None
        assert m.stats()["fault"]["applied"] == 2
        assert _chat(port, "before-stop").startswith(b"HTTP/1.1 200")
        # a keep-alive connection left open: the server closes it on stop, so its side of it
        # sits in TIME_WAIT on the port the restart must bind
        keep = socket.create_connection(("127.0.0.1", port), timeout=5)
        keep.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert keep.recv(65536).startswith(b"HTTP/1.1 200")
    finally:
        assert m.stop() == 0
    keep.close()

    with MockProcess.start(cfg, port=port) as again:
        assert again.port == port
        assert _http_get(port, "/health").startswith(b"HTTP/1.1 200")
        assert again.stats()["backend"] == "b3" and again.get_fault()["applied"] == 0
        data = _chat(port, "after-restart")
        assert data.startswith(b"HTTP/1.1 200") and b"x-mock-backend: b3" in data.lower()
    # both lives of the backend appended to the same log
    assert [json.loads(line)["id"] for line in log.read_bytes().splitlines()] == ["before-stop", "after-restart"]


def test_start_waits_for_a_port_that_is_briefly_busy():
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    threading.Timer(0.3, busy.close).start()
    with MockProcess.start(MockConfig(), port=port) as m:
        assert m.port == port
        assert _http_get(port, "/health").startswith(b"HTTP/1.1 200")
