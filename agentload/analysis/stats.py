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
from agentload.records.histograms import clamp_us, new_histogram, record_ns
from agentload.records.phases import BY_NAME

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


def percentiles_ms(h: "HdrHistogram | SparseHistogram",
                   ps: Iterable[float] = PERCENTILES) -> dict[float, float] | None:
    """The percentiles `ps` of h in ms, read in one pass over its buckets; None when h is empty."""
    if isinstance(h, SparseHistogram):
        h = h.histogram()
    if h.get_total_count() == 0:
        return None
    lo, hi = h.get_min_value(), h.get_max_value()
    vals = h.get_percentile_to_value_dict(list(ps))
    return {p: round(min(max(vals.get(p, hi), lo), hi) / 1000.0, 3) for p in ps}


def quantile_ms(values_ns: Iterable[int | None], p: float) -> float | None:
    """One percentile of a list of durations (ns) in ms, by the same rule as every table."""
    got = percentiles_ms(histogram_of(values_ns), (p,))
    return None if got is None else got[p]


_BUCKETS = new_histogram()  # only asked which bucket a value falls in


class SparseHistogram:
    """An HdrHistogram kept as counts per bucket in a dict: the memory of the buckets it uses
    (a full one is ~186 KB; per-round tables of a long run have thousands of them).

    `histogram()` gives the full HdrHistogram back, with the same counts in the same buckets,
    so every percentile, minimum and maximum read from it is the one a full histogram that
    recorded the same durations gives."""

    __slots__ = ("counts",)

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}

    def record_ns(self, ns: int) -> None:
        v = _BUCKETS.get_lowest_equivalent_value(clamp_us(ns))
        self.counts[v] = self.counts.get(v, 0) + 1

    def add(self, other: "SparseHistogram | HdrHistogram") -> None:
        """Adds another histogram's counts (as HdrHistogram.add does)."""
        if isinstance(other, SparseHistogram):
            items = list(other.counts.items())
        else:
            items = [(other.get_value_from_index(i), c) for i in range(other.counts_len)
                     if (c := other.get_count_at_index(i))]
        for v, n in items:
            v = _BUCKETS.get_lowest_equivalent_value(v)
            self.counts[v] = self.counts.get(v, 0) + n

    def histogram(self) -> HdrHistogram:
        h = new_histogram()
        for v, n in self.counts.items():
            h.record_value(v, n)
        return h


def pct_ms(h: HdrHistogram | SparseHistogram, p: float) -> float | None:
    """One percentile of a histogram in ms (None when empty): what quantile_ms gives for the
    durations recorded into it."""
    got = percentiles_ms(h, (p,))
    return None if got is None else got[p]


def summarize(h: "HdrHistogram | SparseHistogram") -> dict[str, float | int] | None:
    if isinstance(h, SparseHistogram):
        h = h.histogram()
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
    """Histograms of every report phase, for one group of records (a round, or all), fed one
    record at a time (`add`). Durations of a phase marked `ok_only` in the phase table (e2e)
    count completed requests only.

    Counts: `stalled` is every request that made no progress for stall.after_s, however it
    ended (given up, ended by the server, or finished late); `given_up` those agentload ended."""

    def __init__(self) -> None:
        self.hists = {p: SparseHistogram() for p in REPORT_PHASES}
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
            if ns is not None and (o == "ok" or not _OK_ONLY[p]):
                self.hists[p].record_ns(ns)

    def phases(self) -> dict[str, dict | None]:
        return {p: summarize(h) for p, h in self.hists.items()}

    def counts(self) -> dict[str, int]:
        return {"requests": self.requests, "completed": self.completed, "errors": self.errors,
                "stalled": self.stalled, "given_up": self.given_up, "cut_short": self.cut_short}

    def merge(self, other: "PhaseStats") -> None:
        """Adds another group's counts and histograms (a band of rounds: exact, not an average)."""
        for k in ("requests", "completed", "errors", "stalled", "given_up", "cut_short"):
            setattr(self, k, getattr(self, k) + getattr(other, k))
        for p, h in other.hists.items():
            self.hists[p].add(h)


ROUNDS_ONE_BY_ONE = 10  # a table shows the first rounds one by one ...
MAX_ROUND_ROWS = 20  # ... and, past this many rounds, the rest in bands that double in width


def band_ranges(rounds: Iterable[int]) -> list[tuple[int, int]] | None:
    """The rows of a table of a run with many rounds, as (first round, last round) over the rounds
    present: rounds 1-10 one by one, then 11-20, 21-40, 41-80, ... (a band only where a round is).
    None when every round fits in a table row of its own. Every per-round table uses these bands."""
    keys = sorted(set(rounds))
    if len(keys) <= MAX_ROUND_ROWS:
        return None
    out = [(r, r) for r in keys if r <= ROUNDS_ONE_BY_ONE]
    lo, width = ROUNDS_ONE_BY_ONE + 1, ROUNDS_ONE_BY_ONE
    last = keys[-1]
    while lo <= last:
        hi = lo + width - 1
        if any(lo <= r <= hi for r in keys):
            out.append((lo, min(hi, last)))
        lo, width = hi + 1, width * 2
    return out


def round_bands(rounds: dict[int, PhaseStats]) -> list[tuple[int, int, PhaseStats]] | None:
    """(first round, last round, merged stats) for a table of a run with many rounds (`band_ranges`;
    each band's percentiles exact, from the merged histograms). None when every round fits in a
    table row of its own."""
    ranges = band_ranges(rounds)
    if ranges is None:
        return None
    out: list[tuple[int, int, PhaseStats]] = []
    for lo, hi in ranges:
        inside = [rounds[r] for r in sorted(rounds) if lo <= r <= hi]
        if lo == hi:
            out.append((lo, hi, inside[0]))
            continue
        band = PhaseStats()
        for st in inside:
            band.merge(st)
        out.append((lo, hi, band))
    return out


_OK_ONLY = {p: BY_NAME[p].ok_only for p in REPORT_PHASES}


class RoundStats:
    """PhaseStats over every agent request and per round: a consumer of the records' pass."""

    def __init__(self) -> None:
        self.overall = PhaseStats()
        self.rounds: dict[int, PhaseStats] = {}

    def add(self, r: Record) -> None:
        if r.kind != "agent":
            return
        self.overall.add(r)
        st = self.rounds.get(r.round)
        if st is None:
            st = self.rounds[r.round] = PhaseStats()
        st.add(r)


def by_round(records: Iterable[Record]) -> tuple[PhaseStats, dict[int, PhaseStats]]:
    rs = RoundStats()
    for r in records:
        rs.add(r)
    return rs.overall, rs.rounds
