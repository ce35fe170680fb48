"""Reports in one streaming pass over the records: no list of every record, bounded consumers.

`agentload report` reads records.jsonl once (`RunData.iter_records`), and each consumer keeps
only what it needs: histograms, counts, per-agent state, the troubled records, a sample of lanes.
What the report says must not depend on that: the same summary as from a sorted list of every
record, whatever order the lines are in.
"""

from __future__ import annotations

import dataclasses
import gc
import random
import shutil
import weakref
from collections import Counter
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentload.analysis.stats import SparseHistogram, histogram_of, summarize
from agentload.analysis.summary import build_summary
from agentload.analysis.tallies import FirstSeenCounts, SizeCounts, Spans
from agentload.records import Record, rundir
from agentload.records.rundir import RunData, load_run
from agentload.report.build import write_reports
from agentload.report.html_view import EndBins
from agentload.report.timeline import LaneSampler, thin_for_drawing
from helpers import REPO
from records_factory import MS, RunBuilder

FIXTURE = REPO / "tests" / "data" / "report-fixture"
GOLDEN = REPO / "tests" / "golden" / "report-fixture"


def _write(run: RunBuilder, out: Path, order: list[Record] | None = None) -> Path:
    """The builder's run as a run folder (run.json, records.jsonl, samples.jsonl)."""
    out.mkdir(parents=True, exist_ok=True)
    meta = dict(run.meta, t0_ns=MS, t_end_ns=run.clock + MS, t0_unix=0.0)
    (out / "run.json").write_bytes(orjson.dumps(meta))
    recs = run.records if order is None else order
    (out / "records.jsonl").write_bytes(b"".join(r.to_json() + b"\n" for r in recs))
    (out / "samples.jsonl").write_bytes(b"".join(orjson.dumps(s) + b"\n" for s in run.samples))
    return out


def _big_run(agents: int, rounds: int, stall_every: int) -> RunBuilder:
    run = RunBuilder(agents=agents, rounds=rounds + 1)
    for rnd in range(1, rounds + 1):
        for a in range(agents):
            run.ok(a, rnd, prompt_tokens=100 * rnd + a % 7)
    for a in range(0, agents, stall_every):
        run.stalled(a, rounds + 1, "ttfb", prompt_tokens=100 * (rounds + 1))
    for _ in range(5):
        run.ok(0, 0, kind="canary", ttft_ms=3)
    run.sample()
    return run


# ---------------------------------------------------------------- no list of every record


class _WeakRecord(Record):
    """A record that can be watched with a weak reference (Record has slots and no __weakref__)."""

    __slots__ = ("__weakref__",)


def test_run_data_read_from_disk_holds_no_record(tmp_path):
    data = load_run(_write(_big_run(20, 3, 5), tmp_path / "run"))
    held = [v for v in vars(data).values() if isinstance(v, (list, tuple)) and any(isinstance(x, Record) for x in v)]
    assert not held
    first, again = list(data.iter_records()), list(data.iter_records())  # a fresh stream each time
    assert len(first) == len(again) == 20 * 3 + 4 + 5 and first == again


def test_the_report_reads_the_records_once_and_keeps_few_of_them(tmp_path, monkeypatch):
    run = _big_run(agents=1500, rounds=4, stall_every=50)
    out = _write(run, tmp_path / "run")
    monkeypatch.setattr(rundir, "Record", _WeakRecord)
    streams: list[int] = []
    watched: list[weakref.ref] = []
    alive_at_end: list[int] = []
    original = RunData.iter_records

    def watching(self):
        streams.append(1)
        for rec in original(self):
            watched.append(weakref.ref(rec))
            yield rec
        gc.collect()  # the consumers have seen every record: what do they still hold?
        alive_at_end.append(sum(1 for w in watched if w() is not None))

    def no_list(self):
        raise AssertionError("a report asked for a list of every record")

    monkeypatch.setattr(RunData, "iter_records", watching)
    monkeypatch.setattr(RunData, "records", property(no_list))
    summary, _ = write_reports(out)
    assert len(streams) == 1, "the reports read records.jsonl more than once"
    total = len(watched)
    assert total == 1500 * 4 + 30 + 5
    # kept: the troubled records, the canaries and the timeline's lane sample (2 pools of 150
    # lanes at most), never the 6,000 fine records
    assert 35 <= alive_at_end[0] <= 2 * 150 * 4 + 30 + 5, alive_at_end
    assert summary["verdict"]["kind"] == "server_stall" and summary["totals"]["requests"] == 1500 * 4 + 30
    # the same summary as from every record held in a list, in the requests' order
    monkeypatch.undo()
    data = load_run(out)
    listed = RunData.from_records(out, data.meta, sorted(run.records, key=rundir.start_key), data.samples)
    assert build_summary(listed) == orjson.loads((out / "summary.json").read_bytes())


def test_the_order_of_the_lines_does_not_change_what_the_report_says(tmp_path):
    run_dir = tmp_path / "fx"
    shutil.copytree(FIXTURE, run_dir)
    lines = (run_dir / "records.jsonl").read_bytes().splitlines(keepends=True)
    random.Random(7).shuffle(lines)
    (run_dir / "records.jsonl").write_bytes(b"".join(lines))
    write_reports(run_dir)
    for name in ("summary.json", "report.txt"):
        assert (run_dir / name).read_text() == (GOLDEN / name).read_text(), name


def test_a_killed_run_is_counted_at_the_end_of_the_stream(tmp_path):
    run = _big_run(10, 3, 5)
    out = _write(run, tmp_path / "run")
    meta = orjson.loads((out / "run.json").read_bytes())
    meta.pop("t_end_ns")
    meta.update(ended=False)
    (out / "run.json").write_bytes(orjson.dumps(meta))
    with open(out / "records.jsonl", "ab") as f:
        f.write(run.records[0].to_json().replace(b'"run":"synthetic"', b'"run":"other"') + b"\n")
        f.write(b'{"v":1,"run":"synthetic","kind":"ag')
    data = load_run(out)
    assert data.torn_lines == 1 and data.other_run_records == 1  # a stream of their own when asked first
    summary, text = write_reports(out)
    assert summary["totals"]["torn_lines"] == 1 and summary["run"]["cut_short"]
    assert "1 record(s) of other runs" in text


# ---------------------------------------------------------------- the timeline's lane sample


def _lane_run(agents: int, rounds: int, stall_every: int) -> RunBuilder:
    run = RunBuilder(agents=agents, rounds=rounds)
    for rnd in range(1, rounds + 1):
        for a in range(agents):
            if rnd == rounds and a % stall_every == 0:
                run.stalled(a, rnd, "ttfb")
            else:
                run.ok(a, rnd)
    return run


def _sampler(run: RunBuilder, recs: list[Record], cap: int = 150, budget: int = 12_000) -> LaneSampler:
    s = LaneSampler(run.meta, cap, budget, t0=MS, end=run.clock)
    for r in recs:
        s.add(r)
    return s


def test_the_lane_sample_keeps_every_troubled_agent_and_is_the_same_in_any_order():
    run = _lane_run(400, 3, 7)
    troubled = set(range(0, 400, 7))
    pick = _sampler(run, run.records).pick_lanes(run.clock)
    keys = [ln.key for ln in pick.lanes]
    assert len(keys) == 150 and keys == sorted(keys)
    assert troubled <= set(keys)  # 58 agents with a stall: fewer than half the room, all shown
    assert pick.note.startswith("showing 150 of 400 agents: 58 of 58 with a stall")
    full = [ln for ln in pick.lanes if ln.key in troubled and not ln.partial]
    assert all(len(ln.records) == 3 and len(ln.gaps) == 2 for ln in full)
    assert all(len(ln.records) == 1 for ln in pick.lanes if ln.partial)  # joined at its first problem
    # agent by agent instead of round by round: the same lanes
    by_agent = sorted(run.records, key=lambda r: (r.agent, r.round))
    assert [ln.key for ln in _sampler(run, by_agent).pick_lanes(run.clock).lanes] == keys


def test_a_run_with_few_agents_keeps_every_lane_whole():
    run = _lane_run(12, 4, 5)
    pick = _sampler(run, run.records).pick_lanes(run.clock)
    assert pick.note is None and [ln.key for ln in pick.lanes] == list(range(12))
    assert all(len(ln.records) == 4 and len(ln.gaps) == 3 and not ln.partial for ln in pick.lanes)


def test_past_its_budget_the_sampler_keeps_the_lanes_the_drawing_can_show():
    run = _lane_run(20, 60, 1000)  # 1,200 requests, each long enough to draw
    s = _sampler(run, run.records, budget=200)
    assert s.kept <= 200 + 60  # the budget, and at most one lane more
    pick = s.pick_lanes(run.clock)
    assert pick.hidden > 0 and max(ln.key for ln in pick.lanes) < 19
    lanes, note = thin_for_drawing(pick.lanes, 100, run.clock - MS, pick.hidden, pick.hidden_short)
    assert [ln.key for ln in lanes] == [0]  # only the first lanes fit the drawing: those were kept
    assert note is not None and "of these 20 lanes fit the drawing budget" in note


# ---------------------------------------------------------------- bounded structures, exact answers


def test_end_bins_of_a_killed_run_match_those_of_a_run_with_a_known_end():
    t0 = 10 ** 12
    rnd = random.Random(3)
    for span_s in (0.7, 30, 1_000, 50_000):
        end = t0 + int(span_s * 1e9)
        recs = []
        for i in range(3_000):
            e = t0 + (int(rnd.uniform(0, span_s * 1000)) * MS + MS // 2)  # half a ms off any bin edge
            outcome = rnd.choice(["ok", "ok", "ok", "error", "stalled", "cut_short"])
            recs.append(Record(1, "r", "agent", i, 1, 0, f"r{i}", 1, 1, 1, None, 3, None, outcome, None, None, None,
                               None, None, 0, 1, 1, 0, 0, 0, {"start": t0, "end": min(e, end)}))
        known, killed = EndBins(t0, end), EndBins(t0, None)
        for r in recs:
            known.add(r)
            killed.add(r)
        assert killed.result(t0, end) == known.result(t0, end), span_s


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=60), max_size=80), st.integers(min_value=0, max_value=62))
def test_spans_are_a_set_of_rounds(xs, probe):
    s = Spans()
    for x in xs:
        s.add(x)
    assert len(s) == len(set(xs)) and (probe in s) == (probe in set(xs))
    assert s.count_below(probe) == len({x for x in xs if x < probe})
    assert all(a <= b for a, b in zip(s.lo, s.hi)) and all(b + 1 < a for b, a in zip(s.hi, s.lo[1:]))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=50), max_size=60), st.integers(min_value=-1, max_value=52))
def test_size_counts_answer_what_a_list_of_sizes_would(xs, lo):
    c = SizeCounts()
    for x in xs:
        c.add(x)
    assert c.count_at_least(lo) == sum(1 for x in xs if x >= lo)
    assert c.max_below(lo) == max((x for x in xs if x < lo), default=None)


def test_first_seen_counts_break_ties_by_first_appearance():
    c = FirstSeenCounts()
    for i, v in [(5, "b"), (1, "a"), (9, "a"), (2, "c"), (3, "b")]:
        c.add(v, i)
    # as a Counter over the values sorted by order: a (1), c (2), b (3) -> ties keep that order
    assert c.counter().most_common() == Counter(["a", "c", "b", "a", "b"]).most_common()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=3_000_000_000_000), min_size=1, max_size=200))
def test_a_sparse_histogram_gives_the_percentiles_of_a_full_one(values):
    sparse = SparseHistogram()
    for v in values:
        sparse.record_ns(v)
    assert summarize(sparse) == summarize(histogram_of(values))
    merged = SparseHistogram()
    merged.add(sparse)
    merged.add(histogram_of(values))
    assert summarize(merged) == summarize(histogram_of(values + values))


def test_records_from_memory_are_streamed_in_their_order():
    run = _lane_run(3, 2, 100)
    recs = list(reversed(run.records))
    data = RunData.from_records(Path("/nonexistent"), run.meta, recs)
    assert list(data.iter_records()) == recs and data.torn_lines == 0
    assert data.records == sorted(recs, key=rundir.start_key)  # materialised on demand, sorted by start
    assert dataclasses.is_dataclass(recs[0])


def test_a_consumer_can_be_any_object_with_add(tmp_path):
    from agentload.analysis.passes import one_pass

    seen = []

    class Count:
        def add(self, rec):
            seen.append(rec.request_id)

    data = load_run(_write(_big_run(5, 2, 5), tmp_path / "run"))
    assert one_pass(data, [Count()]) == len(seen) == 5 * 2 + 1 + 5


@pytest.mark.parametrize("name", ["summary.json", "report.txt"])
def test_the_fixture_reported_from_memory_matches_the_golden_files(tmp_path, name):
    """RunData.from_records (the rule tests' way) and the stream give the same report."""
    from agentload.report.text import render

    data = load_run(FIXTURE)
    listed = RunData.from_records(FIXTURE, data.meta, data.records, data.samples)
    summary = build_summary(listed)
    if name == "summary.json":
        assert orjson.loads((GOLDEN / name).read_bytes()) == summary
    else:
        assert render(summary) == (GOLDEN / name).read_text()


def test_every_report_input_is_read_once(tmp_path, monkeypatch):
    """run.json, samples and target_metrics.jsonl: read once each, through the run's RunData."""
    from agentload.records import target_metrics

    run = _big_run(6, 2, 3)
    out = _write(run, tmp_path / "run")
    meta = orjson.loads((out / "run.json").read_bytes())
    meta["scenario"]["target"] = {"metrics_urls": ["http://127.0.0.1:9/metrics"]}
    (out / "run.json").write_bytes(orjson.dumps(meta))
    url = "http://127.0.0.1:9/metrics"
    lines = [{"t": MS + i * 1000 * MS, "url": url, "full": True, "v": {"vllm:num_requests_running": float(i)}}
             for i in range(3)]
    (out / "target_metrics.jsonl").write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))
    loads: list[Path] = []
    reads: list[str] = []
    original_load, original_read, original_open = target_metrics.load_target_metrics, Path.read_bytes, open

    def counting_load(*a, **kw):
        loads.append(Path(a[0]))
        return original_load(*a, **kw)

    def counting_read(self):
        reads.append(self.name)
        return original_read(self)

    monkeypatch.setattr(target_metrics, "load_target_metrics", counting_load)
    monkeypatch.setattr(Path, "read_bytes", counting_read)
    def counting_open(f, *a, **kw):
        reads.append(Path(f).name)
        return original_open(f, *a, **kw)

    monkeypatch.setattr("builtins.open", counting_open)
    summary, _ = write_reports(out)
    assert summary["target_metrics"][url]["ok"] == 3
    assert "fig-target" in (out / "report.html").read_text()
    assert len(loads) == 1
    counts = Counter(reads)
    assert counts["run.json"] == 1 and counts["target_metrics.jsonl"] == 1, counts
    assert counts["records.jsonl"] == 1 and counts["samples.jsonl"] == 1, counts
