"""Report memory does not grow with the number of rounds (issue: "report memory grows with the number
of rounds, not the load"): the same records spread over 10 and over 5,000 rounds build their reports
(`write_reports`: summary.json, report.txt, report.html) within a bound of each other.

Peak memory is traced with tracemalloc around `write_reports` alone (the records are on disk, as
`agentload report` reads them). Not a speed test: no time is asserted. The figures of a day-long
run with 10,000 rounds are in docs/memory.md (`tools/gen_long_run.py`)."""

from __future__ import annotations

import gc
import tracemalloc
from pathlib import Path

import orjson

from agentload.analysis.summary import build_summary, summary_pass
from agentload.records.rundir import load_run
from agentload.report.build import write_reports
from records_factory import RunBuilder

AGENTS = 2
PER_AGENT = 5_000  # 10,000 requests: round 1..5,000 once per agent, or conversations of 10 rounds


def _run(tmp_path: Path, rounds: int) -> Path:
    """The same requests (same agents, same durations, same order), their rounds 1..`rounds` (an agent
    past its last round starts a new conversation at round 1, as with agents.restart)."""
    run = RunBuilder(agents=AGENTS, rounds=rounds)
    run.meta["scenario"]["agents"]["restart"] = True
    for i in range(PER_AGENT):
        conv, rnd = divmod(i, rounds)
        for a in range(AGENTS):
            k = i * AGENTS + a
            kw = dict(ttfb_ms=1 + (k * 7919 % 997) / 10, ttft_ms=20 + (k * 104729 % 4999) / 10,
                      stream_ms=50 + (k * 15485863 % 9973) / 10, conversation=conv,
                      connect_ms=0.5 if i == 0 else None)
            if k % 997 == 5:
                run.error(a, rnd + 1, "http_500", **kw)
            else:
                run.ok(a, rnd + 1, **kw)
        if i % 500 == 0:
            run.sample()
    out = tmp_path / f"rounds-{rounds}"
    run.write(out)
    return out


def _traced_peak_mb(fn):
    gc.collect()
    tracemalloc.start()
    try:
        out = fn()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return peak / 2**20, out


def _summary_path(run_dir: Path) -> dict:
    data = load_run(run_dir)
    return build_summary(data, summary_pass(data))


def test_the_same_records_over_10_or_5000_rounds_build_their_report_in_the_same_memory(tmp_path):
    few, many = _run(tmp_path, 10), _run(tmp_path, 5_000)
    write_reports(few)  # once untraced: imports and first-use caches (plotly's) are no report's memory
    peak_few, s_few = _traced_peak_mb(lambda: write_reports(few)[0])
    peak_many, s_many = _traced_peak_mb(lambda: write_reports(many)[0])
    sum_few, _ = _traced_peak_mb(lambda: _summary_path(few))
    sum_many, _ = _traced_peak_mb(lambda: _summary_path(many))
    # the same requests: the same totals and the same percentiles over all of them
    assert s_few["totals"]["requests"] == s_many["totals"]["requests"] == AGENTS * PER_AGENT
    assert s_few["phases"] == s_many["phases"]
    # every round keeps its counts; the tables show rounds 1-10 and then bands (each band exact)
    assert len(s_many["rounds"]) == 5_000 and sum(r["requests"] for r in s_many["rounds"]) == AGENTS * PER_AGENT
    assert [b["rounds"] for b in s_many["round_bands"]][-1] == [2561, 5000]
    assert s_many["rounds"][4999]["phases"] is None and s_many["rounds"][0]["phases"] is not None
    assert sum(b["requests"] for b in s_many["round_bands"]) == AGENTS * PER_AGENT
    html = (many / "report.html").read_bytes()
    assert b"2561-5000" in html and len(html) < 1.5 * len((few / "report.html").read_bytes())
    assert len(orjson.dumps(s_many)) < 1_500_000  # 5,000 rounds of counts, not of percentiles
    # the bound: memory set by the load, not by how many rounds it is spread over (before the rounds
    # were banded as they came, here: 39 -> 83 MB for the reports, 10 -> 57 MB for the summary)
    assert peak_many <= 1.5 * peak_few + 4, (peak_few, peak_many)
    assert sum_many <= 2 * sum_few + 6, (sum_few, sum_many)
