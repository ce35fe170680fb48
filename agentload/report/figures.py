"""The figures of report.html that draw the run itself (the router's and the target's own are in
router_chart.py and target_chart.py): the agents' swim lanes, phase percentiles per round, each
prefix group's cache hit rate and time to first token, stall probability against prompt size, and
the run over time. Each is a pure function of what the
report's pass gathered (`HtmlView`) and the summary, so the page's bytes are too.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from agentload.records import REPORT_PHASES, Record, phase_ns
from agentload.records import phases as phase_table
from agentload.records.rundir import RunData
from agentload.report.html_view import (
    MAX_POINTS,
    MAX_TIMELINE_REQUESTS,
    HtmlView,
    sample_series,
)
from agentload.report.html_view import sec as _sec
from agentload.report.markup import TEMPLATE
from agentload.report.markup import esc as _e
from agentload.report.markup import ms as _ms
from agentload.report.router_chart import FaultWindow, add_fault_bands
from agentload.report.text import round_label
from agentload.report.timeline import (
    GAP_COLORS,
    GAP_KINDS,
    GAP_LABELS,
    REQUEST_PHASES,
    Lane,
    end_phase,
    request_segments,
    thin_for_drawing,
)

PROMPT_BINS = 24

# the phase table's colours and labels, then the timeline's gaps between requests
COLORS = {**phase_table.COLORS, **GAP_COLORS}
LABELS = {**phase_table.LABELS, **GAP_LABELS}
MARKS = ("stalled", "error", "cut_short")


# ---------------------------------------------------------------- timeline


def fig_timeline(data: RunData, view: HtmlView, faults: list[FaultWindow] | None = None
                 ) -> tuple[go.Figure, str | None, int]:
    """One lane per agent (and one for the canaries), each request drawn as its phases and the
    gaps between them as the agent's own time; returns the figure, its note (what was sampled or
    left out) and the number of agent lanes drawn."""
    t0 = view.t0()
    run_end = view.run_end(data.samples)
    lanes, note, shown = _timeline_lanes(view, t0, run_end)
    n = max(1, len(lanes))
    lane_px = 26 if n <= 16 else max(6, min(26, 1500 // n))
    after_ns = int(float((data.meta.get("scenario", {}).get("stall", {}) or {}).get("after_s") or 0) * 1e9)
    drawing = _LaneDrawing(t0, after_ns)
    for y, ln in enumerate(lanes):
        drawing.add_lane(ln, y)
    fig = go.Figure()
    drawing.add_traces(fig, lane_px, show_text=n <= 30)
    fig.add_vline(x=_sec(run_end, t0), line=dict(color="#999", width=1, dash="dash"))
    add_fault_bands(fig, faults or [])
    _timeline_layout(fig, lanes, n, lane_px, note)
    return fig, note, shown


def _timeline_lanes(view: HtmlView, t0: int, run_end: int) -> tuple[list[Lane], str | None, int]:
    """The canaries' lane first, then the agents' (a sample of them beyond MAX_LANES), thinned to
    about MAX_TIMELINE_REQUESTS requests; the note says what was left out."""
    pick = view.lanes.pick_lanes(run_end)
    agents, note = pick.lanes, pick.note
    canary = view.canary_lane()
    lanes: list[Lane] = ([canary] if canary is not None else []) + agents
    lanes, thin_note = thin_for_drawing(lanes, MAX_TIMELINE_REQUESTS, run_end - t0, pick.hidden, pick.hidden_short)
    if thin_note:
        note = f"{note}; {thin_note}" if note else thin_note
    return lanes, note, len(agents)


class _LaneDrawing:
    """The timeline's traces, gathered lane by lane: each kind's segments (one line trace per kind,
    None between segments), the ticks where requests start, the marks of stalled, failed and
    cut-short requests."""

    def __init__(self, t0: int, after_ns: int):
        self.t0 = t0
        self.after_ns = after_ns  # stall.after_s: a stall's mark goes where it was declared
        self.seg_x: dict[str, list] = defaultdict(list)
        self.seg_y: dict[str, list] = defaultdict(list)
        self.start_x: list[float] = []
        self.start_y: list[int] = []
        self.start_text: list[str] = []
        self.start_label: list[str] = []
        self.marks: dict[str, tuple[list, list, list]] = {k: ([], [], []) for k in MARKS}

    def add_lane(self, ln: Lane, y: int) -> None:
        for rec in ln.records:
            self._add_request(rec, y)
        for kind, b, e in ln.gaps:
            self._add_segment(kind, b, e, y)

    def _add_segment(self, kind: str, b: int, e: int, y: int) -> None:
        if e > b:
            self.seg_x[kind] += [_sec(b, self.t0), _sec(e, self.t0), None]
            self.seg_y[kind] += [y, y, None]

    def _add_request(self, rec: Record, y: int) -> None:
        t0 = self.t0
        segs = request_segments(rec.t)
        for kind, b, e in segs:
            self._add_segment(kind, b, e, y)
        if "start" in rec.t:
            self.start_x.append(_sec(rec.t["start"], t0))
            self.start_y.append(y)
            self.start_text.append(_hover(rec))
            self.start_label.append(f"r{rec.round}" if rec.kind == "agent" else "")
        end = rec.t.get("end") or (segs[-1][2] if segs else None)
        if end is None:
            return
        if rec.stalled_phase:
            begin = next((b for k, b, _ in segs if k == rec.stalled_phase), end)
            at = min(end, begin + self.after_ns) if self.after_ns else end
            self._mark("stalled", at, y,
                       f"stalled in {rec.stalled_phase}<br>{_e(rec.request_id)}<br>outcome {rec.outcome}")
        if rec.outcome in ("error", "cut_short"):
            self._mark(rec.outcome, end, y,
                       f"{rec.outcome}: {_e(rec.error)} in {end_phase(rec)}<br>{_e(rec.request_id)}")

    def _mark(self, kind: str, at: int, y: int, text: str) -> None:
        mx, my, mt = self.marks[kind]
        mx.append(_sec(at, self.t0))
        my.append(y)
        mt.append(text)

    def add_traces(self, fig: go.Figure, lane_px: int, show_text: bool) -> None:
        width = max(2.0, lane_px * 0.62)
        for kind in GAP_KINDS + REQUEST_PHASES:
            if not self.seg_x.get(kind):
                continue
            fig.add_trace(go.Scatter(
                x=self.seg_x[kind], y=self.seg_y[kind], mode="lines", name=LABELS[kind], hoverinfo="skip",
                line=dict(color=COLORS[kind], width=width if kind not in GAP_KINDS else max(1.5, width * 0.45),
                          dash="dot" if kind == "no_record" else "solid"),
                connectgaps=False))
        fig.add_trace(go.Scatter(
            x=self.start_x, y=self.start_y, mode="markers+text" if show_text else "markers",
            name="request start (round boundary)",
            text=self.start_label if show_text else None, textposition="top right",
            textfont=dict(size=9, color="#444"), hovertext=self.start_text, hoverinfo="text",
            marker=dict(symbol="line-ns-open", size=max(6, lane_px * 0.9), color="#333",
                        line=dict(width=1, color="#333"))))
        styles = {"stalled": ("x", "#d62728", "stalled (no progress for stall.after_s)"),
                  "error": ("triangle-up", "#000000", "failed (error)"),
                  "cut_short": ("square-open", "#555555", "still in flight at the end (cut short)")}
        for k, (sym, col, label) in styles.items():
            mx, my, mt = self.marks[k]
            if mx:
                fig.add_trace(go.Scatter(x=mx, y=my, mode="markers", name=label, hovertext=mt, hoverinfo="text",
                                         marker=dict(symbol=sym, size=max(8, min(14, lane_px)), color=col,
                                                     line=dict(width=2, color=col))))


def _timeline_layout(fig: go.Figure, lanes: list[Lane], n: int, lane_px: int, note: str | None) -> None:
    step = max(1, math.ceil(n / 40))
    ticks = list(range(0, len(lanes), step))  # none when nothing was recorded (n is 1 then, for the height)
    title = "Agents over time: one lane per agent, each request drawn as its phases"
    if note:
        title += f"<br><sup>{_e(note)}</sup>"
    fig.update_layout(
        template=TEMPLATE, height=n * lane_px + 170 + 50,
        title=dict(text=title, x=0.01, xanchor="left", y=1.0, yref="container", yanchor="top", pad=dict(t=14)),
        margin=dict(l=70, r=20, t=115 if note else 95, b=50), hovermode="closest",
        legend=dict(orientation="h", yanchor="bottom", y=1.0, xanchor="left", x=0.0, font=dict(size=11)),
        xaxis=dict(title="seconds since the run started", rangemode="tozero", zeroline=False),
        yaxis=dict(autorange="reversed", tickmode="array", tickvals=ticks,
                   ticktext=["canaries" if lanes[i].key < 0 else f"agent {lanes[i].key}" for i in ticks],
                   showgrid=False, zeroline=False, range=[n - 0.5, -0.5]))


def _hover(rec: Record) -> str:
    parts = [f"<b>{_e(rec.request_id)}</b>", f"agent {rec.agent} round {rec.round} call {rec.call}",
             f"outcome {rec.outcome}" + (f" ({_e(rec.error)})" if rec.error else ""),
             f"prompt {rec.prompt_tokens:,} tokens, {rec.messages} messages",
             "connection " + ("reused" if rec.reused else "new" if rec.reused is False else "?")]
    if rec.stalled_phase:
        parts.append(f"<b>stalled in {rec.stalled_phase}</b>")
    ph = []
    for p in REPORT_PHASES:
        v = phase_ns(rec.t, p, rec.reused)
        if v is not None:
            ph.append(f"{p} {_ms(v / 1e6)}")
    parts.append(" · ".join(ph) + " ms")
    if rec.error_msg:
        parts.append(_e(rec.error_msg[:120]))
    return "<br>".join(parts)


# ---------------------------------------------------------------- per round


def fig_rounds(summary: dict[str, Any]) -> go.Figure:
    bands = summary.get("round_bands")
    rounds = bands or summary.get("rounds", [])  # a long run: later rounds in bands, as the tables
    xs = [round_label(r) for r in rounds]
    fig = go.Figure()
    for p in REPORT_PHASES:
        for q, dash in (("p50_ms", "solid"), ("p99_ms", "dot")):
            ys = []
            for r in rounds:
                v = (r["phases"].get(p) or {}).get(q)
                ys.append(v if v and v >= 0.002 else None)  # 0.001 ms is the histogram's floor: zero
            if any(v is not None for v in ys):
                fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers", name=f"{p} {q[:3]}",
                                         legendgroup=p, line=dict(color=COLORS[p], dash=dash),
                                         hovertemplate=f"round %{{x}}<br>{p} {q[:3]} %{{y:.1f}} ms<extra></extra>"))
    fig.update_layout(template=TEMPLATE, height=420, title=dict(text="Phase percentiles per round (solid p50, dotted p99)",
                                                                x=0.01, xanchor="left"),
                      xaxis=dict(title="round", type="category") if bands else dict(title="round", dtick=1),
                      yaxis=dict(title="ms (log)", type="log"),
                      margin=dict(l=60, r=20, t=50, b=50))
    return fig


# ---------------------------------------------------------------- prefix groups


def fig_groups(summary: dict[str, Any]) -> go.Figure | None:
    """Per prefix group ([conversation] prefix_groups): its prefix-cache hit rate (bars) and time to
    first token p50 / p99 (lines). None for a run without groups."""
    groups = summary.get("groups") or {}
    if not groups:
        return None
    xs = [f"group {g}" for g in groups]
    rows = list(groups.values())
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    hit = [None if x.get("cache_hit_rate") is None else round(100 * x["cache_hit_rate"], 1) for x in rows]
    fig.add_trace(go.Bar(x=xs, y=hit, name="prefix-cache hit rate %", marker_color="#9ecae1",
                         customdata=[[x["agents"], x["requests"]] for x in rows],
                         hovertemplate="%{x}: %{y:.1f}% of prompt tokens cached (%{customdata[0]} agents, "
                                       "%{customdata[1]} requests)<extra></extra>"), secondary_y=False)
    for q, dash in (("ttft_p50_ms", "solid"), ("ttft_p99_ms", "dot")):
        fig.add_trace(go.Scatter(x=xs, y=[x.get(q) for x in rows], name=f"time to first token {q[5:8]}",
                                 mode="lines+markers", line=dict(color="#08519c", dash=dash),
                                 hovertemplate=f"%{{x}}: {q[5:8]} %{{y:.1f}} ms<extra></extra>"), secondary_y=True)
    fig.update_layout(template=TEMPLATE, height=400, margin=dict(l=60, r=60, t=50, b=50),
                      title=dict(text="Prefix-cache hit rate and time to first token by prefix group", x=0.01),
                      legend=dict(orientation="h", y=1.02, x=1, xanchor="right", yanchor="bottom"))
    fig.update_xaxes(type="category")
    fig.update_yaxes(title_text="% of prompt tokens cached", range=[0, 100], secondary_y=False)
    fig.update_yaxes(title_text="ms", rangemode="tozero", secondary_y=True, showgrid=False)
    return fig


# ---------------------------------------------------------------- prompt size


def fig_prompt(view: HtmlView) -> go.Figure:
    bins = view.stall_bins(PROMPT_BINS)
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    xs = [(b["lo"] + b["hi"]) / 2 for b in bins]
    w = [(b["hi"] - b["lo"]) * 0.9 for b in bins]
    hover = [f"{b['lo']:,.0f}-{b['hi']:,.0f} tokens<br>{b['stalled']} of {b['n']} stalled, {b['errors']} failed"
             for b in bins]
    fig.add_trace(go.Bar(x=xs, y=[b["stalled"] / b["n"] for b in bins], width=w, name="stall probability",
                         marker_color="#d62728", hovertext=hover, hoverinfo="text"), secondary_y=False)
    fig.add_trace(go.Scatter(x=xs, y=[b["n"] for b in bins], mode="lines+markers", name="requests in bin",
                             line=dict(color="#7f7f7f", dash="dot"), hovertext=hover, hoverinfo="text"),
                  secondary_y=True)
    fig.update_layout(template=TEMPLATE, height=380, bargap=0,
                      title=dict(text="Stall probability against prompt size (a context-length cliff shows as a step)",
                                 x=0.01, xanchor="left"),
                      margin=dict(l=60, r=60, t=50, b=50), legend=dict(orientation="h", y=1.02, x=1, xanchor="right",
                                                                       yanchor="bottom"))
    fig.update_xaxes(title_text="prompt tokens (agentload's estimate)")
    fig.update_yaxes(title_text="share of requests that stalled", range=[0, 1.05], secondary_y=False)
    fig.update_yaxes(title_text="requests", secondary_y=True, rangemode="tozero", showgrid=False)
    return fig


# ---------------------------------------------------------------- over time


def fig_over_time(data: RunData, view: HtmlView, faults: list[FaultWindow] | None = None) -> go.Figure:
    """Five rows on one time axis: requests in flight by phase, the client pool, throughput, errors
    and stalls by end time, the canaries' latency."""
    t0 = view.t0()
    end_s, width, nb, done, toks, errs = view.ends.result(t0, view.run_end(data.samples))
    fig = make_subplots(rows=5, cols=1, shared_xaxes=True, vertical_spacing=0.045,
                        specs=[[{}], [{}], [{"secondary_y": True}], [{}], [{}]],
                        subplot_titles=("requests in flight by phase (and stalled)",
                                        "client pool: connections in use / idle, waiters, against the limit",
                                        "throughput: completed requests/s and output tokens/s",
                                        "errors, stalls given up and cut-short requests (count per bin, by end time)",
                                        "canary latency (fresh connection, short prompt)"))
    _add_samples(fig, data, t0)
    _add_end_rates(fig, width, nb, done, toks, errs)
    _add_canaries(fig, view, t0)
    add_fault_bands(fig, faults or [], rows=5)
    fig.update_layout(template=TEMPLATE, height=1250, margin=dict(l=60, r=60, t=40, b=50),
                      barmode="stack", hovermode="x unified",
                      legend=dict(orientation="v", x=1.02, y=1, font=dict(size=10)))
    fig.update_xaxes(range=[0, end_s * 1.01])
    fig.update_xaxes(title_text="seconds since the run started", row=5, col=1)
    fig.update_yaxes(title_text="requests", row=1, col=1, rangemode="tozero")
    fig.update_yaxes(title_text="connections", row=2, col=1, rangemode="tozero")
    fig.update_yaxes(title_text="req/s", row=3, col=1, rangemode="tozero", secondary_y=False)
    fig.update_yaxes(title_text="tokens/s", row=3, col=1, rangemode="tozero", secondary_y=True, showgrid=False)
    fig.update_yaxes(title_text=f"per {width:g} s", row=4, col=1, rangemode="tozero")
    fig.update_yaxes(title_text="ms", row=5, col=1, rangemode="tozero")
    return fig


def _add_samples(fig: go.Figure, data: RunData, t0: int) -> None:
    """Rows 1 and 2, from samples.jsonl: in flight by phase and stalled; the client pool."""
    pool_keys = ("in_use", "idle", "waiters", "limit")
    fns: dict[str, Any] = {p: (lambda s, p=p: (s.get("inflight") or {}).get(p, 0)) for p in REQUEST_PHASES}
    fns["__stalled"] = lambda s: s.get("stalled", 0)
    for k in pool_keys:
        fns[f"__pool_{k}"] = lambda s, k=k: (s.get("pool") or {}).get(k, 0)
    # streamed from samples.jsonl, at most MAX_POINTS per series (the largest of each block)
    dx, dc = sample_series(data.samples, lambda s: _sec(s["t"], t0), fns, MAX_POINTS)
    phases = [p for p in REQUEST_PHASES if any(dc[p])]
    for p in phases:
        fig.add_trace(go.Scatter(x=dx, y=dc[p], name=f"in flight: {p}", stackgroup="inflight", mode="lines",
                                 line=dict(color=COLORS[p], width=0.5), legendgroup="inflight"), row=1, col=1)
    if not dx:
        for row in (1, 2):
            _note(fig, row, "no samples.jsonl in this run folder")
        return
    fig.add_trace(go.Scatter(x=dx, y=dc["__stalled"], name="stalled", mode="lines",
                             line=dict(color="#d62728", width=2, dash="dash")), row=1, col=1)
    fig.add_trace(go.Scatter(x=dx, y=dc["__pool_in_use"], name="pool in use", mode="lines",
                             line=dict(color="#1f77b4")), row=2, col=1)
    fig.add_trace(go.Scatter(x=dx, y=dc["__pool_idle"], name="pool idle", mode="lines",
                             line=dict(color="#aec7e8")), row=2, col=1)
    fig.add_trace(go.Scatter(x=dx, y=dc["__pool_waiters"], name="waiters queued for a connection", mode="lines",
                             line=dict(color="#9467bd", width=2)), row=2, col=1)
    if any(dc["__pool_limit"]):
        fig.add_trace(go.Scatter(x=dx, y=dc["__pool_limit"], name="pool limit", mode="lines",
                                 line=dict(color="#d62728", dash="dash")), row=2, col=1)


def _add_end_rates(fig: go.Figure, width: float, nb: int, done: list, toks: list, errs: dict[str, list]) -> None:
    """Rows 3 and 4, by end time in bins of ~1/400 of the run (never under 50 ms), gathered in the
    pass: completed requests/s and output tokens/s; errors, stalls given up, cut short."""
    bx = [round(i * width, 4) for i in range(nb)]
    fig.add_trace(go.Scatter(x=bx, y=[v / width for v in done], name="completed req/s", mode="lines",
                             line=dict(color="#2ca02c", shape="hv")), row=3, col=1)
    fig.add_trace(go.Scatter(x=bx, y=[v / width for v in toks], name="output tokens/s", mode="lines",
                             line=dict(color="#17becf", shape="hv", dash="dot")), row=3, col=1, secondary_y=True)
    ecol = {"error": "#000000", "stalled": "#d62728", "cut_short": "#7f7f7f"}
    for k, v in errs.items():
        if any(v):
            fig.add_trace(go.Bar(x=bx, y=v, name=f"{k} per {width:g} s", marker_color=ecol[k],
                                 width=width * 0.9, offset=0), row=4, col=1)
    if not any(any(v) for v in errs.values()):
        _note(fig, 4, "no errors, stalls or cut-short requests")


def _add_canaries(fig: go.Figure, view: HtmlView, t0: int) -> None:
    """Row 5: each canary's end-to-end time, and its failures."""
    canaries = view.canary_points
    for kind in ("ok", "bad"):
        starts, ms, recs = canaries.points(kind)
        if not starts:
            continue
        xs = [_sec(v, t0) for v in starts]
        hover: list[str] | None = [_hover(r) for r in recs] if recs is not None else None
        if len(xs) > MAX_POINTS:  # a long run's canaries: the slowest of each block of k
            xs, cols = _downsample(xs, {"ms": ms}, MAX_POINTS)
            ms, hover = cols["ms"], None
        if kind == "ok":
            fig.add_trace(go.Scatter(x=xs, y=ms, mode="lines+markers", name="canary e2e ms", line=dict(color="#2ca02c"),
                                     hovertext=hover, hoverinfo="text" if hover is not None else None), row=5, col=1)
        else:
            fig.add_trace(go.Scatter(x=xs, y=ms, mode="markers", name="canary failed",
                                     marker=dict(symbol="x", color="#d62728", size=10),
                                     hovertext=hover, hoverinfo="text" if hover is not None else None), row=5, col=1)
    if not len(canaries):
        _note(fig, 5, "no canaries in this run ([canary] every_s = 0)")


def _downsample(xs: list[float], cols: dict[str, list[float]], max_points: int) -> tuple[list[float], dict[str, list]]:
    if len(xs) <= max_points:
        return xs, cols
    k = math.ceil(len(xs) / max_points)
    out_x = [xs[i] for i in range(0, len(xs), k)]
    out = {name: [max(v[i:i + k]) for i in range(0, len(v), k)] for name, v in cols.items()}
    return out_x, out


def _note(fig: go.Figure, row: int, text: str) -> None:
    """A grey note in the middle of one subplot (of a one-column make_subplots figure)."""
    sp = fig.get_subplot(row, 1)
    xr = sp.xaxis.plotly_name.replace("axis", "")
    yr = sp.yaxis.plotly_name.replace("axis", "")
    fig.add_annotation(text=text, xref=f"{xr} domain", yref=f"{yr} domain", x=0.5, y=0.5, showarrow=False,
                       font=dict(color="#888"))
    # plotly.js draws no axes for a subplot without a trace: give it an invisible one.
    fig.add_trace(go.Scatter(x=[0], y=[0], mode="markers", marker=dict(opacity=0), showlegend=False,
                             hoverinfo="skip"), row=row, col=1)
