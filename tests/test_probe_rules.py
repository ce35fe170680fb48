"""How the verdict reads a stall wave's probes (agentload.run.probes), on synthetic runs.

Every run here has the same confounded records: round 1 on new connections completed, round 2 (a
larger prompt, on the same connections reused) stalled in ttfb. Only the probes differ.
"""

from __future__ import annotations

from agentload.analysis.verdict import diagnose
from agentload.report.timeline import build_lanes
from records_factory import RunBuilder


def confounded(agents: int = 4, probes: bool | None = True) -> RunBuilder:
    run = RunBuilder(agents=agents, rounds=3)
    if probes is not None:
        run.meta["scenario"]["stall"]["probes"] = probes
    for a in range(agents):
        run.ok(a, 1, prompt_tokens=300, reused=False)
    for a in range(agents):
        run.stalled(a, 2, prompt_tokens=1603, reused=True)
    return run


def probe(run: RunBuilder, kind: str, answered: bool, wave: int = 1, **kw):
    reused = kind.endswith("_reused")
    tokens = 1603 if "_body_" in kind else 40
    if answered:
        return run.ok(0, 2, kind=kind, call=wave, reused=reused, prompt_tokens=tokens, **kw)
    return run.stalled(0, 2, kind=kind, call=wave, reused=reused, prompt_tokens=tokens, **kw)


def ev_line(v: dict, start: str) -> str:
    return next(e for e in v["evidence"] if e.startswith(start))


def test_a_short_prompt_hanging_on_a_reused_connection_names_the_connection_not_the_size():
    run = confounded()
    probe(run, "probe_body_fresh", True)
    probe(run, "probe_short_fresh", True)
    probe(run, "probe_short_reused", False)
    v = diagnose(run.data())
    assert v["kind"] == "server_stall" and v["first_round"] == 2
    assert "the hang follows the connection, not the prompt" in v["summary"], v["summary"]
    assert "prompt tokens stalled" not in v["summary"]  # the correlation the probes contradict never leads
    assert "the probes contradict it" in ev_line(v, "every request at or above 1,603 prompt tokens")
    line = ev_line(v, "probes of stall wave 1")
    assert "agent 0's round 2 request, 1,603 prompt tokens" in line and line.endswith("-> it follows the connection")
    assert v["agents_stopped"] == 4  # probes are no agent's requests
    assert "4 of 4 agents" in v["summary"]


def test_the_body_hanging_on_a_fresh_connection_names_the_content_with_its_threshold():
    run = confounded()
    probe(run, "probe_body_fresh", False)
    probe(run, "probe_short_fresh", True)
    probe(run, "probe_short_reused", True)
    v = diagnose(run.data())
    assert "every request at or above 1,603 prompt tokens stalled; the hang follows the request's content" \
           in v["summary"], v["summary"]
    assert "contradict" not in ev_line(v, "every request at or above")


def test_a_short_prompt_on_a_fresh_connection_hanging_too_means_no_one_is_answered():
    run = confounded()
    probe(run, "probe_body_fresh", False)
    probe(run, "probe_short_fresh", False)
    v = diagnose(run.data())
    assert "the server is not answering anyone" in v["summary"], v["summary"]
    assert "prompt tokens stalled" not in v["summary"]


def test_both_factors_needed_and_not_reproduced_are_told_apart_by_the_fourth_probe():
    run = confounded()
    for kind in ("probe_body_fresh", "probe_short_fresh", "probe_short_reused"):
        probe(run, kind, True)
    probe(run, "probe_body_reused", False)
    v = diagnose(run.data())
    assert "the hang needs both the content and a reused connection" in v["summary"], v["summary"]
    assert "1,603 prompt tokens stalled" in v["summary"]

    run = confounded()
    for kind in ("probe_body_fresh", "probe_short_fresh", "probe_short_reused", "probe_body_reused"):
        probe(run, kind, True)
    v = diagnose(run.data())
    assert "the probes did not reproduce it" in v["summary"] and "or was transient" in v["summary"], v["summary"]


def test_each_factor_alone_hanging_is_said_so():
    run = confounded()
    probe(run, "probe_body_fresh", False)
    probe(run, "probe_short_fresh", True)
    probe(run, "probe_short_reused", False)
    assert "each factor alone hangs" in diagnose(run.data())["summary"]


def test_a_probe_on_the_wrong_kind_of_connection_tells_nothing():
    """A 'reused' probe that went out on a new connection (the server closed the pooled one) did not
    change the factor: no conclusion from it, and the evidence says so."""
    run = confounded()
    probe(run, "probe_body_fresh", True)
    probe(run, "probe_short_fresh", True)
    run.stalled(0, 2, kind="probe_short_reused", call=1, reused=False, prompt_tokens=40)
    v = diagnose(run.data())
    assert "the hang follows" not in v["summary"] and "1,603 prompt tokens stalled" in v["summary"]
    assert "went out on a new connection instead, so it tells nothing" in ev_line(v, "probes of stall wave 1")
    assert "no probe was conclusive: the cause rests on correlation" in " ".join(v["evidence"])


def test_without_probes_the_evidence_says_the_cause_rests_on_correlation_and_what_is_confounded():
    v = diagnose(confounded(probes=False).data())
    line = ev_line(v, "probes are off ([stall] probes = false)")
    assert "prompt size and connection reuse are confounded" in line and "1,603" in line
    assert "1,603 prompt tokens stalled" in v["summary"]
    v = diagnose(confounded(probes=True).data())
    assert ev_line(v, "no probe ran during the stall")
    # a stalled request on a new connection: reuse is not needed, only size is left
    run = confounded(probes=False)
    run.stalled(0, 3, prompt_tokens=2000, reused=False)
    assert "connection reuse is not needed" in ev_line(diagnose(run.data()), "probes are off")


def test_waves_that_disagree_lead_with_the_most_common_cause_and_say_so():
    run = confounded()
    # wave 1: content; waves 2 and 3: the connection
    probe(run, "probe_body_fresh", False, wave=1)
    probe(run, "probe_short_reused", True, wave=1)
    for w in (2, 3):
        probe(run, "probe_body_fresh", True, wave=w)
        probe(run, "probe_short_reused", False, wave=w)
    v = diagnose(run.data())
    assert "the hang follows the connection" in v["summary"], v["summary"]
    assert "it follows the connection x2, it follows the content x1" in ev_line(v, "the probed waves disagree")


def test_a_slow_server_is_worded_as_stalled_not_hung():
    run = RunBuilder(agents=2, rounds=2)
    run.meta["scenario"]["stall"]["probes"] = True
    for a in range(2):
        run.ok(a, 1, prompt_tokens=300, reused=False)
        run.ok(a, 2, prompt_tokens=900, stalled_phase="ttfb", ttfb_ms=9000)
    probe(run, "probe_body_fresh", False)
    probe(run, "probe_short_reused", True)
    v = diagnose(run.data())
    assert v["kind"] == "server_slow" and "its own body stalled on a fresh connection" in v["summary"], v["summary"]


def test_probes_are_drawn_in_the_canaries_lane_not_an_agents():
    run = confounded(agents=2)
    probe(run, "probe_body_fresh", True)
    lanes, _ = build_lanes(run.data())
    assert [ln.key for ln in lanes] == [-1, 0, 1]
    assert [r.kind for r in lanes[0].records] == ["probe_body_fresh"]


def test_behind_a_router_a_probe_answered_by_another_backend_compares_backends_not_factors():
    """The PD incident's shape: every stalled request went to b1; the body answered on b0 and hung
    on b1, a short prompt answered on b1: the backend, not 'both factors'."""
    run = RunBuilder(agents=3, rounds=3).fleet(2)
    run.meta["scenario"]["stall"]["probes"] = True
    for a in range(3):
        run.ok(a, 1, prompt_tokens=300, reused=False, backend="b0")
        run.stalled(a, 2, prompt_tokens=1603, reused=True, backend="b1")
    probe(run, "probe_body_fresh", True, backend="b0")
    probe(run, "probe_short_fresh", True, backend="b1")
    probe(run, "probe_short_reused", True, backend="b1")
    probe(run, "probe_body_reused", False, backend="b1")
    v = diagnose(run.data())
    assert "the hang follows the backend, not the content or the connection: the stalled request's own body " \
           "answered on b0 and hung on b1" in v["summary"], v["summary"]
    assert "not where the stalled requests went" in ev_line(v, "probes of stall wave 1")
    # the same probes where the body answered on b1 too: the factors, as without a router
    run2 = RunBuilder(agents=3, rounds=3).fleet(2)
    run2.meta["scenario"]["stall"]["probes"] = True
    for a in range(3):
        run2.ok(a, 1, prompt_tokens=300, reused=False, backend="b0")
        run2.stalled(a, 2, prompt_tokens=1603, reused=True, backend="b1")
    probe(run2, "probe_body_fresh", True, backend="b1")
    probe(run2, "probe_short_reused", True, backend="b1")
    probe(run2, "probe_body_reused", False, backend="b1")
    assert "the hang needs both" in diagnose(run2.data())["summary"]
