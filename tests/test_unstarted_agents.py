"""Agents asked for that never started are counted in run.json and reported: 100,000 agents asked
for a 0.3 s run start only a few hundred (agentload starts them a slice per loop step), and the
run must not look like a full success; agents scheduled after the end (a ramp longer than the run)
are a warning line. Over real HTTP against the embedded mock."""

from __future__ import annotations

import orjson

from agentload.launch import run_to_dir
from agentload.run.scenario import load_scenario


def _run(tmp_path, name, sets):
    sc = load_scenario("demo", ["canary.every_s=0", "agents.rounds=1", *sets])
    out = run_to_dir(sc, tmp_path / name, live=False, install_signals=False, log=lambda m: None)
    return out, orjson.loads((tmp_path / name / "run.json").read_bytes())


def test_agents_due_that_never_started_are_counted_and_named_in_the_verdict(tmp_path):
    out, meta = _run(tmp_path, "many", ["agents.count=100000", "agents.duration_s=0.3"])
    started, due = meta["agents_started"], meta["agents_due_unstarted"]
    assert meta["agents_asked"] == 100_000 and 0 < started < 100_000, meta
    assert due == 100_000 - started, meta  # start = "all": every one was due at once
    v = out.summary["verdict"]
    kinds = [v["kind"]] + [s["kind"] for s in v.get("secondary", [])]
    assert "client_saturated" in kinds and v["kind"] != "healthy", v
    text = out.text
    assert f"started only {started:,} of 100,000 agents" in text, text[:2000]
    assert f"(started {started:,} of 100,000 asked)" in text
    html = (tmp_path / "many" / "report.html").read_text()
    assert f"started only {started:,} of 100,000 agents" in html


def test_agents_scheduled_after_the_end_are_a_warning(tmp_path):
    # a 30 s ramp of 4 agents (due at 0, 10, 20, 30 s) in a 1 s run: one starts, three were never due
    out, meta = _run(tmp_path, "ramp", ["agents.count=4", "agents.start=30", "agents.duration_s=1"])
    assert meta["agents_started"] == 1 and meta["agents_due_unstarted"] == 0, meta
    assert out.summary["verdict"]["kind"] == "healthy", out.summary["verdict"]
    assert any("3 of 4 agents asked for never started: 3 were due only after the run ended" in w
               for w in out.summary["warnings"]), out.summary["warnings"]
    assert "(started 1 of 4 asked)" in out.text and "warning: 3 of 4 agents asked for never started" in out.text


def test_open_loop_arrivals_after_the_end_are_counted(tmp_path):
    out, meta = _run(tmp_path, "open", ["agents.count=400", "agents.arrival=\"open\"", "agents.rate_per_s=40",
                                        "agents.rate_dist=\"constant\"", "agents.duration_s=1"])
    started, due = meta["agents_started"], meta["agents_due_unstarted"]
    assert 30 <= started <= 45 and due <= 3, meta  # 40 a second for 1 s
    assert any(f"{400 - started - due} were due only after the run ended" in w
               for w in out.summary["warnings"] + out.summary["verdict"]["evidence"]), out.summary


def test_every_agent_started_says_nothing(tmp_path):
    out, meta = _run(tmp_path, "all", ["agents.count=3"])
    assert meta["agents_started"] == 3 and meta["agents_due_unstarted"] == 0
    assert "never started" not in out.text and "asked)" not in out.text
