"""What report.html draws beyond summary.json, gathered in the report's one pass over the records.

`HtmlView` is a consumer of `agentload.analysis.passes.one_pass` (beside the summary's): it
keeps the timeline's bounded lane sample (`LaneSampler`), stalls and errors by round x phase,
requests by prompt size (a count per distinct size), agent requests by end time (bins, not the
requests), the canaries, and where the run starts and ends. No plotly here: `report.html`
renders what this holds.
"""

from __future__ import annotations

import math
from array import array
from collections import Counter
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

from agentload.analysis.passes import order_key
from agentload.analysis.tallies import FirstSeenCounts
from agentload.records import Record, phase_ns
from agentload.report.timeline import Lane, LaneSampler, end_phase

if TYPE_CHECKING:
    from agentload.records.rundir import RunData

MAX_POINTS = 1500  # points per series in the over-time charts
MAX_LANES = 150  # agent lanes drawn in the timeline; more are sampled (and the chart says so)
MAX_TIMELINE_REQUESTS = 6000  # requests drawn in the timeline; a long run leaves out sub-pixel ones
LANE_BUDGET = 2 * MAX_TIMELINE_REQUESTS  # requests the lane sampler holds before it lets short ones go
END_KINDS = ("error", "stalled", "cut_short")


def sec(ns: int, t0: int) -> float:
    return round((ns - t0) / 1e9, 4)


def nice(x: float) -> float:
    """The smallest of 1, 2, 2.5, 5 x 10^k that is >= x."""
    if x <= 0:
        return 1.0
    k = math.floor(math.log10(x))
    for m in (1, 2, 2.5, 5, 10):
        if m * 10 ** k >= x:
            return m * 10 ** k
    return 10 ** (k + 1)


def end_bins(t0: int, end_ns: int) -> tuple[float, float, int]:
    """The over-time chart's rate bins: (end_s, width_s, count): ~400 over the run, never under 50 ms."""
    end_s = max(sec(end_ns, t0), 1.0)
    width = nice(max(0.05, end_s / 400))
    return end_s, width, int(end_s // width) + 1


class EndBins:
    """Agent requests by end time: completed ones and their output tokens, failed, given up and
    cut short, in the over-time chart's bins.

    Those bins depend on the run's end. Known from run.json, they are the chart's from the
    start. Not known (a killed run): 50 ms cells that coarsen tenfold whenever they pass 4,000
    (every width the chart can choose then is a multiple of theirs), regrouped at the end. With
    no t0 in run.json (never written so by agentload) the requests' end times are kept."""

    BASE_NS = 50_000_000
    MAX_CELLS = 4000

    def __init__(self, t0: int | None, end: int | None):
        self.t0 = t0
        self.fixed: tuple[float, float, int] | None = None
        self.cells: dict[int, list[int]] = {}  # cell -> [done, tokens, error, stalled, cut_short]
        self.cell_ns = self.BASE_NS
        self.raw: list[tuple[int, int, int]] | None = None
        if t0 is None:
            self.raw = []
        elif end is not None:
            self.fixed = end_bins(t0, end)

    def add(self, r: Record) -> None:
        e = r.t.get("end")
        if e is None:
            return
        k = 0 if r.outcome == "ok" else 2 + END_KINDS.index(r.outcome if r.outcome in END_KINDS else "error")
        tok = (r.output_tokens or r.token_chunks) if k == 0 else 0
        if self.raw is not None:
            self.raw.append((e, k, tok))
            return
        assert self.t0 is not None
        if self.fixed is not None:
            _, width, nb = self.fixed
            cell = min(nb - 1, max(0, int(sec(e, self.t0) // width)))
        else:
            cell = max(0, e - self.t0) // self.cell_ns
            while cell >= self.MAX_CELLS:
                self._coarsen()
                cell = max(0, e - self.t0) // self.cell_ns
        c = self.cells.get(cell)
        if c is None:
            c = self.cells[cell] = [0, 0, 0, 0, 0]
        if k == 0:
            c[0] += 1
            c[1] += tok
        else:
            c[k] += 1

    def _coarsen(self) -> None:
        self.cell_ns *= 10
        cells: dict[int, list[int]] = {}
        for i, c in self.cells.items():
            acc = cells.setdefault(i // 10, [0, 0, 0, 0, 0])
            for j in range(5):
                acc[j] += c[j]
        self.cells = cells

    def result(self, t0: int, end_ns: int) -> tuple[float, float, int, list[int], list[int], dict[str, list[int]]]:
        """(end_s, width, nb, completed, tokens, {error/stalled/cut_short: counts}) per bin."""
        end_s, width, nb = self.fixed if self.fixed is not None else end_bins(t0, end_ns)
        done, toks = [0] * nb, [0] * nb
        errs = {k: [0] * nb for k in END_KINDS}

        def put(i: int, c: list[int]) -> None:
            done[i] += c[0]
            toks[i] += c[1]
            for j, k in enumerate(END_KINDS):
                errs[k][i] += c[2 + j]

        if self.raw is not None:
            for e, k, tok in self.raw:
                i = min(nb - 1, max(0, int(sec(e, t0) // width)))
                c = [0, 0, 0, 0, 0]
                if k == 0:
                    c[0], c[1] = 1, tok
                else:
                    c[k] = 1
                put(i, c)
        elif self.fixed is not None:
            for i, c in self.cells.items():
                put(i, c)
        else:
            width_ns = round(width * 1e9)  # a multiple of cell_ns (see the class)
            for i, c in self.cells.items():
                put(min(nb - 1, i * self.cell_ns // width_ns), c)
        return end_s, width, nb, done, toks, errs


class CanarySeries:
    """The canary chart's points from the stream: per canary with a start, its start and its latency
    (ms: e2e of a completed one, start to end of another), in two arrays (16 bytes a canary);
    the records themselves (for each point's hover text) only while there are at most `keep` of a
    kind (a day of canaries, one a second, is 86,400: then the chart is downsampled instead)."""

    def __init__(self, keep: int = MAX_POINTS):
        self.keep = keep
        self.cols = {k: (array("q"), array("d")) for k in ("ok", "bad")}
        self.recs: dict[str, list[Record] | None] = {"ok": [], "bad": []}

    def add(self, r: Record) -> None:
        t = r.t
        s = t.get("start")
        if s is None:
            return
        k = "ok" if r.outcome == "ok" else "bad"
        ms = (round((phase_ns(t, "e2e") or 0) / 1e6, 3) if k == "ok"
              else round(((t.get("end") or s) - s) / 1e6, 3))
        starts, vals = self.cols[k]
        starts.append(s)
        vals.append(ms)
        recs = self.recs[k]
        if recs is not None:
            recs.append(r)
            if len(recs) > self.keep:
                self.recs[k] = None

    def points(self, kind: str) -> tuple[list[int], list[float], list[Record] | None]:
        """(starts, ms, records or None) of one kind ("ok" or "bad"), in the requests' order (by start,
        then their place in the stream: a stable sort)."""
        starts, vals = self.cols[kind]
        order = sorted(range(len(starts)), key=starts.__getitem__)
        recs = self.recs[kind]
        return ([starts[i] for i in order], [vals[i] for i in order],
                None if recs is None else [recs[i] for i in order])

    def __len__(self) -> int:
        return sum(len(c[0]) for c in self.cols.values())


def sample_series(samples: Iterable[dict[str, Any]], x: Callable[[dict[str, Any]], float],
                  cols: dict[str, Callable[[dict[str, Any]], Any]], max_points: int | None = MAX_POINTS
                  ) -> tuple[list[float], dict[str, list]]:
    """Columns of the samples that have a `t`, read as a stream (samples.jsonl is read from disk
    each walk: a day-long run has 86,400): every `k`-th sample's x and, per column, the largest
    value of each block of k samples, k the smallest that leaves at most `max_points` (1: every
    sample; None: never downsampled)."""
    n = sum(1 for s in samples if isinstance(s.get("t"), int)) if max_points is not None else 0
    k = math.ceil(n / max_points) if max_points is not None and n > max_points else 1
    xs: list[float] = []
    out: dict[str, list] = {name: [] for name in cols}
    fns = list(cols.items())
    i = 0
    for s in samples:
        if not isinstance(s.get("t"), int):
            continue
        if i % k == 0:
            xs.append(x(s))
            for name, f in fns:
                out[name].append(f(s))
        else:
            for name, f in fns:
                v = f(s)
                col = out[name]
                if v > col[-1]:
                    col[-1] = v
        i += 1
    return xs, out


class HtmlView:
    """The HTML report's consumer of the records' pass (`add` each record)."""

    def __init__(self, data: "RunData", max_lanes: int = MAX_LANES, lane_budget: int = LANE_BUDGET):
        meta = data.meta
        t0 = int(meta.get("t0_ns") or 0) or None
        end = int(meta.get("t_end_ns") or 0) or None
        self.meta = meta
        self.lanes = LaneSampler(meta, max_lanes, lane_budget, t0, end)
        self.ends = EndBins(t0, end)
        self.records = 0
        self.seq = 0
        self.min_start: int | None = None
        self.stalls: Counter = Counter()  # (round, phase) -> stalled requests
        self.errors: Counter = Counter()  # (round, phase it failed in) -> failed requests
        self.rounds: set[int] = set()
        self.error_classes = FirstSeenCounts()
        self.prompts: dict[int, int] = {}  # prompt tokens -> requests
        self.prompts_bad: dict[int, list[int]] = {}  # prompt tokens -> [stalled, failed] (where any)
        self.canary_points = CanarySeries()

    def add(self, r: Record) -> None:
        self.records += 1
        self.seq += 1
        self.lanes.add(r)
        s = r.t.get("start")
        if s is not None:
            self.min_start = s if self.min_start is None else min(self.min_start, s)
        if r.kind == "canary":
            self.canary_points.add(r)
        if r.kind != "agent":
            return
        self.rounds.add(r.round)
        if r.stalled_phase:
            self.stalls[(r.round, r.stalled_phase)] += 1
        if r.outcome == "error":
            self.errors[(r.round, end_phase(r))] += 1
            self.error_classes.add(r.error, order_key(r, self.seq))
        pt = r.prompt_tokens
        self.prompts[pt] = self.prompts.get(pt, 0) + 1
        if r.stalled_phase or r.outcome == "error":
            b = self.prompts_bad.get(pt)
            if b is None:
                b = self.prompts_bad[pt] = [0, 0]
            b[0] += bool(r.stalled_phase)
            b[1] += r.outcome == "error"
        self.ends.add(r)

    # ---- after the pass

    def t0(self) -> int:
        t0 = self.meta.get("t0_ns")
        if t0:
            return int(t0)
        return self.min_start if self.min_start is not None else 0

    def run_end(self, samples: Sequence[dict[str, Any]]) -> int:
        return self.lanes.run_end(samples)

    def canary_lane(self) -> Lane | None:
        return self.lanes.canary_lane()

    def stall_bins(self, bins: int) -> list[dict[str, Any]]:
        """Requests, stalls and failures per prompt-size bin (~`bins` of a 'nice' width)."""
        if not self.prompts:
            return []
        lo, hi = min(self.prompts), max(self.prompts)
        width = nice(max(1, (hi - lo) / bins))
        base = math.floor(lo / width) * width
        out: dict[int, dict[str, Any]] = {}
        for size in sorted(self.prompts):
            n = self.prompts[size]
            st, er = self.prompts_bad.get(size, (0, 0))
            i = int((size - base) // width)
            b = out.setdefault(i, {"lo": base + i * width, "hi": base + (i + 1) * width, "n": 0, "stalled": 0,
                                   "errors": 0})
            b["n"] += n
            b["stalled"] += st
            b["errors"] += er
        return [out[i] for i in sorted(out)]


def html_view(data: "RunData") -> HtmlView:
    """A pass over the run's records with only the HTML report's consumer."""
    from agentload.analysis.passes import one_pass

    v = HtmlView(data)
    one_pass(data, [v])
    return v
