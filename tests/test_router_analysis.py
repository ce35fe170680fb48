"""The router soak bench's analysis on synthetic run folders (no HTTP, milliseconds each):
attribution of requests to backends, retries across backends, stickiness, cache hit rate and time
to first token by round, the scheduled faults' figures, the router's in-flight leak, the verdict's
evidence by backend, and the reports' ROUTER sections (text, summary.json, HTML, compare)."""

from __future__ import annotations

import dataclasses

import orjson
import pytest

from agentload.analysis.compare import compare_dirs
from agentload.analysis.router import LogIndex, id_hash
from agentload.analysis.summary import build_summary
from agentload.analysis.tallies import TimeCounts
from agentload.analysis.verdict import diagnose
from agentload.records.target_metrics import load_target_metrics
from agentload.report.build import write_reports
from agentload.report.compare_html import build_compare_html
from agentload.report.compare_text import render_text
from agentload.report.text import render
from records_factory import MS, RunBuilder

SMG_ACTIVE = "smg_worker_requests_active"


def _active(values: dict[str, float]) -> dict[str, float]:
    """An smg page: its per-worker in-flight gauge (and a routed counter, so the family is known)."""
    v = {f'{SMG_ACTIVE}{{worker="http://127.0.0.1:{8100 + int(w[1:])}"}}': n for w, n in values.items()}
    v.update({f'smg_worker_requests_total{{worker="http://127.0.0.1:{8100 + int(w[1:])}"}}': 1.0 for w in values})
    return v


def hang_run() -> RunBuilder:
    """Three backends behind smg; b2 hangs from 60 s to 90 s. Before the fault each agent's rounds go
    to b0/b1/b2 in turn; during it the router sends b2 four requests (three stall, one arrives
    and is cut off by the log), stops routing there 4.2 s in, and uses it again 1.1 s after it recovered."""
    run = RunBuilder(agents=3, rounds=6).fleet(3)
    run.fault(0, "b2", "hang", at_s=60.0, for_s=30.0)
    run.applied(0, start_s=60.0, end_s=90.0)
    # before the fault: rounds 1-2 of agents 0-2, each on "its" backend (a sticky router)
    for rnd, at in ((1, 10_000), (2, 30_000)):
        for a in range(3):
            rec = run.ok(a, rnd, backend=f"b{a}", cached_tokens=0 if rnd == 1 else 150, prompt_tokens=200,
                         id_sent=f"id-a{a}-r{rnd}", at_ms=at + 1000 * a)
            run.log(f"b{a}", rec)
    # during it: three stalled requests on b2 (no chunk: no fingerprint; the log names b2) and one more arrival
    for i, at in enumerate((61_000, 62_000, 64_200)):
        rec = run.stalled(i, 3, "ttfb", id_sent=f"id-hang-{i}", at_ms=at)
        run.log("b2", rec, outcome="client_gone", fault="hang")
    run.log("b2", id="id-probe", recv_ms=63_000, outcome="cut", fault="hang")
    # the router sends the retried rounds elsewhere
    for i in range(3):
        rec = run.ok(i, 3, backend="b0", call=1, id_sent=f"id-a{i}-r3-retry", at_ms=80_000 + 100 * i,
                     cached_tokens=0, prompt_tokens=300)
        run.log("b0", rec)
    # after it: b2 again 1.1 s after recovery
    rec = run.ok(2, 4, backend="b2", id_sent="id-a2-r4", at_ms=91_100, cached_tokens=250, prompt_tokens=400)
    run.log("b2", rec)
    run.meta["t_end_ns"] = 120_000 * MS
    return run


def test_a_run_without_a_fleet_has_no_router_section_and_an_unchanged_report(tmp_path):
    run = RunBuilder(agents=2, rounds=2)
    run.agents_done(range(2), range(1, 3))
    summary = build_summary(run.write(tmp_path / "plain"))
    assert "router" not in summary
    text = render(summary)
    assert "ROUTER" not in text and "fault" not in text
    write_reports(tmp_path / "plain")
    html = (tmp_path / "plain" / "report.html").read_text()
    assert "fig-router" not in html and "fig-groups" not in html and "data-figures='4'" in html
    assert "Prefix groups" not in html and "Load imbalance" not in html


def test_records_are_attributed_by_fingerprint_and_by_the_backend_logs(tmp_path):
    run = RunBuilder(agents=2, rounds=2).fleet(2)
    r1 = run.ok(0, 1, backend="b0", id_sent="x1")
    run.log("b0", r1)
    r2 = run.error(1, 1, "ServerDisconnectedError", id_sent="x2")  # no chunk: no fingerprint
    run.log("b1", r2, outcome="error")
    run.ok(0, 2, id_sent="x3")  # a router that dropped the field, and no log line: not attributed
    r = build_summary(run.write(tmp_path))["router"]
    a = r["attribution"]
    assert (a["requests"], a["attributed"], a["by_fingerprint"], a["by_log"], a["unattributed"]) == (3, 2, 1, 1, 1)
    by = {b["name"]: b for b in r["backends"]}
    assert (by["b0"]["requests"], by["b0"]["ok"], by["b0"]["share"]) == (1, 1, 0.5)
    assert (by["b1"]["requests"], by["b1"]["errors"]) == (1, 1)
    assert by["b1"]["log"] == {"arrivals": 1, "outcomes": {"error": 1}}
    assert r["over_time"]["backends"]["unattributed"] and sum(r["over_time"]["backends"]["b0"]) == 1


def test_a_request_retried_on_another_backend_counts_as_a_retry_and_goes_to_the_last_one(tmp_path):
    run = RunBuilder(agents=1, rounds=1).fleet(3)
    rec = run.ok(0, 1, id_sent="retried")  # the answer names no backend
    run.log("b0", rec, recv_ms=1001, outcome="error")
    run.log("b2", rec, recv_ms=1003, outcome="ok")
    r = build_summary(run.write(tmp_path))["router"]
    a = r["attribution"]
    assert a["retried_across_backends"] == 1 and a["repeated_at_one_backend"] == 0
    assert a["retried_examples"] == [{"id": "retried", "backends": ["b0", "b2"]}]
    assert {b["name"]: b["requests"] for b in r["backends"]} == {"b0": 0, "b1": 0, "b2": 1}
    assert "1 request id(s) reached 2+ backends of one role (router retries)" in render(build_summary(run.data()))


def test_stickiness_counts_consecutive_rounds_of_one_conversation_on_the_last_attempts_backend(tmp_path):
    run = RunBuilder(agents=3, rounds=4).fleet(2)
    for rnd, b in zip(range(1, 5), ("b0", "b0", "b1", "b1")):  # 3 pairs, 2 on the same backend
        run.ok(0, rnd, backend=b)
    run.ok(1, 1, backend="b0")
    run.ok(1, 2, backend="b0")  # same
    run.ok(1, 1, backend="b1", conversation=1)  # a new conversation: no pair across conversations
    run.ok(1, 2, backend="b1", conversation=1)  # same
    run.error(2, 1, "http_500", backend="b0")  # the round's first attempt ...
    run.ok(2, 1, backend="b1", call=1)  # ... and its last one, which counts
    run.ok(2, 2, backend="b1")  # same
    st = build_summary(run.write(tmp_path))["router"]["stickiness"]
    assert st == {"pairs": 6, "same": 5, "share": round(5 / 6, 4)}
    assert "stickiness: 83% (5 of 6)" in render(build_summary(run.data()))


def test_cache_hit_rate_and_time_to_first_token_by_round(tmp_path):
    run = RunBuilder(agents=2, rounds=2).fleet(2)
    run.ok(0, 1, backend="b0", cached_tokens=0, prompt_tokens=100, ttfb_ms=5, ttft_ms=20)
    run.ok(1, 1, backend="b1", cached_tokens=50, prompt_tokens=100, ttfb_ms=5, ttft_ms=20)
    run.ok(0, 2, backend="b0", cached_tokens=270, prompt_tokens=300, ttfb_ms=2, ttft_ms=8)
    run.ok(1, 2, backend="b1", prompt_tokens=300, ttfb_ms=2, ttft_ms=8)  # reports no cached_tokens: left out
    r = build_summary(run.write(tmp_path))["router"]
    r1, r2 = r["rounds"]
    assert (r1["cache_hit_rate"], r1["reporting_cache"], r1["cached_tokens"], r1["prompt_tokens"]) == (0.25, 2, 50, 200)
    assert (r2["cache_hit_rate"], r2["reporting_cache"]) == (0.9, 1)
    assert r["cache_hit_rate"] == round(320 / 500, 4)
    assert r1["time_to_first_token"]["n"] == 2 and 24 <= r1["time_to_first_token"]["p50_ms"] <= 26  # sent -> first token
    assert 9 <= r2["time_to_first_token"]["p90_ms"] <= 11
    assert {b["name"]: b["cache_hit_rate"] for b in r["backends"]} == {"b0": 0.675, "b1": 0.5}


def test_a_long_run_bands_its_rounds_like_the_phase_tables(tmp_path):
    run = RunBuilder(agents=1, rounds=40).fleet(1)
    for rnd in range(1, 41):
        run.ok(0, rnd, backend="b0", cached_tokens=10, prompt_tokens=100)
    r = build_summary(run.write(tmp_path))["router"]
    assert len(r["rounds"]) == 40
    assert [b["rounds"] for b in r["round_bands"]][-3:] == [[10, 10], [11, 20], [21, 40]]
    assert r["round_bands"][-1]["requests"] == 20 and r["round_bands"][-1]["cache_hit_rate"] == 0.1


def test_fault_figures_stopped_routing_after_and_used_again_after(tmp_path):
    run = hang_run()
    summary = build_summary(run.write(tmp_path))
    f = summary["router"]["faults"][0]
    assert (f["number"], f["backend"], f["fault"], f["start_s"], f["end_s"]) == (1, "b2", "hang", 60.0, 90.0)
    assert f["sent_there"] == {"backend_log": 4, "records": 3}  # records attributed there (here by the log)
    assert (f["client_stalls"], f["client_errors"], f["stalls_there"]) == (3, 0, 3)
    assert f["stopped_routing_after_s"] == 4.2 and f["used_again_after_s"] == 1.1
    assert f["log_outcomes"] == {"client_gone": 3, "cut": 1}
    text = render(summary)
    assert ("fault 1: hang b2 at 60.0 s for 30 s: 4 requests sent there after it failed, 3 stalled / 0 errors "
            "seen by clients, router stopped routing there after 4.2 s, used it again 1.1 s after recovery") in text


def test_a_router_that_kept_routing_to_the_faulty_backend_never_stopped(tmp_path):
    run = RunBuilder(agents=1, rounds=1).fleet(2)
    run.fault(0, "b1", "errors", at_s=100.0, for_s=20.0)
    run.fault(1, "b0", "kill", at_s=130.0, for_s=None)
    run.fault(2, "b0", "stop", at_s=500.0, for_s=10.0)
    run.applied(0, start_s=100.0, end_s=120.0)
    run.applied(1, start_s=130.0)  # no end line: the run ended during the fault
    for s in range(0, 21):  # b1 got requests the whole window: the router never stopped
        run.log("b1", id=f"e{s}", recv_ms=99_500 + 1000 * s, outcome="error" if 100 <= 99.5 + s < 120 else "ok")
    run.ok(0, 1, backend="b0", at_ms=1_000)
    run.meta["t_end_ns"] = 150_000 * MS
    faults = build_summary(run.write(tmp_path))["router"]["faults"]
    f0, f1, f2 = faults
    assert f0["stopped_routing_after_s"] == "never" and f0["used_again_after_s"] is None
    assert f0["sent_there"]["backend_log"] == 20
    assert f1["stopped_routing_after_s"] == 0.0 and f1["ended_in_run"] is False and f1["window_end_s"] == 150.0
    assert f2["applied"] is False and f2["start_s"] is None
    text = render(build_summary(run.data()))
    assert "router kept routing there until the fault ended, did not use it again after recovery" in text
    assert "fault 2: kill b0 at 130.0 s: 0 requests sent there after it failed" in text
    assert "router sent it nothing after it failed, the run ended during the fault" in text
    assert "fault 3: stop b0 planned at 500 s: not applied (the run ended first)" in text


def test_without_schedule_jsonl_the_planned_times_stand_in(tmp_path):
    run = RunBuilder(agents=1, rounds=1).fleet(3)
    run.fault(0, "b2", "slow", at_s=5.0, for_s=2.0)
    run.ok(0, 1, backend="b0", at_ms=1_000)
    run.meta["t_end_ns"] = 10_000 * MS
    f = build_summary(run.write(tmp_path))["router"]["faults"][0]
    assert (f["source"], f["start_s"], f["end_s"], f["applied"]) == ("run.json", 5.0, 7.0, True)


def _leak_run(last: float, *, ended: bool = True, last_at: float = 20.0) -> RunBuilder:
    run = RunBuilder(agents=2, rounds=1).fleet(2)
    run.ok(0, 1, backend="b0", at_ms=1_000)
    run.ok(1, 1, backend="b1", at_ms=2_000)
    run.scrape(0.5, _active({"b0": 0, "b1": 0}))  # before the first request
    run.scrape(1.5, _active({"b0": 1, "b1": 0}))
    run.scrape(last_at, _active({"b0": last, "b1": 0}))
    run.meta["ended"] = ended
    return run


def test_a_router_that_still_counts_requests_after_agentload_had_none_leaks(tmp_path):
    run = _leak_run(2.0)
    v = diagnose(run.write(tmp_path))
    assert v["kind"] == "router_leak" and v["agents_stopped"] == 0
    assert "still reports 2 request(s) in flight (smg_worker_requests_active) at its last scrape" in v["summary"]
    assert any("per worker: http://127.0.0.1:8100 (b0) 2, http://127.0.0.1:8101 (b1) 0" in e for e in v["evidence"])
    x = build_summary(run.data())["router"]["inflight"][0]
    assert (x["leaked"], x["before_run"], x["agentload_idle"], x["last_scrape_s"]) == (2.0, 0.0, True, 20.0)
    assert "router in flight: http://127.0.0.1:29000/metrics smg_worker_requests_active = 2" in \
        render(build_summary(run.data()))


def test_router_leak_near_misses(tmp_path):
    assert diagnose(_leak_run(0.0).write(tmp_path / "a"))["kind"] == "healthy"  # the gauge came back to 0
    assert "router_leak" not in [diagnose(_leak_run(2.0, ended=False).write(tmp_path / "b"))["kind"]]  # killed
    # the last scrape came while agentload still had a request in flight (it ended after it)
    assert diagnose(_leak_run(1.0, last_at=1.5).write(tmp_path / "c"))["kind"] == "healthy"
    # a gauge already at 2 before the run and 2 at its end: not this run's leak
    run = _leak_run(2.0)
    run.scrapes[0]["v"] = _active({"b0": 2, "b1": 0})
    assert diagnose(run.write(tmp_path / "d"))["kind"] == "healthy"


def test_litellms_in_flight_gauge_counts_the_scrape_itself(tmp_path):
    run = RunBuilder(agents=1, rounds=1).fleet(1, router="litellm")
    run.ok(0, 1, backend="b0", at_ms=1_000)
    page = {'litellm_deployment_total_requests_total{api_base="http://127.0.0.1:8100"}': 1.0}
    run.scrape(0.5, {**page, "litellm_in_flight_requests": 1.0})
    run.scrape(9.0, {**page, "litellm_in_flight_requests": 1.0})  # only the scrape itself
    assert diagnose(run.write(tmp_path / "a"))["kind"] == "healthy"
    run.scrapes[-1]["v"]["litellm_in_flight_requests"] = 3.0
    v = diagnose(run.write(tmp_path / "b"))
    assert v["kind"] == "router_leak" and "still reports 2 request(s)" in v["summary"]


def test_verdict_evidence_names_the_backend_and_its_scheduled_fault(tmp_path):
    v = diagnose(hang_run().write(tmp_path))
    assert v["kind"] == "server_stall"
    assert "all 3 stalled requests were served by backend b2 (scheduled hang at 60.0 s)" in v["evidence"]


def test_verdict_evidence_by_backend_when_errors_spread(tmp_path):
    run = RunBuilder(agents=4, rounds=1).fleet(3)
    for a, b in enumerate(("b1", "b1", "b1", "b0")):
        rec = run.error(a, 1, "http_500", id_sent=f"e{a}")
        run.log(b, rec, outcome="error")
    v = diagnose(run.write(tmp_path))
    assert v["kind"] == "server_errors"
    assert "3 of 4 failed requests were served by backend b1; the others: b0 x1" in v["evidence"]


def test_pd_mode_names_the_decode_and_the_prefill_worker(tmp_path):
    run = RunBuilder(agents=2, rounds=2).fleet(3, mode="pd", roles=["prefill", "decode", "decode"])
    run.fault(0, "b2", "hang", at_s=5.0, for_s=10.0)
    run.applied(0, start_s=5.0, end_s=15.0)
    for a in range(2):
        rec = run.ok(a, 1, backend="b1", id_sent=f"p{a}-1", at_ms=1_000 + a * 100)
        run.log("b0", rec)
        run.log("b1", rec)
    for a in range(2):
        rec = run.stalled(a, 2, "stream", backend="b2", id_sent=f"p{a}-2", at_ms=6_000 + a * 100)
        run.log("b0", rec)
        run.log("b2", rec, outcome="client_gone", fault="hang")
    v = diagnose(run.write(tmp_path))
    assert "all 2 stalled requests were served by decode worker b2 (scheduled hang at 5.0 s)" in v["evidence"]
    assert "their prefill: all 2 stalled requests were served by prefill worker b0" in v["evidence"]
    r = build_summary(run.data())["router"]
    assert r["mode"] == "pd" and r["attribution"]["prefill_attributed"] == 4
    by = {(b["name"], b["role"]): b["requests"] for b in r["backends"]}
    assert by == {("b0", "prefill"): 4, ("b1", "decode"): 2, ("b2", "decode"): 2}
    assert r["attribution"]["retried_across_backends"] == 0  # a prefill and a decode line are no retry
    assert list(r["over_time"]["backends"]) == ["b1", "b2"]


def test_reports_show_the_router_section_and_fault_bands(tmp_path):
    d = tmp_path / "soak"
    run = hang_run()
    run.write(d)
    summary, text = write_reports(d)
    on_disk = orjson.loads((d / "summary.json").read_bytes())
    assert on_disk["router"] == summary["router"]
    assert "ROUTER smg (policy cache_aware) in front of 3 backend(s)" in text
    assert "cache hit rate" in text and "per backend" in text
    html = (d / "report.html").read_text()
    for fid in ("fig-router-share", "fig-router-imbalance", "fig-router-rounds"):
        assert f"id=\"{fid}\"" in html or f"id='{fid}'" in html
    assert "Load imbalance over time: the busiest backend" in html
    assert "router&#x27;s own time (request sent -&gt; arrival in the backend&#x27;s log" in html
    assert html.count("fault 1: hang b2") >= 3  # the band's label on every over-time chart
    # rebuilt from disk: the same bytes
    first = {n: (d / n).read_bytes() for n in ("summary.json", "report.txt", "report.html")}
    write_reports(d)
    assert {n: (d / n).read_bytes() for n in first} == first


def test_compare_shows_router_rows_side_by_side(tmp_path):
    dirs = []
    for name, policy, same in (("rr", "round_robin", False), ("ca", "cache_aware", True)):
        run = RunBuilder(agents=2, rounds=3).fleet(2, policy=policy)
        run.meta["fingerprint"] = "fp"
        run.meta["scenario"]["router"] = {"policy": policy}
        run.fault(0, "b1", "hang", at_s=50.0, for_s=10.0)
        run.applied(0, start_s=50.0, end_s=60.0)
        for rnd in range(1, 4):
            for a in range(2):
                b = f"b{a}" if same else f"b{(a + rnd) % 2}"
                rec = run.ok(a, rnd, backend=b, cached_tokens=90 if same and rnd > 1 else 0, prompt_tokens=100)
                run.log(b, rec)
        run.log("b1", id="late", recv_ms=52_000)
        run.log("b1", id="back", recv_ms=61_000 if same else 65_000)
        run.meta["t_end_ns"] = 70_000 * MS
        dirs.append(tmp_path / name)
        run.write(dirs[-1])
    doc = compare_dirs(dirs)
    labels = [r["label"] for r in doc["rows"]]
    assert "cache hit rate" in labels and "stickiness" in labels
    assert any(lbl.startswith("first token round 1") for lbl in labels)
    assert "fault 1 hang b1: stopped routing after s" in labels and "fault 1 hang b1: used again after s" in labels
    assert doc["varied"] == ["router.policy"]
    m = {v["name"]: v["metrics"] for v in doc["variants"]}
    assert m["policy=cache_aware"]["stickiness"] == 1.0 and m["policy=round_robin"]["stickiness"] == 0.0
    assert "conversations on one backend" in labels and "load imbalance overall / worst window" in labels
    assert m["policy=cache_aware"]["conversation_stickiness"] == 1.0
    assert m["policy=round_robin"]["conversation_stickiness"] == 0.0
    assert m["policy=cache_aware"]["fault1_stopped_s"] == 2.0
    assert m["policy=cache_aware"]["fault1_used_again_s"] == 1.0 and m["policy=round_robin"]["fault1_used_again_s"] == 5.0
    text = render_text(doc)
    assert "stickiness" in text and "100%*" in text
    html = build_compare_html(doc)
    assert "fig-cmp-router" in html and "data-figures='4'" in html


def test_stickiness_per_conversation_and_load_imbalance(tmp_path):
    """Conversations' requests by backend: a0's two conversations each stay on b0, a1's goes b1, b1,
    b2, a2's has one request (not counted); an unattributed request counts nowhere. b0 has 5 of 9:
    imbalance 5/9 x 3; the first 10 s window (7 requests) 3/7 x 3; the third (2 requests, under 2 per
    backend) is left out."""
    run = RunBuilder(agents=3, rounds=3).fleet(3)
    for rnd, at in ((1, 1000), (2, 2000), (3, 3000)):
        run.ok(0, rnd, backend="b0", at_ms=at)
        run.ok(1, rnd, backend="b2" if rnd == 3 else "b1", at_ms=at + 100)
    run.ok(2, 1, backend="b2", at_ms=4000)
    run.ok(2, 2, at_ms=5000)  # no fingerprint, no log line
    for rnd, at in ((1, 21_000), (2, 22_000)):
        run.ok(0, rnd, backend="b0", conversation=1, at_ms=at)
    run.meta["t_end_ns"] = 30_000 * MS
    summary = build_summary(run.write(tmp_path / "run"))
    r = summary["router"]
    c = r["conversations"]
    assert (c["conversations"], c["with_2_plus"], c["on_one_backend"]) == (4, 3, 2)
    assert c["share"] == pytest.approx(2 / 3, abs=1e-4)
    assert c["mean_top_share"] == pytest.approx((1 + 2 / 3 + 1) / 3, abs=1e-4)
    x = r["imbalance"]
    assert (x["backends"], x["requests"], x["busiest"]) == (3, 9, "b0")
    assert x["overall"] == pytest.approx(5 / 9 * 3, abs=1e-4)
    assert (x["windows"], x["window_max_at_s"], x["min_window_requests"]) == (1, 0, 6)
    assert x["window_max"] == pytest.approx(3 / 7 * 3, abs=1e-4)
    # window by window for report.html's chart: the thin third window is drawn, not counted
    assert x["over_time"] == {"width_s": 10, "values": [pytest.approx(3 / 7 * 3, abs=1e-4), None, 3.0],
                              "requests": [7, 0, 2]}
    text = render(summary)
    assert "per conversation: 67% (2 of 3) of the conversations with 2+ requests" in text
    assert "1.67 overall (b0 busiest), worst 10 s window 1.29 at +0 s (of 1 windows with 6+ requests)" in text


def test_the_routers_own_time_per_backend_joined_by_traceparent_then_by_id(tmp_path):
    """Backend log arrival - request sent: r1's log line carries another id (a router that rewrote
    X-Request-ID) but its traceparent; r2's has no traceparent (its id joins); r3 was retried, b0
    first (its earliest arrival counts); r4's line predates its send stamp (left out, counted)."""
    run = RunBuilder(agents=1, rounds=4).fleet(2)
    tp = [f"00-{'%032x' % 7}-{'%016x' % i}-01" for i in range(1, 5)]
    sent = lambda rec: rec.t["sent"] / MS  # noqa: E731
    r1 = run.ok(0, 1, backend="b0", id_sent="x1", traceparent=tp[0], at_ms=1000)
    run.log("b0", id="rewritten-1", recv_ms=sent(r1) + 2, traceparent=tp[0])
    r2 = run.ok(0, 2, backend="b1", id_sent="x2", traceparent=tp[1], at_ms=2000)
    run.log("b1", r2, recv_ms=sent(r2) + 5)
    r3 = run.ok(0, 3, backend="b1", id_sent="x3", traceparent=tp[2], at_ms=3000)
    run.log("b1", r3, recv_ms=sent(r3) + 50, traceparent=tp[2])
    run.log("b0", r3, recv_ms=sent(r3) + 1, traceparent=tp[2], outcome="error")
    r4 = run.ok(0, 4, backend="b0", id_sent="x4", at_ms=4000)
    run.log("b0", r4, recv_ms=sent(r4) - 1)
    summary = build_summary(run.write(tmp_path / "run"))
    rt = summary["router"]["router_time"]
    assert (rt["by_traceparent"], rt["by_id"], rt["before_sent"]) == (2, 2, 1)
    b0, b1 = rt["backends"]["b0"], rt["backends"]["b1"]
    assert b0["n"] == 2 and b0["p50_ms"] == pytest.approx(1.0, rel=0.01) and b0["p99_ms"] == pytest.approx(2.0, rel=0.01)
    assert b1["n"] == 1 and b1["p50_ms"] == pytest.approx(5.0, rel=0.01)
    assert rt["all"]["n"] == 3 and rt["all"]["p99_ms"] == pytest.approx(5.0, rel=0.01)
    text = render(summary)
    assert "router's own time (request sent -> arrival in the backend's log, 2 joined by traceparent, 2 by request id)" in text
    assert "1 arrived before the send stamp (left out)" in text


def test_in_pd_mode_the_routers_own_time_to_the_prefill_workers_too(tmp_path):
    """Both workers of a PD pair log the request: the decode worker's arrival (the main role) and,
    under `prefill`, the prefill worker's, joined the same way (traceparent, else request id)."""
    run = RunBuilder(agents=1, rounds=3).fleet(4, mode="pd", roles=["prefill", "prefill", "decode", "decode"])
    tp = [f"00-{'%032x' % 9}-{'%016x' % i}-01" for i in range(1, 4)]
    sent = lambda rec: rec.t["sent"] / MS  # noqa: E731
    r1 = run.ok(0, 1, backend="b2", id_sent="x1", traceparent=tp[0], at_ms=1000)
    run.log("b0", r1, recv_ms=sent(r1) + 2, traceparent=tp[0])
    run.log("b2", r1, recv_ms=sent(r1) + 3, traceparent=tp[0])
    r2 = run.ok(0, 2, backend="b3", id_sent="x2", traceparent=tp[1], at_ms=2000)
    run.log("b1", r2, recv_ms=sent(r2) + 4)  # no traceparent at the prefill worker: its id joins
    run.log("b3", r2, recv_ms=sent(r2) + 6, traceparent=tp[1])
    r3 = run.ok(0, 3, backend="b2", id_sent="x3", traceparent=tp[2], at_ms=3000)
    run.log("b0", r3, recv_ms=sent(r3) - 1, traceparent=tp[2])  # before the send stamp: left out
    run.log("b2", r3, recv_ms=sent(r3) + 8, traceparent=tp[2])
    summary = build_summary(run.write(tmp_path / "run"))
    rt = summary["router"]["router_time"]
    assert (rt["by_traceparent"], rt["by_id"], rt["before_sent"]) == (3, 0, 0)
    assert list(rt["backends"]) == ["b2", "b3"] and rt["backends"]["b3"]["p50_ms"] == pytest.approx(6.0, rel=0.01)
    pre = rt["prefill"]
    assert (pre["by_traceparent"], pre["by_id"], pre["before_sent"]) == (2, 1, 1)
    assert list(pre["backends"]) == ["b0", "b1"]
    assert pre["backends"]["b0"]["n"] == 1 and pre["backends"]["b0"]["p50_ms"] == pytest.approx(2.0, rel=0.01)
    assert pre["backends"]["b1"]["p99_ms"] == pytest.approx(4.0, rel=0.01)
    assert pre["all"]["n"] == 2
    text = render(summary)
    assert ("router's own time to the decode workers (request sent -> arrival in the decode worker's log, 3 joined "
            "by traceparent, 0 by request id)") in text
    assert ("router's own time to the prefill workers (request sent -> arrival in the prefill worker's log, 2 "
            "joined by traceparent, 1 by request id)") in text
    assert "by prefill worker: b0 2.0 / 2.0, b1 4.0 / 4.0; 1 arrived before the send stamp (left out)" in text


# ---------------------------------------------------------------- the bounded structures


def test_log_index_finds_the_latest_backend_of_an_id_and_repeats():
    ix = LogIndex()
    ix.add("worker", id_hash("a"), 0, 10)
    ix.add("worker", id_hash("a"), 2, 30)
    ix.add("worker", id_hash("b"), 1, 20)
    ix.add("worker", id_hash("c"), 1, 40)
    ix.add("worker", id_hash("c"), 1, 50)
    ix.freeze()
    assert ix.latest("worker", id_hash("a")) == 2 and ix.latest("worker", id_hash("b")) == 1
    assert ix.latest("worker", id_hash("zz")) is None and ix.latest("prefill", id_hash("a")) is None
    across, again, ex = ix.repeats("worker")
    assert (across, again, ex) == (1, 1, [id_hash("a")])


def test_time_counts_keep_cells_not_events_and_regroup_into_about_sixty_buckets():
    tc = TimeCounts(0, 60)
    for i in range(100_000):
        tc.add("b0" if i % 2 else "b1", i * 36_000_000)  # one an 36 ms over an hour
    assert tc.cell_ns == 1_000_000_000 and len(tc.cells["b0"]) <= TimeCounts.MAX_CELLS
    width, rows = tc.result(3600 * 10**9)
    assert width == 100.0 and len(rows["b0"]) == 36
    assert sum(rows["b0"]) + sum(rows["b1"]) == 100_000


def test_time_counts_within_a_span_count_only_the_cells_wholly_inside_it():
    tc = TimeCounts(1_000, 60)
    for ms in (5, 15, 25, 35, 45):  # one event in each 10 ms cell from the origin on
        tc.add("b0", 1_000 + ms * MS)
    tc.add("b1", 1_000 + 25 * MS)
    assert tc.within(1_000 + 10 * MS, 1_000 + 40 * MS) == {"b0": 3, "b1": 1}  # cells 1, 2, 3
    assert tc.within(1_000 + 11 * MS, 1_000 + 39 * MS) == {"b0": 1, "b1": 1}  # cell 2 only: 1 and 3 stick out
    assert tc.within(1_000 + 12 * MS, 1_000 + 19 * MS) == {}  # shorter than a cell: nothing is sure
    assert tc.within(0, 1_000 + 20 * MS) == {"b0": 2}  # before the origin: from cell 0


def test_target_metrics_of_a_synthetic_run_load(tmp_path):
    run = _leak_run(2.0)
    run.write(tmp_path)
    tm = load_target_metrics(tmp_path)
    assert tm.urls == ["http://127.0.0.1:29000/metrics"] and len(tm.scrape_times[tm.urls[0]]) == 3


@pytest.mark.slow
def test_the_router_report_renders_in_headless_chromium_without_console_errors(tmp_path):
    from devtools import check_page_sync, find_chromium

    chromium = find_chromium()
    if chromium is None:
        pytest.skip("chromium is not installed (apt-get install chromium; .ci/run installs it)")
    run = hang_run()
    run.scrapes = _leak_run(2.0, last_at=119.0).scrapes
    run.sample(inflight={"ttfb": 1}, stalled=0)
    run.write(tmp_path)
    write_reports(tmp_path)
    res = check_page_sync(tmp_path / "report.html", chromium=chromium, timeout=60)
    assert res.ok, res.problems()
    assert res.ids == ["fig-timeline", "fig-rounds", "fig-prompt", "fig-over-time", "fig-target", "fig-router-share",
                       "fig-router-imbalance", "fig-router-rounds", "fig-router-inflight"]


def test_one_server_naming_itself_is_no_fleet_but_two_behind_a_router_are(tmp_path):
    run = RunBuilder(agents=2, rounds=1)  # agentload's embedded mock names itself "mock"
    run.ok(0, 1, backend="mock")
    run.stalled(1, 1, "ttfb", backend="mock")
    summary = build_summary(run.write(tmp_path / "one"))
    assert "router" not in summary
    assert not any("served by" in e for e in summary["verdict"]["evidence"])
    run.records[0] = dataclasses.replace(run.records[0], backend="b0")  # an external router's two backends
    summary = build_summary(run.write(tmp_path / "two"))
    assert [b["name"] for b in summary["router"]["backends"]] == ["b0", "mock"] and summary["router"]["mode"] is None
    assert "the stalled request was served by backend mock" in summary["verdict"]["evidence"]


def test_a_leak_follows_the_finding_that_stopped_agents(tmp_path):
    run = hang_run()
    run.scrapes = _leak_run(2.0, last_at=119.0).scrapes
    v = diagnose(run.write(tmp_path))
    assert [v["kind"]] + [s["kind"] for s in v["secondary"]] == ["server_stall", "router_leak"]
