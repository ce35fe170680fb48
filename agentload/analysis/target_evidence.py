"""What the target's own metrics said while agents were stalled: evidence lines for the verdict.

Pure function of the stalled records and target_metrics.jsonl (`RunData.target_metrics`, read
once). For the scrape of each URL taken while the most stalled requests were waiting, it reports
the in-flight gauges it knows (smg per worker, vLLM and SGLang engines) and what they mean:

- the router counted 0 active requests while agents waited for its first byte: the requests
  are not in flight at the router (look between agentload and the router, or at its accounting);
- the router counted them on one worker: the hang is behind the router, on that worker.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentload.records import Record
from agentload.records.phases import BY_NAME, WAITING_FOR
from agentload.records.target_metrics import TargetMetrics

if TYPE_CHECKING:
    from agentload.records.rundir import RunData

# name -> (who, what it counts); the first group is per worker (label `worker`)
ROUTER_PER_WORKER = "smg_worker_requests_active"
GAUGES = {
    "smg_admission_inflight": ("router", "requests holding an admission permit"),
    "vllm:num_requests_running": ("engine", "running requests"),
    "vllm:num_requests_waiting": ("engine", "waiting requests"),
    "sglang:num_running_reqs": ("engine", "running requests"),
    "sglang:num_queue_reqs": ("engine", "queued requests"),
}
# what a request stalled in a server phase waited for (the phase table's `waiting_for`)
_WAIT = {ph: f"waited for {what} ({ph})" for ph, what in WAITING_FOR.items()}


def _fmt(v: float | None) -> str:
    if v is None:
        return "n/a"
    return f"{v:.0f}" if float(v).is_integer() else f"{v:.2f}"


def stall_windows(stalled: list[Record], after_s: float) -> list[tuple[int, int, str]]:
    """(from, to, phase) in ns: from the moment a request counted as stalled to its end."""
    out = []
    for r in stalled:
        ph = r.stalled_phase
        start = r.t.get(BY_NAME[ph].start[0]) if ph in _WAIT else None  # when it entered that phase
        end = r.t.get("end")
        if start is None or end is None:
            continue
        out.append((start + int(after_s * 1e9), end, ph or "?"))
    return out


def target_evidence(data: "RunData", stalled: list[Record], tm: TargetMetrics | None = None) -> list[str]:
    """Evidence lines from the target's metrics about the stalled requests (empty when none were scraped)."""
    tm = tm if tm is not None else data.target_metrics
    if not tm:
        return []
    t0 = tm.t0_ns
    after_s = float(((data.meta.get("scenario") or {}).get("stall") or {}).get("after_s") or 0.0)
    windows = stall_windows(stalled, after_s)
    out: list[str] = []
    for url in tm.urls:
        sc = tm.scrapes[url]
        times = tm.scrape_times[url]
        if not times:
            out.append(f"target metrics {url}: every scrape failed ({sc['failed']}), e.g. "
                       f"{(sc['errors'] or ['?'])[0]}")
            continue
        if not windows:
            continue
        best_t, best = None, []
        for t in times:
            waiting = [w for w in windows if w[0] <= t <= w[1]]
            if len(waiting) > len(best):
                best_t, best = t, waiting
        if best_t is None:
            span = max((w[1] - w[0]) / 1e9 for w in windows)
            out.append(f"target metrics {url}: no scrape fell while requests were stalled "
                       f"({len(times)} scrapes; stalls lasted up to {span:.1f} s after stall.after_s); "
                       f"scrape more often ([target] metrics_every_s)")
            continue
        k = len(best)
        phases = sorted({w[2] for w in best})
        what = _WAIT.get(phases[0], "were stalled") if len(phases) == 1 else "were stalled"
        when = f"+{(best_t - t0) / 1e9:.1f} s"
        workers = tm.family(url, ROUTER_PER_WORKER)
        if workers:
            vals = sorted(((s.labels.get("worker", "?"), s.at(best_t)) for s in workers),
                          key=lambda x: -(x[1] or 0))
            total = sum(v or 0 for _, v in vals)
            per = ", ".join(f"{_fmt(v)} for worker {w}" for w, v in vals)
            out.append(f"router {url} at {when}, while {k} agent request(s) {what}: "
                       f"{ROUTER_PER_WORKER} = {per}")
            if total == 0:
                out.append(f"the router reported 0 active requests for every worker while {k} agent request(s) "
                           f"{what}: the stalled requests were not in flight at the router; look between "
                           f"agentload and the router (a proxy, the client) or at the router's own accounting")
            else:
                top_w, top_v = vals[0]
                rest = total - (top_v or 0)
                if top_v and top_v >= k / 2 and top_v > rest:
                    out.append(f"the router held {_fmt(top_v)} of its {_fmt(total)} active request(s) on worker "
                               f"{top_w} while {k} agent request(s) {what}: the hang is behind the router, "
                               f"on that worker")
        for name, (who, label) in GAUGES.items():
            fam = tm.family(url, name)
            if not fam:
                continue
            vals2 = [s.at(best_t) for s in fam]
            total2 = sum(v or 0 for v in vals2)
            out.append(f"{who} {url} at {when}, while {k} agent request(s) {what}: {name} = {_fmt(total2)} "
                       f"{label}")
    return out


def scrape_summary(tm: TargetMetrics) -> dict[str, dict] | None:
    """Per URL scrape counts for summary.json (None when the run scraped nothing)."""
    if not tm:
        return None
    return {u: {"ok": tm.scrapes[u]["ok"], "failed": tm.scrapes[u]["failed"], "errors": tm.scrapes[u]["errors"],
                "series": sum(1 for (uu, _) in tm.series if uu == u)} for u in tm.urls}
