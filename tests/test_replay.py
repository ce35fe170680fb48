"""`agentload replay`: captured conversations played back as scripted agents.

The capture is made the way a user makes it: the openai SDK as the harness, `agentload proxy` in
between, the real mock behind; then `agentload replay` (a subprocess, as the user runs it)."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from pathlib import Path

import orjson
import pytest

from agentload.errors import UserError
from agentload.mock.config import MockConfig
from agentload.mock.process import MockProcess
from agentload.run.replay import load_plans
from helpers import cli


def _write(path: Path, lines: list) -> Path:
    path.write_bytes(b"\n".join(orjson.dumps(x) for x in lines) + b"\n")
    return path


def test_openai_conversation_jsonl_gives_one_round_per_assistant_message(tmp_path):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    conv = {"messages": [
        {"role": "system", "content": "s " * 100}, {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
            {"id": "2", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "1", "content": "x" * 400}, {"role": "tool", "tool_call_id": "2", "content": "y"},
        {"role": "assistant", "content": "done"}], "tools": tools}
    plans = load_plans(str(_write(tmp_path / "c.jsonl", [conv, {"messages": [{"role": "user", "content": "hi"}]}])))
    assert len(plans) == 1 and [r.tool_calls for r in plans[0].rounds] == [2, 0]  # a line without an answer: none
    p1, p2 = (r.prompt_tokens for r in plans[0].rounds)
    assert p2 - p1 > 100 and all(r.think_s is None for r in plans[0].rounds)


@pytest.mark.parametrize("content, expected", [
    (b"not json\n", "line 1: expected one JSON object a line"),
    (b'{"messages": "hi"}\n', "line 1: messages: expected a list of message objects"),
    (b'{"messages": [{"role": "assistant", "tool_calls": 3}]}\n', "line 1: messages[0].tool_calls: expected a list"),
])
def test_a_bad_capture_is_one_line_naming_the_line_and_field(tmp_path, content, expected):
    p = tmp_path / "bad.jsonl"
    p.write_bytes(content)
    with pytest.raises(UserError, match=expected.replace("[", r"\[").replace("]", r"\]")):
        load_plans(str(p))
    r = cli("replay", str(p), "--no-live")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and expected in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("fmt", ["mooncake", "openai"])
def test_a_folder_given_as_a_jsonl_file_is_one_line_naming_it(tmp_path, fmt):
    """--format forces reading the source as JSONL: a folder is the user's mistake, not a traceback."""
    r = cli("replay", str(tmp_path), "--format", fmt, "--no-live")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert f"{tmp_path}: replay.source: cannot read it as a JSONL file" in r.stderr and "Traceback" not in r.stderr


def _capture(tmp_path: Path, mock: MockProcess, stall: bool = False) -> Path:
    from test_proxy import harness, start_proxy, stop_proxy

    out = tmp_path / "capture"
    child, port = start_proxy(mock.url, out)
    try:
        async def fleet():
            return await asyncio.gather(*(harness(port, f"a{i}", 6, think_s=0.05 * (i + 1), result_words=20 + 150 * i)
                                          for i in range(3)), return_exceptions=True)
        asyncio.run(fleet())
    finally:
        stop_proxy(child)
    return out


def _prompts(records: Path) -> dict[int, dict[int, int]]:
    out: dict[int, dict[int, int]] = defaultdict(dict)
    for line in records.read_bytes().splitlines():
        d = orjson.loads(line)
        if d["kind"] == "agent":
            out[d["agent"]][d["round"]] = d["prompt_tokens"]
    return out


@pytest.mark.slow
def test_a_proxy_capture_replayed_at_10x_keeps_each_rounds_prompt_size(tmp_path):
    mock = MockProcess.start(MockConfig(tool_call_rounds=4, output_tokens=8, decode_tokens_per_s=2000))
    try:
        cap = _capture(tmp_path, mock)
        out = tmp_path / "replay"
        r = cli("replay", str(cap), "--agents", "10x", "--speed", "10", "--endpoint", mock.url, "--out", str(out),
                "--no-live", "--set", "canary.every_s=0", timeout=300)
    finally:
        mock.stop()
    assert r.returncode == 0, r.stdout + r.stderr
    captured = _prompts(cap / "records.jsonl")
    order = sorted(captured)
    replayed = _prompts(out / "records.jsonl")
    assert len(replayed) == 30
    for agent, rounds in replayed.items():
        want = captured[order[agent % len(order)]]
        assert sorted(rounds) == sorted(want), (agent, rounds, want)
        for rnd, p in rounds.items():
            assert abs(p - want[rnd]) <= 0.01 * want[rnd], (agent, rnd, p, want[rnd])
    assert "VERDICT [healthy]" in r.stdout
    # the report says what was played back, and how fast
    assert f"workload replayed from {cap} (format auto, speed 10x)" in r.stdout, r.stdout
    assert f"replayed from</th><td>{cap} (format auto, speed 10x)" in (out / "report.html").read_text()


@pytest.mark.slow
def test_a_capture_that_hung_hangs_again_in_the_same_round_and_phase(tmp_path):
    cfg = MockConfig(tool_call_rounds=0, output_tokens=8, decode_tokens_per_s=2000, hang_above_tokens=500)
    mock = MockProcess.start(cfg)
    try:
        cap = _capture(tmp_path, mock, stall=True)
        out = tmp_path / "replay"
        r = cli("replay", str(cap), "--agents", "2x", "--speed", "5", "--endpoint", mock.url, "--out", str(out),
                "--no-live", "--set", "stall.after_s=1", "--set", "stall.give_up_s=3", timeout=300)
    finally:
        mock.stop()
    before = orjson.loads((cap / "summary.json").read_bytes())["verdict"]
    after = orjson.loads((out / "summary.json").read_bytes())["verdict"]
    assert before["kind"] == after["kind"] == "server_stall", r.stdout
    assert (after["phase"], after["first_round"]) == (before["phase"], before["first_round"]) == ("ttfb", before["first_round"])
    assert r.returncode == 1


@pytest.mark.slow
def test_a_capture_with_bodies_is_replayed_verbatim_and_keeps_no_secret(tmp_path):
    import openai

    from test_proxy import KEY, start_proxy, stop_proxy

    mock = MockProcess.start(MockConfig(tool_call_rounds=2, output_tokens=8, decode_tokens_per_s=2000))
    try:
        cap = tmp_path / "capture"
        child, port = start_proxy(mock.url, cap, "--capture-bodies")
        try:
            async def one():
                c = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY, max_retries=0, timeout=30)
                # a harness that pastes its own key into the prompt: the capture must not keep it
                msgs = [{"role": "user", "content": f"my key is {KEY}, list the files"}]
                try:
                    for _ in range(3):
                        r = await c.chat.completions.create(model="mock-model", messages=msgs, stream=False,
                                                            tools=[{"type": "function", "function": {
                                                                "name": "ls", "parameters": {"type": "object"}}}])
                        m = r.choices[0].message
                        if not m.tool_calls:
                            return
                        msgs.append(m.model_dump(exclude_none=True))
                        for tc in m.tool_calls:
                            msgs.append({"role": "tool", "tool_call_id": tc.id, "content": "a.py b.py " * 30})
                finally:
                    await c.close()
            asyncio.run(one())
        finally:
            stop_proxy(child)
        bodies = (cap / "bodies.jsonl").read_bytes()
        assert KEY.encode() not in bodies and b"my key is ***" in bodies
        out = tmp_path / "replay"
        r = cli("replay", str(cap), "--agents", "2x", "--endpoint", mock.url, "--out", str(out), "--no-live",
                "--set", "canary.every_s=0", timeout=300)
    finally:
        mock.stop()
    assert r.returncode == 0, r.stdout + r.stderr
    captured = _prompts(cap / "records.jsonl")[0]
    assert sorted(captured) == [1, 2, 3]
    from agentload.tokens import text_tokens
    # the very bodies, but for the key the capture hid: that message is shorter by its difference
    hidden = (text_tokens(f"my key is {KEY}, list the files") - text_tokens("my key is ***, list the files"))
    for agent, rounds in _prompts(out / "records.jsonl").items():
        assert {n: p + hidden for n, p in rounds.items()} == captured, (agent, rounds, captured)


def _mooncake(path: Path) -> Path:
    # two products: three requests share blocks [11, 12] (1,024 tokens), three share [21]; 0.2 s apart
    lines = [{"timestamp": 1000 + 200 * k, "input_length": 1100 + 40 * k, "output_length": 4 + k,
              "hash_ids": ([11, 12] if k % 2 == 0 else [21, 22 + k]) + [100 + k]} for k in range(6)]
    return _write(path, lines)


def test_mooncake_trace_lines_are_one_round_conversations_at_their_times(tmp_path):
    plans = load_plans(str(_mooncake(tmp_path / "trace.jsonl")))
    assert [p.arrival_s for p in plans] == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert [p.rounds[0].prompt_tokens for p in plans] == [1100 + 40 * k for k in range(6)]
    assert plans[0].blocks == (11, 12, 100) and plans[0].output_tokens == 4
    bad = _write(tmp_path / "bad.jsonl", [{"timestamp": 0, "input_length": 10, "hash_ids": ["x"]}])
    with pytest.raises(UserError, match="line 1: hash_ids: expected a list of whole numbers"):
        load_plans(str(bad))


@pytest.mark.slow
def test_a_mooncake_trace_replayed_keeps_arrivals_sizes_and_shared_prefixes(tmp_path):
    trace = _mooncake(tmp_path / "trace.jsonl")
    mock = MockProcess.start(MockConfig(prefix_cache_tokens=100_000, prefix_block_tokens=16, output_tokens=64,
                                        decode_tokens_per_s=4000))
    try:
        out = tmp_path / "replay"
        r = cli("replay", str(trace), "--speed", "2", "--endpoint", mock.url, "--out", str(out), "--no-live",
                "--set", "canary.every_s=0", timeout=300)
    finally:
        mock.stop()
    assert r.returncode == 0, r.stdout + r.stderr
    recs = sorted((orjson.loads(x) for x in (out / "records.jsonl").read_bytes().splitlines()),
                  key=lambda d: d["agent"])
    assert [d["prompt_tokens"] for d in recs] == [1100 + 40 * k for k in range(6)]
    # each started on the trace's clock at double speed: 0.1 s apart (late by the loop at most a little)
    starts = [d["t"]["intended"] for d in recs]
    assert all(abs((b - a) / 1e9 - 0.1) < 0.01 for a, b in zip(starts, starts[1:])), starts
    # output_length became each request's max_tokens
    assert [d["output_tokens"] for d in recs] == [4 + k for k in range(6)]
    # later requests of each product find the blocks they share with earlier ones in the prefix cache:
    # [11, 12] (two 512-token blocks) for the first product, [21] for the second; the first of each none
    assert [d["cached_tokens"] or 0 for d in recs] == [0, 0, 1024, 512, 1024, 512]


@pytest.mark.slow
@pytest.mark.smg
def test_a_capture_replayed_through_the_router_soak_bench_is_judged_per_backend(tmp_path):
    """The user's next step after a capture: replay it at 10x through the router soak bench (agentload
    starts the mocks and smg); the router section attributes every replayed request to a backend."""
    from smgproc import smg_executable

    if smg_executable() is None:
        pytest.skip("the `smg` executable is missing (pip install smg)")
    mock = MockProcess.start(MockConfig(tool_call_rounds=4, output_tokens=8, decode_tokens_per_s=2000))
    try:
        cap = _capture(tmp_path, mock)
    finally:
        mock.stop()
    out = tmp_path / "replay"
    r = cli("replay", str(cap), "router-soak-smg", "--agents", "10x", "--speed", "10", "--out", str(out), "--no-live",
            "--set", "agents.duration_s=10", "--set", "agents.restart=false", "--set", "schedule=[]", timeout=400)
    assert r.returncode in (0, 1), r.stdout + r.stderr
    s = orjson.loads((out / "summary.json").read_bytes())
    assert s["verdict"]["kind"] in ("healthy", "client_saturated"), r.stdout  # (saturated: a loaded machine)
    captured = _prompts(cap / "records.jsonl")
    replayed = _prompts(out / "records.jsonl")
    assert len(replayed) == 30 and sum(len(x) for x in replayed.values()) == 10 * sum(len(x) for x in captured.values())
    router = s["router"]
    assert router["attribution"]["attributed"] == sum(len(x) for x in replayed.values()), router["attribution"]
    assert "ROUTER smg" in r.stdout
