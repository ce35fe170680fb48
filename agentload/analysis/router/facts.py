"""What the verdict reads of the fleet behind a router, made once before it: `RouterFacts`, given
to the verdict's facts (`verdict.Facts(data, acc, router)`), so no rule calls into the router
analysis itself. It names the backend(s) that served the requests a finding is about, the scheduled
fault that overlapped them, and what the router's in-flight gauges held at the end.
"""

from __future__ import annotations

from collections import Counter
from functools import cached_property
from typing import TYPE_CHECKING, Any, Callable

from agentload.analysis.router.inflight import router_inflight
from agentload.analysis.router.tallies import secs
from agentload.records.fleet import (
    MIN_NAMED_BACKENDS,
    Backend,
    Fault,
    arrival,
    backends_of,
    faults_of,
    fleet_of,
    is_pd,
    log_lines,
    main_role,
)
from agentload.records.record import Record

if TYPE_CHECKING:
    from agentload.records.rundir import RunData

# a record's (backend that answered, prefill worker), by id(record)
Attribution = dict[int, tuple[str | None, str | None]]


def fault_text(f: Fault, t0: int) -> str:
    """`hang at 60 s`: what and when (as applied, else as planned)."""
    at = secs(f.start_ns, t0) if f.start_ns is not None else f.planned_s
    return f"{f.fault} at {float(at):.1f} s" if at is not None else f.fault


class RouterFacts:
    """The run's fleet (run.json), its scheduled faults (read once, when first asked) and its
    backend logs, as the verdict's rules ask about them."""

    def __init__(self, data: "RunData") -> None:
        self.data = data
        self.meta = data.meta
        self.t0 = int(self.meta.get("t0_ns") or 0)
        self.fleet = fleet_of(self.meta)
        self.pd = is_pd(self.meta)
        self.role = main_role(self.meta)
        self.backends: list[Backend] = backends_of(self.meta)
        self.by_name: dict[str, Backend] = {b.name: b for b in self.backends}

    @cached_property
    def faults(self) -> list[Fault]:
        """The scheduled faults (none without a fleet), in the schedule's order."""
        return faults_of(self.data) if self.fleet else []

    def present(self, named_backends: int) -> bool:
        """A fleet behind a router: run.json has one, or the records named MIN_NAMED_BACKENDS backends."""
        return self.fleet is not None or named_backends >= MIN_NAMED_BACKENDS

    def label_of(self, name: str, default_role: str | None = None) -> str:
        b = self.by_name.get(name)
        return b.label if b else Backend(name, default_role or self.role).label

    def attribute(self, records: list[Record]) -> Attribution:
        """{id(record): (backend that answered, prefill worker)} for a few records (the ones a finding
        is about): their own `backend`, else the backend log with their request id; the logs are read
        once, keeping only lines of these ids."""
        want: dict[str, list[Record]] = {}
        for r in records:
            if r.id_sent and (r.backend is None or self.pd):
                want.setdefault(r.id_sent, []).append(r)
        found: dict[tuple[str, str], tuple[int, str]] = {}  # (id, role) -> (latest arrival, backend)
        if want:
            for b in self.backends:
                for line in log_lines(self.data.path, b):
                    if line["id"] in want:
                        recv = arrival(line)
                        k = (line["id"], b.role)
                        if k not in found or recv >= found[k][0]:
                            found[k] = (recv, b.name)
        out: Attribution = {}
        for r in records:
            main = r.backend
            if main is None and r.id_sent:
                main = (found.get((r.id_sent, self.role)) or (0, None))[1]
            pre = (found.get((r.id_sent, "prefill")) or (0, None))[1] if self.pd and r.id_sent else None
            out[id(r)] = (main, pre)
        return out

    def backend_lines(self, bad: list[Record], what: str, attribution: Attribution | None = None,
                      named_backends: int | None = None) -> list[str]:
        """Evidence lines naming the backend(s) that served the requests a finding is about (`what`:
        "stalled", "failed"), with the scheduled fault on that backend that overlapped them; in PD mode
        the decode and the prefill workers. Nothing for a run without a fleet whose records named fewer
        than MIN_NAMED_BACKENDS backends (`named_backends`: how many the whole run's records named,
        else those of `bad`): one server naming itself is no router's fleet."""
        if not bad:
            return []
        attribution = attribution if attribution is not None else self.attribute(bad)
        mains = Counter(attribution.get(id(r), (None, None))[0] for r in bad)
        if not self.present(named_backends if named_backends is not None else len(set(mains) - {None})):
            return []
        n = len(bad)
        out = []
        line = _names(mains, n, what, self.label_of, lambda name: self._fault_on(bad, attribution, name, 0))
        if line is None:
            out.append(f"none of the {n} {what} requests could be attributed to a backend (no system_fingerprint "
                       f"in their answers, and no backend log line with their request id)")
        else:
            out.append(line)
        if self.pd:
            pres = Counter(attribution.get(id(r), (None, None))[1] for r in bad)
            pline = _names(pres, n, what, lambda name: self.label_of(name, "prefill"),
                           lambda name: self._fault_on(bad, attribution, name, 1))
            if pline is not None:
                out.append("their prefill: " + pline)
        return out

    def _fault_on(self, bad: list[Record], attribution: Attribution, name: str, which: int) -> str | None:
        """The scheduled faults on backend `name` that overlapped the requests of `bad` it served
        (`which`: 0 as the answering backend, 1 as the prefill worker), most overlapped first."""
        faults = [f for f in self.faults if f.start_ns is not None]
        hits: Counter[int] = Counter()
        for f in faults:
            if f.backend != name:
                continue
            for r in bad:
                if attribution.get(id(r), (None, None))[which] == name and f.overlaps(r.t.get("start") or 0,
                                                                                      r.t.get("end")):
                    hits[f.index] += 1
        if not hits:
            return None
        chosen = [f for f in faults if f.index in hits]
        chosen.sort(key=lambda f: (-hits[f.index], f.index))
        return ", ".join(f"scheduled {fault_text(f, self.t0)}" for f in chosen[:2])

    def inflight(self, min_start: int | None, max_end: int | None) -> list[dict[str, Any]]:
        """The router's in-flight gauges at its last scrape against agentload's own requests
        (`inflight.router_inflight`): `min_start`, `max_end` are the run's first start and last end."""
        return router_inflight(self.data.target_metrics, self.meta, min_start, max_end)


def _names(counts: Counter[str | None], n: int, what: str, label_of: Callable[[str], str],
           faults_of_backend: Callable[[str], str | None]) -> str | None:
    """One line naming where `n` requests (counts by backend, None: not attributed) were served."""
    missing = counts.get(None, 0)
    known: Counter[str] = Counter({k: v for k, v in counts.items() if k is not None})
    if not known:
        return None
    top, k = max(known.items(), key=lambda x: (x[1], x[0]))
    fault = faults_of_backend(top)
    where = f"{label_of(top)}" + (f" ({fault})" if fault else "")
    if k == n:
        return f"the {what} request was served by {where}" if n == 1 else f"all {n} {what} requests were served by {where}"
    rest = [f"{name} x{v}" for name, v in sorted(known.items(), key=lambda x: (-x[1], x[0])) if name != top]
    if missing:
        rest.append(f"{missing} not attributed to a backend")
    if k > n - k:
        return f"{k} of {n} {what} requests were served by {where}; the others: {', '.join(rest)}"
    return (f"{what} requests by backend: {', '.join(f'{name} x{v}' for name, v in known.most_common())}"
            + (f", {missing} not attributed" if missing else ""))
