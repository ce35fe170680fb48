"""Percentiles per round x phase, from records, with HdrHistogram (microsecond resolution).

This is the one quantile rule of agentload: every percentile that a table, the verdict or a
warning prints is read from an HdrHistogram by `percentiles_ms`, so two figures of one run
never disagree because they were computed two ways. Percentiles are clamped to the observed
min/max (a bucket's highest equivalent value can otherwise exceed the largest value seen).
"""

from __future__ import annotations

from typing import Iterable

from hdrh.histogram import HdrHistogram

from agentload.records import REPORT_PHASES, Record, phase_ns
from agentload.records.histograms import new_histogram, record_ns

PERCENTILES = (50, 90, 99)


def fmt_ms(v: float | None, sep: str = "") -> str:
    """Milliseconds for people, the one formatter of every report: two decimals below 1 ms,
    one below 100 ms, whole numbers below 10 s, then seconds."""
    if v is None:
        return "-"
    if v >= 10_000:
        return f"{v / 1000:.1f}{sep}s"
    if v >= 100:
        return f"{v:.0f}"
    if v >= 1:
        return f"{v:.1f}"
    return f"{v:.2f}"


def histogram_of(values_ns: Iterable[int | None]) -> HdrHistogram:
    """A histogram of durations in ns (None values are absent, not zero)."""
    h = new_histogram()
    for ns in values_ns:
        if ns is not None:
            record_ns(h, ns)
    return h


def percentiles_ms(h: HdrHistogram, ps: Iterable[float] = PERCENTILES) -> dict[float, float] | None:
    """The percentiles `ps` of h in ms, read in one pass over its buckets; None when h is empty."""
    if h.get_total_count() == 0:
        return None
    lo, hi = h.get_min_value(), h.get_max_value()
    vals = h.get_percentile_to_value_dict(list(ps))
    return {p: round(min(max(vals.get(p, hi), lo), hi) / 1000.0, 3) for p in ps}


def quantile_ms(values_ns: Iterable[int | None], p: float) -> float | None:
    """One percentile of a list of durations (ns) in ms, by the same rule as every table."""
    got = percentiles_ms(histogram_of(values_ns), (p,))
    return None if got is None else got[p]


def summarize(h: HdrHistogram) -> dict[str, float | int] | None:
    n = h.get_total_count()
    if n == 0:
        return None
    out: dict[str, float | int] = {"n": n}
    pct = percentiles_ms(h) or {}
    for p in PERCENTILES:
        out[f"p{p}_ms"] = pct[p]
    out["max_ms"] = round(h.get_max_value() / 1000.0, 3)  # the same bucket rule as the percentiles
    return out


class PhaseStats:
    """Histograms of every report phase, for one group of records (a round, or all).

    Counts: `stalled` is every request that made no progress for stall.after_s, however it
    ended (given up, ended by the server, or finished late); `given_up` those agentload ended."""

    def __init__(self) -> None:
        self.hists = {p: new_histogram() for p in REPORT_PHASES}
        self.requests = self.completed = self.errors = self.stalled = self.given_up = self.cut_short = 0

    def add(self, rec: Record) -> None:
        self.requests += 1
        o = rec.outcome
        if o == "ok":
            self.completed += 1
        elif o == "error":
            self.errors += 1
        elif o == "stalled":
            self.given_up += 1
        else:
            self.cut_short += 1
        if rec.stalled_phase is not None:
            self.stalled += 1
        for p in REPORT_PHASES:
            ns = phase_ns(rec.t, p, rec.reused)
            if ns is not None and (p != "e2e" or o == "ok"):
                record_ns(self.hists[p], ns)

    def phases(self) -> dict[str, dict | None]:
        return {p: summarize(h) for p, h in self.hists.items()}

    def counts(self) -> dict[str, int]:
        return {"requests": self.requests, "completed": self.completed, "errors": self.errors,
                "stalled": self.stalled, "given_up": self.given_up, "cut_short": self.cut_short}


def by_round(records: Iterable[Record]) -> tuple[PhaseStats, dict[int, PhaseStats]]:
    overall = PhaseStats()
    rounds: dict[int, PhaseStats] = {}
    for r in records:
        if r.kind != "agent":
            continue
        overall.add(r)
        st = rounds.get(r.round)
        if st is None:
            st = rounds[r.round] = PhaseStats()
        st.add(r)
    return overall, rounds
