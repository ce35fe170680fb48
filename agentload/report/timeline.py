"""Per-agent timelines from records: each request cut into its phases, the gaps between rounds.

Shared by the HTML swim lanes and the Perfetto export, so both draw the same thing. All
times are raw `perf_counter_ns` stamps; callers subtract `run.json`'s `t0_ns`. A request's
segments come from the phase table (`agentload.records.phases.request_segments`).

The HTML report reads the records once, as a stream: `LaneSampler` keeps a bounded sample of
lanes (every agent's when they fit, else the agents with a problem first and a fixed sample of
the others), with per agent only the end of its last request besides. The Perfetto export
draws every request, so `build_lanes` keeps them all.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from agentload.records import Record, phase_at
from agentload.records.phases import (  # noqa: F401
    FIRST_PHASE,
    LAST_PHASE,
    PHASES,
    end_stamp,
    request_segments,
)
from agentload.records.rundir import start_key

if TYPE_CHECKING:
    from agentload.records.rundir import RunData

# The order a request passes them (the phase table), then what happens between requests.
REQUEST_PHASES = PHASES
GAP_KINDS = ("tool", "retry_wait", "no_record")
GAP_COLORS = {"tool": "#c7c7c7", "retry_wait": "#dbdb8d", "no_record": "#7f7f7f"}
GAP_LABELS = {"tool": "tool time between rounds (client side)", "retry_wait": "wait before a retry",
              "no_record": "in flight when the run was killed (no record)"}


def end_phase(rec: Record) -> str:
    """The phase a request was in when it ended (for a stalled one: where it stalled)."""
    if rec.stalled_phase:
        return rec.stalled_phase
    segs = request_segments(rec.t)
    if not segs:
        return FIRST_PHASE
    if rec.outcome == "ok":
        return LAST_PHASE
    # A phase that never got its end stamp is the one the request died in.
    return phase_at(rec.t, rec.reused)


@dataclass
class Lane:
    """One agent (or the canaries): its requests in order, and the gaps between them."""

    key: int  # agent number, -1 for canaries
    records: list[Record]
    gaps: list[tuple[str, int, int]]  # (tool | retry_wait | no_record, begin, end)
    dropped: int = 0  # completed requests too short to see that the sampler let go
    partial: bool = False  # its requests before its first problem were not kept


def seen_end(rec: Record) -> int | None:
    """The last moment a record shows: its end, else its latest stamp."""
    return end_stamp(rec.t) if rec.t else None


def run_end_ns(meta: dict[str, Any], samples: Sequence[dict[str, Any]], seen_max: int | None) -> int:
    """Where the timeline ends: the run's recorded end, else the last thing seen on disk
    (`seen_max`: the latest `seen_end` of the records)."""
    if meta.get("t_end_ns"):
        return int(meta["t_end_ns"])
    seen = [seen_max] if seen_max is not None else []
    seen += [s["t"] for s in samples if isinstance(s.get("t"), int)]
    return max(seen) if seen else int(meta.get("t0_ns") or 0)


def _lane_order(r: Record, seq: int) -> tuple:
    """A lane's order: start, round, call, then the requests' order (start, place in the stream)."""
    return (r.t.get("start") or 0, r.round, r.call, start_key(r), seq)


def _gap(a_end: int | None, a_round: int, b: Record) -> tuple[str, int, int] | None:
    """Between two requests of an agent (the first one's end and round, then the next one):
    `tool` before a new round (the agent's own tool time), `retry_wait` before a retry of the
    same round."""
    bs = b.t.get("intended") or b.t.get("start")
    if a_end is None or bs is None or bs <= a_end:
        return None
    return ("tool" if b.round > a_round else "retry_wait", a_end, bs)


def _no_record(last: Record | "_Last", killed: bool, max_rounds: int | None, end: int) -> tuple[str, int, int] | None:
    """When the run was killed (run.json never says `ended`), an agent whose last record
    completed a round before its last round had a request in flight that left no record."""
    last_end = last.t.get("end") if isinstance(last, Record) else last.end
    ok = last.outcome == "ok"
    if killed and ok and last_end and (max_rounds is None or last.round < max_rounds) and end > last_end:
        return ("no_record", last_end, end)
    return None


def build_lanes(data: "RunData") -> tuple[list[Lane], int]:
    """Every lane with every request (the Perfetto export draws them all): a lane per agent
    (sorted), plus one for canaries (key -1) first when there are any; and where the run ends."""
    per: dict[int, list[tuple[tuple, Record]]] = defaultdict(list)
    seen_max: int | None = None
    for seq, r in enumerate(data.iter_records()):
        per[-1 if r.kind != "agent" else r.agent].append((_lane_order(r, seq), r))
        e = seen_end(r)
        if e is not None:
            seen_max = e if seen_max is None else max(seen_max, e)
    max_rounds = (data.meta.get("scenario", {}).get("agents", {}) or {}).get("rounds")
    killed = not data.meta.get("ended", False)
    end = run_end_ns(data.meta, data.samples, seen_max)
    lanes = []
    for key in sorted(per):
        recs = [r for _, r in sorted(per[key], key=lambda x: x[0])]
        gaps: list[tuple[str, int, int]] = []
        if key >= 0:
            for a, b in zip(recs, recs[1:]):
                g = _gap(a.t.get("end"), a.round, b)
                if g is not None:
                    gaps.append(g)
            nr = _no_record(recs[-1], killed, max_rounds, end)
            if nr is not None:
                gaps.append(nr)
        lanes.append(Lane(key, recs, gaps))
    return lanes, end


@dataclass(slots=True)
class _Last:
    """What the sampler keeps of every agent's latest request: enough for the gap to the next
    one and a killed run's `no_record`."""

    order: tuple
    end: int | None
    round: int
    outcome: str


def _mix(agent: int) -> tuple[int, int]:
    """A fixed pseudo-random rank of an agent number (Knuth's multiplicative hash: a bijection on
    32-bit numbers), so the sample is the same for the same folder, whatever the stream order."""
    return ((agent & 0xFFFFFFFF) * 2654435761) & 0xFFFFFFFF, agent


class _Pool:
    """At most `cap` lanes: those of the agents with the smallest rank (`_mix`)."""

    def __init__(self, cap: int):
        self.cap = cap
        self.lanes: dict[int, Lane] = {}
        self._heap: list[tuple[tuple[int, int], int]] = []  # the largest rank on top; stale entries skipped

    def _top(self) -> int | None:
        h = self._heap
        while h and h[0][1] not in self.lanes:
            heapq.heappop(h)
        return h[0][1] if h else None

    def admits(self, agent: int) -> bool:
        if len(self.lanes) < self.cap:
            return True
        top = self._top()
        return top is not None and _mix(agent) < _mix(top)

    def put(self, agent: int, lane: Lane) -> Lane | None:
        """Adds a lane; returns the one that no longer fits (the largest rank), if any."""
        self.lanes[agent] = lane
        r = _mix(agent)
        heapq.heappush(self._heap, ((-r[0], -r[1]), agent))
        if len(self.lanes) > self.cap:
            top = self._top()
            return self.lanes.pop(top) if top is not None else None
        return None

    def take(self, agent: int) -> Lane | None:
        return self.lanes.pop(agent, None)


class LaneSampler:
    """The timeline's lanes from a stream of records (`add` each), in bounded memory.

    Lanes are kept in two pools of at most `cap` each: agents with a problem (a stall, an error,
    a request cut short) and the others, each the agents of smallest fixed rank (`_mix`), so a
    run with at most `cap` agents keeps every lane, and a folder always gives the same sample.
    An agent whose lane is kept and that runs into a problem moves to the problem pool with all
    its requests; one whose lane was not kept joins it from that request on (`Lane.partial`,
    with the tool time before it).

    Beyond those lanes, per agent only its last request's end, round and outcome are kept (the
    gap to its next request; a killed run's `no_record`). The drawing shows at most
    MAX_TIMELINE_REQUESTS requests, leaving out the sub-pixel ones and then the lanes past
    that budget (in agent order), so when the kept lanes hold more than `budget` requests the
    sampler does the same as it goes: it lets go completed requests and tool gaps shorter than
    1/3000 of the run (from run.json; else of the run as seen so far), then the lanes (in agent
    order) past `budget`, and takes no lane of a later agent number after that. The canaries' lane
    (one a second for as long as the run lasts) counts toward that budget and loses its short
    completed requests by the same rule.

    An agent's requests are sequential, so its records reach the stream in order; one that
    comes out of order is drawn, but no gap is drawn to it.
    """

    def __init__(self, meta: dict[str, Any], cap: int, budget: int, t0: int | None, end: int | None):
        self.meta = meta
        self.cap = cap
        self.budget = budget
        self.t0 = t0  # None: not known before the pass (then no request is let go)
        self.end = end  # run.json's end, when it has one
        self.seq = 0
        self.last: dict[int, _Last] = {}
        self.problem_agents: set[int] = set()
        self.bad = _Pool(cap)
        self.good = _Pool(cap)
        self.canaries: list[tuple[tuple, Record]] = []
        self.canaries_dropped = 0  # completed canaries too short to see that the sampler let go
        self.kept = 0  # requests in kept lanes
        self.trim_at = budget  # trim when `kept` passes this (raised when a trim cannot get below budget)
        self.ceiling: int | None = None  # no lane of an agent numbered above this (the budget)
        self.hidden_short = 0  # requests too short to draw in the lanes past the ceiling
        self.seen_max: int | None = None

    # ---- the stream

    def _lane(self, a: int) -> Lane | None:
        return self.bad.lanes.get(a) or self.good.lanes.get(a)

    def add(self, r: Record) -> None:
        self.seq += 1
        e = seen_end(r)
        if e is not None:
            self.seen_max = e if self.seen_max is None else max(self.seen_max, e)
        order = _lane_order(r, self.seq)
        if r.kind != "agent":  # canaries, and a stall wave's probes: the first lane
            self.canaries.append((order, r))
            if self.kept + len(self.canaries) > self.trim_at:  # a day of canaries, one a second
                self._trim()
                self.trim_at = max(self.budget, self.kept + len(self.canaries) + self.budget // 2)
            return
        a = r.agent
        prev = self.last.get(a)
        in_order = prev is None or order > prev.order
        lane = self._lane(a)
        gap_from = prev if (in_order and prev is not None) else None
        if (r.outcome != "ok" or r.stalled_phase) and a not in self.problem_agents:
            self.problem_agents.add(a)
            if lane is not None and a in self.good.lanes:
                self._put(self.bad, a, self.good.take(a))  # with every request it had
            elif lane is None and self._room(a) and self.bad.admits(a):
                self._put(self.bad, a, Lane(a, [], [], partial=prev is not None))
            lane = self.bad.lanes.get(a)
        elif lane is None and prev is None and self._room(a) and self.good.admits(a):
            lane = Lane(a, [], [])
            self._put(self.good, a, lane)
        if lane is None and self.ceiling is not None and a > self.ceiling and self._short(r):
            self.hidden_short += 1
        if lane is not None:
            if gap_from is not None:
                g = _gap(gap_from.end, gap_from.round, r)
                if g is not None:
                    lane.gaps.append(g)
            lane.records.append(r)
            self.kept += 1
        if in_order:
            self.last[a] = _Last(order, r.t.get("end"), r.round, r.outcome)
        if self.kept + len(self.canaries) > self.trim_at:
            self._trim()
            self.trim_at = max(self.budget, self.kept + len(self.canaries) + self.budget // 2)

    def _room(self, a: int) -> bool:
        return self.ceiling is None or a <= self.ceiling

    def _put(self, pool: _Pool, agent: int, lane: Lane | None) -> None:
        if lane is None:
            return
        out = pool.put(agent, lane)
        if out is not None:
            self.kept -= len(out.records)

    def _min_ns(self) -> int | None:
        if self.t0 is None:
            return None
        end = self.end if self.end is not None else self.seen_max
        return None if end is None else max(1, (end - self.t0) // 3000)

    def _short(self, r: Record, min_ns: int | None = None) -> bool:
        """Completed and shorter than the drawing can show (thin_for_drawing's rule)."""
        min_ns = self._min_ns() if min_ns is None else min_ns
        return (min_ns is not None and r.outcome == "ok" and not r.stalled_phase
                and (r.t.get("end") or 0) - (r.t.get("start") or 0) < min_ns)

    def _trim(self) -> None:
        min_ns = self._min_ns()
        if min_ns is not None:  # what the drawing leaves out anyway (thin_for_drawing's rule)
            for pool in (self.good, self.bad):
                for lane in pool.lanes.values():
                    n = len(lane.records)
                    lane.records = [r for r in lane.records if not self._short(r, min_ns)]
                    lane.gaps = [g for g in lane.gaps if g[0] == "no_record" or g[2] - g[1] >= min_ns]
                    lane.dropped += n - len(lane.records)
                    self.kept -= n - len(lane.records)
            n = len(self.canaries)  # the canaries' lane, by the same rule
            self.canaries = [x for x in self.canaries if not self._short(x[1], min_ns)]
            self.canaries_dropped += n - len(self.canaries)
        if self.kept <= self.budget:
            return
        used = len(self.canaries)  # the drawing's first lane
        ceiling = None
        for a in sorted({*self.good.lanes, *self.bad.lanes}):
            used += len(self._lane(a).records)  # type: ignore[union-attr]
            ceiling = a
            if used > self.budget:
                break
        if ceiling is None:
            return
        for pool in (self.good, self.bad):
            for a in [a for a in pool.lanes if a > ceiling]:
                lane = pool.lanes.pop(a)
                self.kept -= len(lane.records)
                self.hidden_short += lane.dropped + sum(1 for r in lane.records if self._short(r, min_ns))
        self.ceiling = ceiling if self.ceiling is None else min(self.ceiling, ceiling)

    # ---- after the pass

    def run_end(self, samples: Sequence[dict[str, Any]]) -> int:
        return run_end_ns(self.meta, samples, self.seen_max)

    def canary_lane(self) -> Lane | None:
        if not self.canaries and not self.canaries_dropped:
            return None
        self.canaries.sort(key=lambda x: x[0])
        return Lane(-1, [r for _, r in self.canaries], [], dropped=self.canaries_dropped)

    def no_record_agents(self, end: int) -> set[int]:
        """Agents that had a request in flight that left no record (a killed run)."""
        killed = not self.meta.get("ended", False)
        if not killed:
            return set()
        max_rounds = (self.meta.get("scenario", {}).get("agents", {}) or {}).get("rounds")
        return {a for a, last in self.last.items() if _no_record(last, killed, max_rounds, end) is not None}

    def pick_lanes(self, end: int) -> "LanePick":
        """At most `cap` agent lanes, sorted by agent: every lane when they fit, else a sample
        that keeps half its room for agents with a problem; with a note saying what was left out
        (None when nothing was), and how many more lanes the sample holds that the drawing
        budget left out (past `ceiling`)."""
        unrecorded = self.no_record_agents(end)
        max_rounds = (self.meta.get("scenario", {}).get("agents", {}) or {}).get("rounds")
        killed = not self.meta.get("ended", False)
        lanes: dict[int, Lane] = {**self.good.lanes, **self.bad.lanes}
        for a, lane in lanes.items():
            lane.records.sort(key=lambda r: _lane_order(r, 0))  # in order already, unless one came late
            if a in unrecorded:
                nr = _no_record(self.last[a], killed, max_rounds, end)
                if nr is not None:
                    lane.gaps.append(nr)
        bad_agents = self.problem_agents | unrecorded
        total = len(self.last)
        n_bad_all = len(bad_agents)
        n_good_all = total - n_bad_all
        above = sum(1 for a in self.last if a > self.ceiling) if self.ceiling is not None else 0
        if total <= self.cap:  # every agent: the lanes past the ceiling, and their short requests, are known
            return LanePick([lanes[a] for a in sorted(lanes)], None, above, self.hidden_short)
        bad = sorted((a for a in lanes if a in bad_agents), key=_mix)
        good = sorted((a for a in lanes if a not in bad_agents), key=_mix)
        n_bad = min(len(bad), max(self.cap // 2, self.cap - n_good_all))
        n_good = min(len(good), self.cap - n_bad)
        chosen = sorted(bad[:n_bad] + good[:n_good])
        hidden = min(above, self.cap - len(chosen))
        partial = sum(1 for a in chosen if lanes[a].partial)
        if n_bad_all:
            note = (f"showing {len(chosen) + hidden:,} of {total:,} agents: {n_bad:,} of {n_bad_all:,} with a stall, "
                    f"error or unfinished request and {n_good:,} of {n_good_all:,} others, a fixed sample by agent "
                    f"number; the other charts count every agent")
        else:
            note = (f"showing {len(chosen) + hidden:,} of {total:,} agents, a fixed sample by agent number (none had "
                    f"a stall, error or unfinished request); the other charts count every agent")
        if partial:
            note += (f"; {partial:,} of these lanes start at the agent's first problem (its earlier requests "
                     f"were not kept)")
        return LanePick([lanes[a] for a in chosen], note, hidden, 0)


@dataclass
class LanePick:
    """The lanes the timeline draws, from `LaneSampler.pick_lanes`."""

    lanes: list[Lane]
    note: str | None  # what the sample left out
    hidden: int = 0  # lanes of the sample past the drawing budget (not kept)
    hidden_short: int = 0  # their requests too short to draw, where known


def thin_for_drawing(lanes: list[Lane], max_requests: int, span_ns: int,
                     hidden: int = 0, hidden_short: int = 0) -> tuple[list[Lane], str | None]:
    """Keep a long run's timeline drawable: past `max_requests`, completed requests (and tool
    gaps) shorter than 1/3000 of the run are left out (they are under a pixel anyway), and if
    that is not enough, only the first lanes that fit are kept (`hidden`: lanes after these that
    the sampler already left out for the same reason, with `hidden_short` short requests).
    Returns the lanes and a note."""
    dropped = sum(ln.dropped for ln in lanes) + hidden_short  # already let go by the sampler, same rule
    total = sum(len(ln.records) for ln in lanes) + dropped
    if total <= max_requests and not dropped and not hidden:
        return lanes, None
    min_ns = max(1, span_ns // 3000)
    out: list[Lane] = []
    skipped = dropped
    for ln in lanes:
        keep = [r for r in ln.records if r.outcome != "ok" or r.stalled_phase
                or (r.t.get("end") or 0) - (r.t.get("start") or 0) >= min_ns]
        skipped += len(ln.records) - len(keep)
        gaps = [g for g in ln.gaps if g[0] == "no_record" or g[2] - g[1] >= min_ns]
        out.append(Lane(ln.key, keep, gaps, partial=ln.partial))
    note = f"{skipped:,} completed requests shorter than {min_ns / 1e9:.3g} s (under a pixel here) are not drawn"
    if sum(len(ln.records) for ln in out) > max_requests or hidden:
        kept: list[Lane] = []
        used = 0
        for ln in out:
            if kept and used + len(ln.records) > max_requests:
                break
            kept.append(ln)
            used += len(ln.records)
        note += f"; only the first {len(kept):,} of these {len(out) + hidden:,} lanes fit the drawing budget"
        out = kept
    return out, note
