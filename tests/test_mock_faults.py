"""Each fault of the mock server, observed over real HTTP (aiohttp, raw sockets, the openai client).

Every wait is bounded: client timeouts, asyncio.wait_for, or a polling deadline."""

from __future__ import annotations

import asyncio
import json
import random
import time

import aiohttp
import openai
import pytest

from agentload.mock import MockConfig, MockProcess
from agentload.tokens import synthetic_text

TIMEOUT = aiohttp.ClientTimeout(total=10, sock_connect=5)


def start(**kw):
    kw.setdefault("base_latency_ms", 1)
    kw.setdefault("decode_tokens_per_s", 0)
    return MockProcess.start(MockConfig(**kw))


@pytest.fixture(scope="module")
def hang():
    # prompts >= 150 tokens stall after headers, >= 300 get nothing; both forever
    with start(hang_above_tokens=300, stall_after_headers_above_tokens=150) as m:
        yield m


@pytest.fixture(scope="module")
def give_up():
    with start(hang_above_tokens=300, stall_after_headers_above_tokens=150, hang_s=0.5,
               ping_while_stalled_s=0.1) as m:
        yield m


@pytest.fixture(scope="module")
def mid():
    with start(stall_mid_stream={"after_tokens": 3, "for_s": 0.6, "above_tokens": 100}, ping_while_stalled_s=0.15,
               output_tokens=8) as m:
        yield m


@pytest.fixture(scope="module")
def limited():
    with start(max_running=2, decode_tokens_per_s=100, output_tokens=10) as m:
        yield m


@pytest.fixture(scope="module", params=[429, 500])
def erroring(request):
    with start(error_rate=1.0, error_status=request.param) as m:
        yield m


@pytest.fixture(scope="module")
def round3():
    with start(error_at_round=3, error_status=503, reject_protocol_violations=True) as m:
        yield m


@pytest.fixture(scope="module")
def dropping():
    with start(drop_mid_stream_rate=1.0, output_tokens=20) as m:
        yield m


@pytest.fixture(scope="module")
def short_keepalive():
    with start(keepalive_timeout_s=0.5) as m:
        yield m


def body(tokens, stream=True, **kw):
    return {"model": "m", "messages": [{"role": "user", "content": synthetic_text(random.Random(tokens), tokens)}],
            "stream": stream, **kw}


def conversation(rounds):
    msgs = [{"role": "user", "content": "go"}]
    for r in range(1, rounds):
        msgs.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"call_{r}", "type": "function", "function": {"name": "f", "arguments": "{}"}}]})
        msgs.append({"role": "tool", "tool_call_id": f"call_{r}", "content": "ok"})
    return {"model": "m", "messages": msgs, "stream": True}


async def raw_post(mock, payload: dict):
    """A raw HTTP/1.1 request on a fresh socket, so we see exactly which bytes arrive."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", mock.port), 5)
    data = json.dumps(payload).encode()
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
    await writer.drain()
    return reader, writer


async def read_to_eof(reader, timeout_s):
    chunks = []
    async with asyncio.timeout(timeout_s):
        while data := await reader.read(65536):
            chunks.append(data)
    return b"".join(chunks)


async def stats(mock):
    return await asyncio.to_thread(mock.stats)


async def wait_stats(mock, pred, timeout_s=5.0):
    deadline = time.monotonic() + timeout_s
    while True:
        s = await stats(mock)
        if pred(s):
            return s
        if time.monotonic() > deadline:
            raise AssertionError(f"stats never matched: {s}")
        await asyncio.sleep(0.05)


async def timed_lines(resp, timeout_s):
    out = []
    async with asyncio.timeout(timeout_s):
        async for raw in resp.content:
            line = raw.decode().rstrip("\n")
            if line:
                out.append((time.perf_counter(), line))
    return out


def is_token(line):
    return line.startswith("data: {") and '"content":"' in line and '"content":""' not in line


# ------------------------------------------------------------------ hangs


async def test_hang_sends_nothing_and_a_leaving_client_frees_everything(hang):
    async with aiohttp.ClientSession(timeout=TIMEOUT) as s:  # warm up, so the task count is steady
        async with s.post(hang.url + "/chat/completions", json=body(10)) as r:
            assert r.status == 200
            await r.read()
    base = await wait_stats(hang, lambda s: s["in_flight"] == 0)

    reader, writer = await raw_post(hang, body(400))
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(reader.read(1), 0.8)  # not a single byte: no status line, no headers
    s = await stats(hang)
    assert s["hung"] == base["hung"] + 1 and s["in_flight"] == 1

    # a small prompt is still served while the big one hangs
    async with aiohttp.ClientSession(timeout=TIMEOUT) as sess:
        async with sess.post(hang.url + "/chat/completions", json=body(10)) as r:
            assert r.status == 200
            assert (await r.read()).endswith(b"data: [DONE]\n\n")

    writer.close()
    # no task left behind (polled: closed keep-alive connections also take a moment to go)
    s = await wait_stats(hang, lambda s: s["in_flight"] == 0 and s["tasks"] <= base["tasks"])
    assert s["client_gone"] == base["client_gone"] + 1


async def test_hang_client_times_out_before_headers(hang):
    async with aiohttp.ClientSession(timeout=TIMEOUT) as s:
        got_headers = False
        with pytest.raises(asyncio.TimeoutError):
            async with s.post(hang.url + "/chat/completions", json=body(400),
                              timeout=aiohttp.ClientTimeout(total=0.7)) as r:
                got_headers = True
                await r.read()
        assert not got_headers
    await wait_stats(hang, lambda s: s["in_flight"] == 0)


async def test_stall_after_headers(hang):
    async with aiohttp.ClientSession(timeout=TIMEOUT) as s:
        async with s.post(hang.url + "/chat/completions", json=body(200)) as r:
            assert r.status == 200
            first = await asyncio.wait_for(r.content.readline(), 5)
            assert b'"role":"assistant"' in first
            assert await asyncio.wait_for(r.content.readline(), 5) == b"\n"
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(r.content.readline(), 0.8)  # then silence
            r.close()
    s = await wait_stats(hang, lambda s: s["in_flight"] == 0)
    assert s["stalled"] >= 1 and s["pings"] == 0


async def test_hang_s_closes_without_a_response(give_up):
    t0 = time.perf_counter()
    reader, writer = await raw_post(give_up, body(400))
    data = await read_to_eof(reader, 5)
    writer.close()
    assert data == b""  # connection closed, nothing ever sent
    assert time.perf_counter() - t0 >= 0.45
    s = await wait_stats(give_up, lambda s: s["in_flight"] == 0)
    assert s["hung"] >= 1 and s["hangs_given_up"] >= 1


async def test_stall_after_headers_pings_then_gives_up(give_up):
    reader, writer = await raw_post(give_up, body(200))
    data = (await read_to_eof(reader, 5)).decode()
    writer.close()
    assert data.startswith("HTTP/1.1 200")
    assert '"role":"assistant"' in data
    assert data.count(": ping\n\n") >= 2  # bytes flow ...
    assert '"content":"' not in data.replace('"content":""', "")  # ... tokens do not
    assert "[DONE]" not in data


async def test_aiohttp_sees_a_broken_body_when_a_stall_gives_up(give_up):
    async with aiohttp.ClientSession(timeout=TIMEOUT) as s:
        async with s.post(give_up.url + "/chat/completions", json=body(200)) as r:
            assert r.status == 200
            with pytest.raises(aiohttp.ClientPayloadError):
                await asyncio.wait_for(r.read(), 5)


# ------------------------------------------------------------------ mid-stream stall with pings


async def test_stall_mid_stream_with_pings(mid):
    async with aiohttp.ClientSession(timeout=TIMEOUT) as s:
        async with s.post(mid.url + "/chat/completions", json=body(20)) as r:  # below above_tokens
            lines = await timed_lines(r, 5)
        assert sum(is_token(l) for _, l in lines) == 8
        assert not any(l.startswith(":") for _, l in lines)
        assert (await stats(mid))["stalled"] == 0

        async with s.post(mid.url + "/chat/completions", json=body(150)) as r:
            lines = await timed_lines(r, 5)
    kinds = ["token" if is_token(l) else "ping" if l == ": ping" else "other" for _, l in lines]
    tokens = [i for i, k in enumerate(kinds) if k == "token"]
    assert len(tokens) == 8
    third, fourth = tokens[2], tokens[3]
    gap = lines[fourth][0] - lines[third][0]
    assert gap >= 0.55
    between = kinds[third + 1:fourth]
    assert between.count("ping") >= 2 and set(between) == {"ping"}
    assert "ping" not in kinds[fourth:]
    assert lines[-1][1] == "data: [DONE]"
    s = await stats(mid)
    assert s["stalled"] == 1 and s["pings"] >= 2


# ------------------------------------------------------------------ max_running


async def test_max_running_queues_instead_of_failing(limited):
    limited.reset_stats()
    async with aiohttp.ClientSession(timeout=TIMEOUT) as s:
        async def one(i):
            async with s.post(limited.url + "/chat/completions", json=body(10 + i)) as r:
                return r.status, await r.read()
        results = await asyncio.gather(*(one(i) for i in range(8)))
    assert all(status == 200 and data.endswith(b"data: [DONE]\n\n") for status, data in results)
    s = await stats(limited)
    assert s["max_in_flight"] == 2
    assert s["max_queued"] >= 1
    assert s["completed"] == 8 and s["queued"] == 0


# ------------------------------------------------------------------ errors


async def test_error_rate(erroring):
    status = erroring.cfg.error_status
    async with aiohttp.ClientSession(timeout=TIMEOUT) as s:
        async with s.post(erroring.url + "/chat/completions", json=body(10), headers={"X-Request-ID": "e1"}) as r:
            assert r.status == status
            assert r.headers["X-Request-ID"] == "e1"
            assert r.headers.get("Retry-After") == ("1" if status in (429, 503) else None)
            err = (await r.json())["error"]
            assert err["code"] == status and err["message"]
    client = openai.AsyncOpenAI(base_url=erroring.url, api_key="x", max_retries=0, timeout=10)
    try:
        expected = openai.RateLimitError if status == 429 else openai.InternalServerError
        with pytest.raises(expected):
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    finally:
        await client.close()
    s = await stats(erroring)
    assert s["errors_injected"] == 2 and s["by_status"] == {str(status): 2}


async def test_error_at_round(round3):
    async with aiohttp.ClientSession(timeout=TIMEOUT) as s:
        statuses = {}
        for rnd in (1, 2, 3, 4):
            async with s.post(round3.url + "/chat/completions", json=conversation(rnd)) as r:
                statuses[rnd] = r.status
                if r.status == 503:
                    assert r.headers["Retry-After"] == "1"
                await r.read()
    assert statuses == {1: 200, 2: 200, 3: 503, 4: 200}
    s = await stats(round3)
    assert s["rounds_seen"] == {"1": 1, "2": 1, "3": 1, "4": 1}
    assert s["errors_injected"] == 1


async def test_reject_protocol_violations(round3):
    bad = conversation(2)
    del bad["messages"][-1]  # the tool call is never answered
    async with aiohttp.ClientSession(timeout=TIMEOUT) as s:
        async with s.post(round3.url + "/chat/completions", json=bad) as r:
            assert r.status == 400
            assert "tool_call_id" in (await r.json())["error"]["message"]
    assert (await stats(round3))["protocol_violations"] == 1


# ------------------------------------------------------------------ dropped connections


async def test_drop_mid_stream(dropping):
    async with aiohttp.ClientSession(timeout=TIMEOUT) as s:
        lines = []
        with pytest.raises(aiohttp.ClientPayloadError):
            async with s.post(dropping.url + "/chat/completions", json=body(10)) as r:
                assert r.status == 200
                async with asyncio.timeout(5):
                    async for raw in r.content:
                        lines.append(raw)
        assert any(b'"content":"' in l and b'"content":""' not in l for l in lines)  # it was mid-stream
        assert not any(b"[DONE]" in l for l in lines)

        with pytest.raises(aiohttp.ClientPayloadError):
            async with s.post(dropping.url + "/chat/completions", json=body(10, stream=False)) as r:
                await asyncio.wait_for(r.read(), 5)

    client = openai.AsyncOpenAI(base_url=dropping.url, api_key="x", max_retries=0, timeout=10)
    try:
        with pytest.raises(openai.APIConnectionError):
            stream = await client.chat.completions.create(model="m", messages=body(10)["messages"], stream=True)
            async for _ in stream:
                pass
    finally:
        await client.close()
    s = await wait_stats(dropping, lambda s: s["in_flight"] == 0)
    assert s["dropped"] == 3 and s["completed"] == 0


# ------------------------------------------------------------------ keep-alive


async def _idle_after_one_request(mock, wait_s):
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", mock.port), 5)
    try:
        writer.write(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 200") and b"Connection: close" not in head
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        await asyncio.wait_for(reader.readexactly(length), 5)
        t0 = time.perf_counter()
        try:
            data = await asyncio.wait_for(reader.read(1), wait_s)
        except TimeoutError:
            return None  # still open
        return data, time.perf_counter() - t0
    finally:
        writer.close()


async def test_keepalive_timeout_closes_idle_connections(short_keepalive):
    result = await _idle_after_one_request(short_keepalive, 5)
    assert result is not None, "the idle connection was never closed"
    data, idle = result
    assert data == b"" and idle >= 0.4


async def test_default_keepalive_keeps_idle_connections(limited):
    assert await _idle_after_one_request(limited, 1.0) is None
