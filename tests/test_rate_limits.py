"""HTTP 429 over real HTTP (tests/fakeserver.py): its own finding (`rate_limited`), never hidden in
`server_errors`; Retry-After honoured as seconds or as an HTTP date, bounded by
agents.retry_after_max_s; 429s retried up to agents.rate_limit_retries; both in run.json."""

from __future__ import annotations

import email.utils
import time

import orjson
from aiohttp import web

from agentload.launch import run_to_dir
from agentload.records import load_records
from agentload.run.request import retry_after_s
from agentload.run.scenario import load_scenario
from fakeserver import DONE, FakeServer, chunk, sse_response

GOOD = [chunk({"role": "assistant", "content": ""}), chunk({"content": "hi"}), chunk({}, "stop"), DONE]
BASE = ["agents.count=2", "agents.rounds=2", "canary.every_s=0"]


def _limiter(headers_for, every: int = 2):
    """429 to the first request of every `every` (per the server's count), else a good stream."""
    n = [0]

    async def handler(request: web.Request) -> web.StreamResponse:
        n[0] += 1
        if (n[0] - 1) % every == 0:
            return web.json_response({"error": {"message": "Rate limit reached", "type": "requests",
                                                "code": "rate_limit_exceeded"}}, status=429, headers=headers_for())
        return await sse_response(request, GOOD)
    return handler


def _run(tmp_path, srv, name, sets):
    sc = load_scenario("demo", [f'target.endpoint="{srv.url}"', *BASE, *sets])
    out = run_to_dir(sc, tmp_path / name, live=False, install_signals=False, log=lambda m: None)
    recs = load_records(tmp_path / name / "records.jsonl").records
    return out.summary, recs, orjson.loads((tmp_path / name / "run.json").read_bytes())


def _waits(recs):
    """Seconds between each 429 and the retry that followed it (same agent and round)."""
    by = {(r.agent, r.round, r.call): r for r in recs if r.kind == "agent"}
    return [(by[(r.agent, r.round, r.call + 1)].t["start"] - r.t["end"]) / 1e9
            for r in by.values() if r.status == 429 and (r.agent, r.round, r.call + 1) in by]


def test_429_with_retry_after_seconds_is_rate_limited_and_the_retries_worked(tmp_path):
    with FakeServer(_limiter(lambda: {"Retry-After": "1"}, every=2)) as srv:
        summary, recs, meta = _run(tmp_path, srv, "secs", [])
    v = summary["verdict"]
    assert v["kind"] == "rate_limited", v
    limited = [r for r in recs if r.status == 429]
    assert limited and all(r.retry_after_s == 1.0 for r in limited)
    assert f"{len(limited)} of {len(recs)} requests answered HTTP 429" in v["summary"], v["summary"]
    assert "Retry-After asked for 1 s" in v["summary"] and "every rate-limited round completed" in v["summary"], v
    assert "server_errors" not in [s["kind"] for s in v.get("secondary", [])], v
    assert all(w >= 0.99 for w in _waits(recs)), _waits(recs)
    assert meta["scenario"]["agents"]["rate_limit_retries"] == 3
    assert meta["scenario"]["agents"]["retry_after_max_s"] == 30.0
    ev = " | ".join(v["evidence"])
    assert "agents.retry_after_max_s = 30 s" in ev and "agents.rate_limit_retries = 3" in ev, ev
    text = (tmp_path / "secs" / "report.txt").read_text()
    assert "retries: error_retries=3 rate_limit_retries=3 retry_after_max_s=30.0" in text
    html = (tmp_path / "secs" / "report.html").read_text()
    assert "rate_limit_retries" in html and "retry_after_max_s" in html


def test_retry_after_as_an_http_date_is_honoured(tmp_path):
    def headers():
        now = time.time()
        return {"Date": email.utils.formatdate(now, usegmt=True),
                "Retry-After": email.utils.formatdate(int(now) + 2, usegmt=True)}

    with FakeServer(_limiter(headers, every=2)) as srv:
        summary, recs, _ = _run(tmp_path, srv, "date", ["agents.count=1"])
    limited = [r for r in recs if r.status == 429]
    assert limited and all(1.0 <= r.retry_after_s <= 2.0 for r in limited), [r.retry_after_s for r in limited]
    waits = _waits(recs)
    assert waits and all(w >= 0.99 for w in waits), waits
    assert summary["verdict"]["kind"] == "rate_limited"


def test_retries_that_never_worked_stop_the_agents_and_say_so(tmp_path):
    with FakeServer(_limiter(lambda: {"Retry-After": "100"}, every=1)) as srv:
        summary, recs, _ = _run(tmp_path, srv, "never",
                                ["agents.rate_limit_retries=1", "agents.retry_after_max_s=0.3",
                                 "agents.error_retries=0"])
    v = summary["verdict"]
    assert v["kind"] == "rate_limited", v
    assert len(recs) == 4 and all(r.status == 429 for r in recs)  # 2 agents x (1 + 1 retry), round 1
    assert "0 of 2 rate-limited rounds completed after retrying, 2 agent(s) stopped" in v["summary"], v["summary"]
    ev = " | ".join(v["evidence"])
    assert "the server asked for up to 100 s" in ev and "retry_after_max_s = 0.3 s" in ev, ev
    assert all(0.29 <= w < 5 for w in _waits(recs)), _waits(recs)  # capped, not 100 s


def test_a_429_without_retry_after_backs_off_and_is_still_rate_limited(tmp_path):
    with FakeServer(_limiter(lambda: {}, every=3)) as srv:
        summary, recs, _ = _run(tmp_path, srv, "bare", [])
    v = summary["verdict"]
    assert v["kind"] == "rate_limited" and "no Retry-After header" in v["summary"], v


def test_retry_after_parsing():
    assert retry_after_s("3") == 3.0 and retry_after_s(" 0.5 ") == 0.5
    assert retry_after_s("-1") is None and retry_after_s("soon") is None and retry_after_s(None) is None
    assert retry_after_s("Wed, 21 Oct 2015 07:28:10 GMT", "Wed, 21 Oct 2015 07:28:00 GMT") == 10.0
    assert retry_after_s("Wed, 21 Oct 2015 07:28:00 GMT", "Wed, 21 Oct 2015 07:28:10 GMT") == 0.0
    assert retry_after_s("Wed, 21 Oct 2015 07:28:10 GMT", None, now=1445412480.0) == 10.0
