"""A run's fleet, as the run folder records it: run.json's `fleet` (mode, backends and their roles,
the router, the planned fault schedule), `schedule.jsonl` (each scheduled fault as applied, on the
records' clock) and each backend's request log (`fleet/<name>.requests.jsonl`: one line per request
it received, with its X-Request-ID, when it arrived and how it ended; a killed backend loses the
lines of the requests it had in flight).

Read here, so the router analysis (`agentload.analysis.router`) is a pure function of what it is
given.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from agentload.records.record import iter_record_dicts

if TYPE_CHECKING:
    from agentload.records.rundir import RunData

SCHEDULE_FILE = "schedule.jsonl"
ROLE_WORDS = {"worker": "backend", "prefill": "prefill worker", "decode": "decode worker"}
# Without a fleet in run.json, records must name this many backends for the run to count as one
# behind a router (agentload's embedded mock names itself too: one name is one server, not a fleet)
MIN_NAMED_BACKENDS = 2


@dataclass(frozen=True)
class Backend:
    name: str
    role: str  # worker | prefill | decode
    index: int | None = None
    url: str | None = None
    log: str | None = None  # the request log, relative to the run folder

    @property
    def label(self) -> str:
        """`backend b2`, `decode worker b3`: how the reports name it."""
        return f"{ROLE_WORDS.get(self.role, 'backend')} {self.name}"


def fleet_of(meta: dict[str, Any]) -> dict[str, Any] | None:
    f = meta.get("fleet")
    return f if isinstance(f, dict) else None


def is_pd(meta: dict[str, Any]) -> bool:
    return (fleet_of(meta) or {}).get("mode") == "pd"


def backends_of(meta: dict[str, Any]) -> list[Backend]:
    """The fleet's backends in run.json's order (none without a fleet)."""
    out = []
    for i, b in enumerate((fleet_of(meta) or {}).get("backends") or []):
        if isinstance(b, dict) and b.get("name"):
            out.append(Backend(str(b["name"]), str(b.get("role") or "worker"), b.get("index", i), b.get("url"),
                               b.get("request_log")))
    return out


def main_role(meta: dict[str, Any]) -> str:
    """The role of the backend that streams an answer (a record's `backend`)."""
    return "decode" if is_pd(meta) else "worker"


def log_lines(run_dir: Path, b: Backend) -> Iterator[dict[str, Any]]:
    """A backend's request log, line by line (torn lines skipped); nothing when it has none."""
    if not b.log:
        return
    path = Path(run_dir) / b.log
    if not path.exists():
        return
    for d in iter_record_dicts(path):
        if d is not None and isinstance(d.get("id"), str):
            yield d


def arrival(line: dict[str, Any]) -> int:
    """When a backend log line's request arrived (perf_counter_ns, the records' clock); 0 without a stamp."""
    recv = line.get("recv_ns")
    return recv if isinstance(recv, int) else 0


# ---------------------------------------------------------------- scheduled faults


@dataclass
class Fault:
    """One scheduled fault: where and what, and its window as applied (perf_counter_ns)."""

    index: int
    backend: str
    fault: str
    planned_s: float | None
    for_s: float | None
    start_ns: int | None  # None: never applied (the run ended first, or applying it failed)
    end_ns: int | None  # None: the run ended during the fault (or it has no end)
    applied: bool
    error: str | None = None
    source: str = SCHEDULE_FILE  # or "run.json" (planned times: no schedule.jsonl in the folder)

    @property
    def number(self) -> int:
        """How reports count faults: 1, 2, ..."""
        return self.index + 1

    def overlaps(self, start: int, end: int | None) -> bool:
        if self.start_ns is None:
            return False
        return (end is None or end >= self.start_ns) and (self.end_ns is None or start < self.end_ns)


def faults_of(data: "RunData") -> list[Fault]:
    """The scheduled faults, from schedule.jsonl (as applied), else run.json's planned times; in
    the schedule's order. A fault schedule.jsonl has no start line for was not applied."""
    meta = data.meta
    planned = [s for s in (fleet_of(meta) or {}).get("schedule") or [] if isinstance(s, dict)]
    path = Path(data.path) / SCHEDULE_FILE
    have_file = path.exists()
    events: list[dict[str, Any]] = []
    if have_file:  # a torn line (a killed run) or one without an index is left out
        events = [d for d in iter_record_dicts(path) if d is not None and isinstance(d.get("index"), int)]
    by_index: dict[int, dict[str, Any]] = {}
    for i, p in enumerate(planned):
        by_index[p["index"] if isinstance(p.get("index"), int) else i] = p
    for ev in events:  # an event of a fault run.json does not list still counts
        by_index.setdefault(ev["index"], {"backend": ev.get("backend"), "fault": ev.get("fault"),
                                          "at_s": ev.get("planned_s")})
    out = []
    for idx in sorted(by_index):
        p = by_index[idx]
        f = Fault(idx, str(p.get("backend")), str(p.get("fault")), p.get("at_s"), p.get("for_s"), None, None, False)
        if have_file:
            _as_applied(f, [e for e in events if e.get("index") == idx])
        elif f.planned_s is not None:
            _as_planned(f, int(meta.get("t0_ns") or 0), int(meta.get("t_end_ns") or 0) or None)
        out.append(f)
    return out


def _as_applied(f: Fault, events: list[dict[str, Any]]) -> None:
    """The fault's window from its schedule.jsonl lines (its first start and end events)."""
    start = next((e for e in events if e.get("event") == "start"), None)
    stop = next((e for e in events if e.get("event") == "end"), None)
    if start is not None:
        f.applied = bool(start.get("ok", True))
        f.error = start.get("error")
        f.start_ns = int(start["at_ns"]) if f.applied and start.get("at_ns") is not None else None
        f.applied = f.start_ns is not None
    if f.applied and stop is not None and stop.get("at_ns") is not None:
        f.end_ns = int(stop["at_ns"])


def _as_planned(f: Fault, t0: int, end: int | None) -> None:
    """The fault's window from run.json's planned times: one planned past the run's end never happened."""
    assert f.planned_s is not None
    f.source = "run.json"
    s = t0 + int(float(f.planned_s) * 1e9)
    if end is None or s < end:
        f.start_ns, f.applied = s, True
        if f.for_s is not None:
            e = s + int(float(f.for_s) * 1e9)
            f.end_ns = e if end is None or e < end else None


__all__ = ["MIN_NAMED_BACKENDS", "ROLE_WORDS", "SCHEDULE_FILE", "Backend", "Fault", "arrival", "backends_of",
           "faults_of", "fleet_of", "is_pd", "log_lines", "main_role"]
