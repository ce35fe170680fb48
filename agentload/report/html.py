"""report.html: one self-contained file (plotly.js inlined once, no CDN) that opens offline.

A pure function of the run folder (records, run.json, samples) and the summary built from
it, so `agentload report RUN_DIR` writes the same bytes as the end of `agentload run`: every
figure gets a fixed div id, nothing depends on the clock or on randomness. The records are read
once, in the pass that also builds the summary: what the charts need of them is gathered by
`agentload.report.html_view.HtmlView` (a bounded lane sample, counters and bins).

Contents, top to bottom: the verdict and its evidence, every other finding (ALSO) with its own
(and a banner when the run was cut short), the run's settings, the agents' swim lanes, per-round phase percentiles, stall and
error counts by round x phase, stall probability against prompt size, the run over time, the
target's own metrics, and (a run with a fleet behind a router) the router section
(`agentload.report.router_chart`). A run with scheduled faults has their windows shaded on every
chart whose axis is time.
"""

from __future__ import annotations

import html
import math
import pkgutil
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs
from plotly.subplots import make_subplots

from agentload.analysis.stats import band_ranges
from agentload.analysis.summary import tls_note
from agentload.redact import redact
from agentload.report.text import fmt_ms
from agentload.records import REPORT_PHASES, Record, phase_ns
from agentload.records import phases as phase_table
from agentload.records.rundir import RunData
from agentload.report.html_view import (MAX_LANES, MAX_POINTS, MAX_TIMELINE_REQUESTS, HtmlView,  # noqa: F401
                                        html_view, nice as _nice, sample_series, sec as _sec)
from agentload.report.router_chart import (FaultWindow, add_fault_bands, fault_windows, fig_router_inflight,
                                           fig_router_rounds, fig_router_share, router_html)
from agentload.report.target_chart import fig_target_metrics
from agentload.report.timeline import (GAP_COLORS, GAP_KINDS, GAP_LABELS, REQUEST_PHASES, Lane, end_phase,
                                       request_segments, thin_for_drawing)

PROMPT_BINS = 24

# the phase table's colours and labels, then the timeline's gaps between requests
COLORS = {**phase_table.COLORS, **GAP_COLORS}
LABELS = {**phase_table.LABELS, **GAP_LABELS}
PLOT_CONFIG = {"displaylogo": False, "responsive": True,
               "modeBarButtonsToRemove": ["select2d", "lasso2d"]}
TEMPLATE = "plotly_white"


# ---------------------------------------------------------------- helpers


def _e(v: Any) -> str:
    return html.escape("" if v is None else str(v))


def _ms(v: float | None) -> str:
    return fmt_ms(v, sep=" ")


def _figure_html(fig: go.Figure, div_id: str) -> str:
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id, config=PLOT_CONFIG,
                       default_width="100%", default_height=f"{fig.layout.height or 450}px")


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


# ---------------------------------------------------------------- timeline


def fig_timeline(data: RunData, view: HtmlView, faults: list[FaultWindow] | None = None
                 ) -> tuple[go.Figure, str | None, int]:
    t0 = view.t0()
    run_end = view.run_end(data.samples)
    pick = view.lanes.pick_lanes(run_end)
    agents, note = pick.lanes, pick.note
    canary = view.canary_lane()
    lanes: list[Lane] = ([canary] if canary is not None else []) + agents
    lanes, thin_note = thin_for_drawing(lanes, MAX_TIMELINE_REQUESTS, run_end - t0, pick.hidden, pick.hidden_short)
    if thin_note:
        note = f"{note}; {thin_note}" if note else thin_note
    n = max(1, len(lanes))
    lane_px = 26 if n <= 16 else max(6, min(26, 1500 // n))
    height = n * lane_px + 170
    width = max(2.0, lane_px * 0.62)
    after_ns = int(float((data.meta.get("scenario", {}).get("stall", {}) or {}).get("after_s") or 0) * 1e9)

    seg_x: dict[str, list] = defaultdict(list)
    seg_y: dict[str, list] = defaultdict(list)
    start_x, start_y, start_text, start_label = [], [], [], []
    marks: dict[str, tuple[list, list, list]] = {k: ([], [], []) for k in ("stalled", "error", "cut_short")}
    for y, ln in enumerate(lanes):
        for rec in ln.records:
            segs = request_segments(rec.t)
            for kind, b, e in segs:
                if e > b:
                    seg_x[kind] += [_sec(b, t0), _sec(e, t0), None]
                    seg_y[kind] += [y, y, None]
            if "start" in rec.t:
                start_x.append(_sec(rec.t["start"], t0))
                start_y.append(y)
                start_text.append(_hover(rec))
                start_label.append(f"r{rec.round}" if rec.kind == "agent" else "")
            end = rec.t.get("end") or (segs[-1][2] if segs else None)
            if end is None:
                continue
            if rec.stalled_phase:
                begin = next((b for k, b, _ in segs if k == rec.stalled_phase), end)
                at = min(end, begin + after_ns) if after_ns else end
                mx, my, mt = marks["stalled"]
                mx.append(_sec(at, t0)); my.append(y)
                mt.append(f"stalled in {rec.stalled_phase}<br>{_e(rec.request_id)}<br>outcome {rec.outcome}")
            if rec.outcome in ("error", "cut_short"):
                mx, my, mt = marks[rec.outcome]
                mx.append(_sec(end, t0)); my.append(y)
                mt.append(f"{rec.outcome}: {_e(rec.error)} in {end_phase(rec)}<br>{_e(rec.request_id)}")
        for kind, b, e in ln.gaps:
            if e > b:
                seg_x[kind] += [_sec(b, t0), _sec(e, t0), None]
                seg_y[kind] += [y, y, None]

    fig = go.Figure()
    for kind in GAP_KINDS + REQUEST_PHASES:
        if not seg_x.get(kind):
            continue
        fig.add_trace(go.Scatter(
            x=seg_x[kind], y=seg_y[kind], mode="lines", name=LABELS[kind], hoverinfo="skip",
            line=dict(color=COLORS[kind], width=width if kind not in GAP_KINDS else max(1.5, width * 0.45),
                      dash="dot" if kind == "no_record" else "solid"),
            connectgaps=False))
    show_text = n <= 30
    fig.add_trace(go.Scatter(
        x=start_x, y=start_y, mode="markers+text" if show_text else "markers", name="request start (round boundary)",
        text=start_label if show_text else None, textposition="top right", textfont=dict(size=9, color="#444"),
        hovertext=start_text, hoverinfo="text",
        marker=dict(symbol="line-ns-open", size=max(6, lane_px * 0.9), color="#333", line=dict(width=1, color="#333"))))
    styles = {"stalled": ("x", "#d62728", "stalled (no progress for stall.after_s)"),
              "error": ("triangle-up", "#000000", "failed (error)"),
              "cut_short": ("square-open", "#555555", "still in flight at the end (cut short)")}
    for k, (sym, col, label) in styles.items():
        mx, my, mt = marks[k]
        if mx:
            fig.add_trace(go.Scatter(x=mx, y=my, mode="markers", name=label, hovertext=mt, hoverinfo="text",
                                     marker=dict(symbol=sym, size=max(8, min(14, lane_px)), color=col,
                                                 line=dict(width=2, color=col))))
    end_s = _sec(run_end, t0)
    fig.add_vline(x=end_s, line=dict(color="#999", width=1, dash="dash"))
    add_fault_bands(fig, faults or [])
    step = max(1, math.ceil(n / 40))
    ticks = list(range(0, len(lanes), step))  # none when nothing was recorded (n is 1 then, for the height)
    title = "Agents over time: one lane per agent, each request drawn as its phases"
    if note:
        title += f"<br><sup>{_e(note)}</sup>"
    fig.update_layout(
        template=TEMPLATE, height=height + 50,
        title=dict(text=title, x=0.01, xanchor="left", y=1.0, yref="container", yanchor="top", pad=dict(t=14)),
        margin=dict(l=70, r=20, t=115 if note else 95, b=50), hovermode="closest",
        legend=dict(orientation="h", yanchor="bottom", y=1.0, xanchor="left", x=0.0, font=dict(size=11)),
        xaxis=dict(title="seconds since the run started", rangemode="tozero", zeroline=False),
        yaxis=dict(autorange="reversed", tickmode="array", tickvals=ticks,
                   ticktext=["canaries" if lanes[i].key < 0 else f"agent {lanes[i].key}" for i in ticks],
                   showgrid=False, zeroline=False, range=[n - 0.5, -0.5]))
    return fig, note, len(agents)


# ---------------------------------------------------------------- per round


def _row_label(r: dict[str, Any]) -> Any:
    """A per-round table row's label: its round, or a band's 'first-last' (a long run)."""
    if "round" in r:
        return r["round"]
    lo, hi = r["rounds"]
    return str(lo) if lo == hi else f"{lo}-{hi}"


def fig_rounds(summary: dict[str, Any]) -> go.Figure:
    bands = summary.get("round_bands")
    rounds = bands or summary.get("rounds", [])  # a long run: later rounds in bands, as the tables
    xs = [_row_label(r) for r in rounds]
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


def table_rounds(summary: dict[str, Any]) -> str:
    head = "".join(f"<th>{p}<br><small>p50 / p90 / p99 (max)</small></th>" for p in REPORT_PHASES)
    rows = []
    rows_of = summary.get("round_bands") or summary.get("rounds", [])  # a long run: later rounds in bands
    for r in rows_of + ([{"round": "all", **summary["totals"], "phases": summary.get("phases", {})}]
                        if summary.get("rounds") else []):
        cells = []
        for p in REPORT_PHASES:
            ph = r["phases"].get(p)
            cells.append("<td>-</td>" if not ph else
                         f"<td>{_ms(ph['p50_ms'])} / {_ms(ph['p90_ms'])} / {_ms(ph['p99_ms'])} "
                         f"<small>({_ms(ph['max_ms'])})</small></td>")
        rows.append(f"<tr><th>{_e(_row_label(r))}</th><td>{r['requests']}</td><td>{r['completed']}</td>"
                    f"<td>{r['errors']}</td><td>{r['stalled']}</td><td>{r.get('cut_short', 0)}</td>{''.join(cells)}</tr>")
    return (f"<table class='num'><thead><tr><th>round</th><th>requests</th><th>ok</th><th>errors</th>"
            f"<th>stalled</th><th>cut short</th>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>")


def table_stalls(view: HtmlView) -> str:
    stalls, errors = view.stalls, view.errors
    if not stalls and not errors:
        return "<p>No request stalled or failed.</p>"
    # a long run: rounds 1-10 one by one, then the bands of every per-round table
    ranges = band_ranges(view.rounds) or [(r, r) for r in sorted(view.rounds)]
    head = "".join(f"<th>{p}</th>" for p in REQUEST_PHASES)
    s_by: Counter = Counter()
    e_by: Counter = Counter()
    row_of = {rnd: i for i, (lo, hi) in enumerate(ranges) for rnd in
              {k for k, _ in stalls} | {k for k, _ in errors} if lo <= rnd <= hi}
    for (rnd, p), n in stalls.items():
        s_by[(row_of[rnd], p)] += n
    for (rnd, p), n in errors.items():
        e_by[(row_of[rnd], p)] += n
    rows = []
    for i, (lo, hi) in enumerate(ranges):
        cells = []
        for p in REQUEST_PHASES:
            s, e = s_by.get((i, p), 0), e_by.get((i, p), 0)
            cls = " class='bad'" if s or e else ""
            cells.append(f"<td{cls}>{s} / {e}</td>" if s or e else "<td></td>")
        label = lo if lo == hi else f"{lo}-{hi}"
        rows.append(f"<tr><th>{label}</th>{''.join(cells)}<td>{sum(v for (k, _), v in s_by.items() if k == i)} / "
                    f"{sum(v for (k, _), v in e_by.items() if k == i)}</td></tr>")
    by_err = view.error_classes.counter()
    err_line = ("<p>Errors by class: " + ", ".join(f"{_e(k)} x{v}" for k, v in by_err.most_common()) + "</p>"
                if by_err else "")
    return (f"<table class='num'><thead><tr><th>round</th>{head}<th>total</th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>"
            "<p class='note'>Each cell: stalled / failed requests whose stall or failure was in that phase. "
            "A stall counts even if the request finished later.</p>" + err_line)


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


def fig_over_time(data: RunData, view: HtmlView, faults: list[FaultWindow] | None = None) -> go.Figure:
    t0 = view.t0()
    end_s, width, nb, done, toks, errs = view.ends.result(t0, view.run_end(data.samples))
    fig = make_subplots(rows=5, cols=1, shared_xaxes=True, vertical_spacing=0.045,
                        specs=[[{}], [{}], [{"secondary_y": True}], [{}], [{}]],
                        subplot_titles=("requests in flight by phase (and stalled)",
                                        "client pool: connections in use / idle, waiters, against the limit",
                                        "throughput: completed requests/s and output tokens/s",
                                        "errors, stalls given up and cut-short requests (count per bin, by end time)",
                                        "canary latency (fresh connection, short prompt)"))
    pool_keys = ("in_use", "idle", "waiters", "limit")
    fns: dict[str, Any] = {p: (lambda s, p=p: (s.get("inflight") or {}).get(p, 0)) for p in REQUEST_PHASES}
    fns["__stalled"] = lambda s: s.get("stalled", 0)
    for k in pool_keys:
        fns[f"__pool_{k}"] = lambda s, k=k: (s.get("pool") or {}).get(k, 0)
    # streamed from samples.jsonl, at most MAX_POINTS per series (the largest of each block)
    dx, dc = sample_series(data.samples, lambda s: _sec(s["t"], t0), fns, MAX_POINTS)
    phases = [p for p in REQUEST_PHASES if any(dc[p])]
    samples = bool(dx)
    for p in phases:
        fig.add_trace(go.Scatter(x=dx, y=dc[p], name=f"in flight: {p}", stackgroup="inflight", mode="lines",
                                 line=dict(color=COLORS[p], width=0.5), legendgroup="inflight"), row=1, col=1)
    if samples:
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
    else:
        for row in (1, 2):
            _note(fig, row, "no samples.jsonl in this run folder")

    # rates by end time, in bins of ~1/400 of the run (never under 50 ms): gathered in the pass
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


# ---------------------------------------------------------------- settings and verdict


def _kv_table(title: str, d: dict[str, Any]) -> str:
    rows = "".join(f"<tr><th>{_e(k)}</th><td>{_e(_fmt_val(v))}</td></tr>" for k, v in d.items())
    return f"<table class='kv'><caption>{_e(title)}</caption>{rows}</table>"


def _fmt_val(v: Any) -> str:
    if isinstance(v, dict):
        return ", ".join(f"{k}={_fmt_val(x)}" for k, x in v.items())
    if isinstance(v, list):
        return ", ".join(_fmt_val(x) for x in v)
    return "null" if v is None else str(v)


def settings_html(data: RunData, summary: dict[str, Any]) -> str:
    m = data.meta
    sc = m.get("scenario", {}) or {}
    run = summary["run"]
    tgt = dict(sc.get("target", {}) or {})
    general = {
        "scenario": run.get("scenario"),
        "run id": run.get("id"),
        "target endpoint": run.get("endpoint") + (" (embedded mock)" if run.get("embedded_mock") else "")
        + (f" ({tls_note(run.get('tls'))})" if tls_note(run.get("tls")) else "")
        if run.get("endpoint") else None,
        "model": tgt.get("model"),
        "api": run.get("api", "chat"),
        "started (unix)": run.get("started_unix"),
        "duration s": run.get("duration_s"),
        "ended": "normally" if run.get("ended_normally") and not run.get("cut_short")
        else f"cut short: {run.get('stop_reason') or 'unknown'}",
        "workload fingerprint": run.get("fingerprint"),
        "latency measured from": run.get("latency_from"),
        "agentload": m.get("version"),
        "python / aiohttp": f"{(m.get('versions') or {}).get('python')} / {(m.get('versions') or {}).get('aiohttp')}",
    }
    parts = [_kv_table("run", general)]
    for sec, title in (("client", "client pool and timeouts"), ("stall", "stall detection"),
                       ("agents", "agents"), ("conversation", "conversation"), ("canary", "canary")):
        if sc.get(sec):
            parts.append(_kv_table(title, sc[sec]))
    fleet = m.get("fleet")
    if isinstance(fleet, dict):  # a router soak: the fleet agentload started (or was pointed at)
        router = fleet.get("router") or {}
        parts.append(_kv_table("fleet and router", {
            "mode": fleet.get("mode"),
            "backends": ", ".join(f"{b.get('name')} ({b.get('role')}) {b.get('url')}" for b in fleet.get("backends") or []),
            "router": f"{router.get('kind')}" + (f", policy {router['policy']}" if router.get("policy") else ""),
            "router endpoint": router.get("endpoint"),
            "router metrics": router.get("metrics_url"),
            "schedule": "; ".join(f"{s.get('fault')} {s.get('backend')} at {s.get('at_s')} s"
                                  + (f" for {s['for_s']} s" if s.get("for_s") is not None else "")
                                  for s in fleet.get("schedule") or []) or "none",
        }))
    if run.get("embedded_mock") and sc.get("mock"):
        mock = {k: v for k, v in sc["mock"].items() if v not in (None, 0, 0.0, False) or k in ("seed",)}
        parts.append(_kv_table("embedded mock server (non-default faults shown)", mock))
    return "<div class='settings'>" + "".join(parts) + "</div>"


def verdict_html(data: RunData, summary: dict[str, Any], view: HtmlView) -> str:
    v = summary.get("verdict") or {}
    run = summary["run"]
    kind = v.get("kind", "?")
    cls = "ok" if kind == "healthy" else "bad"
    facts = []
    for key in ("phase", "first_round", "agents_affected"):
        if v.get(key) not in (None, ""):
            facts.append(f"{key.replace('_', ' ')}: <b>{_e(v[key])}</b>")
    out = [f"<div class='verdict {cls}'><span class='kind'>{_e(kind)}</span> {_e(v.get('summary', ''))}"
           + (f"<div class='facts'>{' · '.join(facts)}</div>" if facts else "") + "</div>"]
    if v.get("evidence"):
        out.append("<ul class='evidence'>" + "".join(f"<li>{_e(e)}</li>" for e in v["evidence"]) + "</ul>")
    for sec in v.get("secondary") or []:  # every other finding, in order, as report.txt's ALSO lines
        out.append(f"<div class='verdict also'><span class='kind'>ALSO {_e(sec.get('kind', '?'))}</span> "
                   f"{_e(sec.get('summary', ''))}</div>")
        if sec.get("evidence"):
            out.append("<ul class='evidence'>" + "".join(f"<li>{_e(e)}</li>" for e in sec["evidence"]) + "</ul>")
    if run.get("cut_short"):
        if not data.meta.get("ended", False):
            unrecorded = len(view.lanes.no_record_agents(view.run_end(data.samples)))
            msg = ["This run was killed: run.json never says it ended. This report covers the records on disk."]
            if unrecorded:
                msg.append(f"{unrecorded} agent(s) had a request in flight that left no record (drawn dotted "
                           f"to the end of the timeline); the verdict cannot see those.")
        else:
            msg = [f"This run was cut short: {_e(run.get('stop_reason') or 'it did not end normally')}."]
        if data.torn_lines:
            msg.append(f"{data.torn_lines} torn line(s) at the end of records.jsonl were skipped.")
        out.append("<div class='banner'>" + " ".join(msg) + "</div>")
    if summary.get("warnings"):
        out.append("<ul class='warnings'>" + "".join(f"<li>warning: {_e(w)}</li>" for w in summary["warnings"])
                   + "</ul>")
    tot = summary["totals"]
    outcomes = Counter(a.get("outcome") for a in summary.get("agents", []))
    out.append(f"<p class='totals'>agents {tot['agents']} ({', '.join(f'{k} {n}' for k, n in sorted(outcomes.items()))})"
               f" · requests {tot['requests']} · completed {tot['completed']} · errors {tot['errors']} · "
               f"stalled {tot['stalled']} · cut short {tot['cut_short']} · rounds completed {tot['rounds_completed']} · "
               f"canaries {tot['canaries_ok']}/{tot['canaries']} ok</p>")
    return "".join(out)


CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0 auto;max-width:1500px;padding:16px 24px;color:#222}
h1{font-size:20px;margin:0 0 8px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
.verdict{font-size:17px;padding:10px 14px;border-radius:6px;margin:8px 0}
.verdict.ok{background:#e8f5e9;border-left:6px solid #2ca02c}.verdict.bad{background:#fdecea;border-left:6px solid #d62728}
.verdict.also{font-size:15px;background:#fff4e5;border-left:6px solid #ff7f0e}
.verdict .kind{font-weight:700;font-family:monospace;margin-right:8px}.verdict .facts{font-size:13px;margin-top:4px;color:#444}
.banner{background:#fff3cd;border:1px solid #e0b400;padding:8px 12px;border-radius:6px;margin:8px 0;font-weight:600}
ul.evidence li{margin:2px 0}ul.warnings{color:#8a5300}
.settings{display:flex;flex-wrap:wrap;gap:12px}
table{border-collapse:collapse;font-size:12.5px}table caption{font-weight:700;text-align:left;padding:2px 0}
table.kv th{text-align:left;color:#555;font-weight:500;padding:1px 10px 1px 0}table.kv td{padding:1px 0;font-family:monospace}
table.num th,table.num td{border:1px solid #ddd;padding:3px 6px;text-align:right;white-space:nowrap}
table.num thead th{background:#f5f5f5;text-align:center}td.bad{background:#fdecea;font-weight:600}
.note{color:#666;font-size:12px}.scroll{overflow-x:auto}
"""


def build_html(data: RunData, summary: dict[str, Any], view: HtmlView | None = None) -> str:
    """The whole report.html as one string (deterministic for a given run folder). `view`: what
    the report's pass over the records gathered for it (else a pass of its own)."""
    return _page(data, summary, view).replace(_PLOTLYJS_SLOT, get_plotlyjs(), 1)


def build_html_bytes(data: RunData, summary: dict[str, Any], view: HtmlView | None = None) -> bytes:
    """`build_html(...).encode("utf-8")`, with plotly.js's 4.8 MB joined in as the package's bytes:
    one copy of it in memory, not three (its text, the page's text, the page's bytes)."""
    head, tail = _page(data, summary, view).split(_PLOTLYJS_SLOT, 1)
    return b"".join((head.encode("utf-8"), pkgutil.get_data("plotly", "package_data/plotly.min.js") or b"",
                     tail.encode("utf-8")))


def _page(data: RunData, summary: dict[str, Any], view: HtmlView | None) -> str:
    """The page, redacted, with a slot where plotly.js goes."""
    if view is None:
        view = html_view(data)
    run = summary["run"]
    faults = fault_windows(summary)  # scheduled faults (a router soak): shaded on every chart over time
    # each figure is rendered as soon as it is built and let go: one plotly figure in memory at a time
    rendered: dict[str, str] = {}
    timeline, note, shown = fig_timeline(data, view, faults)
    rendered["fig-timeline"] = _figure_html(timeline, "fig-timeline")
    del timeline
    makers: list[tuple[str, Any]] = [("fig-rounds", lambda: fig_rounds(summary)), ("fig-prompt", lambda: fig_prompt(view)),
                                     ("fig-over-time", lambda: fig_over_time(data, view, faults)),
                                     # [target] metrics_urls: the router's/engines' own series
                                     ("fig-target", lambda: fig_target_metrics(data, faults=faults))]
    if summary.get("router"):
        makers += [("fig-router-share", lambda: fig_router_share(summary, faults)),
                   ("fig-router-rounds", lambda: fig_router_rounds(summary)),
                   ("fig-router-inflight", lambda: fig_router_inflight(data, faults))]
    for fid, make in makers:
        fig = make()
        if fig is not None:
            rendered[fid] = _figure_html(fig, fid)
        del fig
    figs = rendered
    title = f"agentload report: {run.get('scenario')} ({run.get('id')})"
    body = [
        f"<h1>{_e(title)}</h1>",
        verdict_html(data, summary, view),
        "<h2>Settings</h2>", settings_html(data, summary),
        "<h2>Timeline</h2>",
        "<p class='note'>Each lane is one agent; each request is drawn as its phases, grey between rounds is the "
        "agent's own tool time. Ticks mark where each request (round) started; hover them for the request id and "
        "phase times. Red x: stalled; black triangle: failed; open square: still in flight when the run ended."
        + (f" <b>{_e(note)}.</b>" if note else "") + "</p>",
        rendered["fig-timeline"],
        "<h2>Per round</h2>", "<div class='scroll'>", table_rounds(summary), "</div>", rendered["fig-rounds"],
        "<h2>Stalls and errors by round x phase</h2>", table_stalls(view),
        "<h2>Stall probability against prompt size</h2>", rendered["fig-prompt"],
        "<h2>Over time</h2>", rendered["fig-over-time"],
        *(["<h2>The target's metrics</h2>", "<p class='note'>Scraped from [target] metrics_urls during the run "
           "(target_metrics.jsonl), on the same clock as the requests; dashed: agentload's own view.</p>",
           rendered["fig-target"]] if "fig-target" in rendered else []),
        *(["<h2>Router and backends</h2>", router_html(summary), rendered["fig-router-share"],
           rendered["fig-router-rounds"], rendered.get("fig-router-inflight", "")] if summary.get("router") else []),
        f"<p class='note'>Rebuild with <code>agentload report {_e(str(data.path.resolve()))}</code>; "
        f"{view.records:,} records, {len(data.samples):,} samples.</p>",
    ]
    page = ("<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            f"<title>{_e(title)}</title><style>{CSS}</style>"
            f"<script type='text/javascript'>{_PLOTLYJS_SLOT}</script></head>"
            f"<body data-figures='{len(figs)}'>" + "\n".join(body) + "</body></html>\n")
    # every secret this process knows is hidden in what the run put into the page; plotly.js itself
    # is left alone (a short key that happens to be a word of its code must not break the charts)
    return redact(page)


_PLOTLYJS_SLOT = "\x00agentload-plotly.js\x00"


def write_html(run_dir: Path, data: RunData, summary: dict[str, Any], view: HtmlView | None = None) -> Path:
    path = Path(run_dir) / "report.html"
    tmp = path.with_suffix(".html.tmp")
    tmp.write_text(build_html(data, summary, view), encoding="utf-8")
    tmp.replace(path)
    return path
