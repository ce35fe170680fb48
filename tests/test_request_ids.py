"""What agentload puts on the wire for the servers people run (issue 12), over real HTTP against
`fakeserver.FakeServer` playing llama-cpp-python's rules: an X-Request-ID that is not a UUID gets
a 400 with an EMPTY body, and an assistant turn with `"content": null` gets a 500.

Each record keeps the readable id (`request_id`) and the value sent (`id_sent`); an error with an
empty body names the headers agentload sent (never their values).
"""

from __future__ import annotations

import uuid

import orjson
from aiohttp import web

from agentload.records import load_records
from agentload.run.request import REQUEST_ID_NAMESPACE, sent_request_id
from fakeserver import DONE, FakeServer, chunk, sse_response
from helpers import cli, run_scenario

GOOD = [chunk({"role": "assistant", "content": ""}), chunk({"content": "hello"}), chunk({}, "stop"), DONE]


async def llama_like(request: web.Request) -> web.StreamResponse:
    """llama-cpp-python's server as agentload met it: its request-id middleware refuses a
    non-UUID X-Request-ID with an empty 400, its pydantic models refuse an assistant `content: null`."""
    rid = request.headers.get("X-Request-ID")
    if rid is not None:
        try:
            uuid.UUID(rid)
        except ValueError:
            return web.Response(status=400, body=b"")
    body = orjson.loads(await request.read())
    if any(m.get("role") == "assistant" and "content" in m and m["content"] is None for m in body["messages"]):
        return web.json_response({"error": {"message": "7 validation errors: ..."}}, status=500)
    return await sse_response(request, GOOD)


def _run(tmp_path, *extra: str, env: dict | None = None):
    with FakeServer(llama_like) as srv:
        res = run_scenario("demo", tmp_path, [f'target.endpoint="{srv.url}"', "agents.count=2", "agents.rounds=3",
                                              "canary.every_s=0", "agents.error_retries=0",
                                              "conversation.tool_latency_ms=0", *extra])
        headers = list(srv.headers)
    recs = [r for r in load_records(tmp_path / "records.jsonl").records if r.kind == "agent"]
    return res, recs, headers


def test_the_id_sent_is_a_uuid_derived_from_the_readable_id_and_recorded(tmp_path):
    res, recs, headers = _run(tmp_path)
    assert res.summary["verdict"]["kind"] == "healthy", res.summary["verdict"]
    assert len(recs) == 6 and all(r.outcome == "ok" for r in recs)
    for r in recs:
        assert r.request_id.endswith(f"-a{r.agent}-r{r.round}-c{r.call}")  # the readable id stays
        assert r.id_sent == str(uuid.uuid5(REQUEST_ID_NAMESPACE, r.request_id)) == sent_request_id(r.request_id)
    # what the server received joins to the records by id_sent
    assert sorted(h["X-Request-ID"] for h in headers) == sorted(r.id_sent for r in recs)


def test_readable_ids_get_the_empty_400_and_the_error_names_the_headers_not_their_values(tmp_path):
    secret = "sk-test-SECRET-987654"
    out = tmp_path / "run"
    with FakeServer(llama_like) as srv:
        r = cli("run", "demo", "--no-live", "--endpoint", srv.url, "--out", str(out),
                "--set", 'target.request_id_format="readable"', "--set", 'target.api_key_env="AGENTLOAD_TEST_KEY"',
                "--set", "agents.count=1", "--set", "agents.rounds=2", "--set", "agents.error_retries=0",
                "--set", "canary.every_s=0", env={"AGENTLOAD_TEST_KEY": secret})
    assert r.returncode == 1, r.stderr
    assert r.stdout.startswith("VERDICT [server_errors]"), r.stdout
    recs = load_records(out / "records.jsonl").records
    assert [(x.status, x.id_sent == x.request_id) for x in recs] == [(400, True)]
    msg = recs[0].error_msg
    assert msg.startswith("HTTP 400 with an empty body (agentload sent headers: Content-Type, "), msg
    assert "X-Request-ID" in msg and "Authorization" in msg and msg.endswith("a server may reject a header's format)")
    assert secret not in msg and "Bearer" not in msg
    assert "HTTP 400 with an empty body" in r.stdout  # the verdict's sample message
    for p in out.iterdir():
        assert secret not in p.read_text(errors="replace"), p


def test_the_id_header_can_be_renamed_or_switched_off(tmp_path):
    res, recs, headers = _run(tmp_path / "renamed", 'target.request_id_header="X-Correlation-ID"',
                              'target.headers={"X-Request-ID" = "0b6a3f1e-8b0a-5c3e-9d7a-1234567890ab"}')
    assert res.summary["verdict"]["kind"] == "healthy"
    assert sorted(h["X-Correlation-ID"] for h in headers) == sorted(r.id_sent for r in recs)
    assert {h["X-Request-ID"] for h in headers} == {"0b6a3f1e-8b0a-5c3e-9d7a-1234567890ab"}  # sent as written
    res, recs, headers = _run(tmp_path / "off", "target.request_id_header=false")
    assert res.summary["verdict"]["kind"] == "healthy"
    assert not any("X-Request-ID" in h for h in headers) and all(r.id_sent is None for r in recs)


def test_tool_call_turns_are_sent_with_empty_content_unless_told_otherwise(tmp_path):
    res, recs, _ = _run(tmp_path / "empty")  # rounds 2 and 3 carry the scripted tool-call turns
    assert res.summary["verdict"]["kind"] == "healthy" and len(recs) == 6
    res, recs, _ = _run(tmp_path / "omit", 'conversation.assistant_content="omit"')
    assert res.summary["verdict"]["kind"] == "healthy" and len(recs) == 6
    res, recs, _ = _run(tmp_path / "null", 'conversation.assistant_content="null"')
    v = res.summary["verdict"]
    assert (v["kind"], v["first_round"]) == ("server_errors", 2), v
    assert [(r.round, r.status) for r in sorted(recs, key=lambda r: r.round) if r.outcome != "ok"] == [(2, 500)] * 2
