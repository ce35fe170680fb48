"""Each verdict rule on synthetic runs: its positive case, its near misses, its precedence.

Fast (no HTTP): the end-to-end verdicts over real HTTP live in test_verdicts.py and
test_fail_closed_*.py.
"""

from __future__ import annotations

import dataclasses
import re

from agentload.analysis.verdict import (
    RULES,
    Facts,
    FactsAccumulator,
    Kind,
    agent_outcomes,
    diagnose,
    findings,
)
from helpers import REPO
from records_factory import MS, RunBuilder


def healthy_base(agents: int = 4, rounds: int = 3, **kw) -> RunBuilder:
    run = RunBuilder(agents=agents, rounds=rounds, **kw)
    run.agents_done(range(agents), range(1, rounds + 1))
    return run


def kinds(run: RunBuilder) -> list[str]:
    v = diagnose(run.data())
    return [v["kind"]] + [s["kind"] for s in v["secondary"]]


def test_all_fine_is_healthy_and_says_what_it_measured():
    v = diagnose(healthy_base().data())
    assert v["kind"] == "healthy" and v["secondary"] == []
    assert "12 of 12 requests" in v["summary"]
    assert any("sent -> first token" in e for e in v["evidence"])


def test_no_records_is_no_data_never_healthy():
    assert diagnose(RunBuilder().data())["kind"] == "no_data"


def test_a_phase_that_never_happened_is_absent_not_zero():
    run = healthy_base()
    # answers that legitimately finished empty: a finish_reason, no token
    run.ok(0, 4, ttft_ms=None, finish_reason="stop")
    run.ok(1, 4, ttft_ms=None, finish_reason="stop")
    v = diagnose(run.data())
    assert v["kind"] == "healthy"
    tok = next(e for e in v["evidence"] if "first token" in e)
    assert "p50 0" not in tok and "(12 answers with a token)" in tok
    assert any("2 answer(s) finished with no token (stop x2)" in e for e in v["evidence"])


# ------------------------------------------------------------------ agentload_error


def test_a_crashed_agent_blames_agentload():
    run = healthy_base()
    run.meta["crashes"] = [{"where": "agent", "agent": 2, "round": 1, "error": "AttributeError",
                            "message": "'str' object has no attribute 'get'",
                            "traceback": "Traceback\n  File x, line 3, in attempt\nAttributeError"}]
    v = diagnose(run.data())
    assert v["kind"] == "agentload_error" and v["first_round"] == 1 and v["agents_stopped"] == 1
    assert "AttributeError" in v["summary"] and "agent 2 in round 1" in v["evidence"][0]


def test_a_dead_watchdog_is_a_finding_even_when_every_request_went_fine():
    run = healthy_base()
    run.meta["crashes"] = [{"where": "watchdog", "agent": None, "round": None, "error": "RuntimeError",
                            "message": "boom", "traceback": ""}]
    v = diagnose(run.data())
    assert v["kind"] == "agentload_error"
    assert any("stalls after that point may not have been detected" in e for e in v["evidence"])


def test_an_empty_crash_list_is_not_a_finding():
    run = healthy_base()
    run.meta["crashes"] = []
    assert diagnose(run.data())["kind"] == "healthy"


def test_a_rule_that_raises_is_a_finding_not_a_pass():
    def rule_broken(f: Facts):
        raise ZeroDivisionError("division by zero")

    found = findings(Facts(healthy_base().data()), [rule_broken])
    assert [f.kind for f in found] == [Kind.AGENTLOAD_ERROR]
    assert "could not compute the broken rule" in found[0].summary


# ------------------------------------------------------------------ client_saturated


def test_sustained_loop_lag_is_client_saturated_but_a_spike_is_not():
    run = healthy_base()
    for _ in range(9):
        run.sample(loop_lag_ms=5.0)
    run.sample(loop_lag_ms=400.0)
    assert diagnose(run.data())["kind"] == "healthy"
    run.samples.clear()
    for _ in range(6):
        run.sample(loop_lag_ms=350.0)
    for _ in range(4):
        run.sample(loop_lag_ms=5.0)
    v = diagnose(run.data())
    assert v["kind"] == "client_saturated" and "350 ms" in v["evidence"][0]
    # the verdict says it already: no second "agentload itself was a bottleneck" warning
    from agentload.analysis.summary import build_summary

    summary = build_summary(run.data())
    assert summary["verdict"]["kind"] == "client_saturated"
    assert not [w for w in summary["warnings"] if "agentload itself was a bottleneck" in w], summary["warnings"]


# ------------------------------------------------------------------ server_stall / server_slow


def test_hung_requests_past_the_pool_are_a_server_stall_with_round_and_phase():
    run = RunBuilder(agents=4, rounds=4)
    run.agents_done(range(4), range(1, 4), prompt_tokens=None)
    for a in range(3):
        run.stalled(a, 4, "ttfb", prompt_tokens=6000)
    run.ok(3, 4, prompt_tokens=500)
    v = diagnose(run.data())
    assert (v["kind"], v["phase"], v["first_round"], v["agents_stopped"]) == ("server_stall", "ttfb", 4, 3)
    assert "3 of 4 agents" in v["summary"] and "6,000 prompt tokens" in v["summary"]
    assert any("completed 3 round(s) before its first stall" in e for e in v["evidence"])


def test_stalls_that_all_finished_are_server_slow_and_stop_nobody():
    run = healthy_base()
    run.ok(0, 4, ttfb_ms=7000, stalled_phase="ttfb")
    v = diagnose(run.data())
    assert v["kind"] == "server_slow" and v["agents_stopped"] == 0


def _slot_queue(answering: list[int], stuck_past: int = 0, ok_grows: bool = True, given_up: bool = True) -> RunBuilder:
    """8 agents on a server of 2 slots: round 1's first two answered, the other six waited for
    headers (given up after give_up_s, or answered late); one sample a second meanwhile, with
    `answering[i]` requests past headers (`stuck_past` of them stalled too) and the completed count
    growing by one a second or not."""
    run = RunBuilder(agents=8, rounds=3, after_s=5.0)
    run.ok(0, 1)
    run.ok(1, 1)
    for a in range(2, 8):
        if given_up:
            run.stalled(a, 1, "ttfb")
        else:
            run.ok(a, 1, ttfb_ms=9000, stalled_phase="ttfb")
    for i, past in enumerate(answering):
        by = {"1/ttfb": 6}
        if stuck_past:
            by["1/stream"] = stuck_past
        run.sample(inflight={"ttfb": 6, "stream": past}, stalled=6 + stuck_past, stalled_by=by,
                   counts={"ok": 2 + (i if ok_grows else 0)})
    return run


def test_requests_waiting_for_headers_while_the_server_answers_others_are_a_queue_with_its_size():
    """Issue 27 case 4: llama-server --parallel 2 with 8 agents was server_stall in one run (queued
    requests given up) and server_slow in the next: a queue either way, named with its size."""
    for given_up in (True, False):
        v = diagnose(_slot_queue([2, 2, 1, 2], given_up=given_up).data())
        assert (v["kind"], v["phase"], v["first_round"]) == ("server_queue", "ttfb", 1), v
        assert "the server works on at most 2 request(s) at once" in v["summary"], v["summary"]
        assert ("6 given up after stall.give_up_s, 6 agent(s) stopped" in v["summary"]) == given_up, v["summary"]
        assert v["agents_stopped"] == (6 if given_up else 0)
        ev = "\n".join(v["evidence"])
        assert "in 4 of 4 one-second sample(s) taken while requests waited for headers past stall.after_s" in ev, ev
        assert "a queue in front of the server's 2 slot(s), not a hang" in ev, ev


def test_requests_waiting_for_headers_while_nothing_else_moves_are_a_stall_not_a_queue():
    """SIGSTOP, or a server hung with its slots busy: requests past headers are stalled too and
    nothing completes."""
    v = diagnose(_slot_queue([0, 0, 0, 0, 0]).data())  # (completions counted: none past headers at the ticks)
    assert v["kind"] == "server_queue", "completions while waiting: still a queue"
    v = diagnose(_slot_queue([2, 2, 2], stuck_past=2, ok_grows=False).data())
    assert v["kind"] == "server_stall", v
    v = diagnose(_slot_queue([0, 0, 0], ok_grows=False).data())
    assert v["kind"] == "server_stall", v
    v = diagnose(_slot_queue([], ok_grows=False).data())  # no sample while they waited: not named a queue
    assert v["kind"] == "server_stall", v


def _hung_backend_behind_a_router(answered_on: str) -> RunBuilder:
    """A fleet of three: six requests routed to b1 wait for headers for 15 s (given up) while one
    request a second completes on `answered_on`; the samples meanwhile see others past headers
    and the completed count grow, as a queue's would."""
    run = RunBuilder(agents=8, rounds=3, after_s=5.0).fleet(3, logs=False)
    for a in range(2, 8):
        run.stalled(a, 1, "ttfb", at_ms=2_000, held_ms=15_000, backend="b1")
    for i in range(10):
        run.ok(i % 2, 1 + i // 2, at_ms=3_000 + 1_000 * i, backend=answered_on)
    for i in range(4):
        run.sample(inflight={"ttfb": 6, "stream": 1}, stalled=6, stalled_by={"1/ttfb": 6}, counts={"ok": 2 + i})
    return run


def test_requests_waiting_on_a_hung_backend_while_other_backends_answer_are_a_stall_not_a_queue():
    """Behind a router "the server answered others" may be other backends: with every waiting request's
    backend known and, while they waited, answers completed on other backends only, theirs is hung,
    not queueing (a scheduled hang on b1 of the router soak was once named a queue of 1 slot). When
    their own backend answered too, it is a queue as before."""
    v = diagnose(_hung_backend_behind_a_router("b0").data())
    assert (v["kind"], v["phase"]) == ("server_stall", "ttfb"), v
    ev = "\n".join(v["evidence"])
    assert "10 request(s) completed on other backends (b0 10) and none on b1, where they went" in ev, ev
    assert "a queue in front of" not in ev, ev
    v = diagnose(_hung_backend_behind_a_router("b1").data())
    assert v["kind"] == "server_queue", v


def test_the_queue_quotes_llamacpp_busy_slots_and_deferred_requests(tmp_path):
    run = _slot_queue([2, 2, 2])
    url = "http://127.0.0.1:9/metrics"
    run.meta["scenario"]["target"] = {"metrics_urls": [url]}
    for i, (busy, deferred) in enumerate([(0, 0), (2, 6), (2, 5), (2, 0)]):
        run.scrape(1.0 + 2 * i, {"llamacpp:requests_processing": busy, "llamacpp:requests_deferred": deferred}, url)
    v = diagnose(run.write(tmp_path))
    assert v["kind"] == "server_queue", v
    ev = "\n".join(v["evidence"])
    assert (f"engine {url} over 4 scrape(s): llamacpp:requests_processing at most 2 (requests processing (busy slots)), "
            f"llamacpp:requests_deferred up to 6 (requests deferred (waiting for a free slot))") in ev, ev


def test_a_stall_in_pool_wait_alone_is_not_a_server_stall():
    run = healthy_base()
    run.stalled(0, 4, "pool_wait")
    v = diagnose(run.data())
    assert v["kind"] == "client_pool" and v["phase"] == "pool_wait"


def test_pool_queueing_behind_a_server_stall_is_a_consequence():
    # 4 hung requests hold all 4 connections for 15 s; the 2 other agents queue behind them
    run = RunBuilder(agents=6, rounds=2, limit=4)
    run.agents_done(range(6), range(1, 2))
    for a in range(4):
        run.stalled(a, 2, "ttfb", at_ms=10_000 + a, held_ms=15_000)
    for a in (4, 5):
        run.stalled(a, 2, "pool_wait", at_ms=10_010 + a)
    for _ in range(3):
        run.sample(stalled=6, pool={"in_use": 4, "idle": 0, "waiters": 2, "limit": 4})
    v = diagnose(run.data())
    assert v["kind"] == "server_stall" and v["agents_affected"] == 6 and v["agents_stopped"] == 6
    assert "client_pool" not in [s["kind"] for s in v["secondary"]]
    assert "2 more agent(s) queued behind them (a consequence, not the cause)" in v["summary"]
    assert "2 more request(s) stalled in pool_wait behind them" in "\n".join(v["evidence"])
    assert ("the pool had waiters queued in 3 of 3 samples taken while requests were stalled (max 2; limit 4, "
            "of which the stalled requests held up to 4)") in v["evidence"]


def test_a_pool_with_no_waiters_while_stalled_says_so_plainly():
    run = RunBuilder(agents=2, rounds=2)
    run.agents_done(range(2), range(1, 2))
    run.stalled(0, 2, "ttfb", held_ms=15_000)
    run.sample(stalled=1)
    run.sample(stalled=1)
    v = diagnose(run.data())
    assert v["kind"] == "server_stall" and v["summary"].endswith("; the client pool is not the cause")
    assert "the pool had no waiters queued in any of the 2 samples taken while requests were stalled (limit 100)" \
        in v["evidence"]
    assert not any("in 0 of" in e or "no waiters queued in 2 of" in e for e in v["evidence"])


# ------------------------------------------------------------------ client_pool


def test_pool_wait_from_the_records_names_the_pool_without_any_sampler_waiters():
    run = RunBuilder(agents=8, rounds=2, limit=2)
    for rnd in (1, 2):
        for a in range(8):
            run.ok(a, rnd, pool_wait_ms=80, ttfb_ms=5, ttft_ms=30, stream_ms=20)
    run.sample()  # the sampler saw no waiters: a short run
    v = diagnose(run.data())
    assert (v["kind"], v["phase"], v["first_round"]) == ("client_pool", "pool_wait", 1)
    assert "16 of 16 requests waited" in v["summary"] and "pool_wait p50 80" in v["summary"]
    assert any(e.startswith("rule: pool_wait at least 20% of e2e") for e in v["evidence"])
    assert any("sampler caught no waiter in any of its 1 sample(s)" in e for e in v["evidence"])


def test_a_queue_that_only_some_requests_meet_is_quoted_at_p90_not_at_a_p50_of_zero():
    # A router soak: a quarter of the requests waited 200 ms, the rest none: p50 is 0, which in the
    # headline would read as "no queue" next to "20 of 80 requests waited".
    run = RunBuilder(agents=8, rounds=10, limit=6)
    for rnd in range(1, 11):
        for a in range(8):
            run.ok(a, rnd, pool_wait_ms=200 if a < 2 else 0, ttfb_ms=5, ttft_ms=30, stream_ms=20)
    v = diagnose(run.data())
    assert v["kind"] == "client_pool", v
    assert "pool_wait p90 200 ms" in v["summary"] and "of e2e p90" in v["summary"], v["summary"]
    assert "p50 0" not in v["summary"] and "20 of 80 requests waited" in v["summary"]
    assert any("pool_wait p50 0" in e for e in v["evidence"])  # both still in the rule's evidence


def test_short_pool_waits_are_healthy():
    run = RunBuilder(agents=8, rounds=2)
    for a in range(8):
        run.ok(a, 1, pool_wait_ms=1, ttfb_ms=50, ttft_ms=200, stream_ms=100)
    assert diagnose(run.data())["kind"] == "healthy"  # 1 ms of ~350: not worth a verdict


def test_a_few_long_waits_among_many_requests_are_healthy():
    run = healthy_base(agents=10, rounds=10)
    run.ok(0, 11, pool_wait_ms=500)  # 1 of 101 waited (< 5%)
    assert diagnose(run.data())["kind"] == "healthy"


# ------------------------------------------------------------------ connect, disconnects, server errors


def test_one_connect_error_is_a_connect_finding():
    run = healthy_base()
    run.error(3, 4, "ClientConnectorError", ttfb_ms=None, reused=False)
    v = diagnose(run.data())
    assert v["kind"] == "connect" and v["phase"] == "connect" and v["agents_stopped"] == 1


def test_a_stale_keepalive_post_is_disconnects_in_send():
    run = healthy_base()
    run.error(1, 4, "ServerDisconnectedError", ttfb_ms=None, reused=True)
    v = diagnose(run.data())
    assert (v["kind"], v["phase"]) == ("disconnects", "send")
    assert any("aiohttp does not retry these" in e for e in v["evidence"])


def _stale_run(ok_idle_ms: float | None, failed_idle_ms: list[float | None], reused_ok: bool = True) -> RunBuilder:
    run = RunBuilder(agents=4, rounds=3)
    for rnd in (1, 2, 3):
        for a in range(4):
            if rnd == 1 or not reused_ok:
                run.ok(a, rnd, connect_ms=1.0)
            else:
                run.ok(a, rnd, reused=True, idle_ms=ok_idle_ms)
    for i, idle in enumerate(failed_idle_ms):
        run.error(i, 4, "ServerDisconnectedError", ttfb_ms=None, reused=True, idle_ms=idle)
    return run


def test_a_failed_reuse_idle_longer_than_every_answered_reuse_is_a_keepalive_timeout_between_the_two():
    v = diagnose(_stale_run(800.0, [2_500.0, 3_000.0]).data())
    assert (v["kind"], v["phase"]) == ("disconnects", "send")
    ev = "\n".join(v["evidence"])
    assert "idle in the pool before the failed reuse: 2500 ms-3000 ms" in ev, ev
    assert "keep-alive timeout lies between 800 ms and 2500 ms, shorter than the client's keepalive_timeout (15.0 s)" in ev, ev


def test_failed_reuses_when_no_reuse_ever_got_an_answer_blame_a_close_after_each_answer_not_a_timeout():
    """llama-server closes after every streamed answer: no reuse works, whatever the idle time."""
    v = diagnose(_stale_run(None, [0.4, 12.0], reused_ok=False).data())
    ev = "\n".join(v["evidence"])
    assert "idle in the pool before the failed reuse: 0.40 ms-12.0 ms" in ev, ev
    assert "no reused connection ever got an answer (2 of 14 requests reused a connection (14%)" in ev, ev
    assert "closes its connection after each answer" in ev and "no keep-alive timeout is as short as 12.0 ms" in ev, ev
    assert "keep-alive timeout lies between" not in ev and "shorter than the client's" not in ev, ev


def test_failed_reuses_that_sat_idle_as_long_as_answered_ones_are_a_race_with_the_keepalive_timeout():
    v = diagnose(_stale_run(300.0, [160.0, 290.0]).data())
    ev = "\n".join(v["evidence"])
    assert "reuses that got an answer had sat idle up to 300 ms" in ev and "a race with the server's keep-alive" in ev, ev


def test_a_failed_reuse_without_an_idle_time_says_it_cannot_tell():
    v = diagnose(_stale_run(300.0, [None]).data())
    assert any("how long their connections had sat idle was not recorded" in e for e in v["evidence"]), v["evidence"]


def test_a_single_server_error_is_never_healthy():
    run = healthy_base(agents=10, rounds=10)
    run.error(0, 11, "http_503")
    v = diagnose(run.data())
    assert v["kind"] == "server_errors" and "1 of 101" in v["summary"]


def test_a_404_without_v1_in_the_endpoint_gets_a_hint():
    run = healthy_base()
    run.meta["endpoint"] = "http://127.0.0.1:8000"
    run.error(0, 1, "http_404")
    v = diagnose(run.data())
    assert any("has no path such as /v1" in e and "try --endpoint http://127.0.0.1:8000/v1)" in e
               for e in v["evidence"]), v["evidence"]
    run.meta["endpoint"] = "http://127.0.0.1:8000/v1"
    ev = diagnose(run.data())["evidence"]
    assert not any("such as /v1" in e for e in ev)
    assert any("HTTP 404 from http://127.0.0.1:8000/v1/chat/completions" in e for e in ev), ev
    run.meta["endpoint"] = "https://x.example/openai/deployments/d?api-version=2024-06-01"
    ev = diagnose(run.data())["evidence"]
    assert any("HTTP 404 from https://x.example/openai/deployments/d/chat/completions?api-version=2024-06-01: "
               in e for e in ev) and not any("/v1" in e for e in ev), ev


def test_error_counts_are_written_for_people_not_as_a_python_dict():
    run = healthy_base()
    run.error(0, 4, "ClientPayloadError")
    run.error(1, 4, "ClientPayloadError")
    v = diagnose(run.data())
    assert "errors: ClientPayloadError x2" in v["evidence"]
    assert not any("{" in e for e in v["evidence"])


# ------------------------------------------------------------------ bad responses, other errors


def test_an_answer_that_is_not_a_stream_is_a_bad_response():
    run = healthy_base()
    run.error(0, 4, "not_a_stream", error_msg="HTTP 200 text/html, not an event stream: <html>",
              ttft_ms=None)
    v = diagnose(run.data())
    assert v["kind"] == "bad_responses" and "<html>" in " ".join(v["evidence"])


def test_malformed_events_in_answers_that_completed_keep_the_verdict_from_healthy():
    run = healthy_base()
    run.ok(0, 4, bad_events=3)
    assert run.records[-1].bad_events == 3
    v = diagnose(run.data())
    assert v["kind"] == "bad_responses" and v["agents_stopped"] == 0
    assert any("3 malformed event(s)" in e for e in v["evidence"])


def test_an_unknown_error_class_is_named_never_dropped():
    run = healthy_base()
    run.error(2, 4, "total_timeout")
    v = diagnose(run.data())
    assert v["kind"] == "other_errors" and "total_timeout x1" in v["summary"]


# ------------------------------------------------------------------ killed while stalled


def test_a_run_killed_while_requests_hung_still_gets_round_and_phase():
    run = healthy_base()
    run.meta["ended"] = False
    run.sample(stalled=3, stalled_by={"4/ttfb": 3})
    v = diagnose(run.data())
    assert (v["kind"], v["phase"], v["first_round"]) == ("server_stall", "ttfb", 4)
    run.meta["ended"] = True
    assert diagnose(run.data())["kind"] == "healthy"


def test_a_run_killed_while_requests_hung_with_more_queued_behind_them_names_the_hang():
    run = healthy_base(limit=50)
    run.meta["ended"] = False
    run.sample(stalled=288, stalled_by={"4/ttfb": 50, "4/pool_wait": 238})
    v = diagnose(run.data())
    assert (v["kind"], v["phase"], v["first_round"]) == ("server_stall", "ttfb", 4), v
    assert ("50 request(s) were stalled at the server (most in round 4, ttfb) and 238 more queued in pool_wait "
            "behind them") in v["summary"]
    run.samples[-1]["stalled_by"] = {"4/pool_wait": 238}  # only a queue: the pool's
    assert diagnose(run.data())["kind"] == "client_pool"


# ------------------------------------------------------------------ precedence


def test_errors_that_stopped_every_agent_lead_over_slow_requests_that_finished():
    # issue 10 case 12: server-queue + error_at_round=2 once said server_slow
    run = RunBuilder(agents=12, rounds=3)
    for a in range(12):
        run.ok(a, 1, ttfb_ms=3000 if a < 7 else 5, stalled_phase="ttfb" if a < 7 else None)
        for call in range(4):
            run.error(a, 2, "http_500", call=call)
    v = diagnose(run.data())
    assert v["kind"] == "server_errors" and v["agents_stopped"] == 12
    assert [s["kind"] for s in v["secondary"]] == ["server_slow"]


def test_the_stall_leads_when_it_stopped_more_agents_than_the_errors():
    run = RunBuilder(agents=4, rounds=3)
    run.agents_done(range(4), range(1, 3))
    for a in range(3):
        run.stalled(a, 3, "ttft")
    run.error(3, 3, "http_500")
    assert kinds(run) == ["server_stall", "server_errors"]


def test_ties_go_to_the_rule_listed_first():
    run = RunBuilder(agents=2, rounds=2)
    run.agents_done(range(2), range(1, 2))
    run.stalled(0, 2, "ttfb")
    run.error(1, 2, "http_500")
    assert kinds(run) == ["server_stall", "server_errors"]  # one agent each: RULES order


# The documented list of verdict kinds: a new `Kind` needs its `- `kind`: ...` line there.
VERDICT_KINDS_PAGE = REPO / "docs" / "verdicts.md"


def test_every_rule_has_a_kind_in_the_enumeration_and_the_docs_list_every_kind():
    page = VERDICT_KINDS_PAGE.read_text()
    para = page[page.index("Verdict kinds:"):]
    para = para[: para.index("\n\n")]
    listed = set(re.findall(r"^- `([a-z_]+)`", para, flags=re.M))
    code = {k.value for k in Kind}
    assert listed == code, (f"{VERDICT_KINDS_PAGE.relative_to(REPO)} lists {sorted(listed - code)} that Kind lacks "
                            f"and lacks {sorted(code - listed)}: one `- `kind`: what it means` line per Kind")
    assert len(RULES) == len(set(RULES))


def test_a_connect_timeout_while_queued_for_a_slot_is_the_pools():
    run = healthy_base()
    rec = run.error(0, 4, "connect_timeout", pool_wait_ms=30_000, ttfb_ms=None)
    del rec.t["queued_end"], rec.t["sent"]  # still queued when the timeout fired
    v = diagnose(run.data())
    assert v["kind"] == "client_pool" and v["agents_stopped"] == 1
    assert any("failed waiting for a connection" in e for e in v["evidence"])
    assert "connect" not in [s["kind"] for s in v["secondary"]]


def test_aiohttp_connect_timeouts_are_classified_as_connect_timeout():
    import aiohttp

    from agentload.run.request import classify_exception

    assert classify_exception(aiohttp.ConnectionTimeoutError("Connection timeout to host"))[0] == "connect_timeout"
    assert classify_exception(aiohttp.SocketTimeoutError("Timeout on reading data from socket"))[0] == "read_timeout"


def _stall_with_canaries(outcomes: list[tuple[str, float]]) -> dict:
    run = RunBuilder(agents=2, rounds=2)
    run.meta["scenario"]["canary"] = {"timeout_s": 5.0}
    run.agents_done(range(2), range(1, 2))
    run.stalled(0, 2, "ttfb")
    run.stalled(1, 2, "ttfb")
    for i, (outcome, ms) in enumerate(outcomes):
        if outcome == "ok":
            run.add(-1, 1, kind="canary", call=i, ttfb_ms=ms / 2, ttft_ms=ms / 4, stream_ms=ms / 4)
        else:
            run.add(-1, 1, kind="canary", call=i, outcome=outcome, ttfb_ms=None,
                    error="read_timeout" if outcome == "error" else "cut_short")
    # canaries are sent after the first stalled request
    first = min(r.t["start"] for r in run.records if r.stalled_phase)
    for r in run.records:
        if r.kind == "canary":
            r.t.update({k: v + first for k, v in r.t.items()})
    v = diagnose(run.data())
    return next(e for e in v["evidence"] if e.startswith("canaries"))


def test_canaries_already_in_flight_when_the_first_stalled_request_was_sent_are_its_evidence():
    """Sent a moment before the first stalled request and still running after it: they ran through
    the stall as much as the next ones (with one canary every few seconds they may be all there
    are). One that ended before it is not counted."""
    run = RunBuilder(agents=2, rounds=2)
    run.meta["scenario"]["canary"] = {"timeout_s": 5.0}
    run.agents_done(range(2), range(1, 2))
    first = run.stalled(0, 2, "ttfb").t["start"] / 1e6
    run.stalled(1, 2, "ttfb")
    run.add(-1, 1, kind="canary", call=0, at_ms=first - 50)  # ended 15 ms before it (35 ms)
    for i in (1, 2):  # sent 1 ms before it, timed out 5 s later
        run.add(-1, 1, kind="canary", call=i, outcome="error", error="read_timeout", ttfb_ms=None, at_ms=first - 1,
                held_ms=5000)
    v = diagnose(run.data())
    assert v["kind"] == "server_stall", v
    ev = next(e for e in v["evidence"] if e.startswith("canaries"))
    assert "0/2 succeeded" in ev and "the server is not answering anyone" in ev, ev
    assert "read_timeout x2" in ev, ev
    assert not v["secondary"], v["secondary"]  # the stall's evidence, not a finding of their own


def test_canaries_all_quick_say_the_hang_depends_on_the_agents():
    assert "the hang depends on the agents' state" in _stall_with_canaries([("ok", 20)] * 3)


def test_a_canary_cut_short_at_the_end_is_not_a_failure():
    text = _stall_with_canaries([("ok", 20), ("ok", 20), ("cut_short", 0)])
    assert "2/2 succeeded" in text and "failed" not in text


def test_mostly_failing_canaries_are_not_called_slow():
    text = _stall_with_canaries([("ok", 20)] * 2 + [("error", 0)] * 8)
    assert "2/10 succeeded" in text and "most canaries failed too" in text and "slow" not in text
    assert "read_timeout x8 (a canary gives up at its own canary.timeout_s = 5 s)" in text


def test_slow_canaries_say_slow_for_everyone():
    text = _stall_with_canaries([("ok", 9000)] * 3)
    assert "over stall.after_s (5 s) too" in text


def _slow_server(after_s: float = 10.0, canary_gap_ms: float = 2100, agent_stream_ms: float = 16_000,
                 stalled: bool = False) -> RunBuilder:
    """A server at ~0.44 token chunks/s for everyone: agents' answers of 8 chunks take 16 s; two
    canaries (max_tokens 8) time out at canary.timeout_s = 10 s with 5 chunks each."""
    run = RunBuilder(agents=2, rounds=2, after_s=after_s)
    run.meta["scenario"]["canary"] = {"timeout_s": 10.0, "max_tokens": 8}
    for rnd in (1, 2):
        for a in range(2):
            run.ok(a, rnd, ttfb_ms=1, ttft_ms=40, stream_ms=agent_stream_ms, token_chunks=8, token_reads=8,
                   max_gap_ms=2300, stalled_phase="stream" if stalled else None, prompt_tokens=1000 * rnd + a)
    for i in range(2):
        run.add(-1, 1, kind="canary", call=i, outcome="error", error="total_timeout", error_msg="total_timeout",
                ttfb_ms=1, ttft_ms=10, stream_ms=9_990, token_chunks=5, token_reads=5, max_gap_ms=canary_gap_ms,
                at_ms=1_000 + 11_000 * i)
    return run


def test_canaries_timed_out_behind_a_server_slow_for_everyone_are_its_evidence():
    v = diagnose(_slow_server().data())
    assert v["kind"] == "server_slow" and v["agents_stopped"] == 0, v
    assert "slow for everyone" in v["summary"] and "2 of 2 canaries timed out behind the same slowness" in v["summary"]
    assert v["phase"] == "stream"
    ev = " ".join(v["evidence"])
    assert "while their tokens were still arriving" in ev and "canary.timeout_s = 10 s" in ev, ev
    assert "~16." in ev  # a canary's 8 tokens at the agents' pace
    assert not [s for s in v["secondary"] if s["kind"] == "canary_failures"], v["secondary"]


def test_canaries_that_time_out_while_the_agents_are_quick_are_a_finding_of_their_own():
    v = diagnose(_slow_server(agent_stream_ms=14).data())  # agents: 2 ms a token chunk
    assert v["kind"] == "canary_failures", v


def test_a_canary_that_stopped_getting_tokens_is_hung_not_slow():
    v = diagnose(_slow_server(canary_gap_ms=9_500).data())  # silent for 9.5 s of its 10
    assert v["kind"] == "canary_failures", v


def test_a_slow_server_with_a_short_stall_after_s_says_slow_for_everyone_not_not_answering():
    v = diagnose(_slow_server(after_s=1.0, stalled=True).data())
    assert v["kind"] == "server_slow" and "but all finished" in v["summary"], v
    ev = "\n".join(v["evidence"])
    assert "not answering anyone" not in ev and "slow for everyone" in ev, ev
    assert "0 request(s) of that size or larger completed" not in ev, ev
    assert "no request completed without it at any size" in ev, ev


# ------------------------------------------------------------------ no_tool_calls (mode model)


def model_run(agents: int = 4, rounds: int = 3, **kw) -> RunBuilder:
    run = RunBuilder(agents=agents, rounds=rounds, **kw)
    run.meta["scenario"]["conversation"] = {"mode": "model", "max_tokens": 32, "tools": 4, "tool_choice": None}
    return run


def no_tool(run: RunBuilder, agent: int, rnd: int, finish: str | None = "length", **kw):
    """An answer that completed with text and no tool call."""
    rec = run.ok(agent, rnd, finish_reason=finish, **kw)
    run.records[-1] = dataclasses.replace(rec, tool_calls=0)
    return run.records[-1]


def test_model_answers_without_a_tool_call_before_the_last_round_are_no_tool_calls():
    run = model_run()
    for a in range(4):
        no_tool(run, a, 1)
    v = diagnose(run.data())
    assert (v["kind"], v["first_round"], v["agents_affected"], v["agents_stopped"]) == ("no_tool_calls", 1, 4, 4)
    assert v["summary"] == ("4 of 4 agents ended early: the model answered without a tool call in round 1 "
                            "(finish_reason length x4); the conversation could not go on")
    ev = "\n".join(v["evidence"])
    assert "round 1: 4 (agents.rounds = 3)" in ev and "conversation.max_tokens = 32" in ev
    assert "tool_choice was not sent" in ev and 'tool_choice = "required"' in ev
    assert "completed 0 round(s) with a tool call first" in ev
    out = agent_outcomes(run.data())
    got = [(o["outcome"], o["no_tool_call_round"], o["finish_reason"]) for o in out]
    assert got == [("no_tool_call", 1, "length")] * 4


def test_no_tool_calls_names_each_round_and_finish_reason_and_the_agents_that_went_on_are_done():
    run = model_run(agents=4, rounds=4)
    run.agents_done(range(4), range(1, 3))
    no_tool(run, 0, 3, finish="stop")
    no_tool(run, 1, 2, finish="length")  # a retry of round 2 answered without a tool call
    run.records[-1] = dataclasses.replace(run.records[-1], call=1)
    run.agents_done(range(2, 4), range(3, 5))
    v = diagnose(run.data())
    assert v["kind"] == "no_tool_calls" and v["first_round"] == 2 and v["agents_stopped"] == 2
    assert "2 of 4 agents ended early" in v["summary"] and "in rounds 2-3" in v["summary"]
    assert "finish_reason length x1, stop x1" in v["summary"] or "finish_reason stop x1, length x1" in v["summary"]
    assert "completed 1-2 round(s) with a tool call first" in "\n".join(v["evidence"])
    outcomes = {o["agent"]: o["outcome"] for o in agent_outcomes(run.data())}
    assert outcomes == {0: "no_tool_call", 1: "no_tool_call", 2: "done", 3: "done"}


def test_no_tool_calls_near_misses_are_healthy():
    # the last round's answer needs no tool call
    run = model_run(rounds=2)
    run.agents_done(range(4), range(1, 2))
    for a in range(4):
        no_tool(run, a, 2, finish="stop")
    assert diagnose(run.data())["kind"] == "healthy"
    assert {o["outcome"] for o in agent_outcomes(run.data())} == {"done"}
    # scripted agents go on whatever the model says
    run.meta["scenario"]["conversation"]["mode"] = "scripted"
    run.meta["scenario"]["agents"]["rounds"] = 3
    assert diagnose(run.data())["kind"] == "healthy"
    # mode model stopped at duration_s between two rounds: tool calls, so duration_reached, not no_tool_call
    run = model_run(rounds=5)
    run.agents_done(range(4), range(1, 3))
    run.meta["ended_by"] = "duration"
    assert diagnose(run.data())["kind"] == "healthy"
    assert {o["outcome"] for o in agent_outcomes(run.data())} == {"duration_reached"}


def test_an_agent_whose_last_request_failed_is_an_error_not_a_missing_tool_call():
    run = model_run(agents=2)
    no_tool(run, 0, 1)
    run.error(1, 1, "http_500")  # failed records carry no tool call either
    v = diagnose(run.data())
    assert kinds(run) == ["server_errors", "no_tool_calls"]  # one agent each: RULES order
    assert v["agents_stopped"] == 1
    assert {o["agent"]: o["outcome"] for o in agent_outcomes(run.data())} == {0: "no_tool_call", 1: "error"}


def test_no_tool_calls_leads_when_it_stopped_more_agents():
    run = model_run(agents=3)
    no_tool(run, 0, 1)
    no_tool(run, 1, 1)
    run.error(2, 1, "http_500")
    assert kinds(run) == ["no_tool_calls", "server_errors"]


def test_no_tool_calls_facts_are_per_agent_not_a_list_of_records():
    run = model_run(agents=50, rounds=3)
    for a in range(50):
        run.ok(a, 1)
        no_tool(run, a, 2)
    acc = FactsAccumulator()
    for r in run.records:
        acc.add(r)
    f = Facts(run.data(), acc)
    assert acc.troubled == [] and len(f.no_tool_call) == 50  # fine answers are not kept as records
    assert f.no_tool_call[7] == (2, "length", 4)  # round, finish_reason, token chunks


def test_no_tool_calls_counts_empty_answers():
    run = model_run(agents=2)
    no_tool(run, 0, 1, finish="stop", ttft_ms=None)  # no token at all
    no_tool(run, 1, 1, finish="stop")
    v = diagnose(run.data())
    assert v["kind"] == "no_tool_calls" and "finish_reason stop x2" in v["summary"]
    assert "1 of these answers carried no token at all (an empty answer)" in v["evidence"]


def test_no_tool_calls_with_no_tools_offered_says_so():
    run = model_run(agents=1)
    run.meta["scenario"]["conversation"]["tools"] = 0
    no_tool(run, 0, 1, finish="stop")
    v = diagnose(run.data())
    assert v["kind"] == "no_tool_calls"
    assert any("offers no tools (conversation.tools = 0)" in e for e in v["evidence"])


def test_an_error_threshold_that_is_also_a_round_boundary_says_so():
    run = RunBuilder(agents=3, rounds=3)
    run.agents_done(range(3), range(1, 2))
    for a in range(3):
        run.error(a, 2, "http_500")
    v = diagnose(run.data())
    thr = next(e for e in v["evidence"] if e.startswith("every request at or above"))
    assert "the prompt size and the round cannot be told apart" in thr
    # a request of the same round that completed below the size: the size, not the round, is the clue
    run2 = RunBuilder(agents=3, rounds=3)
    run2.agents_done(range(3), range(1, 2))
    run2.ok(0, 2, prompt_tokens=150)
    for a in (1, 2):
        run2.error(a, 2, "http_500", prompt_tokens=400)
    thr2 = next(e for e in diagnose(run2.data())["evidence"] if e.startswith("every request at or above"))
    assert "cannot be told apart" not in thr2


def test_failed_canaries_keep_the_verdict_from_healthy_but_cut_short_ones_do_not():
    run = healthy_base()
    run.add(-1, 1, kind="canary", call=0, outcome="cut_short", ttfb_ms=None, error="cut_short")
    assert diagnose(run.data())["kind"] == "healthy"
    run.meta["scenario"]["canary"] = {"timeout_s": 5.0}
    run.add(-1, 1, kind="canary", call=1, outcome="error", ttfb_ms=None, error="read_timeout",
            error_msg="Timeout on reading data from socket")
    v = diagnose(run.data())
    assert v["kind"] == "canary_failures" and v["agents_stopped"] == 0
    assert "1 of 1" in v["summary"] and "read_timeout x1" in v["summary"]
    assert "canary.timeout_s = 5 s" in v["evidence"][0]


def test_waits_of_seconds_are_written_in_seconds_not_seconds_ms():
    run = RunBuilder(agents=8, rounds=1, limit=2)
    for a in range(8):
        run.ok(a, 1, pool_wait_ms=60_000 + a, ttfb_ms=5, ttft_ms=30, stream_ms=20)
    v = diagnose(run.data())
    assert v["kind"] == "client_pool"
    text = " ".join([v["summary"], *v["evidence"]])
    assert "pool_wait p50 60.0 s = " in v["summary"] and "s ms" not in text, text


# ------------------------------------------------------------------ the client as the bottleneck


def _late_first_tokens(run: RunBuilder, late_ms: float) -> None:
    """Every record's first token seen `late_ms` after the (embedded) mock stamped its send."""
    for i, r in enumerate(run.records):
        run.records[i] = dataclasses.replace(r, server_first_token_ns=r.t["first_token"] - int(late_ms * 1_000_000))


def test_first_tokens_read_late_say_agentload_itself_was_the_bottleneck():
    from agentload.analysis.summary import build_summary

    def bound_warnings(run: RunBuilder) -> list[str]:
        return [w for w in build_summary(run.data())["warnings"] if "agentload itself was a bottleneck" in w]

    run = healthy_base()
    run.meta["embedded_mock"] = True
    _late_first_tokens(run, 0.3)
    for _ in range(10):
        run.sample(loop_lag_ms=2.0)
    assert bound_warnings(run) == []
    _late_first_tokens(run, 25.0)  # every first token read 25 ms after the mock sent it
    (w,) = bound_warnings(run)
    assert "p99 25" in w and "lag p50 2 ms over 10" in w, w
    # the verdict itself stays the target's (here healthy): the warning is about the measurement
    assert diagnose(run.data())["kind"] == "healthy"


def test_a_loop_busy_in_most_samples_says_so_without_a_server_stamp():
    from agentload.analysis.summary import build_summary

    run = healthy_base()
    for lag in (30.0,) * 6 + (1.0,) * 4:
        run.sample(loop_lag_ms=lag)
    (w,) = [w for w in build_summary(run.data())["warnings"] if "agentload itself was a bottleneck" in w]
    assert "lagged 30 ms or more in half of 10" in w, w
    run.samples.clear()
    for lag in (30.0,) * 4 + (1.0,) * 6:  # busy in fewer than half: no such warning
        run.sample(loop_lag_ms=lag)
    assert not [w for w in build_summary(run.data())["warnings"] if "bottleneck" in w]


# ------------------------------------------------------------------ findings that co-occur in a soak
# A soak is where several things go wrong at once: each finding that holds on its own requests
# appears, whatever else the run found (issue 32).


def pool_soak(agents: int = 20, limit: int = 8, rounds: range = range(1, 11), skip: set[int] = frozenset(),
              **kw) -> RunBuilder:
    """A pool too small for its agents: round r's requests start at r s, each waiting 80 ms for a
    connection of an e2e of ~135 ms (59%). `skip`: rounds left to the caller."""
    run = RunBuilder(agents=agents, rounds=max(rounds), limit=limit, **kw)
    for rnd in rounds:
        if rnd in skip:
            continue
        for a in range(agents):
            run.ok(a, rnd, pool_wait_ms=80, ttfb_ms=5, ttft_ms=30, stream_ms=20, at_ms=rnd * 1000 + a)
    return run


def test_a_pool_too_small_for_the_whole_soak_is_its_own_finding_beside_a_hang():
    # issue 32: 400 agents on a pool of 100 with b2 hung for 30 s said server_stall, no client_pool
    run = pool_soak(rounds=range(1, 11), skip={6, 7, 8, 9, 10})
    for a in (0, 1):  # round 6: two requests hang 15 s and are given up, ending their agents
        run.stalled(a, 6, "ttfb", at_ms=6000 + a, held_ms=15_000)
    for a in range(2, 20):  # the others' round 6 queued (briefly) while the two hung
        run.ok(a, 6, pool_wait_ms=80, ttfb_ms=5, ttft_ms=30, stream_ms=20, at_ms=6000 + a)
    for rnd in range(7, 11):  # after the hang: the pool throttles every request again
        for a in range(2, 20):
            run.ok(a, rnd, pool_wait_ms=80, ttfb_ms=5, ttft_ms=30, stream_ms=20, at_ms=16_000 + rnd * 1000 + a)
    for _ in range(12):
        run.sample(stalled=2, pool={"in_use": 8, "idle": 0, "waiters": 12, "limit": 8})
    v = diagnose(run.data())
    assert kinds(run) == ["server_stall", "client_pool"]  # the hang stopped 2 agents, the pool none
    assert v["agents_stopped"] == 2
    assert "the client pool is not the cause of the stall" in v["summary"]
    assert v["summary"].endswith("but it queued requests outside the stall too: see client_pool"), v["summary"]
    assert "the pool had waiters queued in 12 of 12 samples taken while requests were stalled (max 12" \
        in "\n".join(v["evidence"])
    pool = v["secondary"][0]
    # its figures: the requests outside the stall window (rounds 1-5 and 7-10), not the 18 queued inside it
    assert pool["summary"].startswith("client pool exhausted apart from the server stall"), pool["summary"]
    assert "pool_wait p50 80.1 ms = 59% of e2e p50 135 ms" in pool["summary"], pool["summary"]
    assert "172 of 172 requests there waited" in pool["summary"]
    assert "the server was not the bottleneck" not in pool["summary"]
    ev = "\n".join(pool["evidence"])
    assert "1 stall window(s), 15.0 s in all" in ev and "held up to 2 of the pool's connections (limit 8)" in ev
    assert "18 request(s) of 18 agent(s) queued inside them" in ev and "not counted here" in ev


def test_a_pool_that_throttles_every_request_beside_a_slow_server_is_named_too():
    # issue 32's second case: a 10 s hang that every request survived (server_slow) hid the pool
    run = pool_soak(rounds=range(1, 8))
    run.ok(0, 8, ttfb_ms=7000, stalled_phase="ttfb", at_ms=8000)
    for a in range(1, 20):
        run.ok(a, 8, pool_wait_ms=80, ttfb_ms=5, ttft_ms=30, stream_ms=20, at_ms=8000 + a)
    v = diagnose(run.data())
    # neither stopped an agent: the order of RULES
    assert kinds(run) == ["server_slow", "client_pool"]
    assert "not the cause of the stall" in v["summary"] and "see client_pool" in v["summary"]
    assert "140 of 140 requests there waited" in v["secondary"][0]["summary"]


def test_a_queue_far_beyond_what_the_hung_requests_held_is_the_pools_too():
    # 2 hung requests hold 2 of 4 connections for 15 s; 10 agents queue 2 s for each of 5 requests
    # meanwhile: 100 s queued against 30 s held. Without the hang they would have queued anyway.
    run = RunBuilder(agents=12, rounds=6, limit=4)
    for a in (0, 1):
        run.stalled(a, 1, "ttfb", at_ms=1000 + a, held_ms=15_000)
    for rnd in range(1, 6):
        for a in range(2, 12):
            run.ok(a, rnd, pool_wait_ms=2000, ttfb_ms=5, ttft_ms=30, stream_ms=20, at_ms=1000 + rnd * 2500 + a)
    v = diagnose(run.data())
    assert kinds(run) == ["server_stall", "client_pool"]
    assert v["summary"].endswith("but it queued far more requests than the stalled ones held connections: see "
                                 "client_pool"), v["summary"]
    pool = v["secondary"][0]
    assert pool["summary"].startswith("client pool exhausted beyond the server stall"), pool["summary"]
    assert "50 of 52 requests waited" in pool["summary"] and "3.3x as long queued" in pool["summary"]
    assert any("every request counts here" in e for e in pool["evidence"])
    # the same queue, half as long: what the hung requests held explains it
    run2 = RunBuilder(agents=12, rounds=6, limit=4)
    for a in (0, 1):
        run2.stalled(a, 1, "ttfb", at_ms=1000 + a, held_ms=15_000)
    for rnd in range(1, 6):
        for a in range(2, 12):
            run2.ok(a, rnd, pool_wait_ms=500, ttfb_ms=5, ttft_ms=30, stream_ms=20, at_ms=1000 + rnd * 2500 + a)
    assert kinds(run2) == ["server_stall"]  # 25 s queued against 30 s held


def test_pool_queueing_outside_a_hang_below_the_rules_threshold_is_no_finding():
    run = pool_soak(rounds=range(1, 8))
    for i, r in enumerate(run.records):  # 3 ms of ~60: neither a share nor a wait worth a finding
        run.records[i] = dataclasses.replace(r, t={**r.t, "queued_end": r.t["queued_start"] + 3_000_000})
    run.stalled(0, 8, "ttfb", at_ms=8000, held_ms=15_000)
    assert kinds(run) == ["server_stall"]


def test_a_pool_judgement_that_fails_leaves_the_stall_standing(monkeypatch):
    import agentload.analysis.verdict.facts as facts

    def broken(*a, **kw):
        raise RuntimeError("second pass failed")

    monkeypatch.setattr(facts, "PoolApart", broken)  # Facts.pool_apart's second pass
    run = pool_soak(rounds=range(1, 6))
    run.stalled(0, 6, "ttfb", at_ms=6000, held_ms=15_000)
    v = diagnose(run.data())
    assert kinds(run) == ["server_stall", "agentload_error"], kinds(run)  # never a pass, never hiding the stall
    assert "could not compute the client_pool rule (RuntimeError: second pass failed)" in v["secondary"][0]["summary"]


def test_server_errors_and_a_pool_too_small_are_both_findings():
    run = pool_soak(rounds=range(1, 6))
    for a in range(3):
        run.error(a, 6, "http_500", pool_wait_ms=80, at_ms=6000 + a)
    v = diagnose(run.data())
    assert kinds(run) == ["server_errors", "client_pool"]  # the errors stopped 3 agents, the pool none
    assert "103 of 103 requests waited" in v["secondary"][0]["summary"]
    assert "the server was not the bottleneck" in v["secondary"][0]["summary"]  # no stall: the latency is the pool's


def test_disconnects_and_a_pool_too_small_are_both_findings():
    run = pool_soak(rounds=range(1, 6))
    run.error(0, 6, "ServerDisconnectedError", pool_wait_ms=80, ttfb_ms=None, reused=True, at_ms=6000)
    v = diagnose(run.data())
    assert kinds(run) == ["disconnects", "client_pool"]
    assert v["phase"] == "send" and v["secondary"][0]["phase"] == "pool_wait"


def test_a_stall_and_errors_elsewhere_are_both_findings_but_a_stall_the_server_ended_is_told_once():
    run = RunBuilder(agents=4, rounds=3)
    run.agents_done(range(4), range(1, 3))
    run.stalled(0, 3, "ttfb", held_ms=15_000)
    # hung, then cut by the server (a router's timeout): the stall's story, not a disconnect of its own
    run.add(1, 3, outcome="error", error="ServerDisconnectedError", stalled_phase="ttfb", ttfb_ms=None,
            held_ms=6000, status=None, finish_reason=None)
    run.error(2, 3, "http_500")
    v = diagnose(run.data())
    assert kinds(run) == ["server_stall", "server_errors"]  # 2 agents stopped by the stall, 1 by errors
    assert v["agents_stopped"] == 2 and v["secondary"][0]["agents_stopped"] == 1
    assert any("1 were ended by the other side (ServerDisconnectedError x1)" in e for e in v["evidence"])
    assert "1 of 11 requests answered with errors" in v["secondary"][0]["summary"]


def test_canaries_that_failed_outside_a_stall_are_a_finding_of_their_own():
    run = RunBuilder(agents=2, rounds=3)
    run.meta["scenario"]["canary"] = {"timeout_s": 5.0}
    run.agents_done(range(2), range(1, 2))
    run.stalled(0, 2, "ttfb", at_ms=10_000, held_ms=15_000)
    run.add(-1, 1, kind="canary", call=0, outcome="error", ttfb_ms=None, error="read_timeout", at_ms=12_000)
    assert kinds(run) == ["server_stall"]  # inside the stall: its evidence
    run.add(-1, 1, kind="canary", call=1, outcome="error", ttfb_ms=None, error="read_timeout", at_ms=40_000)
    v = diagnose(run.data())
    assert kinds(run) == ["server_stall", "canary_failures"]
    assert v["secondary"][0]["summary"].startswith("canaries failed outside the server stall: 1 of 2")


def test_a_server_whose_template_cannot_call_tools_is_named_instead_of_a_tool_choice_hint():
    """Issue 27 case 14: llama.cpp's /props (run.json server_props) says the chat template has no
    tool calls: the tool_choice already sent cannot help, and the evidence says so."""
    run = model_run(agents=2)
    run.meta["scenario"]["conversation"]["tool_choice"] = "required"
    run.meta["server_props"] = {"url": "http://127.0.0.1:9/props", "total_slots": 1, "supports_tool_calls": False}
    for a in range(2):
        no_tool(run, a, 1, finish="stop")
    v = diagnose(run.data())
    assert v["kind"] == "no_tool_calls", v
    ev = "\n".join(v["evidence"])
    assert "the server cannot call tools: llama.cpp's /props says its chat template does not support tool calls" in ev
    assert 'conversation.tool_choice = "required" was sent, and no tool_choice changes that' in ev, ev
    assert "asks the server for a tool call" not in ev, ev
    run.meta["server_props"]["supports_tool_calls"] = True  # a template that can: the usual hint
    assert any("asks the server for a tool call" in e for e in diagnose(run.data())["evidence"])


# ------------------------------------------------------------------ context overflow in the server's numbers

LLAMA_OVERFLOW = ('{"error":{"code":400,"message":"request (%d tokens) exceeds the available context size (%d '
                  'tokens), try increasing it","type":"exceed_context_size_error","n_prompt_tokens":%d,"n_ctx":%d}}')


def test_a_context_overflow_is_told_in_the_servers_own_numbers_and_the_slot_split():
    run = healthy_base(agents=2, rounds=2)
    run.records[:] = [dataclasses.replace(r, server_prompt_tokens=140 + r.round) for r in run.records]
    for a in range(2):
        run.error(a, 3, "http_400", prompt_tokens=300, error_msg=LLAMA_OVERFLOW % (560, 512, 560, 512))
    run.meta["server_props"] = {"url": "http://127.0.0.1:9/props", "total_slots": 2, "n_ctx_per_slot": 512}
    v = diagnose(run.data())
    assert (v["kind"], v["first_round"]) == ("server_errors", 3), v
    ev = "\n".join(v["evidence"])
    assert ("2 request(s) did not fit the server's context (a context overflow): the server counted 560 prompt tokens "
            "against its n_ctx of 512 (its own numbers, from its error body); agentload's estimate of those prompts: "
            "300 tokens; the largest prompt that completed: 142 tokens by the server's count") in ev, ev
    assert "these requests were not retried" in ev, ev
    assert ("n_ctx 512 is one slot's share: total_slots = 2 split the context (2 x 512 = 1,024 tokens, llama-server -c "
            "over --parallel 2)") in ev, ev
    del run.meta["server_props"]
    assert "one slot's share" not in "\n".join(diagnose(run.data())["evidence"])


def test_an_error_that_is_not_an_overflow_says_nothing_of_context():
    run = healthy_base()
    run.error(0, 4, "http_400", error_msg='{"error":{"message":"bad tool schema"}}')
    assert not any("context" in e for e in diagnose(run.data())["evidence"])


def test_the_queue_quotes_llamacpp_slots_from_props_and_asks_for_its_metrics():
    run = _slot_queue([2, 2, 2])
    run.meta["server_props"] = {"url": "http://127.0.0.1:9/props", "total_slots": 2, "endpoint_metrics": False}
    ev = "\n".join(diagnose(run.data())["evidence"])
    assert "llama.cpp's /props: total_slots = 2 (llama-server --parallel)" in ev, ev
    assert "start llama-server with --metrics and add it to [target] metrics_urls" in ev, ev


# ---------------------------------------------------------------- client_stopped (agentload proxy)

def _proxy_run(gap_ms: float = 200.0, rounds: int = 4) -> RunBuilder:
    """Three conversations through `agentload proxy`, each answered in every round with a tool call,
    the harness `gap_ms` between an answer and its next request."""
    run = RunBuilder(agents=3, rounds=rounds, after_s=1.0)
    run.meta["proxy"] = {"upstream": "http://127.0.0.1:9/v1", "listen": "127.0.0.1:8080", "session_header": None}
    return run


def _conversation(run: RunBuilder, agent: int, rounds: int, start_ms: float, gap_ms: float,
                  last_tool_calls: int = 1) -> float:
    at = start_ms
    for rnd in range(1, rounds + 1):
        rec = run.ok(agent, rnd, at_ms=at, proxied=True, tool_calls=last_tool_calls if rnd == rounds else 1)
        at = rec.t["end"] / 1e6 + gap_ms
    return at


def test_client_stopped_names_the_conversation_the_harness_never_went_on_with():
    run = _proxy_run()
    for a in (0, 1):
        _conversation(run, a, 4, 0, 200, last_tool_calls=0)  # ended: the last answer asked for nothing
    _conversation(run, 2, 2, 0, 200)  # answered with a tool call in round 2, then silence
    run.meta["t_end_ns"] = int(10_000 * MS)
    v = diagnose(run.data())
    assert v["kind"] == "client_stopped", v
    assert (v["agents_stopped"], v["first_round"], v["phase"]) == (1, 3, "tool")
    assert "(2)" in v["summary"] and "conversation 2: round 2 answered" in " ".join(v["evidence"])


def test_client_stopped_follows_the_harness_rhythm_and_never_judges_a_run():
    run = _proxy_run()
    # slow tool work: 3 s between rounds, always; the proxy stopped 5 s after the last answer
    end = _conversation(run, 0, 3, 0, 3000)
    run.meta["t_end_ns"] = int((end - 3000 + 5000) * MS)
    assert diagnose(run.data())["kind"] == "healthy"
    # ... 10 s of silence is past 3x its own gap: stopped
    run.meta["t_end_ns"] = int((end - 3000 + 10_000) * MS)
    assert diagnose(run.data())["kind"] == "client_stopped"
    # the same records in a run of agentload's own agents: their rounds end where the scenario says
    del run.meta["proxy"]
    assert diagnose(run.data())["kind"] == "healthy"


def test_a_stall_at_the_server_is_not_a_client_stop():
    run = _proxy_run()
    _conversation(run, 0, 4, 0, 200, last_tool_calls=0)
    run.ok(1, 1, at_ms=0, proxied=True)
    run.stalled(1, 2, at_ms=500, proxied=True)  # the harness did send round 2: the server never answered
    run.meta["t_end_ns"] = int(30_000 * MS)
    v = diagnose(run.data())
    assert v["kind"] == "server_stall" and all(s["kind"] != "client_stopped" for s in v["secondary"]), v


# ------------------------------------------------------------------ what sits between: proxies

NGINX_504 = ("<html> <head><title>504 Gateway Time-out</title></head> <body> <center><h1>504 Gateway Time-out</h1>"
             "</center> <hr><center>nginx/1.22.1</center> </body> </html>")
NGINX_503 = NGINX_504.replace("504 Gateway Time-out", "503 Service Temporarily Unavailable")
HAPROXY_504 = "<html><body><h1>504 Gateway Time-out</h1> The server didn't respond in time. </body></html> "


def _behind_a_proxy_timeout(durations_ms: list[float], error: str = "http_504", server: str | None = "nginx/1.22.1",
                            body: str = NGINX_504) -> RunBuilder:
    """Two agents answered in round 1 through nginx; in round 2 each request failed after `durations_ms`."""
    run = RunBuilder(agents=len(durations_ms), rounds=2)
    for a in range(len(durations_ms)):
        run.ok(a, 1, server=server)
    for a, d in enumerate(durations_ms):
        if error.startswith("http_"):
            run.error(a, 2, error, ttfb_ms=d, error_msg=body, server=server)
        else:  # a stream cut after two tokens and a silence of d - 100 ms
            run.error(a, 2, error, ttfb_ms=5, ttft_ms=50, stream_ms=d - 55, max_gap_ms=d - 100, server=server,
                      error_msg="Response payload is not completed")
    return run


def test_504s_that_all_ended_at_one_duration_are_a_proxy_timeout_naming_the_proxy():
    v = diagnose(_behind_a_proxy_timeout([3001.2, 3004.8, 3000.9, 3008.0]).data())
    assert v["kind"] == "proxy_timeout" and v["phase"] == "ttfb" and v["first_round"] == 2, v
    assert "ended 3.00 s after send" in v["summary"] and "by nginx/1.22.1" in v["summary"], v["summary"]
    assert "the hang is the server's" in v["summary"]
    ev = "\n".join(v["evidence"])
    assert "3.001-3.008 s after send (within 7 ms of each other" in ev, ev
    assert "Server: nginx/1.22.1" in ev and "504 Gateway Time-out" in ev and "proxy_read_timeout" in ev, ev
    # the same failures are not told again as server errors
    assert "server_errors" not in [s["kind"] for s in v["secondary"]], v["secondary"]


def test_haproxys_504_page_names_haproxy_without_a_server_header():
    v = diagnose(_behind_a_proxy_timeout([3001, 3002, 3013], server=None, body=HAPROXY_504).data())
    assert v["kind"] == "proxy_timeout" and "by haproxy" in v["summary"], v


def test_streams_cut_after_the_same_silence_are_a_proxy_timeout_in_stream():
    v = diagnose(_behind_a_proxy_timeout([3000, 3010, 3004], error="ClientPayloadError").data())
    assert v["kind"] == "proxy_timeout" and v["phase"] == "stream", v
    assert "stream(s) cut by nginx/1.22.1" in v["summary"], v["summary"]
    assert any("before the cut" in e for e in v["evidence"]), v["evidence"]
    assert "disconnects" not in [s["kind"] for s in v["secondary"]]


def test_failures_at_different_durations_or_quick_ones_are_not_a_proxy_timeout():
    assert diagnose(_behind_a_proxy_timeout([3000, 4100, 5200, 900]).data())["kind"] == "server_errors"
    assert diagnose(_behind_a_proxy_timeout([120, 121, 122]).data())["kind"] == "server_errors"  # too short
    # streams cut while tokens still flowed (no silence before the cut): the other side closed them
    run = RunBuilder(agents=3, rounds=1)
    for a in range(3):
        run.error(a, 1, "ClientPayloadError", ttfb_ms=5, ttft_ms=50, stream_ms=2945, max_gap_ms=20)
    assert diagnose(run.data())["kind"] == "disconnects"


def _limit_in_front(refusals: int = 4, inflight: int = 2, server: str | None = "nginx/1.22.1") -> RunBuilder:
    """`inflight` long answers on the wire from 0 to ~1 s; meanwhile `refusals` requests refused with
    503 in 1 ms, each while those were in flight."""
    run = RunBuilder(agents=inflight + refusals, rounds=1)
    for a in range(inflight):
        run.ok(a, 1, at_ms=0, ttfb_ms=5, ttft_ms=20, stream_ms=1000, server=server)
    for i in range(refusals):
        run.error(inflight + i, 1, "http_503", at_ms=100 + 150 * i, ttfb_ms=1, error_msg=NGINX_503, server=server)
    return run


def test_quick_503s_always_at_the_same_load_are_a_concurrency_limit_in_front():
    v = diagnose(_limit_in_front().data())
    assert v["kind"] == "concurrency_limit" and v["phase"] == "ttfb", v
    assert "each while 2 other request(s) were in flight" in v["summary"] and "by nginx/1.22.1" in v["summary"]
    ev = "\n".join(v["evidence"])
    assert "in flight at each refusal: 2: 4" in ev and "limit_conn" in ev and "503 Service" in ev, ev
    assert "server_errors" not in [s["kind"] for s in v["secondary"]]


def test_503s_with_nothing_else_in_flight_are_the_servers_errors():
    assert diagnose(_limit_in_front(inflight=0).data())["kind"] == "server_errors"
    # at different loads: no limit
    run = _limit_in_front(refusals=2)
    run.error(9, 1, "http_503", at_ms=5_000, ttfb_ms=1, error_msg=NGINX_503)  # nothing else in flight then
    assert diagnose(run.data())["kind"] == "server_errors"


def _buffered(reads: int, wait_ms: float, answers: int = 4, chunks: int = 12) -> RunBuilder:
    run = RunBuilder(agents=answers, rounds=1)
    for a in range(answers):
        run.ok(a, 1, ttfb_ms=wait_ms, ttft_ms=0.05, stream_ms=0.1 if reads == 1 else wait_ms * (reads - 1),
               token_chunks=chunks, token_reads=reads, server="nginx/1.22.1")
    return run


def test_answers_that_came_all_at_once_after_a_wait_are_a_buffered_stream():
    v = diagnose(_buffered(reads=1, wait_ms=500).data())
    assert v["kind"] == "buffered_stream" and v["agents_stopped"] == 0 and v["phase"] == "ttfb", v
    assert v["summary"].startswith("a buffering proxy? 4 of 4 answers came in bursts (12 token chunks a read")
    ev = "\n".join(v["evidence"])
    assert "proxy_buffering off" in ev and "X-Accel-Buffering: no" in ev and "nginx/1.22.1 x4" in ev, ev
    v = diagnose(_buffered(reads=3, wait_ms=400).data())  # three 4 KB bursts 400 ms apart
    assert v["kind"] == "buffered_stream", v


def test_paced_tokens_or_a_quick_burst_are_healthy():
    assert diagnose(_buffered(reads=12, wait_ms=500).data())["kind"] == "healthy"  # one token a read
    assert diagnose(_buffered(reads=1, wait_ms=40).data())["kind"] == "healthy"  # a fast server's burst
    assert diagnose(_buffered(reads=1, wait_ms=500, chunks=5).data())["kind"] == "healthy"  # too short to tell
    run = _buffered(reads=1, wait_ms=500, answers=1)
    run.agents_done(range(1, 4), range(1, 2))  # one burst among paced answers
    assert diagnose(run.data())["kind"] == "healthy"


def test_server_errors_say_whether_a_proxy_or_the_server_answered_them():
    run = RunBuilder(agents=2, rounds=2)
    for a in range(2):
        run.ok(a, 1, server="nginx/1.22.1")
        run.error(a, 2, "http_502", ttfb_ms=2, server="nginx/1.22.1",
                  error_msg=NGINX_504.replace("504 Gateway Time-out", "502 Bad Gateway"))
    v = diagnose(run.data())
    assert v["kind"] == "server_errors", v
    assert any(e.startswith("these errors came from nginx/1.22.1 in front of the server") for e in v["evidence"]), v
    run = RunBuilder(agents=2, rounds=2)
    for a in range(2):
        run.ok(a, 1, server="uvicorn")
        run.error(a, 2, "http_500", ttfb_ms=2, server="uvicorn", error_msg='{"error": {"message": "boom"}}')
    v = diagnose(run.data())
    assert any(e.startswith("these errors came from the server itself") for e in v["evidence"]), v


def test_a_stall_that_a_proxy_ended_later_names_the_proxys_timeout():
    """stall.after_s (5 s) shorter than the proxy's timeout (60 s): the stall leads, and its evidence
    says nginx ended those requests at 60 s."""
    run = RunBuilder(agents=3, rounds=2)
    for a in range(3):
        run.ok(a, 1, server="nginx/1.22.1")
        run.error(a, 2, "http_504", ttfb_ms=60_000 + a, stalled_phase="ttfb", error_msg=NGINX_504,
                  server="nginx/1.22.1")
    v = diagnose(run.data())
    assert v["kind"] == "server_stall" and v["phase"] == "ttfb", v
    assert any("3 of those ended 60.00 s after send" in e and "by nginx/1.22.1" in e for e in v["evidence"]), \
        v["evidence"]


def test_a_timer_that_fired_late_on_a_busy_machine_still_counts_but_never_early():
    v = diagnose(_behind_a_proxy_timeout([2001, 2002, 2003, 2180]).data())
    assert v["kind"] == "proxy_timeout" and "4 of" in v["summary"] and not v["secondary"], v
    v = diagnose(_behind_a_proxy_timeout([2001, 2002, 2003, 2004, 1700]).data())  # 300 ms early: not it
    assert v["kind"] == "proxy_timeout" and "4 of" in v["summary"], v
    assert [s["kind"] for s in v["secondary"]] == ["server_errors"], v["secondary"]


def test_bursts_the_server_sent_late_itself_or_that_agentloads_lag_gathered_are_not_a_buffering_proxy():
    # the server's own send stamp: its first token left 1 ms before agentload read it (not held on the way)
    run = _buffered(reads=1, wait_ms=500)
    run.records = [dataclasses.replace(r, server_first_token_ns=r.t["first_token"] - 1_000_000) for r in run.records]
    assert diagnose(run.data())["kind"] == "healthy"
    # ... held 480 ms on the way: a buffering proxy
    run.records = [dataclasses.replace(r, server_first_token_ns=r.t["first_token"] - 480_000_000) for r in run.records]
    v = diagnose(run.data())
    assert v["kind"] == "buffered_stream" and any("before agentload read it" in e for e in v["evidence"]), v
    # agentload's own loop lagged 300 ms once: waits of 500 ms may be its own late reads
    run = _buffered(reads=1, wait_ms=500)
    run.sample(loop_lag_ms=300.0)
    assert "buffered_stream" not in kinds(run)


# ------------------------------------------------------------------ truncated, malformed_tool_calls, protocol

CUT = ["truncated: finish_reason length after 2 token chunk(s): 1 tool call(s), the arguments of 1 cut mid-JSON",
       'bad_arguments: call 0 (tool_1) arguments are not JSON (13 chars): "{\\"query\\": \\"ab"']
WHOLE_CUT = ["truncated: finish_reason length after 3 token chunk(s): 1 tool call(s) with whole arguments"]
NO_ID = ["no_id: call 0 (tool_1) came without an id (a tool result cannot name it)"]


def test_answers_cut_mid_arguments_are_truncated_and_stopped_their_agents():
    run = model_run(agents=4, rounds=3)
    run.agents_done(range(4), range(1, 2))
    for a in range(3):
        run.ok(a, 2, finish_reason="length", tool_call_problems=CUT)
    run.agents_done(range(3, 4), range(2, 4))
    v = diagnose(run.data())
    assert (v["kind"], v["first_round"], v["agents_affected"], v["agents_stopped"]) == ("truncated", 2, 3, 3), v
    assert v["summary"].startswith("truncated: 3 of 9 answers were cut by max_tokens (finish_reason length)")
    assert "cut mid-JSON in 3" in v["summary"] and "3 of 4 agents ended there" in v["summary"]
    ev = "\n".join(v["evidence"])
    assert "round 2: 3; finish_reason: length x3" in ev and '"{\\"query\\": \\"ab"' in ev
    assert "conversation.max_tokens = 32" in ev
    out = {o["agent"]: o for o in agent_outcomes(run.data())}
    assert [out[a]["outcome"] for a in range(4)] == ["bad_tool_calls"] * 3 + ["done"]
    assert out[0]["bad_tool_calls_round"] == 2 and out[0]["tool_call_problems"] == CUT
    assert "no_tool_calls" not in kinds(run)


def test_cut_after_whole_tool_calls_is_truncated_but_stops_no_one():
    run = model_run(agents=2, rounds=2)
    for rnd in (1, 2):
        for a in range(2):
            run.ok(a, rnd, finish_reason="length", tool_call_problems=WHOLE_CUT)
    v = diagnose(run.data())
    assert v["kind"] == "truncated" and v["agents_stopped"] == 0 and "ended there" not in v["summary"], v
    assert {o["outcome"] for o in agent_outcomes(run.data())} == {"done"}


def test_a_forced_tool_call_cut_before_any_is_truncated_not_no_tool_calls():
    run = model_run(agents=2, rounds=3)
    for a in range(2):
        run.ok(a, 1, finish_reason="length", tool_calls=0,
               tool_call_problems=["truncated: finish_reason length after 4 token chunk(s): no tool call, "
                                   "though one was asked for"])
    assert kinds(run) == ["truncated"]
    assert diagnose(run.data())["agents_stopped"] == 2


def test_malformed_tool_calls_stop_model_agents_and_not_scripted_ones():
    run = model_run(agents=3, rounds=3)
    run.ok(0, 1, tool_call_problems=NO_ID)
    run.ok(1, 1, tool_call_problems=['ids_on_one_index: index 0 carried the ids "a" and "b": two calls that would '
                                     'be merged into one'])
    run.agents_done(range(2, 3), range(1, 4))
    v = diagnose(run.data())
    assert (v["kind"], v["agents_stopped"], v["first_round"]) == ("malformed_tool_calls", 2, 1), v
    assert "2 of 5 answers had tool calls" in v["summary"], v
    assert "no_id x1" in v["summary"] and "ids_on_one_index x1" in v["summary"]
    assert any("came without an id" in e for e in v["evidence"])
    # scripted: the same answers stop no one, but keep the verdict from healthy
    run.meta["scenario"]["conversation"]["mode"] = "scripted"
    v = diagnose(run.data())
    assert v["kind"] == "malformed_tool_calls" and v["agents_stopped"] == 0
    assert any('mode = "scripted"' in e for e in v["evidence"])


def test_tool_call_findings_in_the_last_round_stop_no_one_and_yield_to_errors_that_stopped_more():
    run = model_run(agents=3, rounds=2)
    run.agents_done(range(3), range(1, 2))
    run.ok(0, 2, tool_call_problems=NO_ID)  # the last round: the conversation was over anyway
    run.error(1, 2, "http_500")
    run.error(2, 2, "http_500")
    assert kinds(run) == ["server_errors", "malformed_tool_calls"]
    assert diagnose(run.data())["secondary"][0]["agents_stopped"] == 0


def test_tool_call_facts_are_tallies_not_records():
    run = model_run(agents=50, rounds=3)
    for a in range(50):
        run.ok(a, 1, tool_call_problems=WHOLE_CUT, finish_reason="length")
        run.ok(a, 2)
    acc = FactsAccumulator()
    for r in run.records:
        acc.add(r)
    assert acc.troubled == [] and acc.truncated.records == 50 and acc.truncated.codes == {"truncated": 50}
    assert len(acc.truncated.agents) == 50 and acc.truncated.rounds == {1: 50}


def test_protocol_notes_are_a_protocol_finding_that_stops_no_one():
    run = healthy_base(agents=2, rounds=2)
    run.ok(0, 3, protocol=["events_after_done: 2 data event(s) after [DONE], 2 with tokens (not counted: the "
                           "answer ends at [DONE]); first: x"])
    run.ok(1, 3, protocol=["held_open_after_done: the body was still open 1 s after [DONE]; agentload ended the "
                           "read there and closed the connection"])
    v = diagnose(run.data())
    assert (v["kind"], v["agents_stopped"], v["first_round"], v["phase"]) == ("protocol", 0, 3, "stream"), v
    assert "2 of 6 answers broke the stream protocol around [DONE]" in v["summary"]
    assert "data events after [DONE] in 1" in v["summary"] and "held the body open after [DONE] in 1" in v["summary"]
    ev = "\n".join(v["evidence"])
    assert "2 with tokens" in ev and "still open 1 s after [DONE]" in ev and "SDK client" in ev


def test_protocol_yields_to_a_finding_that_stopped_agents():
    run = healthy_base(agents=2, rounds=2)
    run.ok(0, 3, protocol=["held_open_after_done: x"])
    run.error(1, 3, "malformed_stream")
    assert kinds(run) == ["bad_responses", "protocol"]


def test_a_queue_whose_slots_are_slow_themselves_is_told_by_the_engines_work_counter(tmp_path):
    """llama-server --parallel 2 on a busy machine: the two requests in the slots spend longer than
    stall.after_s on their prompt (stalled in ttft), nothing completes before give_up_s, so the
    samples see nothing move; llama.cpp's n_decode_total grew meanwhile: a queue, not a hang."""
    def build(decodes: list[float]) -> RunBuilder:
        run = RunBuilder(agents=8, rounds=2, after_s=1.0)
        url = "http://127.0.0.1:9/metrics"
        run.meta["scenario"]["target"] = {"metrics_urls": [url]}
        for a in range(8):
            if a < 2:
                run.stalled(a, 1, "ttft", at_ms=1000, held_ms=4000)
            else:
                run.stalled(a, 1, "ttfb", at_ms=1000, held_ms=4000)
        for _ in range(3):
            run.sample(inflight={"ttfb": 6, "ttft": 2}, stalled=8, stalled_by={"1/ttfb": 6, "1/ttft": 2},
                       counts={"ok": 0})
        for i, n in enumerate(decodes):
            run.scrape(2.5 + i, {"llamacpp:requests_processing": 2, "llamacpp:requests_deferred": 6,
                                 "llamacpp:n_decode_total": n}, url)
        return run

    v = diagnose(build([10, 40, 90]).write(tmp_path / "working"))
    assert (v["kind"], v["phase"]) == ("server_queue", "ttfb"), v
    assert "the server works on at most 2 request(s) at once" in v["summary"], v["summary"]
    ev = "\n".join(v["evidence"])
    assert "the engine kept working: llamacpp:n_decode_total grew by 80 over 3 scrapes" in ev, ev
    v = diagnose(build([40, 40, 40]).write(tmp_path / "hung"))  # slots busy, no work done: a hang
    assert v["kind"] == "server_stall", v


def test_agents_due_that_never_started_keep_the_verdict_from_healthy():
    """The load asked for was not applied: client_saturated (agentload's side), with the counts;
    a server finding that stopped agents still leads."""
    run = healthy_base(agents=4, rounds=3)
    run.meta["scenario"]["agents"]["count"] = 2_000_000
    run.meta.update(agents_started=7_680, agents_due_unstarted=2_000_000 - 7_680)
    v = diagnose(run.data())
    assert v["kind"] == "client_saturated", v
    assert "started only 7,680 of 2,000,000 agents" in v["summary"], v["summary"]
    assert "1,992,320 were due before the run ended" in " ".join(v["evidence"]), v["evidence"]
    run.stalled(1, 3, phase="ttfb")
    v = diagnose(run.data())
    assert v["kind"] == "server_stall" and [s["kind"] for s in v["secondary"]] == ["client_saturated"], v


def test_agents_scheduled_after_the_end_are_a_warning_not_a_finding(tmp_path):
    from agentload.analysis.summary import build_summary

    run = healthy_base(agents=4, rounds=3)
    run.meta["scenario"]["agents"]["count"] = 10
    run.meta.update(agents_started=4, agents_due_unstarted=0)
    data = run.write(tmp_path)
    s = build_summary(data)
    assert s["verdict"]["kind"] == "healthy", s["verdict"]
    assert any("6 of 10 agents asked for never started" in w and "due only after the run ended" in w
               for w in s["warnings"]), s["warnings"]
    run = healthy_base(agents=4, rounds=3)  # every agent started, or a run.json from before the counts
    for extra in ({"agents_started": 4, "agents_due_unstarted": 0}, {}):
        run.meta.update(extra)
        assert diagnose(run.data())["kind"] == "healthy"


def _limited_run(retried_ok: bool) -> RunBuilder:
    run = RunBuilder(agents=2, rounds=2)
    run.meta["scenario"]["agents"].update(rate_limit_retries=1, retry_after_max_s=30.0)
    run.ok(0, 1)
    run.ok(1, 1)
    run.error(0, 2, "http_429", retry_after_s=2.0, error_msg='{"error": "Rate limit reached"}')
    if retried_ok:
        run.ok(0, 2, call=1)
    else:
        run.error(0, 2, "http_429", call=1, retry_after_s=60.0)
    run.ok(1, 2)
    return run


def test_a_429_is_rate_limited_never_server_errors_and_says_whether_retries_worked():
    v = diagnose(_limited_run(True).data())
    assert v["kind"] == "rate_limited" and not v["secondary"], v
    assert "1 of 5 requests answered HTTP 429, first in round 2" in v["summary"], v["summary"]
    assert "Retry-After asked for 2 s" in v["summary"] and "every rate-limited round completed" in v["summary"]
    assert v["agents_stopped"] == 0
    v = diagnose(_limited_run(False).data())
    assert v["kind"] == "rate_limited" and v["agents_stopped"] == 1, v
    assert "Retry-After asked for 2-60 s" in v["summary"] and "0 of 1 rate-limited rounds completed" in v["summary"]
    ev = " | ".join(v["evidence"])
    assert "the server asked for up to 60 s" in ev and "rate_limit_retries = 1" in ev, ev
    assert "(rate_limit_retries exhausted)" in ev


def test_a_500_next_to_a_429_is_still_server_errors_and_the_one_that_stopped_more_leads():
    run = _limited_run(True)
    run.error(1, 1, "http_500", call=1)  # retried and the agent went on: neither stopped an agent
    assert kinds(run) == ["rate_limited", "server_errors"]
    run = _limited_run(True)
    run.error(1, 3, "http_500")  # agent 1's last request: it stopped there
    assert kinds(run) == ["server_errors", "rate_limited"]


def test_a_refused_certificate_is_connect_with_the_problem_and_what_to_do():
    run = healthy_base(agents=2, rounds=2)
    for a in (0, 1):
        run.error(a, 3, "tls_certificate", status=None, ttfb_ms=None,
                  error_msg="TLS certificate of 127.0.0.1:8443 not accepted: certificate has expired")
    v = diagnose(run.data())
    assert v["kind"] == "connect" and "tls_certificate x2" in v["summary"], v
    assert any(e.startswith("certificate problem (2 request(s)): certificate has expired: the certificate is outside")
               for e in v["evidence"]), v["evidence"]
    run = healthy_base(agents=1, rounds=1)
    run.error(0, 2, "tls_handshake", status=None, ttfb_ms=None, error_msg="TLS handshake with h:1 failed: x")
    v = diagnose(run.data())
    assert v["kind"] == "connect" and any("does the endpoint speak TLS" in e for e in v["evidence"]), v
    assert not any(e.startswith("certificate problem") for e in v["evidence"])
