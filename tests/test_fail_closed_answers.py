"""Issue 27, items 1, 2 and 13: answers that complete but cannot be used as they came, read over
real HTTP against `fakeserver.FakeServer` on 127.0.0.1.

- 13: a stream sent with `Content-Encoding: gzip` (though agentload asks for identity) is
  decompressed; an encoding agentload cannot decode is named in the error, never "no event".
"""

from __future__ import annotations

import zlib

import orjson
import pytest
from aiohttp import web

from agentload.run import direct, transport

from agentload.records import load_records

from fakeserver import DONE, FakeServer, chunk
from helpers import run_scenario

USAGE = {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}


def _usage_chunk(usage=USAGE) -> str:
    obj = {"id": "fake-1", "object": "chat.completion.chunk", "model": "fake", "choices": [], "usage": usage}
    return "data: " + orjson.dumps(obj).decode() + "\n\n"


GOOD = [chunk({"role": "assistant", "content": ""}), chunk({"content": "hel"}), chunk({"content": "lo"}),
        chunk({}, "stop"), _usage_chunk(), DONE]


class Recs(list):
    """The run's agent records, with the run's summary beside them."""

    summary: dict
    verdict: dict
    requests: list


def _run(tmp_path, handler, *extra: str) -> Recs:
    """2 agents x 2 rounds, no canaries, no retries of errors."""
    with FakeServer(handler) as srv:
        res = run_scenario("demo", tmp_path, [f'target.endpoint="{srv.url}"', "agents.count=2", "agents.rounds=2",
                                              "canary.every_s=0", "agents.error_retries=0",
                                              "conversation.tool_latency_ms=0", *extra])
        assert srv.requests, "the fake server got no request"
    loaded = load_records(tmp_path / "records.jsonl")
    assert loaded.torn_lines == 0
    recs = Recs(r for r in loaded.records if r.kind == "agent")
    assert recs and res.summary is not None
    recs.summary = res.summary
    recs.verdict = res.summary["verdict"]
    recs.requests = srv.requests
    return recs


# ----------------------------------------------------------------------------- 13. gzip


def _compressed(events: list[str], encoding: str = "gzip", wbits: int = 31):
    """Each event compressed and flushed on its own (Z_SYNC_FLUSH, as a streaming proxy does), so
    the stream arrives event by event, compressed."""
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Content-Encoding": encoding})
        await resp.prepare(request)
        z = zlib.compressobj(wbits=wbits)
        for ev in events:
            await resp.write(z.compress(ev.encode()) + z.flush(zlib.Z_SYNC_FLUSH))
        await resp.write(z.flush())
        await resp.write_eof()
        return resp
    return handler


@pytest.fixture(params=["direct", "session.post"])
def request_path(request, monkeypatch):
    """Both ways a request goes out: the direct path, and session.post (as without its hooks)."""
    if request.param == "session.post":
        monkeypatch.setattr(direct, "_missing", ["ResponseHandler.read()"])
        monkeypatch.setattr(transport, "_warned", set())
    return request.param


def test_a_gzip_stream_is_decompressed(tmp_path, request_path):
    recs = _run(tmp_path, _compressed(GOOD))
    assert len(recs) == 4 and all(r.outcome == "ok" and r.error is None for r in recs), \
        [(r.outcome, r.error, r.error_msg) for r in recs]
    assert all(r.token_chunks == 2 and r.finish_reason == "stop" and r.output_tokens == 3 for r in recs)
    assert all(r.phase_ns("ttft") is not None for r in recs)
    assert recs.verdict["kind"] == "healthy", recs.verdict


def test_a_deflate_stream_is_decompressed(tmp_path, request_path):
    recs = _run(tmp_path, _compressed(GOOD, "deflate", 15))
    assert len(recs) == 4 and all(r.outcome == "ok" and r.token_chunks == 2 for r in recs), \
        [(r.outcome, r.error, r.error_msg) for r in recs]
    assert recs.verdict["kind"] == "healthy", recs.verdict


def test_an_encoding_agentload_cannot_decode_is_named(tmp_path, request_path):
    # x-snappy: not one aiohttp knows; br: known, but refused without the Brotli package
    for enc in ("x-snappy", "br"):
        out = tmp_path / enc
        recs = _run(out, _compressed(GOOD, enc))
        assert len(recs) == 2 and all(r.outcome == "error" for r in recs), [(r.error, r.error_msg) for r in recs]
        for r in recs:
            assert f"Content-Encoding: {enc}" in r.error_msg, (r.error, r.error_msg)
            assert "no event" not in r.error_msg
        v = recs.verdict
        assert v["kind"] == "bad_responses", v
        assert any(f"Content-Encoding: {enc}" in e for e in v["evidence"]), v
