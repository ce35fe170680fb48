"""Per-agent timelines from records: each request cut into its phases, the gaps between rounds.

Shared by the HTML swim lanes and the Perfetto export, so both draw the same thing. All
times are raw `perf_counter_ns` stamps; callers subtract `run.json`'s `t0_ns`.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

from agentload.records import Record, phase_at

if TYPE_CHECKING:
    from agentload.records.rundir import RunData

# The order a request passes them, then what happens between requests.
REQUEST_PHASES = ("pool_wait", "connect", "send", "ttfb", "ttft", "stream")
GAP_KINDS = ("tool", "retry_wait", "no_record")
TIMELINE_KINDS = REQUEST_PHASES + GAP_KINDS


def request_segments(t: dict[str, int]) -> list[tuple[str, int, int]]:
    """(phase, begin_ns, end_ns) for every phase the request entered.

    A phase that began but never ended (the request failed, stalled or was cut short in it)
    runs to the request's `end` stamp, so an unfinished request is drawn to where it stopped.
    """
    start = t.get("start")
    if start is None:
        return []
    end = t.get("end")
    last = end if end is not None else max(t.values())
    out: list[tuple[str, int, int]] = []

    def add(phase: str, b: int, e: int | None) -> None:
        e = last if e is None else e
        out.append((phase, b, max(b, e)))

    qs, qe = t.get("queued_start"), t.get("queued_end")
    cs, ce = t.get("conn_start"), t.get("conn_end")
    if qs is not None:
        add("pool_wait", qs, qe)
    if cs is not None:
        add("connect", cs, ce)
    pool_done = qs is None or qe is not None
    conn_done = cs is None or ce is not None
    sent = t.get("sent")
    if pool_done and conn_done:
        ready = ce or qe or start
        if sent is not None or "headers" not in t:
            add("send", ready, sent)
    if sent is not None:
        add("ttfb", sent, t.get("headers"))
    if "headers" in t:
        add("ttft", t["headers"], t.get("first_token"))
    if "first_token" in t:
        add("stream", t["first_token"], end)
    return out


def end_phase(rec: Record) -> str:
    """The phase a request was in when it ended (for a stalled one: where it stalled)."""
    if rec.stalled_phase:
        return rec.stalled_phase
    segs = request_segments(rec.t)
    if not segs:
        return "pool_wait"
    if rec.outcome == "ok":
        return "stream"
    # A phase that never got its end stamp is the one the request died in.
    return phase_at(rec.t, rec.reused)


@dataclass
class Lane:
    """One agent (or the canaries): its requests in order, and the gaps between them."""

    key: int  # agent number, -1 for canaries
    records: list[Record]
    gaps: list[tuple[str, int, int]]  # (tool | retry_wait | no_record, begin, end)

    @property
    def problem(self) -> bool:
        return any(r.outcome != "ok" or r.stalled_phase for r in self.records) or any(
            g[0] == "no_record" for g in self.gaps)


def run_end_ns(data: "RunData") -> int:
    """Where the timeline ends: the run's recorded end, else the last thing seen on disk."""
    m = data.meta
    if m.get("t_end_ns"):
        return int(m["t_end_ns"])
    seen = [r.t.get("end") or max(r.t.values()) for r in data.records if r.t]
    seen += [s["t"] for s in data.samples if isinstance(s.get("t"), int)]
    return max(seen) if seen else int(m.get("t0_ns") or 0)


def build_lanes(data: "RunData") -> list[Lane]:
    """A lane per agent (sorted), plus one for canaries (key -1) first when there are any.

    Between two requests of an agent: `tool` when the next is a new round (the agent's own
    tool time), `retry_wait` when it retries the same round. When the run was killed
    (run.json never says `ended`), an agent whose last record completed a round before its
    last round had a request in flight that left no record: drawn as `no_record` to the end.
    """
    per: dict[int, list[Record]] = defaultdict(list)
    for r in data.records:
        per[-1 if r.kind == "canary" else r.agent].append(r)
    max_rounds = (data.meta.get("scenario", {}).get("agents", {}) or {}).get("rounds")
    killed = not data.meta.get("ended", False)
    end = run_end_ns(data)
    lanes = []
    for key in sorted(per):
        recs = sorted(per[key], key=lambda r: (r.t.get("start") or 0, r.round, r.call))
        gaps: list[tuple[str, int, int]] = []
        if key >= 0:
            for a, b in zip(recs, recs[1:]):
                ae, bs = a.t.get("end"), b.t.get("intended") or b.t.get("start")
                if ae is None or bs is None or bs <= ae:
                    continue
                gaps.append(("tool" if b.round > a.round else "retry_wait", ae, bs))
            last = recs[-1]
            if (killed and last.outcome == "ok" and last.t.get("end")
                    and (max_rounds is None or last.round < max_rounds) and end > last.t["end"]):
                gaps.append(("no_record", last.t["end"], end))
        lanes.append(Lane(key, recs, gaps))
    return lanes


def pick_lanes(lanes: Iterable[Lane], cap: int) -> tuple[list[Lane], str | None]:
    """At most `cap` agent lanes: every lane when they fit, else an even sample that keeps
    half its room for agents with a problem. Returns the lanes and a note saying what was
    left out (None when nothing was)."""
    agents = [ln for ln in lanes if ln.key >= 0]
    if len(agents) <= cap:
        return agents, None
    bad = [ln for ln in agents if ln.problem]
    good = [ln for ln in agents if not ln.problem]
    n_bad = min(len(bad), max(cap // 2, cap - len(good)))
    n_good = min(len(good), cap - n_bad)
    chosen = _spread(bad, n_bad) + _spread(good, n_good)
    chosen.sort(key=lambda ln: ln.key)
    if bad:
        note = (f"showing {len(chosen):,} of {len(agents):,} agents: {n_bad:,} of {len(bad):,} with a stall, "
                f"error or unfinished request and {n_good:,} of {len(good):,} others, evenly spaced by agent "
                f"number; the other charts count every agent")
    else:
        note = (f"showing {len(chosen):,} of {len(agents):,} agents, evenly spaced by agent number (none had a "
                f"stall, error or unfinished request); the other charts count every agent")
    return chosen, note


def _spread(items: list[Lane], n: int) -> list[Lane]:
    if n <= 0:
        return []
    if n >= len(items):
        return list(items)
    step = len(items) / n
    return [items[int(i * step)] for i in range(n)]


def thin_for_drawing(lanes: list[Lane], max_requests: int, span_ns: int) -> tuple[list[Lane], str | None]:
    """Keep a long run's timeline drawable: past `max_requests`, completed requests (and tool
    gaps) shorter than 1/3000 of the run are left out (they are under a pixel anyway), and if
    that is not enough, only the first lanes that fit are kept. Returns the lanes and a note."""
    total = sum(len(ln.records) for ln in lanes)
    if total <= max_requests:
        return lanes, None
    min_ns = max(1, span_ns // 3000)
    out: list[Lane] = []
    skipped = 0
    for ln in lanes:
        keep = [r for r in ln.records if r.outcome != "ok" or r.stalled_phase
                or (r.t.get("end") or 0) - (r.t.get("start") or 0) >= min_ns]
        skipped += len(ln.records) - len(keep)
        gaps = [g for g in ln.gaps if g[0] == "no_record" or g[2] - g[1] >= min_ns]
        out.append(Lane(ln.key, keep, gaps))
    note = f"{skipped:,} completed requests shorter than {min_ns / 1e9:.3g} s (under a pixel here) are not drawn"
    if sum(len(ln.records) for ln in out) > max_requests:
        kept: list[Lane] = []
        used = 0
        for ln in out:
            if kept and used + len(ln.records) > max_requests:
                break
            kept.append(ln)
            used += len(ln.records)
        note += f"; only the first {len(kept):,} of these {len(out):,} lanes fit the drawing budget"
        out = kept
    return out, note
