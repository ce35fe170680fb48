"""Small exact structures that stand in for lists of every record in a one-pass analysis.

- `Spans`: a set of ints (an agent's completed rounds) as sorted runs: rounds 1..n are one pair;
- `SizeCounts`: how many requests had each prompt size (bounded by the distinct sizes, not by
  the number of requests), answering "how many at or above N" and "the largest below N";
- `FirstSeenCounts`: a Counter whose ties keep the order in which the values first appeared in
  the requests' order, as a Counter built over a sorted list does.
"""

from __future__ import annotations

import bisect
from collections import Counter
from typing import Any, Hashable


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

    def counter(self) -> Counter:
        """A Counter whose insertion order is the order of first appearance."""
        return Counter({v: self.counts[v] for v in sorted(self.counts, key=self.first.__getitem__)})
