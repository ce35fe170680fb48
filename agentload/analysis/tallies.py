"""Small exact structures that stand in for lists of every record in a one-pass analysis.

- `Spans`: a set of ints (an agent's completed rounds) as sorted runs: rounds 1..n are one pair;
- `SizeCounts`: how many requests had each prompt size (bounded by the distinct sizes, not by
  the number of requests), answering "how many at or above N" and "the largest below N";
- `FirstSeenCounts`: a Counter whose ties keep the order in which the values first appeared in
  the requests' order, as a Counter built over a sorted list does;
- `TimeCounts`: events per label over time in a fixed number of buckets (counts per cell of time,
  not the events), for the over-time charts of a run whose end is not known before the pass;
- `CanaryTally`: the canaries (one a second for as long as the run lasts) without their records:
  a completed one is its start and its e2e (16 bytes); only the others are kept as records;
- `CodeTally`: the records that carry `code: detail` lines (a record's `protocol` or
  `tool_call_problems`): per code how many, the first detail, and their rounds and agents.
"""

from __future__ import annotations

import bisect
import math
from array import array
from collections import Counter
from typing import Any, Hashable

from agentload.records import Record, phase_ns
from agentload.records.phases import end_stamp


class Spans:
    """A set of ints as sorted disjoint runs [lo, hi]."""

    __slots__ = ("lo", "hi")

    def __init__(self) -> None:
        self.lo: list[int] = []
        self.hi: list[int] = []

    def add(self, x: int) -> None:
        lo, hi = self.lo, self.hi
        if hi and hi[-1] + 1 == x:  # the usual case: the next round
            hi[-1] = x
            self._merge(len(hi) - 1)
            return
        i = bisect.bisect_right(lo, x) - 1  # the run starting at or before x
        if i >= 0 and x <= hi[i]:
            return
        if i >= 0 and hi[i] + 1 == x:
            hi[i] = x
            self._merge(i)
        elif i + 1 < len(lo) and lo[i + 1] == x + 1:
            lo[i + 1] = x
        else:
            lo.insert(i + 1, x)
            hi.insert(i + 1, x)

    def _merge(self, i: int) -> None:
        if i + 1 < len(self.lo) and self.hi[i] + 1 >= self.lo[i + 1]:
            self.hi[i] = max(self.hi[i], self.hi.pop(i + 1))
            self.lo.pop(i + 1)

    def __len__(self) -> int:
        return sum(h - lo + 1 for lo, h in zip(self.lo, self.hi))

    def __contains__(self, x: int) -> bool:
        i = bisect.bisect_right(self.lo, x) - 1
        return i >= 0 and x <= self.hi[i]

    def count_below(self, x: int) -> int:
        """How many members are < x."""
        n = 0
        for lo, h in zip(self.lo, self.hi):
            if lo >= x:
                break
            n += min(h, x - 1) - lo + 1
        return n


class SizeCounts:
    """How many times each size was seen; sizes at or above / below a threshold on demand."""

    __slots__ = ("counts", "_sorted")

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}
        self._sorted: list[int] | None = None

    def add(self, size: int) -> None:
        self.counts[size] = self.counts.get(size, 0) + 1
        self._sorted = None

    def _keys(self) -> list[int]:
        if self._sorted is None:
            self._sorted = sorted(self.counts)
        return self._sorted

    def count_at_least(self, x: int) -> int:
        keys = self._keys()
        return sum(self.counts[k] for k in keys[bisect.bisect_left(keys, x):])

    def max_below(self, x: int) -> int | None:
        """The largest size < x, None when there is none."""
        keys = self._keys()
        i = bisect.bisect_left(keys, x)
        return keys[i - 1] if i else None


class FirstSeenCounts:
    """Counts per value, and where each value was first seen (an order key)."""

    __slots__ = ("counts", "first")

    def __init__(self) -> None:
        self.counts: dict[Hashable, int] = {}
        self.first: dict[Hashable, Any] = {}

    def add(self, value: Hashable, order: Any) -> None:
        self.counts[value] = self.counts.get(value, 0) + 1
        if value not in self.first or order < self.first[value]:
            self.first[value] = order

    def __len__(self) -> int:
        return sum(self.counts.values())

    def counter(self) -> Counter[Hashable]:
        """A Counter whose insertion order is the order of first appearance."""
        return Counter({v: self.counts[v] for v in sorted(self.counts, key=self.first.__getitem__)})


def nice_width(x: float) -> float:
    """The smallest of 1, 2, 5 x 10^k that is >= x (every such width is a whole number of any
    smaller power of ten: what `TimeCounts` regroups its cells into)."""
    if x <= 0:
        return 1.0
    k = math.floor(math.log10(x))
    for m in (1, 2, 5, 10):
        w = m * 10.0 ** k
        if w >= x * (1 - 1e-12):
            return float(f"{w:.12g}")
    return float(f"{10.0 ** (k + 1):.12g}")


class TimeCounts:
    """Events per label over time, in about `buckets` buckets of a 1-2-5 width over the run, kept as
    counts per cell (never the events): cells of 10 ms that coarsen tenfold whenever a cell index
    passes MAX_CELLS, so memory is bounded by the run's length in cells, not by the events. The
    run's end need not be known until `result`; every bucket width it can choose then is a whole
    number of cells."""

    BASE_NS = 10_000_000
    MAX_CELLS = 4000

    def __init__(self, t0_ns: int, buckets: int = 60):
        self.t0 = t0_ns
        self.buckets = buckets
        self.cell_ns = self.BASE_NS
        self.cells: dict[Hashable, dict[int, int]] = {}

    def add(self, label: Hashable, t_ns: int) -> None:
        cell = max(0, t_ns - self.t0) // self.cell_ns
        while cell >= self.MAX_CELLS:
            self._coarsen()
            cell = max(0, t_ns - self.t0) // self.cell_ns
        c = self.cells.get(label)
        if c is None:
            c = self.cells[label] = {}
        c[cell] = c.get(cell, 0) + 1

    def _coarsen(self) -> None:
        self.cell_ns *= 10
        for label, c in self.cells.items():
            out: dict[int, int] = {}
            for i, n in c.items():
                out[i // 10] = out.get(i // 10, 0) + n
            self.cells[label] = out

    def within(self, lo_ns: int, hi_ns: int) -> dict[Hashable, int]:
        """{label: events in the cells that lie wholly inside lo_ns .. hi_ns}: what surely happened
        in that span (nothing, when it is shorter than a cell)."""
        first = -(-max(0, lo_ns - self.t0) // self.cell_ns)  # the first cell that starts at or after lo
        last = (hi_ns - self.t0) // self.cell_ns - 1  # the last cell that ends at or before hi
        return {label: n for label, c in self.cells.items()
                if (n := sum(k for i, k in c.items() if first <= i <= last))}

    def result(self, end_ns: int) -> tuple[float, dict[Hashable, list[int]]]:
        """(bucket width in s, {label: count per bucket}); the buckets cover t0 .. end_ns (and
        whatever came later: the last bucket runs to the latest event)."""
        last_cell = max((max(c) for c in self.cells.values() if c), default=0)
        span_ns = max(end_ns - self.t0, (last_cell + 1) * self.cell_ns, 1)
        width_s = max(nice_width(span_ns / 1e9 / self.buckets), self.cell_ns / 1e9)
        per = max(1, round(width_s * 1e9 / self.cell_ns))  # cells per bucket
        nb = max(1, -(-(span_ns // self.cell_ns) // per))
        out: dict[Hashable, list[int]] = {}
        for label, c in self.cells.items():
            row = [0] * nb
            for i, n in c.items():
                row[min(nb - 1, i // per)] += n
            out[label] = row
        return width_s, out


class CanaryTally:
    """The canaries of a run, fed in stream order (`add(record, order)`): each completed one kept as
    its end stamp and e2e (ns; -1 when it has none) in two arrays, the others (failed, given up, cut
    short) as records, put in the requests' order (the order keys given) by `close()`."""

    def __init__(self) -> None:
        self.ok_last = array("q")
        self.ok_e2e = array("q")
        self._others: list[tuple[Any, Record]] = []
        self.others: list[Record] = []  # in the requests' order, once closed
        self._closed = False

    def add(self, r: Record, order: Any) -> None:
        if r.outcome != "ok":
            self._others.append((order, r))
            return
        e2e = phase_ns(r.t, "e2e")
        self.ok_last.append(end_stamp(r.t))
        self.ok_e2e.append(-1 if e2e is None else e2e)

    def close(self) -> "CanaryTally":
        if not self._closed:
            self._others.sort(key=lambda x: x[0])
            self.others = [r for _, r in self._others]
            self._others = []
            self._closed = True
        return self

    @property
    def ok(self) -> int:
        return len(self.ok_last)

    def failed(self) -> list[Record]:
        """The canaries that failed (neither completed nor cut short at the end), in order."""
        return [c for c in self.others if c.outcome != "cut_short"]

    def sent(self) -> int:
        """Canaries that got an answer or failed (a canary cut short at the end is neither)."""
        return self.ok + sum(1 for c in self.others if c.outcome != "cut_short")

    def in_flight_from(self, t0: int) -> tuple[int, list[int], list[Record]]:
        """(how many completed, the e2e ns of those that have one, the failed ones) among the
        canaries still running at t0 or started after it: those whose end stamp is at or after t0.
        (Not only those sent after t0: a canary sent a moment before the first stalled request ran
        through the stall as much as the next one, and one every canary.every_s may be all there is.)"""
        n = 0
        e2e: list[int] = []
        for last, e in zip(self.ok_last, self.ok_e2e):
            if last >= t0:
                n += 1
                if e >= 0:
                    e2e.append(e)
        return n, e2e, [c for c in self.failed() if end_stamp(c.t) >= t0]


class ReuseTally:
    """How the agent requests got their connection: new or reused (keep-alive), and of the reused
    ones that got an answer (response headers), how long the longest had sat idle in the pool.
    The reuses that failed before any answer are troubled records, kept by the verdict's facts."""

    __slots__ = ("new", "reused", "answered_reuses", "answered_idle_max_ns", "answered_idle_n")

    def __init__(self) -> None:
        self.new = 0
        self.reused = 0
        self.answered_reuses = 0  # reused and got response headers
        self.answered_idle_max_ns: int | None = None
        self.answered_idle_n = 0  # ... of which the idle time is known

    def add(self, r: Record) -> None:
        if r.reused is None:
            return
        if not r.reused:
            self.new += 1
            return
        self.reused += 1
        if "headers" in r.t:
            self.answered_reuses += 1
            idle = r.idle_ns
            if idle is not None:
                self.answered_idle_n += 1
                if self.answered_idle_max_ns is None or idle > self.answered_idle_max_ns:
                    self.answered_idle_max_ns = idle

    @property
    def rate(self) -> float | None:
        """Reused / (new + reused); None when no request got a connection."""
        n = self.new + self.reused
        return self.reused / n if n else None


class CodeTally:
    """Records carrying `code: detail` lines, without the records: how many, per code how many and
    the first one's detail, how many per round, which agents, and the finish_reasons they ended
    with; bounded by the codes, rounds and agents, whatever the run length. `first` is in the
    order the pass sees the records."""

    __slots__ = ("records", "codes", "first", "rounds", "agents", "finish")

    def __init__(self) -> None:
        self.records = 0
        self.codes: Counter[str] = Counter()  # code -> records with it
        self.first: dict[str, str] = {}  # code -> the first record's detail
        self.rounds: Counter[int] = Counter()  # round -> records
        self.agents: set[int] = set()
        self.finish: Counter[str] = Counter()  # finish_reason ("none") -> records

    def add(self, r: Record, lines: list[str]) -> None:
        self.records += 1
        self.rounds[r.round] += 1
        self.agents.add(r.agent)
        self.finish[r.finish_reason or "none"] += 1
        seen = set()
        for line in lines:
            code, _, detail = str(line).partition(": ")
            if code not in seen:
                seen.add(code)
                self.codes[code] += 1
            self.first.setdefault(code, detail)

    def __bool__(self) -> bool:
        return self.records > 0
