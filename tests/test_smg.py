"""agentload through a real router: SGLang's model gateway (`smg`) on loopback in front of two
mock backends (each a real `agentload.mock` process).

smg flags chosen for deterministic tests (besides the ports, `--policy round_robin` and
`--worker-startup-check-interval 1` set by SmgProcess):

- `--disable-retries`: smg retries a request that got no headers on the *other* worker after
  `--request-timeout-secs`, up to 5 attempts. With one hung backend and one healthy one, a
  retry would turn the hang into a slow success (or, with both hung, into a 504 after 5 x the
  timeout), depending on timing. With retries off, each request is exactly one attempt on the
  worker round robin chose, so the hung backend's `hung` counter equals agentload's stalled
  requests and the verdict's first round does not depend on the clock.
- `--request-timeout-secs 60`: a total per-attempt deadline that also cuts healthy streams; set
  far above the scenarios' `give_up_s` (5 s) and any stream here, so agentload's own stall
  detection, not the router's timeout, ends a hung request.
- `--sse-keepalive-secs 1` (stall-after-headers test only): smg pings (`: ping`) after 1 s of
  upstream silence instead of 15, so every stalled request receives several pings before
  agentload gives up on it; the mock itself is configured not to ping.

smg's worker-exclusion heuristics (`--worker-stall-secs`, `--worker-wedge-secs`) may stop routing
to the hung worker after a few seconds; that changes how many agents stall in later rounds,
never the first round or the phase, so the assertions hold either way.
"""

from __future__ import annotations

import orjson
import pytest

from agentload.mock.config import MockConfig
from agentload.records import load_records
from agentload.records.target_metrics import load_target_metrics
from helpers import hung_probes, run_scenario
from serverprocs import router_stack
from smgproc import SmgProcess, smg_executable

pytestmark = [
    pytest.mark.smg,
    pytest.mark.skipif(smg_executable() is None,
                       reason="the `smg` executable is missing (pip install smg, or pip install -e '.[test]')"),
]

FLAGS = ["--disable-retries", "--request-timeout-secs", "60"]
HANG_TOKENS = 6000  # long-context-hang: agents cross it in round 4
BACKEND = dict(decode_tokens_per_s=2000, output_tokens=16)


# stack(backends, flags) -> (smg, mocks); everything started is killed by PID at teardown, also when
# the test fails half-way
stack = router_stack(lambda tmp_path, urls, flags: SmgProcess.start(urls, tmp_path / "smg.log", flags))


def _through(smg: SmgProcess, *extra: str) -> list[str]:
    return [f'target.endpoint="{smg.url}"', f'target.metrics_urls=["{smg.metrics_url}"]',
            "target.metrics_every_s=0.5", *extra]


def test_healthy_run_through_smg_and_request_ids_reach_the_backends(tmp_path, stack):
    smg, (a, b) = stack([MockConfig(**BACKEND), MockConfig(**BACKEND)], FLAGS)
    res = run_scenario("healthy", tmp_path / "run", _through(smg))
    assert res.summary["verdict"]["kind"] == "healthy", res.text
    recs = load_records(tmp_path / "run" / "records.jsonl").records
    assert recs and all(r.outcome == "ok" for r in recs), res.text
    sa, sb = a.stats(), b.stats()
    # round robin used both workers, and every request reached one of them exactly once
    assert sa["completed"] > 0 and sb["completed"] > 0
    assert sa["requests_total"] + sb["requests_total"] == len(recs)
    assert len(recs) <= 200  # each mock keeps its last 100 ids: all of them fit
    # smg forwards X-Request-ID (it drops other x-* headers); agentload's body has no `user` or
    # `metadata`, so the id the mock logged came through the header: each record's id_sent (a UUID
    # derived from its readable request_id)
    seen = set(sa["last_request_ids"]) | set(sb["last_request_ids"])
    assert seen == {r.id_sent for r in recs}
    assert all(r.id_sent and r.id_sent != r.request_id for r in recs)
    # the router's metrics were scraped beside the run and line up with it
    tm = load_target_metrics(tmp_path / "run")
    assert tm.urls == [smg.metrics_url] and tm.scrapes[smg.metrics_url]["ok"] >= 2
    workers = {s.labels.get("worker") for s in tm.family(smg.metrics_url, "smg_worker_requests_total")}
    assert {a.base, b.base} <= workers
    assert res.summary["target_metrics"][smg.metrics_url]["failed"] == 0


def test_long_context_hang_on_one_backend_through_smg(tmp_path, stack):
    smg, (good, bad) = stack([MockConfig(**BACKEND), MockConfig(**BACKEND, hang_above_tokens=HANG_TOKENS)], FLAGS)
    res = run_scenario("long-context-hang", tmp_path / "run", _through(smg, "canary.every_s=1.0"))
    v = res.summary["verdict"]
    # smg sends no headers (and no pings) until the worker does: the hang shows as ttfb
    assert (v["kind"], v["phase"], v["first_round"]) == ("server_stall", "ttfb", 4), res.text
    recs = load_records(tmp_path / "run" / "records.jsonl").records
    stalled = [r for r in recs if r.kind == "agent" and r.stalled_phase]
    assert stalled and all(r.stalled_phase == "ttfb" and r.round >= 4 for r in stalled)
    assert all(r.prompt_tokens >= HANG_TOKENS for r in stalled)
    assert all(a["stalled_round"] >= 4 for a in res.summary["agents"] if a["outcome"] == "stalled")
    # retries off: every stalled request was one attempt on the hung backend, none on the good one
    assert good.stats()["hung"] == 0
    # ... and the stall probes that resent a stalled body hung there too, where smg sent them there
    assert bad.stats()["hung"] == len(stalled) + len(hung_probes(recs, HANG_TOKENS))
    # the router's own gauges name the worker the stalled requests sat on
    ev = "\n".join(v["evidence"])
    assert "smg_worker_requests_active = " in ev, ev
    assert f"on worker {bad.base} while" in ev and "what held them is behind the router" in ev, ev


def test_stall_after_headers_on_one_backend_smg_pings_do_not_hide_it(tmp_path, stack):
    smg, (good, bad) = stack(
        [MockConfig(**BACKEND), MockConfig(**BACKEND, stall_after_headers_above_tokens=HANG_TOKENS)],
        FLAGS + ["--sse-keepalive-secs", "1"])
    res = run_scenario("long-context-hang", tmp_path / "run", _through(smg, "canary.every_s=1.0"))
    v = res.summary["verdict"]
    # headers and the role-only chunk pass through smg, then only smg's pings: no token, so ttft
    assert (v["kind"], v["phase"], v["first_round"]) == ("server_stall", "ttft", 4), res.text
    recs = load_records(tmp_path / "run" / "records.jsonl").records
    stalled = [r for r in recs if r.kind == "agent" and r.stalled_phase]
    assert stalled and all(r.stalled_phase == "ttft" and r.round >= 4 for r in stalled)
    # bytes flowed (smg's `: ping` comments), tokens did not; the mock itself sent no ping
    assert all(r.comments >= 1 and r.token_chunks == 0 for r in stalled), [(r.comments, r.token_chunks) for r in stalled]
    # (the stall probes that resent a stalled body stalled there too, where smg sent them)
    assert bad.stats()["pings"] == 0 and bad.stats()["stalled"] == len(stalled) + len(hung_probes(recs, HANG_TOKENS))
    assert good.stats()["stalled"] == 0
    assert any("': ping'" in e for e in v["evidence"]), v["evidence"]
    summary = orjson.loads((tmp_path / "run" / "summary.json").read_bytes())
    assert summary["verdict"]["kind"] == "server_stall"


def test_agentload_proxy_in_front_of_smg_keeps_per_backend_attribution(tmp_path, stack):
    """A real harness (the openai SDK) -> agentload proxy -> smg -> two mock backends: each recorded
    request names the backend that answered (smg passes `system_fingerprint` through)."""
    import asyncio

    from test_proxy import harness, records, start_proxy, stop_proxy

    smg, _ = stack([MockConfig(name="b1", tool_call_rounds=2, **BACKEND),
                    MockConfig(name="b2", tool_call_rounds=2, **BACKEND)], FLAGS)
    smg.wait_ready(2, 30)
    out = tmp_path / "proxy"
    child, port = start_proxy(smg.url, out)
    try:
        async def fleet():
            return await asyncio.gather(*(harness(port, f"a{i}", 5) for i in range(4)))
        seen = asyncio.run(fleet())
    finally:
        code, text = stop_proxy(child)
    assert all(len(s) == 3 for s in seen), seen  # tool calls in rounds 1-2, then a plain answer
    recs = [r for r in records(out) if r["kind"] == "agent"]
    assert len(recs) == 12 and all(r["outcome"] == "ok" for r in recs)
    assert {r["backend"] for r in recs} == {"b1", "b2"}
    assert sorted({(r["agent"], r["round"]) for r in recs}) == [(a, n) for a in range(4) for n in (1, 2, 3)]
    assert code == 0 and "VERDICT [healthy]" in text, text


def test_trace_context_reaches_the_backends_through_smg(tmp_path, stack):
    """Every request's `traceparent` arrives at the backend smg chose (a second way, beside the request
    id, to join a backend's log line to agentload's record), and the session header rides along."""
    logs = [tmp_path / "b1.log", tmp_path / "b2.log"]
    smg, _ = stack([MockConfig(name="b1", request_log=str(logs[0]), **BACKEND),
                    MockConfig(name="b2", request_log=str(logs[1]), **BACKEND)], FLAGS)
    res = run_scenario("healthy", tmp_path / "run", _through(smg, 'target.session_header="X-SMG-Routing-Key"'))
    assert res.summary["verdict"]["kind"] == "healthy", res.text
    recs = [r for r in load_records(tmp_path / "run" / "records.jsonl").records if r.kind == "agent"]
    logged = {}
    for p in logs:
        for line in p.read_bytes().splitlines():
            d = orjson.loads(line)
            logged[d["traceparent"]] = d["backend"]
    joined = [r for r in recs if r.traceparent in logged]
    assert len(joined) == len(recs), f"{len(joined)} of {len(recs)} joined by traceparent"
    assert all(logged[r.traceparent] == r.backend for r in joined)  # the same backend the answer named
