"""Percentiles per round x phase, from records, with HdrHistogram (microsecond resolution)."""

from __future__ import annotations

from typing import Iterable

from hdrh.histogram import HdrHistogram

from agentload.records import REPORT_PHASES, Record, phase_ns

# 1 us .. 1 hour at 3 significant digits: enough for any phase of any request.
HIST_MIN_US = 1
HIST_MAX_US = 3_600_000_000
HIST_DIGITS = 3
PERCENTILES = (50, 90, 99)


def new_histogram() -> HdrHistogram:
    return HdrHistogram(HIST_MIN_US, HIST_MAX_US, HIST_DIGITS)


def record_ns(h: HdrHistogram, ns: int) -> None:
    h.record_value(min(max(ns // 1000, HIST_MIN_US), HIST_MAX_US))


def summarize(h: HdrHistogram) -> dict[str, float | int] | None:
    n = h.get_total_count()
    if n == 0:
        return None
    out: dict[str, float | int] = {"n": n}
    for p in PERCENTILES:
        out[f"p{p}_ms"] = round(h.get_value_at_percentile(p) / 1000.0, 3)
    out["max_ms"] = round(h.get_max_value() / 1000.0, 3)
    return out


class PhaseStats:
    """Histograms of every report phase, for one group of records (a round, or all)."""

    def __init__(self) -> None:
        self.hists = {p: new_histogram() for p in REPORT_PHASES}
        self.requests = self.completed = self.errors = self.stalled = self.cut_short = 0

    def add(self, rec: Record) -> None:
        self.requests += 1
        o = rec.outcome
        if o == "ok":
            self.completed += 1
        elif o == "error":
            self.errors += 1
        elif o == "stalled":
            self.stalled += 1
        else:
            self.cut_short += 1
        for p in REPORT_PHASES:
            ns = phase_ns(rec.t, p, rec.reused)
            if ns is not None and (p != "e2e" or o == "ok"):
                record_ns(self.hists[p], ns)

    def phases(self) -> dict[str, dict | None]:
        return {p: summarize(h) for p, h in self.hists.items()}

    def counts(self) -> dict[str, int]:
        return {"requests": self.requests, "completed": self.completed, "errors": self.errors,
                "stalled": self.stalled, "cut_short": self.cut_short}


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
