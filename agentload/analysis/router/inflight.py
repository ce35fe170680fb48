"""The router's own in-flight gauges (`RouterFamily.inflight`) against agentload's requests: what
each said at the last scrape (a leak: requests it still counts after every one of agentload's
ended), and each one over the run for the report's chart."""

from __future__ import annotations

from typing import Any

from agentload.analysis.router.families import family_of
from agentload.analysis.router.tallies import secs
from agentload.records.target_metrics import TargetMetrics


def router_inflight(tm: TargetMetrics, meta: dict[str, Any], min_start: int | None,
                    max_end: int | None) -> list[dict[str, Any]]:
    """Per router URL and in-flight gauge (`RouterFamily.inflight`), what it said at the last
    scrape against agentload's own requests: `leaked` is how many requests the router still counts
    in flight (above what the gauge read before the run, and the scrape itself where it counts)
    when agentload had none (the run ended and every request ended before that scrape); 0 when
    agentload cannot say it had none (a killed run, a request that ended after the scrape)."""
    if not tm:
        return []
    t0 = tm.t0_ns
    out = []
    for url in tm.urls:
        fam = family_of(tm, url)
        times = tm.scrape_times.get(url) or []
        if fam is None or not times:
            continue
        last, first = times[-1], times[0]
        for name, self_count, what in fam.inflight:
            series = tm.family(url, name)
            if not series:
                continue
            at_last = sum(s.at(last) or 0.0 for s in series)
            before = None
            if min_start is None or first < min_start:  # the first scrape was before any request
                before = sum(s.at(first) or 0.0 for s in series)
            floor = max(float(self_count), before if before is not None else float(self_count))
            idle = bool(meta.get("ended")) and (max_end is None or max_end <= last)
            per_worker: dict[str, float] = {}
            if fam.worker_label and any(fam.worker_label in s.labels for s in series):
                for s in series:
                    w = s.labels.get(fam.worker_label, "?")
                    per_worker[w] = per_worker.get(w, 0.0) + (s.at(last) or 0.0)
            out.append({
                "url": url, "router": fam.name, "gauge": name, "what": what, "self_count": self_count,
                "before_run": before, "at_last_scrape": at_last, "last_scrape_s": round((last - t0) / 1e9, 3),
                "scrapes": len(times),
                "agentload_idle": idle,
                "agentload_last_end_s": secs(max_end, t0),
                "per_worker": dict(sorted(per_worker.items())) if per_worker else None,
                "leaked": max(0.0, at_last - floor) if idle else 0.0,
            })
    return out


def inflight_series(tm: TargetMetrics) -> list[tuple[str, str, list[float], list[float]]]:
    """(url, gauge, seconds since t0, value less the scrape itself) of every router in-flight gauge,
    summed over its workers at each scrape: the chart beside agentload's own in-flight count."""
    out: list[tuple[str, str, list[float], list[float]]] = []
    if not tm:
        return out
    for url in tm.urls:
        fam = family_of(tm, url)
        times = tm.scrape_times.get(url) or []
        if fam is None or not times:
            continue
        for name, self_count, _ in fam.inflight:
            series = tm.family(url, name)
            if not series:
                continue
            xs = [round((t - tm.t0_ns) / 1e9, 3) for t in times]
            ys = [max(0.0, sum(s.at(t) or 0.0 for s in series) - self_count) for t in times]
            out.append((url, name, xs, ys))
    return out
