"""The phase table: the one definition of a request's phases, their stamps, names and colours.

One row per phase, in the order a request passes them (`e2e`, the whole request, last). Every
consumer reads this table: the record's phase durations (`phase_ns`) and current phase
(`phase_at`), the watchdog's idea of progress, the agent dump, the report tables and their
order, the timeline's segments, legends and colours, the verdict's "past the pool" phases, the
target-metrics evidence, and `agentload compare`'s rows. Adding a phase is one row here (and
golden files regenerated); nothing else spells the order out.

A row:

- `start`: the stamps that open the phase, the first one present wins (`send` opens when the
  connection is ready: after connect, else after the pool, else at the start);
- `end`: the stamp that closes it;
- `passed_by` / `passed_if_reused`: a phase whose opening stamp is missing took no time when
  the request got past it (a later stamp exists, or a reused connection skipped it): 0, not
  absent. Any other missing stamp means the request never got through the phase (None);
- `entered_by` / `entered_if_reused`: what shows the request is in this phase now (the last
  phase entered is the one it is in, or died in);
- `marks`: stamps taken inside the phase that bound no phase (`first_byte`);
- `label`, `color`: for people and charts;
- `request`: a step of the request (drawn in the timeline, counted in flight); `e2e` is not;
- `server`: past the client's pool and connection: no progress here is the server's doing;
- `waiting_for`: what a request stalled here waits for (evidence text);
- `report`: a column of the per-round tables (summary.json, report.txt, report.html);
- `ok_only`: its percentiles count completed requests only (`e2e`);
- `compare`, `compare_cdf`: a row of `agentload compare`'s table / a CDF in compare.html.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True, slots=True)
class Phase:
    name: str
    start: tuple[str, ...]
    end: str
    label: str
    color: str
    request: bool = True
    server: bool = False
    report: bool = True
    ok_only: bool = False
    compare: bool = False
    compare_cdf: bool = False
    passed_by: tuple[str, ...] = ()
    passed_if_reused: bool = False
    entered_by: tuple[str, ...] = ()
    entered_if_reused: bool = False
    marks: tuple[str, ...] = ()
    waiting_for: str | None = None


TABLE: tuple[Phase, ...] = (
    Phase("pool_wait", ("queued_start",), "queued_end", "pool_wait (waiting for a connection)", "#9467bd",
          compare=True, compare_cdf=True, passed_by=("conn_start", "sent"), passed_if_reused=True),
    Phase("connect", ("conn_start",), "conn_end", "connect (DNS+TCP+TLS)", "#8c564b",
          compare=True, passed_by=("sent",), entered_by=("conn_start",)),
    Phase("send", ("conn_end", "queued_end", "start"), "sent", "send (request body)", "#e377c2",
          report=False, entered_by=("conn_end",), entered_if_reused=True),
    Phase("ttfb", ("sent",), "headers", "ttfb (waiting for headers)", "#ff7f0e",
          server=True, compare=True, compare_cdf=True, entered_by=("sent",), waiting_for="response headers"),
    Phase("ttft", ("headers",), "first_token", "ttft (waiting for the first token)", "#1f77b4",
          server=True, compare=True, entered_by=("headers",), marks=("first_byte",),
          waiting_for="their first token"),
    Phase("stream", ("first_token",), "end", "stream (decode)", "#2ca02c",
          server=True, entered_by=("first_token",), waiting_for="their next token"),
    Phase("e2e", ("intended", "start"), "end", "e2e (start to end)", "#17becf",
          request=False, ok_only=True, compare=True, compare_cdf=True),
)

BY_NAME: dict[str, Phase] = {p.name: p for p in TABLE}
REQUEST: tuple[Phase, ...] = tuple(p for p in TABLE if p.request)

# ---- what other code imports (agentload.records re-exports the first three)

PHASES = tuple(p.name for p in REQUEST)  # the steps of a request, in order
REPORT_PHASES = tuple(p.name for p in TABLE if p.report)  # the columns of the per-round tables
SERVER_PHASES = tuple(p.name for p in TABLE if p.server)  # past the pool: a stall here is the server's
COMPARE_PHASES = tuple(p.name for p in TABLE if p.compare)  # agentload compare's phase rows
COMPARE_CDF_PHASES = tuple(p.name for p in TABLE if p.compare_cdf)  # compare.html's CDFs
FIRST_PHASE = REQUEST[0].name  # where a request with no stamp past its start is
LAST_PHASE = REQUEST[-1].name  # where a request that completed ended
COLORS = {p.name: p.color for p in TABLE}
LABELS = {p.name: p.label for p in TABLE}
WAITING_FOR = {p.name: p.waiting_for for p in TABLE if p.waiting_for}


def _stamps() -> tuple[str, ...]:
    out = ["intended", "start"]
    for p in REQUEST:
        for s in (*p.start, *p.marks, p.end):
            if s not in out:
                out.append(s)
    return tuple(out)


STAMPS = _stamps()  # keys of Record.t, in the order a request passes them
# When a request last entered a phase, latest first (the watchdog's progress; first_token
# means "its last token", which the trace keeps apart)
PROGRESS_STAMPS = tuple(p.start[0] for p in reversed(REQUEST)) + ("start",)


def phase_begin(t: dict[str, int], phase: str) -> int | None:
    """When `phase` began: its first opening stamp present (None when it never began)."""
    for s in BY_NAME[phase].start:
        v = t.get(s)
        if v is not None:
            return v
    return None


def phase_at(t: dict[str, int], reused: bool | None) -> str:
    """The phase a request is in (or died in), from which stamps exist."""
    for p in reversed(REQUEST):
        if (p.entered_if_reused and reused) or any(s in t for s in p.entered_by):
            return p.name
    return FIRST_PHASE


def phase_since(t: dict[str, int], reused: bool | None) -> int:
    """When the request entered the phase it is in now (the agent dump's "in phase" clock)."""
    b = phase_begin(t, phase_at(t, reused))
    return t.get("start", 0) if b is None else b


def phase_ns(t: dict[str, int], phase: str, reused: bool | None = None) -> int | None:
    """Duration of one phase from raw stamps; None where the request never got through it.

    e2e runs from when the request should have started (open loop: coordinated omission),
    else from its send."""
    return DURATION[phase](t, reused)  # KeyError for a phase the table does not know


def _duration_of(p: Phase) -> Callable[[dict[str, int], bool | None], int | None]:
    """`phase_ns` of one phase, with its row's stamps bound (called for every phase of every record)."""
    start, end, passed_by, passed_if_reused = p.start, p.end, p.passed_by, p.passed_if_reused

    def duration(t: dict[str, int], reused: bool | None = None) -> int | None:
        if "start" not in t:
            return None
        for s in start:
            b = t.get(s)
            if b is not None:
                e = t.get(end)
                return None if e is None else e - b
        if (passed_if_reused and reused) or any(s in t for s in passed_by):
            return 0
        return None

    return duration


# phase -> its phase_ns(t, reused)
DURATION: dict[str, Callable[[dict[str, int], bool | None], int | None]] = {p.name: _duration_of(p) for p in TABLE}


def end_stamp(t: dict[str, int]) -> int:
    """A request's end stamp, or its last stamp when it has none (failed or cut short before
    its end was stamped); 0 when it has no stamp at all."""
    end = t.get("end")
    return end if end is not None else max(t.values(), default=0)


def request_segments(t: dict[str, int]) -> list[tuple[str, int, int]]:
    """(phase, begin_ns, end_ns) for every phase the request entered, in order.

    A phase that began but never ended (the request failed, stalled or was cut short in it)
    runs to the request's `end` stamp (or its last stamp), so an unfinished request is drawn to
    where it stopped. A phase that opens when the ones before it are done (`send`) is left out
    while one of them is still open, and when the request got past it without its end stamp.
    """
    start = t.get("start")
    if start is None:
        return []
    last = end_stamp(t)
    out: list[tuple[str, int, int]] = []
    still_open = False  # an earlier phase began and never ended
    for i, p in enumerate(REQUEST):
        b = phase_begin(t, p.name)
        if b is None:
            continue
        e = t.get(p.end)
        if len(p.start) > 1:  # opens after the phases before it
            later = any(q.start[0] in t for q in REQUEST[i + 1:])
            if still_open or (e is None and later):
                continue
        elif e is None:
            still_open = True
        e = last if e is None else e
        out.append((p.name, b, max(b, e)))
    return out
