"""What the target's own metrics said about the requests that went wrong: evidence lines for the
verdict, and warnings for what a router hid from the agents.

Pure functions of the troubled records and target_metrics.jsonl (`RunData.target_metrics`, read
once). Two kinds of lines:

- At one moment (`target_evidence`, for the stall rules): the scrape of each URL taken while the
  most stalled requests were waiting, and the in-flight counts it shows (per worker for a router,
  in total for vLLM and SGLang engines).
- Over the run (`router_evidence`, for the stall and error rules; `router_warnings`, for
  summary.json): per worker, what the router's counters grew by between the first and the last
  scrape: attempts that failed, and attempts routed that never got an outcome (routed minus
  outcomes: requests still in flight, or abandoned because the client left).

Every router is read through one table, `analysis.router.families` (its metric names, what they
mean, how its attempts in flight show): one function per reading, whatever the router (`_router_at`
at a moment, `_counters` over the run, each under the family's own worker label). The lines name a
worker only when the router's numbers say it: most of the requests in question, and more than all
other workers together.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from agentload.analysis.router.families import ROUTERS, RouterFamily, family_of
from agentload.records import Record
from agentload.records.phases import BY_NAME, WAITING_FOR
from agentload.records.target_metrics import TargetMetrics

if TYPE_CHECKING:
    from agentload.records.rundir import RunData


# engine gauges read at the stall moment: name -> (who, what it counts)
GAUGES = {
    "smg_admission_inflight": ("router", "requests holding an admission permit"),
    "litellm_in_flight_requests": ("router", "requests in flight at the proxy (all routes)"),
    "vllm:num_requests_running": ("engine", "running requests"),
    "vllm:num_requests_waiting": ("engine", "waiting requests"),
    "sglang:num_running_reqs": ("engine", "running requests"),
    "sglang:num_queue_reqs": ("engine", "queued requests"),
    # llama.cpp's llama-server (--metrics): slots busy, and requests waiting for a free slot
    "llamacpp:requests_processing": ("engine", "requests processing (busy slots)"),
    "llamacpp:requests_deferred": ("engine", "requests deferred (waiting for a free slot)"),
}
# an engine's own count of what it works on and what waits (running, waiting), as the queue rule reads them
ENGINE_QUEUE = (("llamacpp:requests_processing", "llamacpp:requests_deferred"),
                ("vllm:num_requests_running", "vllm:num_requests_waiting"),
                ("sglang:num_running_reqs", "sglang:num_queue_reqs"))
# what a request stalled in a server phase waited for (the phase table's `waiting_for`)
_WAIT = {ph: f"waited for {what} ({ph})" for ph, what in WAITING_FOR.items()}


def _fmt(v: float | None) -> str:
    if v is None:
        return "n/a"
    return f"{v:.0f}" if float(v).is_integer() else f"{v:.2f}"


def _per_worker(tm: TargetMetrics, url: str, name: str, t: int, keep: Callable[[dict], bool] | None = None,
                label: str = "worker") -> Counter:
    """{worker: sum of the series of `name` at `t`} (a series not yet there counts 0; one whose
    worker label is empty, a request refused before routing, is left out)."""
    out: Counter = Counter()
    for s in tm.family(url, name):
        if (keep is None or keep(s.labels)) and s.labels.get(label, "?"):
            out[s.labels.get(label, "?")] += s.at(t) or 0.0  # type: ignore[assignment]  # floats: see pyproject
    return out


def _grew(tm: TargetMetrics, url: str, name: str, t0: int, t1: int, keep: Callable[[dict], bool] | None = None,
          label: str = "worker") -> Counter:
    """{worker: how much `name` grew from t0 to t1}; a counter that went down (a restart) counts from 0."""
    a, b = _per_worker(tm, url, name, t0, keep, label), _per_worker(tm, url, name, t1, keep, label)
    out: Counter = Counter()
    for w in set(a) | set(b):
        d = b[w] - a[w]
        out[w] = d if d >= 0 else b[w]
    return out


def _failure(labels: dict) -> bool:
    return labels.get("outcome") == "failure"


def _failed(fam: RouterFamily, tm: TargetMetrics, url: str, t0: int, t1: int) -> Counter:
    """{worker: failed attempts from t0 to t1}."""
    if fam.failures:
        return _grew(tm, url, fam.failures, t0, t1, None, fam.worker_label)
    return _grew(tm, url, fam.outcomes, t0, t1, _failure, fam.worker_label)


def _failure_name(fam: RouterFamily) -> str:
    return fam.failures or f"{fam.outcomes}{{outcome=\"failure\"}}"


def _unfinished(fam: RouterFamily, tm: TargetMetrics, url: str, times: list[int], t: int) -> Counter:
    """{worker: attempts routed and not ended at `t`, above the fewest any scrape up to `t` saw}.

    Routed minus ended is cumulative: it also holds attempts abandoned before the run (a router
    counts no outcome for those, ever). They never end, so the fewest seen at any scrape bounds
    them; at a scrape that found the worker idle it is exactly them. The first scrape alone is no
    baseline: it races the run's first requests."""
    if not fam.counts_at_send:  # routed is counted at the end too: nothing in flight shows
        return Counter()

    def unended(at: int) -> Counter:
        lb = fam.worker_label
        routed, ended = _per_worker(tm, url, fam.routed, at, label=lb), _per_worker(tm, url, fam.outcomes, at, label=lb)
        if fam.failures:
            ended += _per_worker(tm, url, fam.failures, at, label=lb)
        return Counter({w: routed[w] - ended[w] for w in set(routed) | set(ended)})

    now = unended(t)
    earlier = [unended(at) for at in times if at < t]  # a worker not yet on the page had 0 then
    return Counter({w: max(0.0, now[w] - min([e[w] for e in earlier] + [now[w]])) for w in now})


def _per_text(c: Counter, workers: list[str]) -> str:
    """`11 for worker A, 0 for worker B`: the largest first, every worker the router knows."""
    order = sorted(workers, key=lambda w: (-c[w], w))
    return ", ".join(f"{_fmt(c[w])} for worker {w}" for w in order)


def _top(c: Counter, k: int | None = None) -> tuple[str, float] | None:
    """The worker holding most of `c`, when it holds more than all others together (and at least
    half of `k`, the agent requests in question, when given)."""
    total = sum(c.values())
    if not total:
        return None
    w, v = max(c.items(), key=lambda x: (x[1], x[0]))
    if v > total - v and (k is None or v >= k / 2):
        return w, v
    return None


def _workers(tm: TargetMetrics, url: str, fam: RouterFamily) -> list[str]:
    return sorted({s.labels.get(fam.worker_label, "?") for name in (fam.routed, fam.outcomes, fam.active, fam.failures)
                   if name for s in tm.family(url, name)} - {""})


# ---------------------------------------------------------------- at the stall moment, per family


def _held(url_total: float, top: tuple[str, float], k: int, what: str, unit: str) -> str:
    return (f"the router held {_fmt(top[1])} of its {_fmt(url_total)} {unit} on worker {top[0]} while {k} agent "
            f"request(s) {what}: what held them is behind the router, on that worker (a hang, or a queue when they finished late)")


# how each RouterFamily.moment reads a router's attempts in flight per worker at one scrape: what
# the line calls the count, its unit, and what a count of 0 for every worker says
_MOMENT = {
    "gauge": ("{active}", "active request(s)",
              "the router reported 0 active requests for every worker while {k} agent request(s) {what}: the "
              "stalled requests were not in flight at the router; look between agentload and the router (a proxy, "
              "the client) or at the router's own accounting"),
    "unended": ("attempts routed and not ended ({routed} - {outcomes}, above the fewest an earlier scrape saw)",
                "unended attempt(s)",
                "the router had seen every attempt it routed end while {k} agent request(s) {what}: the stalled "
                "requests were not in flight at the router; look between agentload and the router or at the "
                "router's own accounting"),
}


def _router_at(fam: RouterFamily, tm: TargetMetrics, url: str, t: int, k: int, what: str, when: str,
               times: list[int]) -> list[str]:
    """What the router held in flight per worker at the stall moment, as its family reads it
    (`RouterFamily.moment`): its live gauge, or attempts routed without an outcome."""
    how = fam.moment
    if how == "gauge" and fam.active and tm.family(url, fam.active):
        c = _per_worker(tm, url, fam.active, t)
        workers = list(c)
    elif how == "unended" and tm.family(url, fam.routed):
        c = _unfinished(fam, tm, url, times, t)
        workers = _workers(tm, url, fam)
    else:
        return []
    name, unit, none = _MOMENT[how]
    name = name.format(active=fam.active, routed=fam.routed, outcomes=fam.outcomes)
    out = [f"router {url} at {when}, while {k} agent request(s) {what}: {name} = {_per_text(c, workers)}"]
    total = sum(c.values())
    if total == 0:
        out.append(none.format(k=k, what=what))
    else:
        top = _top(c, k)
        if top:
            out.append(_held(total, top, k, what, unit))
    return out


# ---------------------------------------------------------------- over the run, per worker


def _span(tm: TargetMetrics, url: str) -> tuple[int, int] | None:
    times = tm.scrape_times.get(url) or []
    return (times[0], times[-1]) if len(times) >= 2 else None


def _counters(fam: RouterFamily, tm: TargetMetrics, url: str, bad: list[Record], what: str, kind: str) -> list[str]:
    """Per worker, from the first scrape to the last: failed attempts, and attempts never ended.
    `bad`: the agent requests in question (`what` says what happened to them); `kind`: "error" or
    "stall", which of the two counts explains them."""
    span = _span(tm, url)
    if span is None:
        return []
    t0, t1 = span
    when = f"+{(t0 - tm.t0_ns) / 1e9:.1f} .. +{(t1 - tm.t0_ns) / 1e9:.1f} s"
    workers = _workers(tm, url, fam)
    failed = _failed(fam, tm, url, t0, t1)
    unended = _unfinished(fam, tm, url, tm.scrape_times[url], t1)
    k = len(bad)
    out = []
    if sum(failed.values()):
        out.append(f"router {url} ({fam.name}) counted failed attempts over the run ({when}): "
                   f"{_failure_name(fam)} grew by {_per_text(failed, workers)}")
    if sum(unended.values()):
        out.append(f"router {url} ({fam.name}) routed attempts that never ended over the run ({when}): "
                   f"{fam.routed} - {fam.outcomes} = {_per_text(unended, workers)} at the last scrape, above the "
                   f"fewest an earlier scrape saw (in flight then, or abandoned when the client gave up)")
    main = failed if kind == "error" else unended
    top = _top(main, k)
    if top and k:
        noun = "failed attempt(s)" if kind == "error" else "attempt(s) that never ended"
        out.append(f"the router counted {_fmt(top[1])} of its {_fmt(sum(main.values()))} {noun} on worker {top[0]} "
                   f"while {k} agent request(s) {what}: they came from that worker")
    return out


def router_evidence(data: "RunData", bad: list[Record], kind: str, tm: TargetMetrics | None = None) -> list[str]:
    """What each router's per-worker counters said over the run about `bad` (the agent requests a
    rule is about): kind "error" (server errors, disconnects, bad responses) or "stall"."""
    tm = tm if tm is not None else data.target_metrics
    if not tm or not bad:
        return []
    if kind == "stall":
        what = "stalled"
    else:
        what = f"failed ({', '.join(f'{e} x{n}' for e, n in Counter(r.error for r in bad).most_common())})"
    out: list[str] = []
    for url in tm.urls:
        fam = family_of(tm, url)
        if fam is not None:
            out.extend(_counters(fam, tm, url, bad, what, kind))
    return out


def router_warnings(data: "RunData", seen: int, tm: TargetMetrics | None = None) -> list[str]:
    """Failures a router counted that agents never saw (it retried them on another worker): one
    warning per router, naming the failing worker(s) and the counts. `seen`: the server errors
    (HTTP errors and in-band error events) agents got."""
    tm = tm if tm is not None else data.target_metrics
    if not tm:
        return []
    out = []
    for url in tm.urls:
        fam = family_of(tm, url)
        span = _span(tm, url)
        if fam is None or span is None:
            continue
        failed = _failed(fam, tm, url, *span)
        n = sum(failed.values())
        if n <= seen:
            continue
        retried = 0.0
        if fam.retries:
            retried = sum(_grew(tm, url, fam.retries, *span).values())
        workers = [w for w, v in failed.most_common() if v]
        out.append(f"router {url} ({fam.name}) counted {_fmt(n)} failed attempt(s) on its workers "
                   f"({_per_text(failed, workers)}; {_failure_name(fam)}) and "
                   f"{_fmt(retried)} retr{'y' if retried == 1 else 'ies'} ({fam.retries or 'not counted'}), while agents saw {seen} "
                   f"server error(s): the router hid {_fmt(n - seen)} failure(s) by retrying them; worker "
                   f"{workers[0]} is failing requests")
    return out


# ---------------------------------------------------------------- the stall rule's lines


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
        best_t: int | None = None
        best: list[tuple[int, int, str]] = []
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
        for fam in ROUTERS:
            out.extend(_router_at(fam, tm, url, best_t, k, what, when, times))
        for name, (who, label) in GAUGES.items():
            series = tm.family(url, name)
            if not series:
                continue
            total2 = sum(s.at(best_t) or 0 for s in series)
            out.append(f"{who} {url} at {when}, while {k} agent request(s) {what}: {name} = {_fmt(total2)} "
                       f"{label}")
    out.extend(router_evidence(data, stalled, "stall", tm))
    return out


# an engine's counters of work done (any step of any request), as the queue rule reads them
ENGINE_PROGRESS = ("llamacpp:n_decode_total", "vllm:generation_tokens_total", "sglang:generation_tokens_total")


@dataclass(frozen=True)
class EngineWork:
    """What an engine's own metrics said while requests waited for headers (`engine_work`)."""

    url: str
    counter: str
    grew: float  # how much it grew from the first to the last scrape inside the waits
    scrapes: int  # ... over this many scrapes
    running_max: float  # the most requests it worked on at one of those scrapes
    waiting_max: float  # ... and the most it kept waiting


def engine_work(data: "RunData", stalled: list[Record], tm: TargetMetrics | None = None) -> EngineWork | None:
    """The engine kept working while `stalled` (requests stalled in ttfb) waited for headers: its
    progress counter (llama.cpp's n_decode_total: every decode step of any request) grew between two
    scrapes taken inside their waits, with requests running and requests waiting. None: no engine
    metrics, no two scrapes inside the waits, or no work done (a stopped or hung engine)."""
    tm = tm if tm is not None else data.target_metrics
    if not tm:
        return None
    after_s = float(((data.meta.get("scenario") or {}).get("stall") or {}).get("after_s") or 0.0)
    windows = [w for w in stall_windows(stalled, after_s) if w[2] == "ttfb"]
    if not windows:
        return None
    best: EngineWork | None = None
    for url in tm.urls:
        times = [t for t in tm.scrape_times.get(url) or [] if any(a <= t <= b for a, b, _ in windows)]
        if len(times) < 2:
            continue
        for counter in ENGINE_PROGRESS:
            fam = tm.family(url, counter)
            if not fam:
                continue
            grew = sum((s.at(times[-1]) or 0.0) - (s.at(times[0]) or 0.0) for s in fam)
            if grew <= 0:
                continue
            running = waiting = 0.0
            for r_name, w_name in ENGINE_QUEUE:
                if r_name.split(":")[0] != counter.split(":")[0]:
                    continue
                for t in times:
                    running = max(running, sum(s.at(t) or 0.0 for s in tm.family(url, r_name)))
                    waiting = max(waiting, sum(s.at(t) or 0.0 for s in tm.family(url, w_name)))
            if running >= 1 and (best is None or grew > best.grew):
                best = EngineWork(url, counter, grew, len(times), running, waiting)
    return best


def engine_queue_evidence(tm: TargetMetrics) -> list[str]:
    """What an engine's own gauges said over the run about its queue: the most requests it worked on
    at one scrape, and the most it kept waiting (llama.cpp: busy slots and deferred requests)."""
    out: list[str] = []
    if not tm:
        return out
    for url in tm.urls:
        for running, waiting in ENGINE_QUEUE:
            r, w = tm.family(url, running), tm.family(url, waiting)
            if not r and not w:
                continue
            r_max = max((x.max() for x in r), default=0.0)
            w_max = max((x.max() for x in w), default=0.0)
            n = len(tm.scrape_times.get(url) or [])
            out.append(f"engine {url} over {n} scrape(s): {running} at most {_fmt(r_max)} ({GAUGES[running][1]}), "
                       f"{waiting} up to {_fmt(w_max)} ({GAUGES[waiting][1]})"
                       + (": the engine's own count of a queue" if r_max and w_max else ""))
    return out


def scrape_summary(tm: TargetMetrics) -> dict[str, dict] | None:
    """Per URL scrape counts for summary.json (None when the run scraped nothing)."""
    if not tm:
        return None
    return {u: {"ok": tm.scrapes[u]["ok"], "failed": tm.scrapes[u]["failed"], "errors": tm.scrapes[u]["errors"],
                "series": sum(1 for (uu, _) in tm.series if uu == u)} for u in tm.urls}
