"""The histogram every duration goes into: HdrHistogram, 1 us .. 1 hour at 3 significant digits.

One definition for the run path (the interval log it writes) and for analysis (every table and
the verdict read their percentiles from these; see agentload.analysis.stats).
"""

from __future__ import annotations

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
