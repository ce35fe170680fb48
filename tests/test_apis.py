"""Issue 29: agents that speak Anthropic Messages (`/v1/messages`) and OpenAI Responses
(`/v1/responses`) beside chat/completions, over real HTTP.

- the requests each API's own shape, from the same seeded conversation (bodies seen by a fake
  server), and the API's headers (`anthropic-version`, the key as `x-api-key`);
- runs against the mock in each API: the same verdict, rounds, prompt tokens (agentload's count is
  the mock's), cached tokens, first output kind, backend; model mode; `responses_chain`;
- the official `anthropic` and `openai` SDKs parse the mock's streams and non-streamed answers
  (the check that the mock's shapes are right), and a stored response continues by
  `previous_response_id`;
- fail closed in each API (`fakeserver.FakeServer`): a stream without its terminal event,
  `event: error` (overloaded_error), HTTP 529, `response.failed`, `response.incomplete`, a 200 that
  is not an event stream, unparseable events. (Tool calls that cannot be sent back: each API in
  test_fail_closed_answers.py, as chat's.)
"""

from __future__ import annotations

import json

import aiohttp
import anthropic
import openai
import orjson
import pytest
from aiohttp import web

from agentload.mock import MockConfig, MockProcess
from agentload.records import load_records
from agentload.tokens import prompt_tokens
from fakeserver import FakeServer, sse_response
from helpers import hung_probes, run_cli_together, run_scenario

APIS = ("chat", "messages", "responses")
PATHS = {"chat": "/v1/chat/completions", "messages": "/v1/messages", "responses": "/v1/responses"}


def _agent_records(run_dir):
    loaded = load_records(run_dir / "records.jsonl")
    assert loaded.torn_lines == 0
    return [r for r in loaded.records if r.kind == "agent"]


# ------------------------------------------------------------------ the requests, as a server sees them


def _capture(tmp_path, api, *extra):
    """The bodies and headers of a 2-round run of one agent against a server that answers nothing useful."""
    async def handler(request):
        return web.json_response({"error": {"message": "no"}}, status=400)

    with FakeServer(handler, path=PATHS[api]) as srv:
        run_scenario("demo", tmp_path / api, [f'target.endpoint="{srv.url}"', f'target.api="{api}"', "agents.count=1",
                                              "agents.rounds=2", "canary.every_s=0", "agents.error_retries=0",
                                              "conversation.tools=2", "conversation.tool_choice=\"tool_1\"", *extra])
        return srv.requests, srv.headers


def test_each_api_gets_its_own_request_shape(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTLOAD_TEST_KEY", "sk-test-123")
    key = ['target.api_key_env="AGENTLOAD_TEST_KEY"']
    (chat,), (chat_h,) = _capture(tmp_path, "chat", *key)
    (msgs,), (msgs_h,) = _capture(tmp_path, "messages", *key)
    (resp,), (resp_h,) = _capture(tmp_path, "responses", *key)

    system, user = chat["messages"][0]["content"], chat["messages"][1]["content"]
    assert chat["messages"][0]["role"] == "system" and chat_h["Authorization"] == "Bearer sk-test-123"

    # Messages: system apart, tools with input_schema, Anthropic's tool_choice, x-api-key + anthropic-version
    assert msgs["system"] == system and msgs["messages"] == [{"role": "user", "content": user}]
    assert msgs["max_tokens"] == chat["max_tokens"] and msgs["stream"] is True and "stream_options" not in msgs
    assert msgs["tools"] == [{"name": t["function"]["name"], "description": t["function"]["description"],
                              "input_schema": t["function"]["parameters"]} for t in chat["tools"]]
    assert msgs["tool_choice"] == {"type": "tool", "name": "tool_1"}
    assert msgs_h["x-api-key"] == "sk-test-123" and "Authorization" not in msgs_h
    assert msgs_h["anthropic-version"] == "2023-06-01"

    # Responses: instructions, input items, flat tools, max_output_tokens, stateless (store false)
    assert resp["instructions"] == system and resp["store"] is False and "previous_response_id" not in resp
    assert resp["input"] == [{"type": "message", "role": "user", "content": user}]
    assert resp["max_output_tokens"] == chat["max_tokens"] and resp["stream"] is True
    assert resp["tools"] == [{"type": "function", **{k: t["function"][k] for k in ("name", "description")},
                              "parameters": t["function"]["parameters"]} for t in chat["tools"]]
    assert resp["tool_choice"] == {"type": "function", "name": "tool_1"}
    assert resp_h["Authorization"] == "Bearer sk-test-123"


def test_tool_turns_in_each_api(tmp_path):
    """Round 2 carries round 1's tool calls and results: tool_use/tool_result blocks, function_call /
    function_call_output items joined by call_id; the same ids and arguments as chat's."""
    bodies = {}
    for api in APIS:
        seen = []

        async def handler(request, seen=seen, api=api):
            seen.append(orjson.loads(await request.read()))
            if len(seen) == 1:  # round 1: a whole answer (scripted agents decide their tool calls themselves)
                return await sse_response(request, WHOLE[api])
            return web.json_response({"error": {"message": "stop here"}}, status=400)

        with FakeServer(handler, path=PATHS[api]) as srv:
            run_scenario("demo", tmp_path / api, [f'target.endpoint="{srv.url}"', f'target.api="{api}"',
                                                  "agents.count=1", "agents.rounds=2", "canary.every_s=0",
                                                  "agents.error_retries=0", "conversation.tool_calls_per_round=2"])
        bodies[api] = seen[1]
    chat = bodies["chat"]["messages"]
    asst, results = chat[2], chat[3:]
    calls = asst["tool_calls"]
    assert len(calls) == 2 and [r["tool_call_id"] for r in results] == [c["id"] for c in calls]

    m = bodies["messages"]["messages"]
    assert [x["role"] for x in m] == ["user", "assistant", "user"]
    assert m[1]["content"] == [{"type": "tool_use", "id": c["id"], "name": c["function"]["name"],
                                "input": json.loads(c["function"]["arguments"])} for c in calls]
    assert m[2]["content"] == [{"type": "tool_result", "tool_use_id": r["tool_call_id"], "content": r["content"]}
                               for r in results]

    items = bodies["responses"]["input"]
    assert items[1:] == ([{"type": "function_call", "call_id": c["id"], "name": c["function"]["name"],
                           "arguments": c["function"]["arguments"]} for c in calls]
                         + [{"type": "function_call_output", "call_id": r["tool_call_id"], "output": r["content"]}
                            for r in results])


# ------------------------------------------------------------------ runs against the mock


@pytest.mark.parametrize("api", ["messages", "responses"])
def test_run_against_the_mock_matches_chat(tmp_path, api):
    """The same seeded workload in chat and in `api`: the same verdict, rounds, prompt tokens (as the mock
    counted them), cached tokens, finish reasons, tool calls and first output kind."""
    extra = ["agents.count=3", "agents.rounds=4", "mock.prefix_cache_tokens=100000", "mock.output_tokens=8"]
    runs = {}
    for a in ("chat", api):
        res = run_scenario("healthy", tmp_path / a, [f'target.api="{a}"', *extra])
        runs[a] = (res.summary, sorted(_agent_records(tmp_path / a), key=lambda r: (r.agent, r.round)))
    (s_chat, chat), (s_api, other) = runs["chat"], runs[api]
    assert s_api["verdict"]["kind"] == s_chat["verdict"]["kind"] == "healthy"
    assert s_api["run"]["api"] == api and s_chat["run"]["api"] == "chat"
    assert len(other) == len(chat) == 12
    for c, o in zip(chat, other):
        assert (o.agent, o.round, o.outcome, o.messages, o.prompt_tokens) == (c.agent, c.round, c.outcome,
                                                                               c.messages, c.prompt_tokens)
        assert o.server_prompt_tokens == o.prompt_tokens  # the mock read the API's request into the same count
        assert o.cached_tokens == c.cached_tokens and (o.round == 1 or o.cached_tokens > 0)
        assert (o.finish_reason, o.tool_calls) == (c.finish_reason, c.tool_calls)
        assert o.output_tokens > 0  # (the arguments are drawn per request id: each run's own)
        assert o.first_output == c.first_output == "tool"
        assert o.backend == "mock" and o.server_first_token_ns is not None
        assert o.t["headers"] <= o.t["first_token"] <= o.t["end"] and o.token_chunks > 1


@pytest.mark.parametrize("api", APIS)
def test_model_mode_each_api(tmp_path, api):
    """The model's own tool calls drive the next round; a text answer ends the conversation (first output text)."""
    res = run_scenario("healthy", tmp_path, [f'target.api="{api}"', 'conversation.mode="model"', "agents.count=2",
                                             "agents.rounds=4", "mock.tool_call_rounds=2", "mock.output_tokens=6",
                                             "mock.reject_protocol_violations=true"])
    recs = sorted(_agent_records(tmp_path), key=lambda r: (r.agent, r.round))
    assert [(r.round, r.outcome, r.first_output, r.finish_reason) for r in recs] == [
        (1, "ok", "tool", "tool_calls"), (2, "ok", "tool", "tool_calls"), (3, "ok", "text", "stop")] * 2
    assert all(r.server_prompt_tokens == r.prompt_tokens for r in recs)
    assert res.summary["verdict"]["kind"] == "no_tool_calls"  # the model stopped calling tools in round 3


def test_responses_chain_sends_only_new_items(tmp_path):
    """responses_chain: round 2 on sends previous_response_id and only its new items; the server's context
    (its prompt tokens) still grows as the stateless run's does."""
    extra = ['target.api="responses"', 'conversation.mode="model"', "agents.count=2", "agents.rounds=4",
             "mock.tool_call_rounds=0", "mock.reject_protocol_violations=true", "conversation.tool_result_tokens=400"]
    run_scenario("healthy", tmp_path / "chain", [*extra, "conversation.responses_chain=true"])
    res = run_scenario("healthy", tmp_path / "full", extra)
    chain = sorted(_agent_records(tmp_path / "chain"), key=lambda r: (r.agent, r.round))
    full = sorted(_agent_records(tmp_path / "full"), key=lambda r: (r.agent, r.round))
    assert res.summary["verdict"]["kind"] == "healthy"
    assert [r.outcome for r in chain] == ["ok"] * 8
    saved = []
    for c, f in zip(chain, full):
        assert c.server_prompt_tokens == c.prompt_tokens  # the stored context and the new items, as counted
        if c.round == 1:
            assert c.prompt_bytes == f.prompt_bytes - 1  # ("store":true, not false)
        else:  # the settings, tools and instructions again, then only the tool results: not the history
            saved.append(f.prompt_bytes - c.prompt_bytes)
    for a in range(2):
        per_agent = saved[3 * a:3 * a + 3]
        assert 0 < per_agent[0] < per_agent[1] < per_agent[2] and per_agent[2] > 3200, saved  # the history left out


def test_responses_chain_needs_responses_and_model_mode(tmp_path):
    from agentload.errors import ScenarioError
    from agentload.run.scenario import load_scenario
    with pytest.raises(ScenarioError, match="responses_chain.*target.api"):
        load_scenario("demo", ["conversation.responses_chain=true", 'conversation.mode="model"'])
    with pytest.raises(ScenarioError, match="responses_chain.*mode"):
        load_scenario("demo", ["conversation.responses_chain=true", 'target.api="responses"'])
    with pytest.raises(ScenarioError, match="target.api"):
        load_scenario("demo", ['target.api="completions"'])


# ------------------------------------------------------------------ the official SDKs read the mock


@pytest.fixture(scope="module")
def mock():
    cfg = MockConfig(base_latency_ms=1, decode_tokens_per_s=0, output_tokens=16, tool_calls_per_response=2,
                     chunk_tokens=2, prefix_cache_tokens=100000)
    with MockProcess.start(cfg) as m:
        yield m


TOOLS = [{"name": "search_docs", "description": "search",
          "input_schema": {"type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
                           "required": ["query", "limit"]}}]


async def test_anthropic_sdk_reads_the_mock(mock):
    client = anthropic.AsyncAnthropic(base_url=mock.url.rsplit("/v1", 1)[0], api_key="x", max_retries=0, timeout=10)
    try:
        messages = [{"role": "user", "content": "find the docs"}]
        async with client.messages.stream(model="mock-model", max_tokens=64, system="be brief", messages=messages,
                                          tools=TOOLS, tool_choice={"type": "any"}) as stream:
            final = await stream.get_final_message()
        assert final.stop_reason == "tool_use"
        uses = [b for b in final.content if b.type == "tool_use"]
        assert len(uses) == 2 and all(isinstance(u.input, dict) and "query" in u.input for u in uses)
        chat_form = [{"role": "system", "content": "be brief"}, *messages]
        chat_tools = [{"type": "function", "function": {"name": t["name"], "description": t["description"],
                                                        "parameters": t["input_schema"]}} for t in TOOLS]
        u = final.usage
        assert u.input_tokens + (u.cache_read_input_tokens or 0) == prompt_tokens(chat_form, chat_tools)

        # the next round with tool_result blocks: no protocol violation, a text answer, cached tokens
        mock.reset_stats()
        messages += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in final.content]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": b.id, "content": "r"}
                                                  for b in uses]}]
        async with client.messages.stream(model="mock-model", max_tokens=64, system="be brief", messages=messages,
                                          tools=TOOLS, tool_choice={"type": "none"}) as stream:
            text = "".join([t async for t in stream.text_stream])
            final = await stream.get_final_message()
        assert text and final.stop_reason == "end_turn" and final.usage.cache_read_input_tokens > 0
        assert mock.stats()["protocol_violations"] == 0

        unary = await client.messages.create(model="mock-model", max_tokens=4, messages=messages[:1])
        assert unary.stop_reason == "max_tokens" and unary.content[0].type == "text"
        async with aiohttp.ClientSession() as http:  # max_tokens is required, as Anthropic's API says
            async with http.post(mock.url + "/messages", json={"model": "m", "messages": messages[:1]}) as r:
                assert r.status == 400
                assert (await r.json())["error"] == {"type": "invalid_request_error", "message": "max_tokens: Field required"}
    finally:
        await client.close()


async def test_openai_sdk_reads_the_mock_responses(mock):
    client = openai.AsyncOpenAI(base_url=mock.url, api_key="x", max_retries=0, timeout=10)
    tools = [{"type": "function", "name": t["name"], "description": t["description"], "parameters": t["input_schema"]}
             for t in TOOLS]
    try:
        async with client.responses.stream(model="mock-model", instructions="be brief", input="find the docs",
                                           tools=tools, tool_choice="required") as stream:
            deltas = [e async for e in stream]
            final = await stream.get_final_response()
        assert final.status == "completed"
        calls = [o for o in final.output if o.type == "function_call"]
        assert len(calls) == 2 and all("query" in json.loads(c.arguments) for c in calls)
        assert any(e.type == "response.function_call_arguments.delta" for e in deltas)
        assert [e.sequence_number for e in deltas] == list(range(len(deltas)))

        # stored (store defaults to true): the next round sends only the outputs, by previous_response_id
        mock.reset_stats()
        async with client.responses.stream(model="mock-model", previous_response_id=final.id,
                                           input=[{"type": "function_call_output", "call_id": c.call_id, "output": "r"}
                                                  for c in calls], tools=tools, tool_choice="none") as stream:
            text = "".join([e.delta async for e in stream if e.type == "response.output_text.delta"])
            second = await stream.get_final_response()
        assert text and second.output_text == text and second.usage.input_tokens_details.cached_tokens > 0
        assert second.usage.input_tokens > final.usage.input_tokens
        assert mock.stats()["protocol_violations"] == 0

        unary = await client.responses.create(model="mock-model", input="hi", max_output_tokens=4)
        assert unary.status == "incomplete" and unary.incomplete_details.reason == "max_output_tokens"
        with pytest.raises(openai.BadRequestError, match="not found"):
            await client.responses.create(model="mock-model", input="hi", previous_response_id="resp_nope")
    finally:
        await client.close()


# ------------------------------------------------------------------ fail closed in every API


def _ev(name: str, obj: dict) -> str:
    return f"event: {name}\ndata: {json.dumps(obj)}\n\n"


M_START = _ev("message_start", {"type": "message_start", "message": {
    "id": "msg_1", "type": "message", "role": "assistant", "content": [], "model": "m",
    "usage": {"input_tokens": 10, "output_tokens": 1}}})
M_TEXT = (_ev("content_block_start", {"type": "content_block_start", "index": 0,
                                      "content_block": {"type": "text", "text": ""}})
          + _ev("content_block_delta", {"type": "content_block_delta", "index": 0,
                                        "delta": {"type": "text_delta", "text": "hello"}}))
M_END = (_ev("content_block_stop", {"type": "content_block_stop", "index": 0})
         + _ev("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                                 "usage": {"output_tokens": 3}})
         + _ev("message_stop", {"type": "message_stop"}))

R_START = _ev("response.created", {"type": "response.created", "response": {"id": "resp_1", "object": "response",
                                                                             "status": "in_progress", "output": []}})
R_TEXT = _ev("response.output_text.delta", {"type": "response.output_text.delta", "output_index": 0,
                                            "content_index": 0, "delta": "hello"})
R_END = _ev("response.completed", {"type": "response.completed", "response": {
    "id": "resp_1", "object": "response", "status": "completed",
    "usage": {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 3}}})


CHAT_WHOLE = [f"data: {json.dumps(c)}\n\n" for c in (
    {"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "hello"},
                                                                "finish_reason": None}]},
    {"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
)] + ["data: [DONE]\n\n"]
WHOLE = {"chat": CHAT_WHOLE, "messages": [M_START, M_TEXT, M_END], "responses": [R_START, R_TEXT, R_END]}


def _run_fake(tmp_path, api, handler, *extra):
    with FakeServer(handler, path=PATHS[api]) as srv:
        res = run_scenario("demo", tmp_path, [f'target.endpoint="{srv.url}"', f'target.api="{api}"',
                                              "agents.count=2", "agents.rounds=2", "canary.every_s=0",
                                              "agents.error_retries=0", *extra])
        assert srv.requests
    return _agent_records(tmp_path), res.summary["verdict"]


def _sse(events):
    async def handler(request):
        return await sse_response(request, events)
    return handler


@pytest.mark.parametrize("api,events", [
    ("messages", [M_START, M_TEXT, M_END]),
    ("messages", [M_START, M_END.split("event: content_block_stop")[0], M_END.split("\n\n", 1)[1]]),  # empty, ended
    ("responses", [R_START, R_END]),  # an empty answer that ended: ok, as chat's with a finish_reason
    ("responses", [R_START, R_TEXT, R_END]),
    ("messages", [": ping\n\n", M_START, _ev("ping", {"type": "ping"}), M_TEXT, "data: [DONE]\n\n", M_END]),
])
def test_a_whole_stream_is_ok(tmp_path, api, events):
    recs, verdict = _run_fake(tmp_path, api, _sse(events))
    assert [r.outcome for r in recs] == ["ok"] * 4 and verdict["kind"] in ("healthy", "no_tokens"), verdict
    text = any("hello" in e for e in events)
    assert all(r.first_output == ("text" if text else None) and r.finish_reason == "stop"
               and r.server_prompt_tokens == 10 for r in recs)


def test_malformed_events_in_a_whole_answer_are_counted(tmp_path):
    recs, verdict = _run_fake(tmp_path, "responses", _sse([R_START, "data: {oops\n\n", R_TEXT, R_END]))
    assert [(r.outcome, r.bad_events) for r in recs] == [("ok", 1)] * 4 and verdict["kind"] == "bad_responses"


@pytest.mark.parametrize("api,events,error,msg", [
    ("messages", [M_START, M_TEXT], "incomplete_stream", "without message_stop"),
    ("messages", [M_START, M_TEXT, M_END.split("event: message_stop")[0]], "incomplete_stream",
     "without message_stop"),
    ("responses", [R_START, R_TEXT], "incomplete_stream", "without response.completed"),
    ("messages", [M_START], "empty_stream", "no output, no stop_reason"),
    ("responses", [R_START], "empty_stream", "no output, no response.completed"),
    ("messages", [M_START, M_TEXT, _ev("error", {"type": "error", "error": {"type": "overloaded_error",
                                                                           "message": "Overloaded"}})],
     "inband_error", "overloaded_error: Overloaded"),
    ("messages", [M_START, 'data: {"type":"error","error":{"type":"api_error","message":"boom"}}\n\n'],
     "inband_error", "api_error: boom"),
    ("responses", [R_START, R_TEXT, _ev("response.failed", {"type": "response.failed", "response": {
        "status": "failed", "error": {"code": "server_error", "message": "the model fell over"}}})],
     "inband_error", "response.failed: server_error: the model fell over"),
    ("responses", [R_START, R_TEXT, _ev("response.incomplete", {"type": "response.incomplete", "response": {
        "status": "incomplete", "incomplete_details": {"reason": "content_filter"}}})],
     "inband_error", "response.incomplete: content_filter"),
    ("responses", [R_START, _ev("error", {"type": "error", "code": "rate_limit", "message": "slow down"})],
     "inband_error", "slow down"),
    ("messages", ["data: {not json\n\n", "data: [1, 2]\n\n"], "malformed_stream", "malformed"),
    ("responses", ['data: {"no": "type"}\n\n', R_START], "malformed_stream", "malformed"),
])
def test_fail_closed(tmp_path, api, events, error, msg):
    recs, verdict = _run_fake(tmp_path, api, _sse(events))
    assert len(recs) == 2, [(r.round, r.outcome, r.error) for r in recs]
    for r in recs:
        assert (r.outcome, r.error) == ("error", error), (r.error, r.error_msg)
        assert msg in r.error_msg, r.error_msg
    assert verdict["kind"] in ("server_errors", "bad_responses", "disconnects"), verdict
    assert verdict["kind"] != "healthy" and verdict["agents_stopped"] == 2


@pytest.mark.parametrize("api", ["messages", "responses"])
def test_not_an_event_stream(tmp_path, api):
    async def handler(request):
        return web.json_response({"type": "message", "content": []})
    recs, verdict = _run_fake(tmp_path, api, handler)
    assert {r.error for r in recs} == {"not_a_stream"} and verdict["kind"] == "bad_responses"


def test_http_529_overloaded(tmp_path):
    async def handler(request):
        return web.json_response({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
                                 status=529)
    recs, verdict = _run_fake(tmp_path, "messages", handler)
    assert {r.error for r in recs} == {"http_529"} and "overloaded_error" in recs[0].error_msg
    assert verdict["kind"] == "server_errors"


@pytest.mark.parametrize("api,body,ok", [
    ("messages", {"type": "message", "id": "m", "content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn",
                  "usage": {"input_tokens": 7, "output_tokens": 1}}, True),
    ("responses", {"object": "response", "id": "r", "status": "completed", "usage": {"input_tokens": 7},
                   "output": [{"type": "message", "content": [{"type": "output_text", "text": "hi"}]}]}, True),
    ("messages", {"choices": []}, False),
    ("responses", {"object": "response", "status": "failed", "error": {"code": "x", "message": "no"}}, False),
])
def test_non_streamed(tmp_path, api, body, ok):
    async def handler(request):
        return web.json_response(body)
    recs, verdict = _run_fake(tmp_path, api, handler, "conversation.stream=false")
    if ok:
        assert [r.outcome for r in recs] == ["ok"] * 4 and recs[0].server_prompt_tokens == 7
        assert verdict["kind"] == "healthy" and recs[0].first_output == "text"
    else:
        assert {r.outcome for r in recs} == {"error"} and verdict["kind"] != "healthy"


# ------------------------------------------------------------------ every packaged scenario in every API

from test_verdicts import CASES  # noqa: E402  (scenario, kind, phase, first_round with chat)

# packaged, not in CASES: the verdict each says at its top (stale-keepalive is left out, as test_verdicts leaves
# it out: a race, whose run may lose no POST on a stale connection, and on a loaded machine says client_saturated)
OTHER = {"demo": [("healthy", None, None)], "long-rounds": [("healthy", None, None)]}


OTHER_APIS = ("messages", "responses")


@pytest.mark.slow
@pytest.mark.parametrize("api", OTHER_APIS)
@pytest.mark.parametrize("name", [c[0] for c in CASES] + list(OTHER))
def test_every_packaged_scenario_same_verdict_in_each_api(packaged_runs, name, api):
    """The verdict kind, phase and first round of a packaged scenario on the mock do not depend on the API
    (the router soaks need a router that serves the API: not here)."""
    if name in OTHER:
        wants = OTHER[name]
    else:
        _, kind, phase, first = next(c for c in CASES if c[0] == name)
        wants = [(kind, phase, first)]
    # (a scenario of test_verdicts runs there in chat: that run goes with these, see packaged_runs)
    run = packaged_runs(name, api, APIS if name not in OTHER else OTHER_APIS)
    summary = orjson.loads((run / "summary.json").read_bytes())
    v = summary["verdict"]
    got = [(v["kind"], v["phase"], v["first_round"] if want[2] is not None else None) for want in wants]
    assert any(g == w for g, w in zip(got, wants)), v
    assert summary["run"]["api"] == api
    recs = _agent_records(run)
    assert recs and all(r.server_prompt_tokens in (None, r.prompt_tokens) for r in recs)


@pytest.mark.slow
def test_compare_varies_the_api(tmp_path):
    """`agentload compare healthy --vary target.api=chat,messages,responses`: the same workload (one
    fingerprint), one run per API, side by side."""
    from agentload import compare as cmp
    from agentload.analysis import compare as cmp_math
    from agentload.report import compare_text

    variants = cmp.plan_variants("healthy", cmp.parse_vary(["target.api=chat,messages,responses"]),
                                 ["agents.count=3", "agents.rounds=2", "canary.every_s=0"])
    res = cmp.run_variants(variants, tmp_path, live=False, install_signals=False, log=lambda m: None)
    assert len(res.done) == 3 and not res.interrupted
    doc = cmp_math.compare_dirs([tmp_path / v.folder for v in res.done], names=[v.name for v in res.done],
                                base=tmp_path)
    text = compare_text.write_outputs(doc, tmp_path)
    assert doc["fingerprint"] is not None  # one workload in three APIs: comparable without --force
    assert [v["name"] for v in doc["variants"]] == ["api=chat", "api=messages", "api=responses"]
    assert "target.api" not in doc["common"] and "healthy" in text


def test_endpoint_and_url_follow_the_api():
    from agentload.endpoint import api_url
    from agentload.errors import ScenarioError
    from agentload.run.scenario import load_scenario
    sc = load_scenario("demo", ['target.endpoint="http://127.0.0.1:9/v1/messages"', 'target.api="messages"'])
    assert api_url(sc.target.endpoint, sc.target.api) == "http://127.0.0.1:9/v1/messages"
    assert api_url("http://127.0.0.1:9/v1", "responses") == "http://127.0.0.1:9/v1/responses"
    with pytest.raises(ScenarioError, match="Anthropic's Messages API"):  # a Messages URL, chat's api
        load_scenario("demo", ['target.endpoint="http://127.0.0.1:9/v1/messages"'])


# ------------------------------------------------------------------ through a real router (smg routes all three)


@pytest.fixture(scope="module")
def smg_hang_runs(tmp_path_factory):
    """{api: (run folder, the hanging backend's hung count)}: long-context-hang through smg in front of
    a good and a hanging mock, in messages and in responses at once (each API its own smg and mocks,
    each run the CLI in its own process): a run mostly waits on its hung requests, so the waits overlap."""
    from smgproc import SmgProcess, smg_executable
    if smg_executable() is None:
        pytest.skip("the `smg` executable is missing (pip install smg, or pip install -e '.[test]')")
    from serverprocs import RouterStack

    base = tmp_path_factory.mktemp("smg-each-api")
    flags = ["--disable-retries", "--request-timeout-secs", "60"]
    with RouterStack(lambda urls, log: SmgProcess.start(urls, log, flags)) as stack:
        runs, bads = {}, {}
        for api in OTHER_APIS:
            smg, (_, bads[api]) = stack.start([
                MockConfig(decode_tokens_per_s=2000, output_tokens=16, name="good"),
                MockConfig(decode_tokens_per_s=2000, output_tokens=16, hang_above_tokens=6000, name="bad")],
                base / f"smg-{api}.log")
            runs[api] = ["run", "long-context-hang", "--no-live", "--fail-on", "never", "--endpoint", smg.url,
                         "--set", f'target.api="{api}"', "--set", "canary.every_s=1.0"]
        outs = run_cli_together(base, runs, timeout=300)
        return {api: (out, bads[api].stats()["hung"]) for api, out in outs.items()}


@pytest.mark.smg
@pytest.mark.parametrize("api", OTHER_APIS)
def test_through_smg_each_api(smg_hang_runs, api):
    """smg (SGLang's model gateway) passes /v1/messages and /v1/responses on to its workers: the long-context
    hang on one of two backends is the same server_stall in ttfb from round 4 as with chat (test_smg), and the
    records name the backend that answered."""
    run, hung = smg_hang_runs[api]
    summary = orjson.loads((run / "summary.json").read_bytes())
    v = summary["verdict"]
    assert (v["kind"], v["phase"], v["first_round"]) == ("server_stall", "ttfb", 4), (run / "report.txt").read_text()
    recs = _agent_records(run)
    assert {r.backend for r in recs if r.outcome == "ok"} == {"good", "bad"}
    assert all(r.server_prompt_tokens == r.prompt_tokens for r in recs if r.outcome == "ok")
    every = load_records(run / "records.jsonl").records  # the stall probes that resent a big body too
    assert hung == len([r for r in recs if r.stalled_phase]) + len(hung_probes(every, 6000)) > 0
