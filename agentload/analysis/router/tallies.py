"""The router pass's counters: per backend, per round (or band of rounds), per scheduled fault,
and the small conversions summary.json's figures go through."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from agentload.analysis.stats import SparseHistogram, percentiles_ms
from agentload.records.fleet import Fault
from agentload.records.record import Record


def secs(ns: int | None, t0: int) -> float | None:
    """A stamp as seconds since t0, to the millisecond (None stays None)."""
    return None if ns is None else round((ns - t0) / 1e9, 3)


def prompt_tokens(r: Record) -> int:
    """The prompt's size as the server counted it, else as agentload did."""
    return r.server_prompt_tokens if r.server_prompt_tokens is not None else r.prompt_tokens


def rate(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


def ttft_summary(h: SparseHistogram) -> dict[str, Any] | None:
    pct = percentiles_ms(h, (50, 90))
    if pct is None:
        return None
    return {"n": h.get_total_count(), "p50_ms": pct[50], "p90_ms": pct[90]}


def hop_summary(h: SparseHistogram) -> dict[str, Any] | None:
    pct = percentiles_ms(h, (50, 99))
    if pct is None:
        return None
    return {"n": h.get_total_count(), "p50_ms": pct[50], "p99_ms": pct[99]}


class HopTally:
    """The router's own time to the backends of one role (backend log arrival - request sent):
    how the records were joined to a log line, those that arrived before the send stamp, and a
    histogram per backend of the arrival."""

    __slots__ = ("by_tp", "by_id", "before_sent", "per")

    def __init__(self) -> None:
        self.by_tp = self.by_id = self.before_sent = 0
        self.per: dict[str, SparseHistogram] = {}

    def record(self, name: str, recv: int, sent: int) -> None:
        if recv < sent:  # arrived before agentload's send stamp: not a time the router took
            self.before_sent += 1
            return
        h = self.per.get(name)
        if h is None:
            h = self.per[name] = SparseHistogram()
        h.record_ns(recv - sent)


def ttft_ns(r: Record) -> int | None:
    """Time to first token: request sent -> first token (what the verdict's healthy line says)."""
    t = r.t
    if "first_token" in t and "sent" in t:
        return t["first_token"] - t["sent"]
    return None


class BackendTally:
    __slots__ = ("requests", "ok", "errors", "stalled", "cut_short", "ttft", "cached", "prompt")

    def __init__(self) -> None:
        self.requests = self.ok = self.errors = self.stalled = self.cut_short = 0
        self.ttft = SparseHistogram()
        self.cached = self.prompt = 0

    def add(self, r: Record, ttft: int | None) -> None:
        self.requests += 1
        self.ok += r.outcome == "ok"
        self.errors += r.outcome == "error"
        self.cut_short += r.outcome == "cut_short"
        self.stalled += r.stalled_phase is not None
        if ttft is not None:
            self.ttft.record_ns(ttft)
        if r.cached_tokens is not None:
            self.cached += r.cached_tokens
            self.prompt += prompt_tokens(r)


class RoundTally:
    """A round's (or a band's) counts; its time to first token is kept per row of the table
    (`RouterPass.ttft_rows`), not per round."""

    __slots__ = ("requests", "reporting", "cached", "prompt")

    def __init__(self) -> None:
        self.requests = self.reporting = self.cached = self.prompt = 0

    def add(self, r: Record) -> None:
        self.requests += 1
        if r.cached_tokens is not None:
            self.reporting += 1
            self.cached += r.cached_tokens
            self.prompt += prompt_tokens(r)

    def merge(self, o: "RoundTally") -> None:
        self.requests += o.requests
        self.reporting += o.reporting
        self.cached += o.cached
        self.prompt += o.prompt

    def to_dict(self, ttft: SparseHistogram | None) -> dict[str, Any]:
        return {"requests": self.requests, "reporting_cache": self.reporting, "cached_tokens": self.cached,
                "prompt_tokens": self.prompt, "cache_hit_rate": rate(self.cached, self.prompt),
                "time_to_first_token": ttft_summary(ttft) if ttft is not None else None}


@dataclass
class FaultTally:
    fault: Fault
    before: int = 0  # arrivals at its backend in as long a stretch before the fault
    during: int = 0  # arrivals at its backend during the window (the backend's log)
    last_during: int | None = None
    first_after: int | None = None
    log_outcomes: Counter[str] = field(default_factory=Counter)
    records_there: int = 0  # records attributed to its backend, sent during the window
    errors: int = 0  # client-visible errors and stalls of requests that overlapped the window
    stalls: int = 0
    errors_there: int = 0  # ... of those, attributed to its backend
    stalls_there: int = 0

    def arrival(self, recv: int, outcome: str) -> None:
        """A line of its backend's log: before, during or after the fault's window."""
        s, e = self.fault.start_ns, self.fault.end_ns
        assert s is not None
        length = (e - s) if e is not None else None
        if length is not None and s - length <= recv < s:
            self.before += 1
        if recv >= s and (e is None or recv < e):
            self.during += 1
            self.last_during = recv if self.last_during is None else max(self.last_during, recv)
            self.log_outcomes[outcome] += 1
        if e is not None and recv >= e:
            self.first_after = recv if self.first_after is None else min(self.first_after, recv)

    def record(self, r: Record, there: bool, sent: int | None, start: int, end: int | None) -> None:
        """A record: sent to its backend during the window, and an error or stall overlapping it."""
        f = self.fault
        if there and sent is not None and f.start_ns is not None and sent >= f.start_ns \
                and (f.end_ns is None or sent < f.end_ns):
            self.records_there += 1
        bad_error, bad_stall = r.outcome == "error", r.stalled_phase is not None
        if (bad_error or bad_stall) and f.overlaps(start, end):
            self.errors += bad_error
            self.stalls += bad_stall
            self.errors_there += bad_error and there
            self.stalls_there += bad_stall and there
