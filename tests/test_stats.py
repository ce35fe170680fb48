"""The one quantile rule: every percentile any report prints comes from agentload.analysis.stats."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from agentload.analysis.stats import (
    fmt_ms,
    histogram_of,
    percentiles_ms,
    quantile_ms,
    summarize,
)

durations = st.lists(st.integers(min_value=1_000, max_value=3_000_000_000_000), min_size=1, max_size=200)


@settings(max_examples=200, deadline=None)
@given(durations)
def test_percentiles_are_ordered_and_never_above_the_max(values):
    s = summarize(histogram_of(values))
    assert s["p50_ms"] <= s["p90_ms"] <= s["p99_ms"] <= s["max_ms"]
    # within the histogram's 3 significant digits of the true values
    assert abs(s["max_ms"] - max(values) / 1e6) <= max(values) / 1e6 * 1e-3 + 1e-3
    # what the text prints keeps that order too (issue 10: "p99 0.54 ms, max 0.5 ms")
    shown = [float(fmt_ms(s[k]).removesuffix("s")) * (1000 if fmt_ms(s[k]).endswith("s") else 1)
             for k in ("p50_ms", "p99_ms", "max_ms")]
    assert shown == sorted(shown)


def test_absent_values_are_absent_not_zero():
    assert quantile_ms([None, None], 50) is None
    assert abs(quantile_ms([None, 5_000_000], 50) - 5.0) <= 0.005  # 3 significant digits
    assert percentiles_ms(histogram_of([]), (50,)) is None


def test_the_formatter_keeps_sub_millisecond_digits():
    assert fmt_ms(0.54) == "0.54" and fmt_ms(0.5) == "0.50" and fmt_ms(12.34) == "12.3" and fmt_ms(123.4) == "123"
    assert fmt_ms(12_345) == "12.3s" and fmt_ms(None) == "-"


def test_a_long_run_is_tabled_in_bands_of_rounds_that_add_up():
    from agentload.analysis.summary import build_summary
    from agentload.report.text import render
    from records_factory import RunBuilder

    run = RunBuilder(agents=2, rounds=50)
    for rnd in range(1, 51):
        for a in range(2):
            run.ok(a, rnd, ttfb_ms=rnd)  # ttfb grows with the round: a band's p50 lies inside it
    summary = build_summary(run.data())
    assert len(summary["rounds"]) == 50  # what a program needs: every round
    bands = summary["round_bands"]
    assert [b["rounds"] for b in bands] == [[r, r] for r in range(1, 11)] + [[11, 20], [21, 40], [41, 50]]
    assert sum(b["requests"] for b in bands) == summary["totals"]["requests"] == 100
    b = bands[-1]
    assert 41 <= b["phases"]["ttfb"]["p50_ms"] <= 50.1 and b["completed"] == 20
    text = render(summary)
    assert "41-50" in text and "rounds 11+ in bands" in text
    assert "\n   25 " not in text  # no row of its own for round 25


def test_a_short_run_has_no_bands():
    from agentload.analysis.summary import build_summary
    from records_factory import RunBuilder

    run = RunBuilder(agents=2, rounds=20)
    for rnd in range(1, 21):
        run.ok(0, rnd)
    assert "round_bands" not in build_summary(run.data())


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.integers(-10, 10**7), st.integers(0, 2**62), st.sampled_from([0, 999, 1000, 1001, 2**53])),
                max_size=300))
def test_recording_many_at_once_is_recording_each(values):
    """The interval log records a whole interval in one numpy pass: the same counts, total, min and
    max as hdrh's own record_value for each value (and so the same encoded interval)."""
    import numpy as np

    from agentload.records.histograms import new_histogram, record_many_ns, record_ns

    one, many = new_histogram(), new_histogram()
    for v in values:
        record_ns(one, v)
    record_many_ns(many, np.array(values, dtype=np.int64))
    assert list(one.counts) == list(many.counts)
    assert (one.total_count, one.min_value, one.max_value) == (many.total_count, many.min_value, many.max_value)
    assert one.encode() == many.encode()
