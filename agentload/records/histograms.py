"""The histogram every duration goes into: HdrHistogram, 1 us .. 1 hour at 3 significant digits.

One definition for the run path (the interval log it writes) and for analysis (every table and
the verdict read their percentiles from these; see agentload.analysis.stats).
"""

from __future__ import annotations

import numpy as np
from hdrh.histogram import HdrHistogram

HIST_MIN_US = 1
HIST_MAX_US = 3_600_000_000
HIST_DIGITS = 3


def new_histogram() -> HdrHistogram:
    return HdrHistogram(HIST_MIN_US, HIST_MAX_US, HIST_DIGITS)


def clamp_us(ns: int) -> int:
    """A duration in ns as the histogram's unit (us), inside its range."""
    return min(max(ns // 1000, HIST_MIN_US), HIST_MAX_US)


def record_ns(h: HdrHistogram, ns: int) -> None:
    h.record_value(clamp_us(ns))


def record_many_ns(h: HdrHistogram, ns: np.ndarray) -> None:
    """`record_ns(h, v)` for every v of an int64 array, in one numpy pass instead of a Python call
    per value: the same bucket index as hdrh's `_counts_index_for` (the power of two that contains
    the value, then its sub-bucket), added to the counts in place."""
    if not len(ns):
        return
    us = np.clip(ns // 1000, HIST_MIN_US, HIST_MAX_US).astype(np.int64)
    # bucket: 64 - clz(value | sub_bucket_mask) - unit_magnitude - (sub_bucket_half_count_magnitude + 1);
    # 64 - clz(x) of a positive x is its bit length: frexp's exponent (exact for x < 2**53)
    _, bits = np.frexp((us | h.sub_bucket_mask).astype(np.float64))
    bucket = bits.astype(np.int64) - h.unit_magnitude - (h.sub_bucket_half_count_magnitude + 1)
    sub = us >> (bucket + h.unit_magnitude)
    index = ((bucket + 1) << h.sub_bucket_half_count_magnitude) + sub - h.sub_bucket_half_count
    counts = np.ctypeslib.as_array(h.counts)
    counts += np.bincount(index, minlength=h.counts_len)[:h.counts_len].astype(counts.dtype)
    h.total_count += len(us)
    h.min_value = min(h.min_value, int(us.min()))
    h.max_value = max(h.max_value, int(us.max()))
