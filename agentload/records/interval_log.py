"""HdrHistogram interval log of the run -> RUN_DIR/intervals.hlog (constant memory).

Every finished agent request is added to two histograms (`e2e` and `ttft`, microseconds,
measured from the request's intended start in an open-loop run, else from its send); every
`every_s` seconds they are written as one tagged interval each with hdrh's HistogramLogWriter
and reset. Memory does not grow with the run's length, and a report can rebuild the
percentiles of any window by adding the intervals it covers
(`agentload.analysis.intervals.load_intervals` / `window`). The file is in HdrHistogram's
standard log format (v1.2, `Tag=` lines), readable by HistogramLogAnalyzer and hdrh's reader.
Interval start times are seconds since the run's `t0_ns`.
"""

from __future__ import annotations

import asyncio
import time
from array import array
from pathlib import Path

import numpy as np
from hdrh.log import HistogramLogWriter

from agentload.records import Record
from agentload.records.histograms import new_histogram, record_many_ns

_now = time.perf_counter_ns

TAGS = ("e2e", "ttft")
INTERVAL_S = 5.0


class IntervalLog:
    def __init__(self, path: Path, t0_ns: int, t0_unix: float, every_s: float = INTERVAL_S):
        self.path = path
        self.t0_ns = t0_ns
        self.every_s = every_s
        self.f = open(path, "w", encoding="ascii")
        self.w = HistogramLogWriter(self.f)
        self.w.output_log_format_version()
        self.w.output_comment(f"[StartTime: {t0_unix:.3f} (seconds since epoch)]")
        self.w.output_comment("[agentload: values in microseconds; tags e2e, ttft; interval max in ms;"
                              " timestamps in seconds since the run's t0_ns]")
        self.w.output_legend()
        self.f.flush()
        self.hists = {t: new_histogram() for t in TAGS}
        # the interval's durations (ns), put into the histograms at its end in one numpy pass each:
        # 16 bytes a request here instead of two pure-Python hdrh calls per request
        self.pending = {t: array("q") for t in TAGS}
        self.interval_start = t0_ns
        self.intervals = 0

    def add(self, rec: Record) -> None:
        """A RunContext listener: called once per record as it is written."""
        if rec.kind != "agent" or rec.outcome != "ok":
            return
        t = rec.t
        origin = t.get("intended") or t.get("start")
        if origin is None:
            return
        end = t.get("end")
        if end is not None:
            self.pending["e2e"].append(end - origin)
        ft = t.get("first_token")
        if ft is not None:
            self.pending["ttft"].append(ft - origin)

    def flush(self, now_ns: int | None = None) -> None:
        now = now_ns if now_ns is not None else _now()
        start_ms = (self.interval_start - self.t0_ns) / 1e6
        end_ms = max(start_ms + 0.001, (now - self.t0_ns) / 1e6)
        for tag in TAGS:
            h = self.hists[tag]
            pending = self.pending[tag]
            record_many_ns(h, np.frombuffer(pending, dtype=np.int64).copy())
            del pending[:]
            h.set_start_time_stamp(start_ms)
            h.set_end_time_stamp(end_ms)
            self.f.write(f"Tag={tag},")
            self.w.output_interval_histogram(h, start_ms / 1000.0 or 1e-9, end_ms / 1000.0, max_value_unit_ratio=1000.0)
            self.hists[tag] = new_histogram()  # (hdrh's reset() zeroes its 23,552 counts one by one: 10x the cost)
            # hdrh's histogram and its encoder refer to each other: a cycle, which once the run's
            # collector froze it (`runner.pace_collector`) would be freed only at the run's end;
            # without the histogram's side of it, reference counts free both now
            h.encoder = None
        self.f.flush()
        self.interval_start = now
        self.intervals += 1

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.every_s)
            self.flush()

    def close(self) -> None:
        if not self.f.closed:
            self.flush()
            self.f.close()
