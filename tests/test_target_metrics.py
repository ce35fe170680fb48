"""The target's Prometheus metrics: scraping (bounded, delta-encoded), reading back, and the
evidence the verdict draws from them. Against small local HTTP servers; no router needed."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import orjson
import pytest
from aiohttp import web

from agentload.analysis.target_evidence import target_evidence
from agentload.analysis.verdict import diagnose
from agentload.records import Record
from agentload.records.rundir import load_run
from agentload.records.target_metrics import (
    chosen_series,
    load_target_metrics,
    parse_key,
)
from agentload.report.target_chart import fig_target_metrics
from agentload.run.scraper import TargetScraper, parse_exposition, series_key

PAGES = [
    '# TYPE up gauge\nup 1\n# TYPE smg_worker_requests_active gauge\n'
    'smg_worker_requests_active{worker="http://w1"} 0\nsmg_worker_requests_active{worker="http://w2"} 2\n',
    '# TYPE up gauge\nup 1\n# TYPE smg_worker_requests_active gauge\n'
    'smg_worker_requests_active{worker="http://w1"} 0\nsmg_worker_requests_active{worker="http://w2"} 5\n'
    '# TYPE new_total counter\nnew_total 3\n',
    '# TYPE smg_worker_requests_active gauge\n'
    'smg_worker_requests_active{worker="http://w1"} 1\nsmg_worker_requests_active{worker="http://w2"} 5\n'
    '# TYPE new_total counter\nnew_total 3\n',
]


@pytest.mark.parametrize("labels", [{}, {"a": "x"}, {"b": 'quo"te', "a": "back\\slash"}, {"n": "new\nline", "e": ""}])
def test_series_key_round_trips(labels):
    key = series_key("m_total", labels)
    assert parse_key(key) == ("m_total", labels)
    if labels:  # the same text the exposition format uses, so it parses there too
        text = f"# TYPE m counter\n{key} 1\n"
        assert parse_exposition(text) == {key: 1.0}


async def _serve(handlers: dict[str, object]) -> tuple[web.AppRunner, int]:
    app = web.Application()
    for path, h in handlers.items():
        app.router.add_get(path, h)
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, runner.addresses[0][1]


def test_scraper_writes_deltas_and_errors_and_the_loader_rebuilds_the_series(tmp_path):
    served = {"n": 0}

    async def metrics(request):
        i = min(served["n"], len(PAGES) - 1)
        served["n"] += 1
        return web.Response(text=PAGES[i])

    async def broken(request):
        return web.Response(status=500, text="no")

    async def slow(request):
        await asyncio.sleep(30)
        return web.Response(text="up 1\n")

    async def go():
        runner, port = await _serve({"/metrics": metrics, "/broken": broken, "/slow": slow})
        base = f"http://127.0.0.1:{port}"
        urls = [base + "/metrics", base + "/broken", base + "/slow"]
        sc = TargetScraper(urls, 0.2, tmp_path / "target_metrics.jsonl")
        task = asyncio.create_task(sc.run())
        deadline = time.monotonic() + 30
        # wait for what was written, not what was served: parsing runs in a thread and lags under load
        while (sc.ok[urls[0]] < len(PAGES) + 1 or sc.failed[urls[2]] < 1) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        sc.close()
        await runner.cleanup()
        return urls

    urls = asyncio.run(go())
    lines = [orjson.loads(l) for l in (tmp_path / "target_metrics.jsonl").read_bytes().splitlines()]
    ok_lines = [l for l in lines if l["url"] == urls[0]]
    assert ok_lines[0]["full"] and len(ok_lines[0]["v"]) == 3
    assert ok_lines[1]["v"] == {"smg_worker_requests_active{worker=\"http://w2\"}": 5.0, "new_total": 3.0}
    assert ok_lines[2]["gone"] == ["up"] and ok_lines[3]["v"] == {}
    assert all("error" in l and "HTTP 500" in l["error"] for l in lines if l["url"] == urls[1])
    assert all(l["error"].startswith("timeout after") for l in lines if l["url"] == urls[2])

    (tmp_path / "run.json").write_bytes(orjson.dumps({"t0_ns": ok_lines[0]["t"],
                                                      "scenario": {"target": {"metrics_urls": urls}}}))
    tm = load_target_metrics(tmp_path)
    assert tm.urls == urls  # in the scenario's order
    assert tm.scrapes[urls[1]]["ok"] == 0 and tm.scrapes[urls[1]]["failed"] >= 1
    w2 = tm.series[(urls[0], 'smg_worker_requests_active{worker="http://w2"}')]
    assert w2.values[:2] == [2.0, 5.0] and w2.t_s[0] == 0.0
    assert w2.labels == {"worker": "http://w2"}
    up = tm.series[(urls[0], "up")]
    assert up.values == [1.0, None]  # disappeared on the third scrape
    assert tm.series[(urls[0], 'smg_worker_requests_active{worker="http://w1"}')].at(ok_lines[2]["t"]) == 1.0
    assert tm.series[(urls[0], 'smg_worker_requests_active{worker="http://w1"}')].at(ok_lines[1]["t"]) == 0.0
    names = {s.name for s in chosen_series(tm)}
    assert names == {"smg_worker_requests_active"}


# ---------------------------------------------------------------- evidence in the verdict

T0 = 1_000_000_000_000
S = 1_000_000_000


def _rec(agent: int, rnd: int, sent_s: float, end_s: float, stalled: str | None, outcome: str,
         tokens: int) -> Record:
    t = {"start": T0 + int(sent_s * S) - 1000, "sent": T0 + int(sent_s * S), "end": T0 + int(end_s * S)}
    if outcome == "ok":
        t.update(headers=t["sent"] + 1000, first_byte=t["sent"] + 2000, first_token=t["sent"] + 3000)
    return Record(1, "run", "agent", agent, rnd, 0, f"run-a{agent}-r{rnd}-c0", 3, 100, tokens, None, None,
                  200 if outcome == "ok" else None, outcome, None if outcome == "ok" else "stall_give_up", None,
                  stalled, True, "tool_calls" if outcome == "ok" else None, 1, 5, 3, 0, 0, 0, t)


def _run_dir(tmp_path: Path, router_active: dict[str, float], engine_running: float) -> Path:
    meta = {"run": "run", "t0_ns": T0, "t0_unix": 0.0, "ended": True, "ended_normally": True,
            "scenario": {"stall": {"after_s": 1.0, "give_up_s": 5.0}, "client": {"limit": 100},
                         "agents": {"rounds": 3}, "conversation": {"mode": "scripted"}}}
    (tmp_path / "run.json").write_bytes(orjson.dumps(meta))
    recs = [_rec(a, 1, 0.1 * a, 0.1 * a + 0.2, None, "ok", 1000) for a in range(3)]
    recs += [_rec(a, 2, 2.0, 8.0, "ttfb", "stalled", 7000) for a in range(3)]
    (tmp_path / "records.jsonl").write_bytes(b"".join(r.to_json() + b"\n" for r in recs))
    url = "http://127.0.0.1:29000/metrics"
    lines = []
    for t in (1.0, 4.0, 7.0, 9.0):
        v = {series_key("smg_worker_requests_active", {"worker": w}): (x if 2 <= t <= 8 else 0.0)
             for w, x in router_active.items()}
        v["vllm:num_requests_running"] = engine_running
        lines.append({"t": T0 + int(t * S), "t_start": T0 + int(t * S) - 1000, "url": url, "ms": 1.0, "full": True,
                      "v": v})
    lines.append({"t": T0 + 10 * S, "url": "http://127.0.0.1:1/metrics", "error": "ClientConnectorError: refused"})
    (tmp_path / "target_metrics.jsonl").write_bytes(b"".join(orjson.dumps(l) + b"\n" for l in lines))
    return tmp_path


def test_router_reporting_zero_active_while_agents_wait_is_named(tmp_path):
    run = load_run(_run_dir(tmp_path, {"http://w1": 0.0, "http://w2": 0.0}, 0.0))
    v = diagnose(run)
    assert v["kind"] == "server_stall" and v["phase"] == "ttfb"
    ev = "\n".join(v["evidence"])
    assert ("the router reported 0 active requests for every worker while 3 agent request(s) waited for "
            "response headers (ttfb)") in ev, ev
    assert "smg_worker_requests_active = 0 for worker http://w1, 0 for worker http://w2" in ev
    assert "vllm:num_requests_running = 0 running requests" in ev
    assert "target metrics http://127.0.0.1:1/metrics: every scrape failed (1)" in ev


def test_router_holding_the_stalled_requests_on_one_worker_is_named(tmp_path):
    run = load_run(_run_dir(tmp_path, {"http://w1": 0.0, "http://w2": 3.0}, 3.0))
    ev = target_evidence(run, [r for r in run.records if r.stalled_phase])
    text = "\n".join(ev)
    assert "at +4.0 s, while 3 agent request(s) waited for response headers (ttfb)" in text, text
    assert "smg_worker_requests_active = 3 for worker http://w2, 0 for worker http://w1" in text
    assert "held 3 of its 3 active request(s) on worker http://w2" in text and "behind the router" in text
    fig = fig_target_metrics(run)
    assert fig is not None and any("smg_worker_requests_active" in (tr.name or "") for tr in fig.data)


def test_no_target_metrics_no_evidence_no_figure(tmp_path):
    run = load_run(_run_dir(tmp_path, {"http://w1": 0.0}, 0.0))
    (tmp_path / "target_metrics.jsonl").unlink()
    assert target_evidence(run, [r for r in run.records if r.stalled_phase]) == []
    assert fig_target_metrics(load_run(tmp_path)) is None


@pytest.mark.slow
def test_html_report_charts_the_target_metrics_and_renders_in_chromium(tmp_path):
    from agentload.report.build import write_reports
    from devtools import check_page_sync, find_chromium

    run_dir = _run_dir(tmp_path, {"http://w1": 0.0, "http://w2": 3.0}, 3.0)
    write_reports(run_dir)
    page = run_dir / "report.html"
    assert "fig-target" in page.read_text()
    chromium = find_chromium()
    if chromium is None:
        pytest.skip("chromium is not installed (apt-get install chromium; .ci/run installs it)")
    res = check_page_sync(page, chromium=chromium, timeout=60)
    assert res.ok, res.problems()
    assert res.ids[-1] == "fig-target" and res.drawn == res.expected == len(res.ids)


# ---------------------------------------------------------------- routers' per-worker counters

def _counter_run(tmp_path: Path, recs: list[Record], pages: list[tuple[float, dict[str, float]]]) -> Path:
    """A run folder whose one router URL served `pages` ((seconds, {series key: value}), full scrapes)."""
    meta = {"run": "run", "t0_ns": T0, "t0_unix": 0.0, "ended": True, "ended_normally": True,
            "scenario": {"stall": {"after_s": 1.0, "give_up_s": 5.0}, "client": {"limit": 100},
                         "agents": {"rounds": 3}, "conversation": {"mode": "scripted"}}}
    (tmp_path / "run.json").write_bytes(orjson.dumps(meta))
    (tmp_path / "records.jsonl").write_bytes(b"".join(r.to_json() + b"\n" for r in recs))
    url = "http://127.0.0.1:29000/metrics"
    lines = [{"t": T0 + int(t * S), "t_start": T0 + int(t * S) - 1000, "url": url, "ms": 1.0, "full": True, "v": v}
             for t, v in pages]
    (tmp_path / "target_metrics.jsonl").write_bytes(b"".join(orjson.dumps(l) + b"\n" for l in lines))
    return tmp_path


def _page(prefix: str, routed_name: str, routed: dict[str, float], ok: dict[str, float],
          failed: dict[str, float] | None = None, retries: float = 0.0) -> dict[str, float]:
    v = {series_key(routed_name, {"worker": w, **({"policy": "round_robin"} if prefix == "vllm_router" else {})}): n
         for w, n in routed.items()}
    v.update({series_key(f"{prefix}_cb_outcomes_total", {"worker": w, "outcome": "success"}): n for w, n in ok.items()})
    v.update({series_key(f"{prefix}_cb_outcomes_total", {"worker": w, "outcome": "failure"}): n
              for w, n in (failed or {}).items()})
    v[series_key(f"{prefix}_retries_total" if prefix == "vllm_router" else "smg_worker_retries_total",
                 {"route": "/v1/chat/completions"})] = retries
    return v


def _vr(routed, ok, failed=None, retries=0.0):
    return _page("vllm_router", "vllm_router_policy_decisions_total", routed, ok, failed, retries)


def test_vllm_router_unended_attempts_name_the_worker_holding_the_stalled_requests(tmp_path):
    """vllm-router has no in-flight gauge: routed - outcomes per worker, above what an earlier
    scrape saw (an attempt abandoned before the run never ends: it is not this run's)."""
    recs = [_rec(a, 1, 0.1 * a, 0.1 * a + 0.2, None, "ok", 1000) for a in range(3)]
    recs += [_rec(a, 2, 2.0, 8.0, "ttfb", "stalled", 7000) for a in range(3)]
    w1, w2 = "http://w1", "http://w2"
    pages = [(1.0, _vr({w1: 2, w2: 7}, {w1: 2, w2: 2})),  # 5 left on w2 by an earlier run
             (4.0, _vr({w1: 3, w2: 10}, {w1: 3, w2: 2})),
             (7.0, _vr({w1: 3, w2: 10}, {w1: 3, w2: 2})),
             (9.0, _vr({w1: 3, w2: 10}, {w1: 3, w2: 2}))]
    v = diagnose(load_run(_counter_run(tmp_path, recs, pages)))
    assert v["kind"] == "server_stall"
    ev = "\n".join(v["evidence"])
    assert ("while 3 agent request(s) waited for response headers (ttfb): attempts routed and not ended "
            "(vllm_router_policy_decisions_total - vllm_router_cb_outcomes_total, above the fewest an earlier "
            "scrape saw) = 3 for worker http://w2, 0 for worker http://w1") in ev, ev
    assert "the router held 3 of its 3 unended attempt(s) on worker http://w2" in ev, ev
    assert "the router counted 3 of its 3 attempt(s) that never ended on worker http://w2 while 3 agent" in ev, ev


def test_smg_failure_outcomes_name_the_worker_behind_server_errors(tmp_path):
    recs = [_rec(a, 1, 0.1 * a, 0.1 * a + 0.2, None, "ok", 1000) for a in range(4)]
    recs += [_err_rec(a, 2, 2.0, 2.1) for a in range(2)]
    w1, w2 = "http://w1", "http://w2"
    smg = lambda routed, ok, failed: _page("smg_worker", "smg_worker_requests_total", routed, ok, failed)  # noqa: E731
    pages = [(0.5, smg({w1: 0, w2: 0}, {}, {})),
             (3.0, smg({w1: 2, w2: 4}, {w1: 2, w2: 2}, {w2: 2}))]
    v = diagnose(load_run(_counter_run(tmp_path, recs, pages)))
    assert v["kind"] == "server_errors", v
    ev = "\n".join(v["evidence"])
    assert ('smg_worker_cb_outcomes_total{outcome="failure"} grew by 2 for worker http://w2, 0 for worker http://w1'
            in ev), ev
    assert ("the router counted 2 of its 2 failed attempt(s) on worker http://w2 while 2 agent request(s) failed "
            "(http_500 x2): they came from that worker") in ev, ev


def test_failures_a_router_retried_out_of_sight_are_a_warning_naming_the_worker(tmp_path):
    """Agents saw every answer go right (healthy), but the router counted failures on one worker
    and retried them: a warning, not a verdict (the answers agentload got were right)."""
    from agentload.analysis.summary import build_summary

    recs = [_rec(a, 1, 0.1 * a, 0.1 * a + 0.2, None, "ok", 1000) for a in range(4)]
    w1, w2 = "http://w1", "http://w2"
    pages = [(0.05, _vr({w1: 0, w2: 0}, {})),
             (1.0, _vr({w1: 2, w2: 4}, {w1: 2, w2: 2}, {w2: 2}, retries=2))]
    summary = build_summary(load_run(_counter_run(tmp_path, recs, pages)))
    assert summary["verdict"]["kind"] == "healthy"
    w = [x for x in summary["warnings"] if "hid" in x]
    assert w == ['router http://127.0.0.1:29000/metrics (vllm-router) counted 2 failed attempt(s) on its workers '
                 '(2 for worker http://w2; vllm_router_cb_outcomes_total{outcome="failure"}) and 2 retries '
                 '(vllm_router_retries_total), while agents saw 0 server error(s): the router hid 2 failure(s) by '
                 'retrying them; worker http://w2 is failing requests'], summary["warnings"]


def _err_rec(agent: int, rnd: int, sent_s: float, end_s: float) -> Record:
    t = {"start": T0 + int(sent_s * S) - 1000, "sent": T0 + int(sent_s * S), "end": T0 + int(end_s * S)}
    t["headers"] = t["sent"] + 1000
    return Record(1, "run", "agent", agent, rnd, 0, f"run-a{agent}-r{rnd}-c0", 3, 100, 7000, None, None,
                  500, "error", "http_500", "HTTP 500: boom", None, True, None, 1, 5, 3, 0, 0, 0, t)


# ---------------------------------------------------------------- LiteLLM: a key for /metrics, per-deployment counters


def test_scraper_sends_the_metrics_key_to_the_metrics_urls_only(tmp_path, monkeypatch):
    """`[target] metrics_api_key_env`: the scraper's bearer token (LiteLLM's /metrics answers 401
    without its master key); never in target_metrics.jsonl, never on the agents' requests."""
    from agentload import redact
    from agentload.run.scenario import load_scenario
    from agentload.run.transport import request_headers

    key = "sk-metrics-only-0123456789"
    seen: list[str | None] = []

    async def metrics(request):
        seen.append(request.headers.get("Authorization"))
        if request.headers.get("Authorization") != f"Bearer {key}":
            return web.Response(status=401, text=f"Unauthorized, got {request.headers.get('Authorization')}")
        return web.Response(text=PAGES[0])

    async def go(api_key):
        runner, port = await _serve({"/metrics": metrics})
        url = f"http://127.0.0.1:{port}/metrics"
        sc = TargetScraper([url], 0.2, tmp_path / f"tm-{bool(api_key)}.jsonl", api_key=api_key)
        await sc.baseline()
        await sc.aclose()
        await runner.cleanup()
        return sc.state()[url]

    try:
        # a baseline scrape before the run and a last one at its end (aclose)
        assert asyncio.run(go(key)) == {"ok": 2, "failed": 0}
        assert asyncio.run(go(None)) == {"ok": 0, "failed": 2}
        assert seen == [f"Bearer {key}"] * 2 + [None] * 2
        assert b"HTTP 401" in (tmp_path / "tm-False.jsonl").read_bytes()
        for f in tmp_path.iterdir():
            assert key.encode() not in f.read_bytes()
        monkeypatch.setenv("AGENTLOAD_T_METRICS_KEY", key)
        sc = load_scenario("demo", ['target.metrics_api_key_env="AGENTLOAD_T_METRICS_KEY"'])
        assert "Authorization" not in request_headers(sc.target)  # the agents' requests do not get it
        assert redact.redact(f"x {key} y") == "x *** y"
    finally:
        redact.clear()


def test_an_unset_metrics_api_key_env_stops_the_run_up_front(monkeypatch):
    from agentload.errors import UserError
    from agentload.launch import check_secrets
    from agentload.run.scenario import load_scenario

    monkeypatch.delenv("AGENTLOAD_T_UNSET_METRICS", raising=False)
    sc = load_scenario("demo", ['target.metrics_api_key_env="AGENTLOAD_T_UNSET_METRICS"'])
    with pytest.raises(UserError) as e:
        check_secrets(sc)
    line = str(e.value)
    assert "\n" not in line and "target.metrics_api_key_env" in line and "AGENTLOAD_T_UNSET_METRICS" in line, line
    assert "not set" in line, line


def _litellm_page(ok: dict[str, float], failed: dict[str, float], rejected: float = 0.0) -> dict[str, float]:
    """LiteLLM's per-deployment counters (label api_base; api_base "" for a request refused before routing)."""
    v = {}
    for w in set(ok) | set(failed):
        v[series_key("litellm_deployment_success_responses_total", {"api_base": w, "model_group": "m"})] = ok.get(w, 0)
        v[series_key("litellm_deployment_failure_responses_total",
                     {"api_base": w, "model_group": "m", "exception_class": "APITimeoutError"})] = failed.get(w, 0)
        v[series_key("litellm_deployment_total_requests_total", {"api_base": w, "model_group": "m"})] = \
            ok.get(w, 0) + failed.get(w, 0)
    v[series_key("litellm_deployment_failure_responses_total", {"api_base": "", "exception_class": "Exception"})] = rejected
    v["litellm_in_flight_requests"] = 1.0
    return v


def test_litellm_failure_counters_name_the_deployment_behind_server_errors(tmp_path):
    recs = [_rec(a, 1, 0.1 * a, 0.1 * a + 0.2, None, "ok", 1000) for a in range(4)]
    recs += [_err_rec(a, 2, 2.0, 2.1) for a in range(2)]
    w1, w2 = "http://w1/v1", "http://w2/v1"
    pages = [(0.5, _litellm_page({w1: 0, w2: 0}, {})),
             (3.0, _litellm_page({w1: 2, w2: 2}, {w2: 2}, rejected=5))]  # rejects before routing: no deployment
    v = diagnose(load_run(_counter_run(tmp_path, recs, pages)))
    assert v["kind"] == "server_errors", v
    ev = "\n".join(v["evidence"])
    assert ("(litellm) counted failed attempts over the run (+0.5 .. +3.0 s): litellm_deployment_failure_responses_total "
            "grew by 2 for worker http://w2/v1, 0 for worker http://w1/v1") in ev, ev
    assert ("the router counted 2 of its 2 failed attempt(s) on worker http://w2/v1 while 2 agent request(s) failed "
            "(http_500 x2): they came from that worker") in ev, ev
    assert "never ended" not in ev  # it counts an attempt when it ends: nothing unended to read
