"""The router soak bench end to end: `[fleet]` mock backends and a real router (smg, vllm-router)
started by agentload itself from the scenario, scheduled faults applied to live backends, and every
request attributed to the backend that served it (system_fingerprint, else the backend's request log
joined by request id). Everything on 127.0.0.1, bounded in count and duration.

smg and vllm-router come with .ci/run (smg with '.[test]'); the tests skip without them only when CI
is unset.
"""

from __future__ import annotations

import os

import orjson
import pytest

from agentload.records import load_records
from helpers import run_scenario
from routerprocs import executable
from smgproc import smg_executable

pytestmark = [pytest.mark.smg]

needs_smg = pytest.mark.skipif(smg_executable() is None and not os.environ.get("CI"),
                               reason="`smg` is missing (pip install -e '.[test]')")
needs_vllm_router = pytest.mark.skipif(executable("vllm-router") is None and not os.environ.get("CI"),
                                       reason="`vllm-router` is missing (pip install vllm-router==0.1.17)")

# short soaks: small agent counts, seconds not minutes
SHORT = ["agents.count=12", "agents.start=1.0", "canary.every_s=1.0", "target.metrics_every_s=1.0"]


def _records(out):
    return [r for r in load_records(out / "records.jsonl").records if r.kind == "agent"]


def _summary(out):
    return orjson.loads((out / "summary.json").read_bytes())


def _log_lines(out, name):
    path = out / "fleet" / f"{name}.requests.jsonl"
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def _hit_rate(recs, min_round=2):
    cached = sum(r.cached_tokens or 0 for r in recs if r.round >= min_round and r.cached_tokens is not None)
    prompt = sum(r.server_prompt_tokens or 0 for r in recs if r.round >= min_round and r.cached_tokens is not None)
    return cached / prompt if prompt else 0.0


def _ttft_p50(recs, min_round=2):
    vals = sorted(r.t["first_token"] - r.t["start"] for r in recs
                  if r.round >= min_round and "first_token" in r.t and "start" in r.t)
    return vals[len(vals) // 2]


@needs_smg
def test_smg_fleet_attributes_every_request_and_cache_aware_beats_round_robin(tmp_path):
    runs = {}
    for policy in ("round_robin", "cache_aware"):
        out = tmp_path / policy
        run_scenario("router-soak-smg", out, SHORT + ["agents.duration_s=7", "schedule=[]",
                                                       f"router.policy=\"{policy}\""])
        runs[policy] = out
        recs = _records(out)
        assert recs and all(r.outcome == "ok" for r in recs)
        # attribution: every answer names its backend, through smg
        assert {r.backend for r in recs} == {"b0", "b1", "b2"}
        # the backends' own logs hold every request, joined by the id agentload sent
        logged = {line["id"]: line["backend"] for b in ("b0", "b1", "b2") for line in _log_lines(out, b)}
        assert all(logged.get(r.id_sent) == r.backend for r in recs)
        meta = orjson.loads((out / "run.json").read_bytes())
        assert [b["name"] for b in meta["fleet"]["backends"]] == ["b0", "b1", "b2"]
        assert meta["fleet"]["router"]["policy"] == policy
    rr, ca = _records(runs["round_robin"]), _records(runs["cache_aware"])
    # the mock's prefix cache makes the difference deterministic enough to assert the order
    assert _hit_rate(ca) > _hit_rate(rr) + 0.2, (_hit_rate(ca), _hit_rate(rr))
    assert _ttft_p50(ca) < _ttft_p50(rr)


@needs_smg
def test_scheduled_hang_is_attributed_to_the_backend(tmp_path):
    out = tmp_path / "hang"
    run_scenario("router-soak-smg", out, SHORT + [
        "agents.duration_s=14", "router.policy=\"round_robin\"", "stall.after_s=1.0", "stall.give_up_s=3.0",
        "schedule=[{at_s=3.0, backend=\"b1\", fault=\"hang\", for_s=6.0}]"])
    events = [orjson.loads(x) for x in (out / "schedule.jsonl").read_bytes().splitlines()]
    assert [(e["event"], e["ok"]) for e in events] == [("start", True), ("end", True)]
    start_ns, end_ns = events[0]["at_ns"], events[1]["at_ns"]
    recs = _records(out)
    stalled = [r for r in recs if r.stalled_phase is not None]
    assert stalled
    # every stalled request was at b1 (its own answer, or b1's request log by request id)
    at_b1 = {line["id"] for line in _log_lines(out, "b1")}
    assert all(r.id_sent in at_b1 for r in stalled)
    assert all(r.t["start"] < end_ns and r.t["end"] > start_ns for r in stalled)
    # the hang ended: b1 served again afterwards
    assert any(line["recv_ns"] > end_ns and line["outcome"] == "ok" for line in _log_lines(out, "b1"))
    summary = _summary(out)
    v = summary["verdict"]
    assert v["kind"] != "healthy"
    # the verdict names the backend and its scheduled fault
    assert any("b1" in line and "scheduled hang" in line for line in [v["summary"], *v["evidence"]]), v
    # failover figures, consistent with the records and the backend's log
    fault = summary["router"]["faults"][0]
    assert (fault["backend"], fault["fault"], fault["applied"]) == ("b1", "hang", True)
    assert fault["client_stalls"] == len([r for r in stalled if r.t["start"] < end_ns])
    sent_after = [line for line in _log_lines(out, "b1") if start_ns <= line["recv_ns"] < end_ns]
    assert fault["sent_there"]["backend_log"] == len(sent_after)
    assert fault["stopped_routing_after_s"] == "never" or 0 <= fault["stopped_routing_after_s"] <= 6.0
    assert fault["used_again_after_s"] is not None and fault["used_again_after_s"] >= 0
    report = (out / "report.txt").read_text()
    assert "ROUTER" in report and "fault 1: hang b1" in report


@needs_smg
def test_a_fault_that_cannot_be_applied_keeps_the_verdict_from_healthy(tmp_path):
    out = tmp_path / "bad-schedule"
    # b0 is killed at 1 s; the hang meant for it at 2 s finds no process to apply it to
    run_scenario("router-soak-smg", out, SHORT + [
        "agents.duration_s=5", "router.policy=\"round_robin\"",
        "schedule=[{at_s=1.0, backend=\"b0\", fault=\"kill\", for_s=3.0}, "
        "{at_s=2.0, backend=\"b0\", fault=\"hang\", for_s=1.0}]"])
    v = _summary(out)["verdict"]
    assert v["kind"] == "agentload_error"
    assert any("ScheduleFailed" in line and "hang" in line for line in v["evidence"]), v["evidence"]


@needs_smg
def test_scheduled_kill_and_restart_loses_nothing(tmp_path):
    out = tmp_path / "kill"
    run_scenario("router-soak-smg", out, SHORT + [
        "agents.duration_s=14", "router.policy=\"round_robin\"",
        "schedule=[{at_s=3.0, backend=\"b2\", fault=\"kill\", for_s=4.0}]"])
    events = [orjson.loads(x) for x in (out / "schedule.jsonl").read_bytes().splitlines()]
    assert [(e["event"], e["ok"]) for e in events] == [("start", True), ("end", True)]
    end_ns = events[1]["at_ns"]
    loaded = load_records(out / "records.jsonl")
    assert loaded.torn_lines == 0
    meta = orjson.loads((out / "run.json").read_bytes())
    assert meta["ended"] and meta["ended_normally"]
    recs = [r for r in loaded.records if r.kind == "agent"]
    # the restarted backend serves again, on the same port, after the window
    assert any(r.backend == "b2" and r.t["start"] > end_ns and r.outcome == "ok" for r in recs)
    start_ns = events[0]["at_ns"]
    fault = _summary(out)["router"]["faults"][0]
    errors_in_window = [r for r in recs if r.outcome == "error" and r.t["start"] < end_ns and r.t["end"] > start_ns]
    assert fault["client_errors"] == len(errors_in_window)
    assert fault["used_again_after_s"] is not None and fault["used_again_after_s"] >= 0


@needs_vllm_router
def test_vllm_router_fleet_attributes_requests(tmp_path):
    out = tmp_path / "vr"
    run_scenario("router-soak-vllm-router", out, SHORT + ["agents.duration_s=6", "schedule=[]",
                                                          "router.policy=\"round_robin\""])
    recs = _records(out)
    assert recs and all(r.outcome == "ok" for r in recs)
    assert {r.backend for r in recs} == {"b0", "b1", "b2"}


@needs_smg
def test_pd_incident_stalls_in_round_4_on_the_hanging_decode_worker(tmp_path):
    out = tmp_path / "pd"
    run_scenario("router-pd-incident", out)
    summary = _summary(out)
    v = summary["verdict"]
    assert v["kind"] == "server_stall"
    assert v["first_round"] == 4
    recs = _records(out)
    stalled = [r for r in recs if r.outcome == "stalled"]
    assert stalled
    # each stalled request reached the hanging decode worker d1 (its request log, by request id)
    at_d1 = {line["id"] for line in _log_lines(out, "d1")}
    assert all(r.id_sent in at_d1 for r in stalled)
    # completed answers were streamed by a decode worker, never by a prefill one
    assert {r.backend for r in recs if r.outcome == "ok"} <= {"d0", "d1"}
    # the verdict names the decode worker and its role
    assert any("decode worker d1" in line for line in [v["summary"], *v["evidence"]]), v["evidence"]


@needs_smg
def test_pd_mode_reports_the_routers_own_time_to_the_prefill_workers_too(tmp_path):
    """smg in PD mode sends each request to a prefill and a decode worker; both log it with the
    traceparent agentload sent, so the router's own time is reported to each role's workers.
    Three rounds stay under d1's hang (5,000 prompt tokens)."""
    out = tmp_path / "pd"
    run_scenario("router-pd-incident", out, ["agents.count=4", "agents.rounds=3", "agents.start=0.5",
                                             "canary.every_s=0"])
    recs = _records(out)
    assert len(recs) == 12 and all(r.outcome == "ok" for r in recs)
    rt = _summary(out)["router"]["router_time"]
    for role, names in (("decode", {"d0", "d1"}), ("prefill", {"p0", "p1"})):
        x = rt if role == "decode" else rt["prefill"]
        # smg forwards traceparent to both workers: every request joined by it at each role
        assert (x["by_traceparent"], x["by_id"]) == (12, 0), (role, x)
        assert set(x["backends"]) <= names
        timed = sum(h["n"] for h in x["backends"].values() if h)
        assert timed + x["before_sent"] == 12 and timed == x["all"]["n"], (role, x)
        if timed:  # (on a loaded machine agentload's send stamp can come after every arrival: all before_sent)
            assert 0 <= x["all"]["p50_ms"] <= x["all"]["p99_ms"]
    # the prefill workers' logs have every request once (smg's PD pairs one prefill with one decode)
    at_prefill = [line["traceparent"] for p in ("p0", "p1") for line in _log_lines(out, p)]
    assert sorted(at_prefill) == sorted(r.traceparent for r in recs)
    text = (out / "report.txt").read_text()
    assert "router's own time to the prefill workers (request sent -> arrival in the prefill worker's log, 12 " \
           "joined by traceparent, 0 by request id)" in text


@pytest.mark.litellm
@pytest.mark.slow
def test_litellm_already_running_in_front_of_the_fleet_keeps_attribution(tmp_path, monkeypatch):
    """The other mode: the router runs already (no [router] command); the fleet's backends listen on
    fixed ports the router was configured with. LiteLLM re-encodes every chunk: the backend's name
    must survive that (system_fingerprint), else the request log join gives it."""
    from agentload.process import free_port
    from routerprocs import LiteLLMProcess, litellm_executable

    assert litellm_executable() or not os.environ.get("CI"), "LiteLLM's proxy is missing (.ci/run installs it)"
    if litellm_executable() is None:
        pytest.skip("LiteLLM's proxy is missing (.ci/run installs it)")
    key = "sk-agentload-fleet-test-" + "51e2d84b067f3a9c"
    monkeypatch.setenv("AGENTLOAD_TEST_FLEET_KEY", key)
    ports = [free_port(), free_port()]
    proxy = LiteLLMProcess.start([f"http://127.0.0.1:{p}" for p in ports], tmp_path / "litellm", key)
    try:
        out = tmp_path / "run"
        run_scenario("router-soak-smg", out, [
            "agents.count=4", "agents.duration_s=6", "agents.rounds=3", "canary.every_s=0", "schedule=[]",
            f'target.endpoint="{proxy.url}"', 'target.api_key_env="AGENTLOAD_TEST_FLEET_KEY"',
            "router.command=false", "router.policy=\"simple-shuffle\"",
            f"fleet.backends=[{{port={ports[0]}}}, {{port={ports[1]}}}]", "fleet.count=2"])
    finally:
        proxy.stop()
    recs = _records(out)
    assert recs and all(r.outcome == "ok" for r in recs)
    logged = {line["id"]: line["backend"] for b in ("b0", "b1") for line in _log_lines(out, b)}
    via_fingerprint = [r for r in recs if r.backend is not None]
    assert all(r.backend in ("b0", "b1") for r in via_fingerprint)
    # each request is attributed one way or the other
    assert all(r.backend is not None or r.id_sent in logged for r in recs), \
        "a request LiteLLM served could not be attributed to a backend"
    print(f"attributed by system_fingerprint: {len(via_fingerprint)}/{len(recs)}; by request log: "
          f"{sum(1 for r in recs if r.id_sent in logged)}/{len(recs)}")


@needs_smg
def test_a_scheduled_hang_and_a_pool_too_small_are_both_in_the_verdict(tmp_path):
    """Issue 32: a soak on a pool too small for its agents, with b1 hung for 5 s mid-run. The hang
    is a server stall; the queueing for connections outside it is the pool's own finding, which
    the stall once switched off (and then said "the client pool is not the cause")."""
    out = tmp_path / "hang-pool"
    run_scenario("router-soak-smg", out, SHORT + [
        "agents.duration_s=16", "router.policy=\"round_robin\"", "client.limit=2", "stall.after_s=1.0",
        "stall.give_up_s=3.0", "schedule=[{at_s=6.0, backend=\"b1\", fault=\"hang\", for_s=5.0}]"])
    v = _summary(out)["verdict"]
    found = {x["kind"]: x for x in [v, *v["secondary"]]}
    stall = found.get("server_stall") or found.get("server_slow")
    assert stall is not None, v
    assert "client_pool" in found, v
    pool = found["client_pool"]
    # each says which is which
    assert "the client pool is not the cause of the stall" in stall["summary"] and "see client_pool" in stall["summary"]
    assert "the client pool is not the cause;" not in stall["summary"] and not stall["summary"].endswith("not the cause")
    assert pool["summary"].startswith(("client pool exhausted apart from the server stall",
                                       "client pool exhausted beyond the server stall")), pool["summary"]
    assert "the server was not the bottleneck" not in pool["summary"]
    # the records agree: outside the hang's window, requests spent a large share of e2e queued
    events = [orjson.loads(x) for x in (out / "schedule.jsonl").read_bytes().splitlines()]
    start_ns, end_ns = events[0]["at_ns"], events[1]["at_ns"]
    recs = _records(out)
    outside = [r for r in recs if r.outcome == "ok" and (r.t["end"] < start_ns or r.t["start"] > end_ns + 3 * 10**9)]
    waits = sorted(r.t.get("queued_end", r.t["start"]) - r.t["start"] for r in outside)
    e2e = sorted(r.t["end"] - r.t["start"] for r in outside)
    assert len(outside) >= 20 and waits[len(waits) // 2] >= 0.2 * e2e[len(e2e) // 2], (len(outside), waits, e2e)
    # the hang is still named where it was: b1, its scheduled fault
    assert any("b1" in line and "scheduled hang" in line for line in stall["evidence"]), stall["evidence"]
    report = (out / "report.txt").read_text()
    assert "ALSO [client_pool]" in report or report.startswith("VERDICT [client_pool]")
