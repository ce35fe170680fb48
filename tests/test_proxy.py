"""`agentload proxy` between a real client (the official openai SDK) and the real mock server.

The harness here is nobody's code of ours: the openai SDK's own streaming client, run as a
tool-calling loop (send, read the tool calls, append them and their results, send again). The proxy
runs as the user runs it, `agentload proxy` in a subprocess, and is stopped by SIGINT.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from agentload.analysis.summary import LOOP_LAG_WARN_MS
from agentload.mock.config import MockConfig
from agentload.mock.process import MockProcess
from agentload.process import ChildProcess
from helpers import REPO

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.slow

KEY = "sk-proxy-test-secret-0123456789"
TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "read a file",
                                            "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                                                           "required": ["path"]}}}]


def start_proxy(upstream: str, out: Path, *extra: str) -> tuple[ChildProcess, int]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
    cmd = [sys.executable, "-m", "agentload.cli", "proxy", "--upstream", upstream, "--port", "0", "--out", str(out),
           "--no-live", "--set", "stall.after_s=1", "--set", "stall.give_up_s=4", "--set", "canary.every_s=0.5", *extra]
    child = ChildProcess.start(cmd, name="agentload proxy", env=env, cwd=REPO, stderr=subprocess.STDOUT)
    line = child.wait_line("agentload proxy: listening on", 60)
    port = int(line.split("http://127.0.0.1:", 1)[1].split()[0])
    return child, port


def stop_proxy(child: ChildProcess, timeout_s: float = 60) -> tuple[int | None, str]:
    child.send_signal(signal.SIGINT)
    code = child.wait_exit(timeout_s)
    out = child.proc.stdout.read().decode(errors="replace") if child.proc.stdout else ""
    child.stop()
    return code, out


async def harness(port: int, name: str, rounds: int, stop_after: int | None = None, think_s: float = 0.05,
                  timeout_s: float = 30, result_words: int = 20) -> list[str]:
    """One agent of a real harness: the openai SDK, streamed, tool calls appended with their results."""
    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY, max_retries=0, timeout=timeout_s)
    msgs: list[dict] = [{"role": "system", "content": f"You are agent {name}."},
                        {"role": "user", "content": f"Fix the failing test, {name}."}]
    seen = []
    try:
        for rnd in range(1, rounds + 1):
            stream = await client.chat.completions.create(model="mock-model", messages=msgs, tools=TOOLS, stream=True)
            calls: dict[int, dict] = {}
            text = ""
            finish = None
            async for chunk in stream:
                if not chunk.choices:
                    continue
                ch = chunk.choices[0]
                finish = ch.finish_reason or finish
                text += ch.delta.content or ""
                for tc in ch.delta.tool_calls or ():
                    c = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                    c["id"] = tc.id or c["id"]
                    if tc.function is not None:
                        c["name"] += tc.function.name or ""
                        c["arguments"] += tc.function.arguments or ""
            seen.append(f"round {rnd}: {finish}")
            if not calls:
                return seen
            msgs.append({"role": "assistant", "content": text or None, "tool_calls": [
                {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                for c in calls.values()]})
            for c in calls.values():
                msgs.append({"role": "tool", "tool_call_id": c["id"], "content": "file contents " * result_words})
            if stop_after is not None and rnd >= stop_after:
                return seen  # this harness's agent is stuck now: it never sends the next round
            await asyncio.sleep(think_s)
    finally:
        await client.close()
    return seen


def records(out: Path) -> list[dict]:
    return [orjson.loads(x) for x in (out / "records.jsonl").read_bytes().splitlines() if x.strip()]


@pytest.fixture
def mock():
    m = MockProcess.start(MockConfig(tool_call_rounds=4, output_tokens=8, decode_tokens_per_s=2000))
    yield m
    m.stop()


def test_a_harness_that_stops_after_round_2_is_client_stopped(mock, tmp_path):
    out = tmp_path / "run"
    child, port = start_proxy(mock.url, out)
    try:
        async def fleet():
            return await asyncio.gather(*(harness(port, f"a{i}", 6) for i in range(3)),
                                        harness(port, "stuck", 6, stop_after=2))
        seen = asyncio.run(fleet())
        assert all(len(s) == 5 for s in seen[:3]), seen  # tool calls in rounds 1-4, a plain answer in 5
        import time
        time.sleep(2.5)  # the stuck one idles past stall.after_s and 3x its rhythm
    finally:
        code, text = stop_proxy(child)
    assert code == 1, text
    summary = orjson.loads((out / "summary.json").read_bytes())
    v = summary["verdict"]
    assert v["kind"] == "client_stopped", text
    recs = [r for r in records(out) if r["kind"] == "agent"]
    last_round = {}
    for r in recs:
        last_round[r["agent"]] = max(last_round.get(r["agent"], 0), r["round"])
    assert sorted(last_round.values()) == [2, 5, 5, 5]
    stuck = next(a for a, n in last_round.items() if n == 2)
    assert v["agents_stopped"] == 1 and v["first_round"] == 3
    assert f"({stuck})" in v["summary"] and f"conversation {stuck}: round 2 answered" in " ".join(v["evidence"])
    assert all(r["outcome"] == "ok" for r in recs)
    # both legs on one clock, in order
    for r in recs:
        t = r["t"]
        assert t["down_start"] <= t["down_body"] <= t["start"] <= t["sent"] <= t["headers"] <= t["down_headers"]
        assert t["first_token"] <= t["down_first_token"] <= t["down_end"] <= t["end"]
    # the harness's key went upstream (the mock answered) and was written nowhere
    for f in out.iterdir():
        if f.is_file():
            assert KEY.encode() not in f.read_bytes(), f.name
    assert "client_stopped" in text and "records:" in text
    # Ctrl-C is how a proxy ends: not a cut-short run, and the scenario's agents.count asked for no one
    assert "ended: interrupted (SIGINT)" in text and "cut short:" not in text, text
    assert "asked" not in text and "was cut short" not in text, text
    assert sorted(a["outcome"] for a in summary["agents"]) == ["done"] * 4
    html = (out / "report.html").read_text()
    assert "interrupted (SIGINT) (how a proxy ends)" in html and "class='banner'" not in html


def test_a_whole_answer_through_the_proxy_is_timed_on_both_legs(mock, tmp_path):
    """A harness that asks for no stream gets the answer whole; its record has the first token on both legs
    (read upstream, then written on with the answer) and is ok."""
    out = tmp_path / "run"
    child, port = start_proxy(mock.url, out)
    try:
        async def one():
            client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY, max_retries=0, timeout=30)
            try:
                return await client.chat.completions.create(
                    model="mock-model", messages=[{"role": "user", "content": "hello"}], stream=False)
            finally:
                await client.close()
        answer = asyncio.run(one())
    finally:
        code, text = stop_proxy(child)
    assert answer.choices[0].message.content or answer.choices[0].message.tool_calls
    recs = [r for r in records(out) if r["kind"] == "agent"]
    assert len(recs) == 1 and recs[0]["outcome"] == "ok", recs
    t = recs[0]["t"]
    assert t["first_token"] <= t["down_first_token"] <= t["down_end"], t  # (its `end`: when it was read whole)
    assert code == 0, text


def test_a_server_that_hangs_above_n_tokens_is_a_server_stall_in_ttfb(tmp_path):
    m = MockProcess.start(MockConfig(tool_call_rounds=0, output_tokens=8, decode_tokens_per_s=2000,
                                     hang_above_tokens=400))
    out = tmp_path / "run"
    child, port = start_proxy(m.url, out)
    try:
        async def fleet():
            return await asyncio.gather(*(harness(port, f"a{i}", 8) for i in range(3)), return_exceptions=True)
        got = asyncio.run(fleet())
        # the proxy gave up on the hung requests after give_up_s and told the harness so (a 504 of its own)
        assert all(isinstance(g, openai.APIStatusError) and g.status_code == 504 for g in got), got
        assert all(g.response.headers.get("x-agentload-proxy") == "stall_give_up" for g in got)
    finally:
        code, text = stop_proxy(child)
        m.stop()
    v = orjson.loads((out / "summary.json").read_bytes())["verdict"]
    assert code == 1 and v["kind"] == "server_stall", text
    assert v["phase"] == "ttfb"
    recs = [r for r in records(out) if r["kind"] == "agent"]
    stalled = [r for r in recs if r["outcome"] == "stalled"]
    assert len(stalled) == 3 and all(r["prompt_tokens"] > 400 for r in stalled)
    first = min(r["round"] for r in stalled)
    assert v["first_round"] == first and all(r["prompt_tokens"] <= 400 for r in recs if r["outcome"] == "ok")


def test_a_harness_that_gives_up_is_recorded_and_its_upstream_request_cancelled(tmp_path):
    m = MockProcess.start(MockConfig(hang_above_tokens=1))
    out = tmp_path / "run"
    child, port = start_proxy(m.url, out, "--set", "stall.give_up_s=30")
    try:
        with pytest.raises(openai.APITimeoutError):
            asyncio.run(harness(port, "impatient", 1, timeout_s=2))
        import time
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and m.stats()["in_flight"]:
            time.sleep(0.2)
        stats = m.stats()
    finally:
        code, text = stop_proxy(child)
        m.stop()
    rec = next(r for r in records(out) if r["kind"] == "agent")
    assert rec["error"] == "client_gone" and "the client closed its connection in ttfb" in rec["error_msg"]
    assert rec["stalled_phase"] == "ttfb"  # it had made no progress for stall.after_s before that
    assert stats["in_flight"] == 0, stats


def test_an_upstream_that_breaks_mid_stream_is_a_break_downstream_too(tmp_path):
    m = MockProcess.start(MockConfig(drop_mid_stream_rate=1.0, output_tokens=40, decode_tokens_per_s=400))
    out = tmp_path / "run"
    child, port = start_proxy(m.url, out)
    try:
        # the SDK sees the body end without its last chunk (httpx's RemoteProtocolError), as it would
        # talking to the server itself: not an answer that ended
        with pytest.raises(openai.APIConnectionError) as e:
            asyncio.run(harness(port, "a", 1))
        assert type(e.value.__cause__).__name__ == "RemoteProtocolError", repr(e.value.__cause__)

        async def models():
            c = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY, max_retries=0, timeout=10)
            try:
                return [x.id async for x in c.models.list()]
            finally:
                await c.close()
        assert asyncio.run(models()) == ["mock-model"]  # a path that is no conversation passes through
    finally:
        code, text = stop_proxy(child)
        m.stop()
    recs = [r for r in records(out) if r["kind"] == "agent"]
    assert len(recs) == 1 and recs[0]["outcome"] == "error" and recs[0]["token_chunks"] > 0, recs
    v = orjson.loads((out / "summary.json").read_bytes())["verdict"]
    assert code == 1 and v["kind"] == "disconnects", text


anthropic = pytest.importorskip("anthropic")


async def messages_harness(port: int, name: str, rounds: int, stop_after: int | None = None) -> int:
    """A harness on Anthropic's own SDK (what Claude Code-style agents send): tool_use blocks answered
    with tool_result blocks, streamed. Returns the rounds it ran."""
    client = anthropic.AsyncAnthropic(base_url=f"http://127.0.0.1:{port}", api_key=KEY, max_retries=0, timeout=30)
    msgs: list[dict] = [{"role": "user", "content": f"Fix the failing test, {name}."}]
    tools = [{"name": "read_file", "description": "read a file",
              "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}]
    try:
        for rnd in range(1, rounds + 1):
            async with client.messages.stream(model="mock-model", max_tokens=64, system=f"You are agent {name}.",
                                              messages=msgs, tools=tools) as stream:
                final = await stream.get_final_message()
            uses = [b for b in final.content if b.type == "tool_use"]
            if not uses:
                return rnd
            msgs.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in final.content]})
            msgs.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": b.id, "content": "ok " * 30}
                                                     for b in uses]})
            if stop_after is not None and rnd >= stop_after:
                return rnd
            await asyncio.sleep(0.05)
    finally:
        await client.close()
    return rounds


def test_anthropic_messages_through_the_proxy_read_as_messages_and_a_stop_is_named(mock, tmp_path):
    out = tmp_path / "run"
    child, port = start_proxy(mock.url, out)
    try:
        async def fleet():
            return await asyncio.gather(*(messages_harness(port, f"a{i}", 6) for i in range(2)),
                                        messages_harness(port, "stuck", 6, stop_after=1))
        ran = asyncio.run(fleet())
        import time
        time.sleep(2.5)
    finally:
        code, text = stop_proxy(child)
    assert ran == [5, 5, 1], ran
    recs = [r for r in records(out) if r["kind"] == "agent"]
    assert all(r["outcome"] == "ok" for r in recs), [r["error_msg"] for r in recs if r["outcome"] != "ok"]
    assert sum(r["tool_calls"] for r in recs) == 4 + 4 + 1  # tool_use blocks read from the Messages stream
    v = orjson.loads((out / "summary.json").read_bytes())["verdict"]
    assert v["kind"] == "client_stopped" and v["first_round"] == 2, text


def test_openai_responses_through_the_proxy_read_as_responses(mock, tmp_path):
    out = tmp_path / "run"
    child, port = start_proxy(mock.url, out)
    try:
        async def codex_like():
            c = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY, max_retries=0, timeout=30)
            items: list = [{"role": "user", "content": "fix it"}]
            tools = [{"type": "function", "name": "shell", "parameters": {"type": "object", "properties": {}}}]
            calls = 0
            try:
                for _ in range(3):
                    stream = await c.responses.create(model="mock-model", instructions="you are codex", input=items,
                                                      tools=tools, stream=True)
                    done = None
                    async for ev in stream:
                        if ev.type == "response.completed":
                            done = ev.response
                    fcs = [o for o in done.output if o.type == "function_call"]
                    calls += len(fcs)
                    if not fcs:
                        break
                    for o in fcs:
                        items.append({"type": "function_call", "call_id": o.call_id, "name": o.name,
                                      "arguments": o.arguments})
                        items.append({"type": "function_call_output", "call_id": o.call_id, "output": "ok"})
            finally:
                await c.close()
            return calls
        calls = asyncio.run(codex_like())
    finally:
        code, text = stop_proxy(child)
    recs = [r for r in records(out) if r["kind"] == "agent"]
    assert [(r["agent"], r["round"]) for r in recs] == [(0, 1), (0, 2), (0, 3)]
    assert all(r["outcome"] == "ok" for r in recs) and sum(r["tool_calls"] for r in recs) == calls == 3
    assert code == 0, text


def test_a_request_whose_conversation_cannot_be_read_is_forwarded_and_recorded_never_healthy(mock, tmp_path):
    """A harness posting what agentload cannot follow (not JSON, no messages) fails closed: the server's
    answer goes back as it came, and the run says so instead of judging only what it could read."""
    import aiohttp

    out = tmp_path / "run"
    child, port = start_proxy(mock.url, out)
    try:
        async def mixed():
            seen = await harness(port, "fine", 2)
            base = f"http://127.0.0.1:{port}/v1"
            async with aiohttp.ClientSession() as s:
                async with s.post(f"{base}/chat/completions", data=b"{not json",
                                  headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}) as r:
                    bad_json = (r.status, await r.read())
                async with s.post(f"{base}/messages", json={"model": "m", "max_tokens": 5}) as r:
                    no_messages = r.status
                async with s.get(f"{base}/models") as r:
                    models = r.status
            return seen, bad_json, no_messages, models
        seen, bad_json, no_messages, models = asyncio.run(mixed())
    finally:
        code, text = stop_proxy(child)
    assert len(seen) == 2
    assert bad_json[0] >= 400 and b"agentload_proxy" not in bad_json[1]  # the server's own answer
    assert no_messages >= 400 and models == 200
    recs = [r for r in records(out) if r["kind"] == "agent"]
    unreadable = [r for r in recs if r["error"] == "request_unreadable"]
    assert len(unreadable) == 2, recs
    assert {r["status"] for r in unreadable} == {bad_json[0], no_messages}
    assert any("is not a JSON object" in r["error_msg"] for r in unreadable)
    assert any("/v1/messages" in r["error_msg"] and "no `messages`" in r["error_msg"] for r in unreadable)
    assert len(recs) == 4  # GET /v1/models passed through, unrecorded
    summary = orjson.loads((out / "summary.json").read_bytes())
    assert summary["verdict"]["kind"] != "healthy", text
    assert "request_unreadable" in summary["verdict"]["summary"] + " ".join(summary["verdict"]["evidence"]), text
    for f in out.iterdir():
        if f.is_file():
            assert KEY.encode() not in f.read_bytes(), f.name
    assert code == 1, text


def _dechunk(body: bytes) -> bytes:
    """An HTTP/1.1 chunked body's data (raises on a body cut before its last chunk)."""
    out, i = bytearray(), 0
    while True:
        j = body.index(b"\r\n", i)
        size = int(body[i:j].split(b";")[0], 16)
        if size == 0:
            assert body[j:] == b"\r\n\r\n", body[j:j + 40]
            return bytes(out)
        out += body[j + 2:j + 2 + size]
        assert body[j + 2 + size:j + 4 + size] == b"\r\n"
        i = j + 4 + size


def test_a_harness_that_reads_slower_than_the_server_sends_gets_the_whole_answer_in_order(tmp_path):
    # an answer of megabytes, a harness that reads nothing for a while and then slowly: the proxy's
    # writes to it back up past the transport's high-water mark, so the upstream's reading is held
    m = MockProcess.start(MockConfig(output_tokens=15000, decode_tokens_per_s=0, tool_call_rate=0.0))
    out = tmp_path / "run"
    # (the harness's second without reading holds the upstream that long: a stall at 1 s on a busy machine)
    child, port = start_proxy(m.url, out, "--set", "stall.after_s=3")
    try:
        body = orjson.dumps({"model": "mock-model", "stream": True,
                             "messages": [{"role": "user", "content": "Write a long story."}]})
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.settimeout(30)
            s.connect(("127.0.0.1", port))
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nContent-Type: application/json\r\n"
                      b"Authorization: Bearer %b\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%b"
                      % (KEY.encode(), len(body), body))
            time.sleep(1.0)
            got = bytearray()
            while chunk := s.recv(16384):
                got += chunk
                if len(got) < 1 << 20:
                    time.sleep(0.001)
    finally:
        code, text = stop_proxy(child)
        m.stop()
    head, _, rest = bytes(got).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"transfer-encoding: chunked" in head.lower(), head
    events = [e for e in _dechunk(rest).split(b"\n\n") if e.strip()]
    assert events[-1] == b"data: [DONE]" and len(rest) > 2 << 20, (len(rest), events[-1][:80])
    chunks = [orjson.loads(e.removeprefix(b"data: ")) for e in events[:-1]]
    text_chunks = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    recs = [r for r in records(out) if r["kind"] == "agent"]
    assert len(recs) == 1 and recs[0]["outcome"] == "ok", recs
    assert recs[0]["token_chunks"] == len(text_chunks) and recs[0]["chunks"] == len(events), recs[0]  # ([DONE] too)
    t = recs[0]["t"]
    assert t["down_headers"] <= t["down_first_token"] <= t["down_end"] and t["first_token"] <= t["down_first_token"]
    assert code == 0 and "stall after=3.0" in text, text


def test_expect_100_continue_and_a_body_of_megabytes_are_taken_as_a_server_takes_them(tmp_path):
    """A harness (curl does this for big bodies) that asks `Expect: 100-continue` gets the 100 before it
    sends its body, and a conversation of 2 MB (past aiohttp's 1 MiB default) is forwarded, not refused."""
    m = MockProcess.start(MockConfig(prefill_tokens_per_s=0, output_tokens=8, tool_call_rate=0.0))
    out = tmp_path / "run"
    child, port = start_proxy(m.url, out)
    try:
        body = orjson.dumps({"model": "mock-model", "stream": True,
                             "messages": [{"role": "user", "content": "word " * 400_000}]})
        with socket.socket() as s:
            s.settimeout(30)
            s.connect(("127.0.0.1", port))
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n" % len(body))
            interim = s.recv(64)
            s.sendall(body)
            got = bytearray()
            while chunk := s.recv(65536):
                got += chunk
    finally:
        code, text = stop_proxy(child)
        m.stop()
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n", interim
    head, _, rest = bytes(got).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    assert _dechunk(rest).rstrip().endswith(b"data: [DONE]"), rest[-200:]
    recs = [r for r in records(out) if r["kind"] == "agent"]
    assert len(recs) == 1 and recs[0]["outcome"] == "ok" and recs[0]["prompt_bytes"] == len(body), recs
    assert code == 0, text


def test_a_proxy_whose_event_loop_lags_says_so_in_its_report(mock, tmp_path):
    out = tmp_path / "run"
    child, port = start_proxy(mock.url, out)
    try:
        assert asyncio.run(harness(port, "a", 1)) == ["round 1: tool_calls"]
        os.kill(child.pid, signal.SIGSTOP)  # its loop cannot run: every timer on it fires late
        time.sleep(0.5)
        os.kill(child.pid, signal.SIGCONT)
        time.sleep(1.5)  # a one-second sample takes the lag in
    finally:
        code, text = stop_proxy(child)
    s = orjson.loads((out / "summary.json").read_bytes())
    assert any(w.startswith("agentload's event loop lagged up to") for w in s["warnings"]), s["warnings"]
    assert orjson.loads((out / "run.json").read_bytes())["max_loop_lag_ms"] >= LOOP_LAG_WARN_MS, text


def _responses(sock: socket.socket, n: int) -> list[tuple[bytes, bytes]]:
    """The next `n` chunked answers on a keep-alive connection: (head, body data) each."""
    buf = bytearray()

    def more() -> None:  # (a closed connection reads b"" at once: fail, never spin)
        chunk = sock.recv(65536)
        assert chunk, bytes(buf[-200:])
        buf.extend(chunk)

    def upto(sep: bytes) -> bytes:
        while sep not in buf:
            more()
        i = buf.index(sep)
        got = bytes(buf[:i])
        del buf[:i + len(sep)]
        return got

    out = []
    for _ in range(n):
        head, data = upto(b"\r\n\r\n"), bytearray()
        while size := int(upto(b"\r\n"), 16):
            while len(buf) < size + 2:
                more()
            data += buf[:size]
            assert buf[size:size + 2] == b"\r\n"
            del buf[:size + 2]
        assert upto(b"\r\n") == b""  # (no trailers)
        out.append((head, bytes(data)))
    return out


def test_keep_alive_a_chunked_body_pipelined_requests_and_a_malformed_one(mock, tmp_path):
    """The proxy's own HTTP/1.1 server: two requests on one connection, the second sent before the
    first was answered and with a chunked body, are both answered whole and in order; a malformed
    request gets a 400 and its connection closed."""
    out = tmp_path / "run"
    child, port = start_proxy(mock.url, out)
    try:
        bodies = [orjson.dumps({"model": "mock-model", "stream": True,
                                "messages": [{"role": "user", "content": f"conversation {i}"}]}) for i in range(2)]
        with socket.socket() as s:
            s.settimeout(30)
            s.connect(("127.0.0.1", port))
            half = len(bodies[1]) // 2
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n%b" % (len(bodies[0]), bodies[0])
                      + b"POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nContent-Type: application/json\r\n"
                        b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%b\r\n%x\r\n%b\r\n0\r\n\r\n"
                        % (half, bodies[1][:half], len(bodies[1]) - half, bodies[1][half:]))
            answers = _responses(s, 2)
            s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: proxy\r\n\r\n")  # the same connection, still open
            (models_head, models), = _responses(s, 1)
        with socket.socket() as s:
            s.settimeout(30)
            s.connect(("127.0.0.1", port))
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nContent-Length: nine\r\n\r\n")
            bad = b""
            while chunk := s.recv(65536):
                bad += chunk
    finally:
        code, text = stop_proxy(child)
    for head, data in answers:
        assert head.startswith(b"HTTP/1.1 200") and data.rstrip().endswith(b"data: [DONE]"), (head, data[-100:])
    assert models_head.startswith(b"HTTP/1.1 200") and b"mock-model" in models
    assert bad.split(b"\r\n", 1)[0].split()[1] == b"400", bad[:100]
    recs = [r for r in records(out) if r["kind"] == "agent"]
    assert len(recs) == 2 and all(r["outcome"] == "ok" for r in recs), recs
    assert sorted(r["prompt_bytes"] for r in recs) == sorted(len(b) for b in bodies)
    assert len({r["agent"] for r in recs}) == 2  # two conversations, each its own
    assert code == 0, text
