"""summary.json's `router` section, part by part, from a finished `RouterPass`: attribution,
backends, requests over time, rounds, stickiness per conversation, load imbalance, the router's own
time, and what happened at each scheduled fault's backend."""

from __future__ import annotations

from collections import Counter
from typing import Any

from agentload.analysis.router.log_index import MAX_RETRY_EXAMPLES, id_hash
from agentload.analysis.router.state import IMBALANCE_WINDOW_S, UNATTRIBUTED, PassState
from agentload.analysis.router.tallies import (
    BackendTally,
    FaultTally,
    HopTally,
    RoundTally,
    hop_summary,
    rate,
    secs,
    ttft_summary,
)
from agentload.analysis.stats import SparseHistogram
from agentload.records.fleet import arrival, log_lines

# a window counts toward the imbalance when it has at least this many requests per backend (one
# request alone is always a "hotspot")
IMBALANCE_MIN_PER_BACKEND = 2
# the imbalance over time is drawn with at most this many points (windows merged beyond)
IMBALANCE_MAX_POINTS = 120
# "kept routing there until the fault ended": an arrival at the faulty backend in the window's last
# stretch: a tenth of the window, at least a second, at least three of the gaps between arrivals
# there before the fault (a backend that got a request every 5 s is not abandoned by a 4 s gap),
# at most half the window
NEVER_TAIL_SHARE = 0.1
NEVER_TAIL_MIN_S = 1.0
NEVER_TAIL_GAPS = 3


def conversations(p: PassState) -> dict[str, Any]:
    """Stickiness per conversation: of the conversations with 2+ requests attributed to a
    backend (of the main role), how many had them all on one backend, and the mean share of a
    conversation's requests on its most-used backend."""
    multi = one = 0
    top_share = 0.0
    for c in p.convs.values():
        n = sum(c.values())
        if n < 2:
            continue
        multi += 1
        top = max(c.values())
        one += top == n
        top_share += top / n
    return {"conversations": len(p.convs), "with_2_plus": multi, "on_one_backend": one,
            "share": rate(one, multi), "mean_top_share": round(top_share / multi, 4) if multi else None}


def hotspot(counts: Counter[str], backends: int) -> float:
    """The busiest backend's share of these requests x the number of backends (1.00: even)."""
    return round(max(counts.values()) / sum(counts.values()) * backends, 4)


def imbalance(p: PassState) -> dict[str, Any]:
    """Load imbalance (vllm-router's hotspot): the busiest backend's share of the requests x the
    number of backends, overall and its worst IMBALANCE_WINDOW_S window (of those with at least
    IMBALANCE_MIN_PER_BACKEND requests per backend), and window by window (`over_time`)."""
    names = {b.name for b in p.backends if b.role == p.role} | set(p.load)
    n = len(names)
    total = sum(p.load.values())
    out: dict[str, Any] = {"backends": n, "requests": total, "overall": None, "busiest": None,
                           "window_s": IMBALANCE_WINDOW_S, "min_window_requests": IMBALANCE_MIN_PER_BACKEND * n,
                           "windows": 0, "window_max": None, "window_max_at_s": None}
    if not total or not n:
        return out
    busiest, top = max(p.load.items(), key=lambda x: (x[1], x[0]))
    out["overall"] = round(top / total * n, 4)
    out["busiest"] = busiest
    worst: tuple[float, int] | None = None
    for w in sorted(p.windows):
        c = p.windows[w]
        if sum(c.values()) < IMBALANCE_MIN_PER_BACKEND * n:
            continue
        out["windows"] += 1
        v = hotspot(c, n)
        if worst is None or v > worst[0]:
            worst = (v, w)
    if worst is not None:
        out["window_max"] = worst[0]
        out["window_max_at_s"] = worst[1] * IMBALANCE_WINDOW_S
    out["over_time"] = imbalance_over_time(p, n)
    return out


def imbalance_over_time(p: PassState, n: int) -> dict[str, Any]:
    """The imbalance window by window from the run's start (report.html's chart): consecutive
    IMBALANCE_WINDOW_S windows merged so there are at most IMBALANCE_MAX_POINTS; each point's
    value (None: no request) and its requests (under `min_window_requests` it is not counted
    toward the worst window)."""
    window_ns = IMBALANCE_WINDOW_S * 1_000_000_000
    last = max(max(p.windows, default=0), (p.run_end() - p.t0 - 1) // window_ns)
    per = -(-(last + 1) // IMBALANCE_MAX_POINTS)  # windows per point
    merged: list[Counter[str]] = [Counter() for _ in range(last // per + 1)]
    for w, c in p.windows.items():
        if w >= 0:
            merged[w // per].update(c)
    return {"width_s": IMBALANCE_WINDOW_S * per, "values": [hotspot(c, n) if c else None for c in merged],
            "requests": [sum(c.values()) for c in merged]}


def router_time(p: PassState) -> dict[str, Any]:
    """The router's own time per request: a backend log's arrival - the record's `sent` stamp
    (one clock on one host), per backend of the arrival: to the main role's backends, and in PD
    mode under `prefill` to the prefill workers."""
    out = _hop_section(p, p.hop[p.role])
    if "prefill" in p.hop:
        out["prefill"] = _hop_section(p, p.hop["prefill"])
    return out


def _hop_section(p: PassState, t: HopTally) -> dict[str, Any]:
    total = SparseHistogram()
    per = {}
    order = [b.name for b in p.backends if b.name in t.per]
    order += sorted(k for k in t.per if k not in order)
    for name in order:
        h = t.per[name]
        total.add(h)
        per[name] = hop_summary(h)
    return {"what": "backend log arrival - request sent", "by_traceparent": t.by_tp, "by_id": t.by_id,
            "before_sent": t.before_sent, "all": hop_summary(total), "backends": per}


def attribution(p: PassState) -> dict[str, Any]:
    out: dict[str, Any] = {"requests": p.requests, "attributed": p.by_fingerprint + p.by_log,
                           "by_fingerprint": p.by_fingerprint, "by_log": p.by_log,
                           "unattributed": p.unattributed}
    if p.pd:
        out["prefill_attributed"] = p.prefill_attributed
    across = again = 0
    examples: set[int] = set()
    for role in sorted(p.index.h):
        a, g, ex = p.index.repeats(role)
        across += a
        again += g
        examples.update(ex)
    out["retried_across_backends"] = across
    out["repeated_at_one_backend"] = again
    out["retried_examples"] = retried_examples(p, sorted(examples)[:MAX_RETRY_EXAMPLES]) if examples else []
    return out


def retried_examples(p: PassState, hashes: list[int]) -> list[dict[str, Any]]:
    """The ids behind the first retried hashes, with the backends that got each, by arrival."""
    want = set(hashes)
    seen: dict[int, list[tuple[int, str, str]]] = {}
    for b in p.backends:
        for line in log_lines(p.data.path, b):
            h = id_hash(line["id"])
            if h in want:
                recv = arrival(line)
                seen.setdefault(h, []).append((recv, b.name, line["id"]))
    out = []
    for h in hashes:
        hits = sorted(seen.get(h, []))
        if hits:
            out.append({"id": hits[0][2], "backends": [n for _, n, _ in hits]})
    return out


def backends(p: PassState) -> list[dict[str, Any]]:
    order = [(b.name, b.role) for b in p.backends]
    order += sorted(k for k in p.tallies if k not in order)
    role_total: Counter[str] = Counter()
    for (_name, role), t in p.tallies.items():
        role_total[role] += t.requests
    out = []
    for name, role in order:
        t = p.tallies.get((name, role)) or BackendTally()
        b = p.by_name.get(name)
        entry: dict[str, Any] = {
            "name": name, "role": role, "url": b.url if b else None,
            "requests": t.requests, "share": rate(t.requests, role_total[role]),
            "ok": t.ok, "errors": t.errors, "stalled": t.stalled, "cut_short": t.cut_short,
            "time_to_first_token": ttft_summary(t.ttft), "cache_hit_rate": rate(t.cached, t.prompt),
            "log": None,
        }
        if name in p.log_arrivals:
            entry["log"] = {"arrivals": p.log_arrivals[name],
                            "outcomes": dict(sorted(p.log_counts[name].items()))}
        out.append(entry)
    return out


def over_time(p: PassState) -> dict[str, Any]:
    width, rows = p.over_time.result(p.run_end())
    names = [b.name for b in p.backends if b.role == p.role]
    names += sorted(str(k) for k in rows if k not in names and k != UNATTRIBUTED)
    if UNATTRIBUTED in rows:
        names.append(UNATTRIBUTED)
    nb = max((len(v) for v in rows.values()), default=0)
    return {"width_s": width, "buckets": nb, "by": "request sent",
            "backends": {n: rows.get(n, [0] * nb) for n in names}}


def rounds(p: PassState) -> dict[str, Any]:
    total = RoundTally()
    for rt in p.rounds.values():
        total.merge(rt)
    ttft = SparseHistogram()
    for h in p.ttft_rows.all():
        ttft.add(h)
    own = p.ttft_rows.own
    out: dict[str, Any] = {
        "cache_hit_rate": rate(total.cached, total.prompt),
        "cache_reporting": total.reporting,
        "time_to_first_token": ttft_summary(ttft),
        # every round's counts; its time to first token where it has a table row of its own
        "rounds": [{"round": r, **p.rounds[r].to_dict(own.get(r))} for r in sorted(p.rounds)],
    }
    rows = p.ttft_rows.rows()
    if rows is not None:
        bands = []
        for lo, hi, h in rows:
            band = RoundTally()
            for r in p.rounds:
                if lo <= r <= hi:
                    band.merge(p.rounds[r])
            bands.append({"rounds": [lo, hi], **band.to_dict(h)})
        out["round_bands"] = bands
    return out


def _stopped_after(p: PassState, ft: FaultTally, end: int) -> float | str | None:
    """When the router stopped sending the fault's backend requests (s after the fault began):
    0.0 none arrived, "never" one arrived in the window's last stretch, None no log to say."""
    f = ft.fault
    if f.start_ns is None or f.backend not in p.by_name or f.backend not in p.log_arrivals:
        return None
    if ft.last_during is None:
        return 0.0
    length = max(0, end - f.start_ns)
    gap = length / ft.before if ft.before and f.end_ns is not None else 0
    tail = min(length / 2, max(NEVER_TAIL_MIN_S * 1e9, NEVER_TAIL_SHARE * length, NEVER_TAIL_GAPS * gap))
    return "never" if end - ft.last_during <= tail else round((ft.last_during - f.start_ns) / 1e9, 3)


def fault(p: PassState, ft: FaultTally) -> dict[str, Any]:
    f, t0 = ft.fault, p.t0
    b = p.by_name.get(f.backend)
    end = f.end_ns if f.end_ns is not None else p.run_end()
    has_log = b is not None and f.backend in p.log_arrivals
    again = None
    if f.end_ns is not None and ft.first_after is not None:
        again = round((ft.first_after - f.end_ns) / 1e9, 3)
    return {
        "index": f.index, "number": f.number, "backend": f.backend, "role": b.role if b else None,
        "fault": f.fault, "planned_s": f.planned_s, "for_s": f.for_s, "applied": f.applied,
        "error": f.error, "source": f.source,
        "start_s": secs(f.start_ns, t0), "end_s": secs(f.end_ns, t0),
        "ended_in_run": f.end_ns is not None,
        "window_end_s": secs(end, t0) if f.start_ns is not None else None,
        "sent_there": {"backend_log": ft.during if has_log else None, "records": ft.records_there},
        "log_outcomes": dict(sorted(ft.log_outcomes.items())) if has_log else None,
        "client_errors": ft.errors, "client_stalls": ft.stalls,
        "errors_there": ft.errors_there, "stalls_there": ft.stalls_there,
        "last_arrival_s": secs(ft.last_during, t0),
        "stopped_routing_after_s": _stopped_after(p, ft, end),
        "used_again_after_s": again,
    }
