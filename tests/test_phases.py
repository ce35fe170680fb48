"""The phase table (agentload.records.phases) is the one definition of the phases: every list of
phases other code uses is derived from it, and what it derives keeps the meanings documented in
docs/report.md (which phase a request is in, what a phase lasts, which stamps exist)."""

from __future__ import annotations

import itertools
import re

from agentload.records import PHASES, REPORT_PHASES, STAMPS, Record, phase_at, phase_ns
from agentload.records import phases as ph
from agentload.records.record import Trace
from helpers import REPO


def test_every_derived_list_comes_from_the_table_in_its_order():
    names = [p.name for p in ph.TABLE]
    assert names == ["pool_wait", "connect", "send", "ttfb", "ttft", "stream", "e2e"]
    assert PHASES == tuple(p.name for p in ph.TABLE if p.request)
    assert REPORT_PHASES == ("pool_wait", "connect", "ttfb", "ttft", "stream", "e2e")
    assert ph.SERVER_PHASES == ("ttfb", "ttft", "stream")
    assert ph.COMPARE_PHASES == ("pool_wait", "connect", "ttfb", "ttft", "e2e")
    assert ph.COMPARE_CDF_PHASES == ("pool_wait", "ttfb", "e2e")
    assert STAMPS == ("intended", "start", "queued_start", "queued_end", "conn_start", "conn_end", "sent", "headers",
                      "first_byte", "first_token", "end")
    # labels start with the name people see in the tables; every phase has its own colour
    assert all(p.label.startswith(p.name) for p in ph.TABLE)
    assert len({p.color for p in ph.TABLE}) == len(ph.TABLE)


def test_the_consumers_read_the_table():
    from agentload.analysis import compare, target_evidence
    from agentload.report import figures, timeline

    assert timeline.REQUEST_PHASES == PHASES
    assert compare.PHASE_ROWS == ph.COMPARE_PHASES
    assert all(figures.COLORS[p.name] == p.color and figures.LABELS[p.name] == p.label for p in ph.TABLE)
    assert set(target_evidence._WAIT) == set(ph.SERVER_PHASES)
    assert not hasattr(timeline, "TIMELINE_KINDS")


def test_the_docs_list_the_phases_of_the_table():
    page = (REPO / "docs" / "report.md").read_text()
    part = page[page.index("## Phases"):]
    part = (part + "\n\n")[: (part + "\n\n").index("\n\n", part.index("|"))]
    listed = re.findall(r"^\| `([a-z_0-9]+)` \|", part, flags=re.M)
    assert listed == [p.name for p in ph.TABLE]


def _stamps(keys: tuple[str, ...]) -> dict[str, int]:
    return {k: 1_000 + 10 * i for i, k in enumerate(STAMPS) if k in keys}


def test_a_complete_request_passes_every_phase_and_they_add_up():
    t = _stamps(STAMPS[1:])  # closed loop: no intended start
    segs = ph.request_segments(t)
    assert [s[0] for s in segs] == list(PHASES)
    assert segs[0][1] == t["queued_start"] and segs[-1][2] == t["end"]
    # back to back from the queue to the end, but for the step from a pool slot to connecting
    assert sum(phase_ns(t, p) for p in PHASES) == t["end"] - t["queued_start"] - (t["conn_start"] - t["queued_end"])
    assert phase_at(t, False) == "stream" and phase_ns(t, "e2e") == t["end"] - t["start"]


def test_a_phase_skipped_is_zero_and_a_phase_never_reached_is_absent():
    reused = _stamps(("start", "sent", "headers", "first_token", "end"))
    assert phase_ns(reused, "pool_wait", True) == 0 and phase_ns(reused, "connect", True) == 0
    hung = _stamps(("start", "queued_start", "queued_end", "conn_start", "conn_end", "sent"))
    assert phase_ns(hung, "ttfb") is None and phase_ns(hung, "e2e") is None
    assert phase_at(hung, False) == "ttfb"
    assert ph.phase_since(hung, False) == hung["sent"]
    queued = _stamps(("start", "queued_start"))
    assert phase_at(queued, None) == "pool_wait" and ph.phase_since(queued, None) == queued["queued_start"]
    assert phase_ns({}, "ttfb") is None


def test_the_current_phase_and_its_start_for_every_set_of_stamps():
    """phase_at and phase_since agree with the table: the phase a request is in began at its
    phase_begin stamp, and every phase before it has ended or was skipped."""
    keys = STAMPS[1:]
    for n in range(len(keys) + 1):
        for combo in itertools.combinations(keys, n):
            if "start" not in combo:
                continue
            t = _stamps(combo)
            for reused in (None, True, False):
                p = phase_at(t, reused)
                since = ph.phase_since(t, reused)
                begin = ph.phase_begin(t, p)
                assert since == (t["start"] if begin is None else begin)
                assert since <= max(t.values())


def test_the_watchdog_measures_progress_from_the_phase_it_is_in():
    tr = Trace("agent", 0, 1, 0, "r", 1, 1, 1)
    tr.t.update(_stamps(("start", "queued_start")))
    assert tr.progress_ns() == tr.t["queued_start"]
    tr.t.update(_stamps(("queued_end", "conn_start", "conn_end", "sent", "headers")))
    assert tr.progress_ns() == tr.t["headers"]
    tr.t["first_token"], tr.last_token = 5_000, 6_000
    assert tr.progress_ns() == 6_000  # streaming: the last token is the progress


def test_a_record_reads_its_phases_through_the_table():
    t = _stamps(STAMPS)
    rec = Record(1, "r", "agent", 0, 1, 0, "r-a0-r1-c0", 1, 1, 1, None, 1, 200, "ok", None, None, None, False,
                 "stop", 0, 1, 1, 0, 0, 0, t)
    assert rec.phase_ns("e2e") == t["end"] - t["intended"]  # open loop: from the intended start
    assert rec.phase_ns("send") == t["sent"] - t["conn_end"]
