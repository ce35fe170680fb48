"""Reads RUN_DIR/intervals.hlog (written by agentload.records.interval_log) back: pure, no side effects.

    ivs = load_intervals(run_dir)                  # [Interval(tag, start_s, length_s, hist), ...]
    h = window(ivs, "e2e", 600, 1200)              # merged HdrHistogram of minutes 10-20
    h.get_value_at_percentile(99) / 1000           # p99 in ms (values are microseconds)
    interval_table(ivs, "ttft")                    # [{start_s, n, p50_ms, p99_ms, max_ms}, ...]
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from hdrh.histogram import HdrHistogram

from agentload.records.histograms import new_histogram

FILE = "intervals.hlog"


@dataclass
class Interval:
    tag: str
    start_s: float
    length_s: float
    hist: HdrHistogram


def load_intervals(run_dir: Path) -> list[Interval]:
    """The run's intervals; with --workers N, each worker's intervals-wI.hlog, added up per interval."""
    from agentload.records.rundir import worker_files

    files = worker_files(Path(run_dir), "intervals", ".hlog")
    if len(files) <= 1:
        return _load_file(files[0]) if files else []
    every = 5.0
    try:
        every = float(orjson.loads((Path(run_dir) / "run.json").read_bytes())["intervals"]["every_s"]) or every
    except (OSError, ValueError, KeyError, TypeError):
        pass
    merged: dict[tuple[str, int], Interval] = {}
    for f in files:
        for iv in _load_file(f):
            key = (iv.tag, round(iv.start_s / every))
            m = merged.get(key)
            if m is None:
                merged[key] = Interval(iv.tag, iv.start_s, iv.length_s, iv.hist)
            else:
                m.hist.add(iv.hist)
                end = max(m.start_s + m.length_s, iv.start_s + iv.length_s)
                m.start_s = min(m.start_s, iv.start_s)
                m.length_s = end - m.start_s
    return sorted(merged.values(), key=lambda iv: (iv.start_s, iv.tag))


def _load_file(path: Path) -> list[Interval]:
    out: list[Interval] = []
    with open(path, encoding="ascii", errors="replace") as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#") or line.startswith('"'):
                continue
            tag = ""
            if line.startswith("Tag="):
                tag, _, line = line[4:].partition(",")
            parts = line.split(",", 3)
            if len(parts) != 4:
                continue
            try:
                hist = HdrHistogram.decode(parts[3].encode("ascii"))
                out.append(Interval(tag, float(parts[0]), float(parts[1]), hist))
            except Exception:  # a torn last line of a killed run
                continue
    return out


def window(intervals: list[Interval], tag: str, from_s: float = 0.0, to_s: float = float("inf")) -> HdrHistogram:
    """All intervals of `tag` that start in [from_s, to_s), added into one histogram."""
    h = new_histogram()
    for iv in intervals:
        if iv.tag == tag and from_s <= iv.start_s < to_s:
            h.add(iv.hist)
    return h


def interval_table(intervals: list[Interval], tag: str) -> list[dict[str, Any]]:
    rows = []
    for iv in intervals:
        if iv.tag != tag:
            continue
        n = iv.hist.get_total_count()
        row: dict[str, Any] = {"start_s": round(iv.start_s, 3), "length_s": round(iv.length_s, 3), "n": n}
        if n:
            for p in (50, 90, 99):
                row[f"p{p}_ms"] = round(iv.hist.get_value_at_percentile(p) / 1000.0, 3)
            row["max_ms"] = round(iv.hist.get_max_value() / 1000.0, 3)
        rows.append(row)
    return rows
