"""Percentiles per round x phase, from records, with HdrHistogram's buckets (microsecond resolution).

This is the one quantile rule of agentload: every percentile that a table, the verdict or a
warning prints is read by `percentiles_ms` by HdrHistogram's rule (1 us .. 1 hour, 3 significant
digits: `agentload.records.histograms`), so two figures of one run never disagree because they were
computed two ways. Percentiles are clamped to the observed min/max (a bucket's highest equivalent
value can otherwise exceed the largest value seen).

What the report's pass records into is a `SparseHistogram`: the same buckets, kept as an array of
counts over the range of buckets used, recorded by index arithmetic and read with numpy (all the
percentiles at once from the cumulative counts): what the pure-Python hdrh would walk bucket by
bucket for each percentile. Per-round tables are `RoundRows`: rounds 1-10 one by one and later
rounds in bands, filled as the records come, so a run's rounds cost six counts each, not a
histogram each.
"""

from __future__ import annotations

from array import array
from typing import Any, Callable, Generic, Iterable, TypeVar

import numpy as np
from hdrh.histogram import HdrHistogram

from agentload.records import REPORT_PHASES, Record
from agentload.records.histograms import (
    HIST_MAX_US,
    HIST_MIN_US,
    new_histogram,
    record_ns,
)
from agentload.records.phases import BY_NAME, DURATION

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


def fmt_dur(v: float | None) -> str:
    """`fmt_ms` with its unit, for sentences: "153 ms", "51.4 s" (never "51.4s ms")."""
    text = fmt_ms(v, sep=" ")
    return text if text.endswith("s") or v is None else f"{text} ms"


def histogram_of(values_ns: Iterable[int | None]) -> HdrHistogram:
    """A histogram of durations in ns (None values are absent, not zero)."""
    h = new_histogram()
    for ns in values_ns:
        if ns is not None:
            record_ns(h, ns)
    return h


def percentiles_ms(h: "HdrHistogram | SparseHistogram",
                   ps: Iterable[float] = PERCENTILES) -> dict[float, float] | None:
    """The percentiles `ps` of h in ms (None when h is empty), by HdrHistogram's rule
    (`get_percentile_to_value_dict`: the highest value equivalent to the first bucket whose
    cumulative count reaches the percentile's count), clamped to the observed min/max: read at once
    from the cumulative counts (numpy), not one walk of every bucket per percentile."""
    lo_idx, counts = _dense(h)
    if counts is None:
        return None
    cum = np.cumsum(counts)
    total = int(cum[-1])
    if total == 0:
        return None
    nz = np.flatnonzero(counts)
    lo = _value_at(lo_idx + int(nz[0]))  # get_min_value: the lowest value of the first bucket used
    hi = _highest_at(lo_idx + int(nz[-1]))  # get_max_value: the highest of the last
    vals: dict[float, int] = {}
    for p in sorted(set(ps)):
        if p > 100:
            break
        target = max(int((min(p, 100.0) * total / 100) + 0.5), 1)  # get_target_count_at_percentile
        i = lo_idx + int(np.searchsorted(cum, target, side="left"))
        vals[p] = _highest_at(i) if p else _value_at(i)
    return {p: round(min(max(vals.get(p, hi), lo), hi) / 1000.0, 3) for p in ps}


def quantile_ms(values_ns: Iterable[int | None], p: float) -> float | None:
    """One percentile of a list of durations (ns) in ms, by the same rule as every table."""
    h = SparseHistogram()
    for ns in values_ns:
        if ns is not None:
            h.record_ns(ns)
    got = percentiles_ms(h, (p,))
    return None if got is None else got[p]


# The bucket arithmetic of new_histogram()'s HdrHistogram (1 us .. 1 hour, 3 significant digits):
# a value's counts index, and an index's lowest and highest equivalent values.
_H = new_histogram()
assert _H.unit_magnitude == 0, "the index arithmetic below assumes a lowest trackable value of 1"
_HALF_MAG: int = _H.sub_bucket_half_count_magnitude  # 10
_HALF: int = _H.sub_bucket_half_count  # 1024
_MASK: int = _H.sub_bucket_mask  # 2047
_SHIFT = _HALF_MAG + 1  # 11
_COUNTS_LEN: int = _H.counts_len
del _H


def _index_us(us: int) -> int:
    """HdrHistogram's counts index of a value (us)."""
    b = (us | _MASK).bit_length() - _SHIFT
    return (b << _HALF_MAG) + (us >> b)


def _value_at(i: int) -> int:
    """The lowest value of counts index i (HdrHistogram.get_value_from_index)."""
    b = (i >> _HALF_MAG) - 1
    if b < 0:
        return i & (_HALF - 1)
    return ((i & (_HALF - 1)) + _HALF) << b


def _highest_at(i: int) -> int:
    """The highest value equivalent to counts index i's (get_highest_equivalent_value)."""
    b = max((i >> _HALF_MAG) - 1, 0)
    return _value_at(i) + (1 << b) - 1


def _dense(h: "HdrHistogram | SparseHistogram") -> tuple[int, "np.ndarray | None"]:
    """(first index, counts from there) of either kind of histogram, without a copy where it can."""
    if isinstance(h, SparseHistogram):
        if not h.counts:
            return 0, None
        return h.lo, np.frombuffer(h.counts, dtype=np.int64)
    if h.get_total_count() == 0:
        return 0, None
    return 0, np.ctypeslib.as_array(h.counts)[:h.counts_len].astype(np.int64, copy=False)


class SparseHistogram:
    """The counts of an HdrHistogram (new_histogram's buckets) kept only over the range of buckets
    it uses: an array of int64 counts from the lowest bucket recorded to the highest (a full
    HdrHistogram is ~186 KB; a phase's durations usually span a few hundred to a few thousand of its
    23,552 buckets). Recording is index arithmetic on ints (no hdrh call per value); percentiles,
    minimum and maximum read from it are those a full HdrHistogram that recorded the same durations
    gives (`histogram()` gives that one back)."""

    __slots__ = ("lo", "counts", "n")

    def __init__(self) -> None:
        self.lo = 0  # counts index of counts[0]
        self.counts = array("q")
        self.n = 0

    def record_ns(self, ns: int, count: int = 1) -> None:
        us = ns // 1000
        if us < HIST_MIN_US:
            us = HIST_MIN_US
        elif us > HIST_MAX_US:
            us = HIST_MAX_US
        b = (us | _MASK).bit_length() - _SHIFT
        i = (b << _HALF_MAG) + (us >> b) - self.lo
        c = self.counts
        if 0 <= i < len(c):
            c[i] += count
        else:
            self._put(i + self.lo, count)
        self.n += count

    def _put(self, idx: int, count: int) -> None:
        """Counts index `idx` outside the range kept: widen it (with some room, to grow rarely)."""
        c = self.counts
        if not c:
            self.lo = idx
            self.counts = array("q", [count])
            return
        if idx < self.lo:
            new_lo = max(0, min(idx, self.lo - 64))
            self.counts = array("q", bytes(8 * (self.lo - new_lo))) + c
            self.lo = new_lo
        else:
            hi = min(_COUNTS_LEN, max(idx + 1, self.lo + len(c) + 64))
            c.frombytes(bytes(8 * (hi - self.lo - len(c))))
        self.counts[idx - self.lo] += count

    def get_total_count(self) -> int:
        return self.n

    def add(self, other: "SparseHistogram | HdrHistogram") -> None:
        """Adds another histogram's counts (as HdrHistogram.add does)."""
        lo, counts = _dense(other)
        if counts is None:
            return
        nz = np.flatnonzero(counts)
        first, last = lo + int(nz[0]), lo + int(nz[-1])
        if not self.counts:
            self.lo = first
            self.counts = array("q", counts[first - lo:last - lo + 1].tobytes())
        else:
            if first < self.lo:
                self._put(first, 0)
            if last >= self.lo + len(self.counts):
                self._put(last, 0)
            mine = np.frombuffer(self.counts, dtype=np.int64)
            mine[first - self.lo:last - self.lo + 1] += counts[first - lo:last - lo + 1]
        self.n += int(counts.sum())

    def histogram(self) -> HdrHistogram:
        h = new_histogram()
        for i in np.flatnonzero(np.frombuffer(self.counts, dtype=np.int64)) if self.counts else ():
            h.record_value(_value_at(self.lo + int(i)), self.counts[int(i)])
        return h


def pct_ms(h: HdrHistogram | SparseHistogram, p: float) -> float | None:
    """One percentile of a histogram in ms (None when empty): what quantile_ms gives for the
    durations recorded into it."""
    got = percentiles_ms(h, (p,))
    return None if got is None else got[p]


def summarize(h: "HdrHistogram | SparseHistogram") -> dict[str, float | int] | None:
    n = h.get_total_count()
    if n == 0:
        return None
    out: dict[str, float | int] = {"n": n}
    pct = percentiles_ms(h, (*PERCENTILES, 100)) or {}
    for p in PERCENTILES:
        out[f"p{p}_ms"] = pct[p]
    out["max_ms"] = pct[100]  # get_max_value: the same bucket rule as the percentiles
    return out


class PhaseStats:
    """Histograms of every report phase, for one group of records (a round, or all), fed one
    record at a time (`add`). Durations of a phase marked `ok_only` in the phase table (e2e)
    count completed requests only.

    Counts: `stalled` is every request that made no progress for stall.after_s, however it
    ended (given up, ended by the server, or finished late); `given_up` those agentload ended."""

    def __init__(self) -> None:
        self.hists = {p: SparseHistogram() for p in REPORT_PHASES}
        self._cols = tuple(self.hists.values())  # in REPORT_PHASES' order
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
        t, reused, ok = rec.t, rec.reused, o == "ok"
        for duration, ok_only, h in zip(_DURATIONS, _OK_ONLY_COLS, self._cols):
            ns = duration(t, reused)
            if ns is not None and (ok or not ok_only):
                h.record_ns(ns)

    def phases(self) -> dict[str, dict[str, Any] | None]:
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


def band_of(rnd: int) -> tuple[int, int]:
    """The band (first round, last round) a round past ROUNDS_ONE_BY_ONE falls in: 11-20, 21-40, 41-80,
    ... (`band_ranges` clips the last one to the last round present)."""
    k = ((rnd - 1) // ROUNDS_ONE_BY_ONE).bit_length() - 1
    return ROUNDS_ONE_BY_ONE * (1 << k) + 1, ROUNDS_ONE_BY_ONE * (1 << (k + 1))


T = TypeVar("T")


class RoundRows(Generic[T]):
    """The rows of a per-round table, filled from a stream in memory bounded by the rows, not by
    the rounds: one tally per round while the rounds fit a table of their own (at most
    MAX_ROUND_ROWS), and from the first round past that on, one per row of `band_ranges` (rounds
    1-10 their own, the later ones folded into their band: its edges do not depend on which rounds
    come, so a band's tally is exactly the merge of its rounds', whatever their order).

    `get(round)` is the tally a record of that round goes into; `rows()` gives (first round, last
    round, tally) per row, as `band_ranges` groups them, or None when every round has its own."""

    def __init__(self, new: Callable[[], T], merge: Callable[[T, T], None]):
        self.new = new
        self.merge = merge
        self.own: dict[int, T] = {}  # round -> its tally (after folding: rounds 1-10 only)
        self.bands: dict[int, T] = {}  # first round of a band -> the tally of its rounds
        self.seen: set[int] = set()
        self.max_round: int | None = None
        self.folded = False

    def get(self, rnd: int) -> T:
        if rnd not in self.seen:
            self.seen.add(rnd)
            self.max_round = rnd if self.max_round is None else max(self.max_round, rnd)
            if not self.folded and len(self.seen) > MAX_ROUND_ROWS:
                self._fold()
        if rnd <= ROUNDS_ONE_BY_ONE or not self.folded:
            t = self.own.get(rnd)
            if t is None:
                t = self.own[rnd] = self.new()
            return t
        lo = band_of(rnd)[0]
        t = self.bands.get(lo)
        if t is None:
            t = self.bands[lo] = self.new()
        return t

    def _fold(self) -> None:
        self.folded = True
        for rnd in sorted(r for r in self.own if r > ROUNDS_ONE_BY_ONE):
            lo = band_of(rnd)[0]
            band = self.bands.get(lo)
            if band is None:
                band = self.bands[lo] = self.new()
            self.merge(band, self.own.pop(rnd))

    def rows(self) -> list[tuple[int, int, T]] | None:
        if not self.folded:
            return None
        assert self.max_round is not None
        out = [(r, r, self.own[r]) for r in sorted(self.own)]
        out += [(lo, min(band_of(lo)[1], self.max_round), self.bands[lo]) for lo in sorted(self.bands)]
        return out

    def all(self) -> list[T]:
        """Every tally kept (each record went into exactly one)."""
        return [*self.own.values(), *self.bands.values()]


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
_OK_ONLY_COLS = tuple(_OK_ONLY[p] for p in REPORT_PHASES)
_DURATIONS = tuple(DURATION[p] for p in REPORT_PHASES)
COUNT_KEYS = ("requests", "completed", "errors", "stalled", "given_up", "cut_short")


class RoundStats:
    """PhaseStats of every agent request, per row of the per-round table (`RoundRows`: each round
    while they fit, else rounds 1-10 and bands), and every round's counts: a consumer of the
    records' pass. Memory grows with the table's rows, not with the rounds (a round's counts are
    six ints)."""

    def __init__(self) -> None:
        self.table: RoundRows[PhaseStats] = RoundRows(PhaseStats, PhaseStats.merge)
        self.counts: dict[int, list[int]] = {}  # every round: COUNT_KEYS
        self._overall: PhaseStats | None = None

    def add(self, r: Record) -> None:
        if r.kind != "agent":
            return
        self._overall = None
        rnd = r.round
        self.table.get(rnd).add(r)
        c = self.counts.get(rnd)
        if c is None:
            c = self.counts[rnd] = [0, 0, 0, 0, 0, 0]
        c[0] += 1
        o = r.outcome
        c[1 if o == "ok" else 2 if o == "error" else 4 if o == "stalled" else 5] += 1
        if r.stalled_phase is not None:
            c[3] += 1

    @property
    def overall(self) -> PhaseStats:
        """Every agent request: the rows merged (exact)."""
        if self._overall is None:
            o = PhaseStats()
            for st in self.table.all():
                o.merge(st)
            self._overall = o
        return self._overall

    @property
    def rounds(self) -> dict[int, PhaseStats]:
        """The rounds with stats of their own: every round, unless the run has more than
        MAX_ROUND_ROWS (then rounds 1-10; `bands()` has the rest)."""
        return self.table.own

    def bands(self) -> list[tuple[int, int, PhaseStats]] | None:
        """The table's rows of a run with more than MAX_ROUND_ROWS rounds (as `round_bands`)."""
        return self.table.rows()

    def round_counts(self, rnd: int) -> dict[str, int]:
        return dict(zip(COUNT_KEYS, self.counts[rnd]))


def by_round(records: Iterable[Record]) -> tuple[PhaseStats, dict[int, PhaseStats]]:
    rs = RoundStats()
    for r in records:
        rs.add(r)
    return rs.overall, rs.rounds
