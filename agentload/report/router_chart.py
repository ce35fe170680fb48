"""report.html's router section (the router soak bench): requests per backend and their share over
time, the load imbalance over time, prefix-cache hit rate and time to first token by round, the
router's in-flight gauges beside agentload's own count, and the scheduled fault windows, drawn as
shaded bands on every chart of the report whose axis is time (seconds since the run's t0).

A renderer: everything comes from summary.json's `router` section (agentload.analysis.router),
except the in-flight series, read from `RunData.target_metrics` and the samples.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agentload.analysis.router import inflight_series
from agentload.analysis.stats import fmt_ms
from agentload.report.html_view import sample_series
from agentload.report.markup import TEMPLATE
from agentload.report.markup import esc as _e
from agentload.report.text import (
    conversations_line,
    fault_line,
    imbalance_line,
    inflight_line,
    router_time_lines,
    router_title,
)

if TYPE_CHECKING:
    import plotly.graph_objects as go

    from agentload.records.rundir import RunData

FAULT_COLOR = "#d62728"
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf", "#aec7e8",
           "#ffbb78", "#98df8a", "#c5b0d5")
UNATTRIBUTED_COLOR = "#bbbbbb"

FaultWindow = tuple[float, float, str]  # (start s, end s, label)


def fault_windows(summary: dict[str, Any]) -> list[FaultWindow]:
    """The applied faults' windows, seconds since t0 (a fault the run ended during: to the run's end)."""
    out = []
    for f in (summary.get("router") or {}).get("faults") or []:
        if f.get("start_s") is None:
            continue
        end = f["end_s"] if f.get("end_s") is not None else f.get("window_end_s")
        if end is None or end < f["start_s"]:
            end = f["start_s"]
        out.append((f["start_s"], end, f"fault {f['number']}: {f['fault']} {f['backend']}"))
    return out


def add_fault_bands(fig: "go.Figure", windows: list[FaultWindow], rows: int | None = None) -> None:
    """Shade each fault window on `fig` (on every row of a one-column subplot figure, labelled on
    the first), behind the traces."""
    for x0, x1, label in windows:
        style = dict(x0=x0, x1=x1, fillcolor=FAULT_COLOR, opacity=0.10, line_width=0, layer="below")
        text = dict(annotation_text=label, annotation_position="top left",
                    annotation=dict(font=dict(size=10, color=FAULT_COLOR)))
        if rows is None:
            fig.add_vrect(**style, **text)
            continue
        for row in range(1, rows + 1):
            fig.add_vrect(**style, **(text if row == 1 else {}), row=row, col=1)


def _color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def fig_router_share(summary: dict[str, Any], windows: list[FaultWindow]):
    """Requests sent to each backend per bucket, and each backend's share of them, over time."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    ot = (summary.get("router") or {}).get("over_time") or {}
    width = ot.get("width_s") or 1.0
    rows = ot.get("backends") or {}
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.1,
                        subplot_titles=(f"requests sent per backend (per {width:g} s)",
                                        "share of the requests sent, per backend"))
    for i, (name, counts) in enumerate(rows.items()):
        xs = [round(k * width, 4) for k in range(len(counts))]
        color = UNATTRIBUTED_COLOR if name == "unattributed" else _color(i)
        fig.add_trace(go.Scatter(x=xs, y=counts, name=name, mode="lines", legendgroup=name,
                                 line=dict(color=color, shape="hv"),
                                 hovertemplate=f"{_e(name)}: %{{y}} requests<extra></extra>"), row=1, col=1)
        fig.add_trace(go.Scatter(x=xs, y=counts, name=name, mode="lines", legendgroup=name, showlegend=False,
                                 stackgroup="share", groupnorm="percent", line=dict(color=color, width=0.5, shape="hv"),
                                 hovertemplate=f"{_e(name)}: %{{y:.0f}}%<extra></extra>"), row=2, col=1)
    add_fault_bands(fig, windows, rows=2)
    fig.update_layout(template=TEMPLATE, height=560, margin=dict(l=60, r=40, t=60, b=50), hovermode="x unified",
                      title=dict(text="Requests per backend over time (by when they were sent)", x=0.01))
    fig.update_xaxes(rangemode="tozero")
    fig.update_xaxes(title_text="seconds since the run started", row=2, col=1)
    fig.update_yaxes(title_text="requests", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="% of requests", range=[0, 100], row=2, col=1)
    return fig


def fig_router_imbalance(summary: dict[str, Any], windows: list[FaultWindow]):
    """Load imbalance over time: the busiest backend's share of each window's requests x the number
    of backends (1.00: even, N: all on one), a step per window, beside the run's overall figure and
    its worst window. None without requests to draw."""
    import plotly.graph_objects as go

    x = (summary.get("router") or {}).get("imbalance") or {}
    ot = x.get("over_time")
    if not ot or x.get("overall") is None:
        return None
    width, n, least = ot["width_s"], x["backends"], x["min_window_requests"]
    values, requests = ot["values"], ot["requests"]
    fig = go.Figure()
    for counted in (True, False):
        # a flat segment per window (a break between windows of the other kind or without requests)
        xs: list[float | None] = []
        ys: list[float | None] = []
        cd: list[int | None] = []
        for k, (v, req) in enumerate(zip(values, requests)):
            if v is not None and (req >= least) == counted:
                xs += [round(k * width, 3), round((k + 1) * width, 3), None]
                ys += [v, v, None]
                cd += [req, req, None]
        if not xs:
            continue
        name = f"per {width:g} s window" if counted else f"window with under {least} requests (not counted)"
        fig.add_trace(go.Scatter(x=xs, y=ys, name=name, mode="lines", customdata=cd,
                                 line=dict(width=2 if counted else 1.5,
                                           color="#1f77b4" if counted else UNATTRIBUTED_COLOR,
                                           dash="solid" if counted else "dot"),
                                 hovertemplate="+%{x} s: %{y:.2f} (%{customdata} requests)<extra></extra>"))
    if x.get("window_max") is not None:
        fig.add_trace(go.Scatter(x=[x["window_max_at_s"] + x["window_s"] / 2], y=[x["window_max"]], mode="markers",
                                 name=f"worst {x['window_s']} s window: {x['window_max']:.2f}",
                                 marker=dict(color=FAULT_COLOR, symbol="star", size=12),
                                 hovertemplate="worst window: %{y:.2f}<extra></extra>"))
    fig.add_hline(y=x["overall"], line=dict(color="#555", dash="dash"),
                  annotation_text=f"overall {x['overall']:.2f} ({x['busiest']} busiest)",
                  annotation_position="bottom right")
    add_fault_bands(fig, windows)
    fig.update_layout(template=TEMPLATE, height=380, margin=dict(l=60, r=40, t=80, b=50), showlegend=True,
                      title=dict(text=f"Load imbalance over time: the busiest backend's share x {n} backends",
                                 x=0.01),
                      legend=dict(orientation="h", y=1.02, x=1, xanchor="right", yanchor="bottom"))
    fig.update_xaxes(title_text="seconds since the run started", range=[0, len(values) * width])
    fig.update_yaxes(title_text=f"1.00 = even, {n} = all on one", range=[0.9, n + 0.1])
    return fig


def _round_rows(r: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    rows = r.get("round_bands") or r.get("rounds") or []
    out = []
    for x in rows:
        label = str(x["round"]) if "round" in x else (
            str(x["rounds"][0]) if x["rounds"][0] == x["rounds"][1] else f"{x['rounds'][0]}-{x['rounds'][1]}")
        out.append((label, x))
    return out


def fig_router_rounds(summary: dict[str, Any]):
    """Prefix-cache hit rate (bars) and time to first token p50 / p90 (lines) by round."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    rows = _round_rows(summary.get("router") or {})
    xs = [label for label, _ in rows]
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    hit = [None if x["cache_hit_rate"] is None else round(100 * x["cache_hit_rate"], 1) for _, x in rows]
    fig.add_trace(go.Bar(x=xs, y=hit, name="prefix-cache hit rate %", marker_color="#9ecae1",
                         customdata=[x["reporting_cache"] for _, x in rows],
                         hovertemplate="round %{x}: %{y:.1f}% of prompt tokens cached "
                                       "(%{customdata} requests reported it)<extra></extra>"), secondary_y=False)
    for q, dash in (("p50_ms", "solid"), ("p90_ms", "dot")):
        ys = [(x.get("time_to_first_token") or {}).get(q) for _, x in rows]
        fig.add_trace(go.Scatter(x=xs, y=ys, name=f"time to first token {q[:3]}", mode="lines+markers",
                                 line=dict(color="#08519c", dash=dash),
                                 hovertemplate=f"round %{{x}}: {q[:3]} %{{y:.1f}} ms<extra></extra>"),
                      secondary_y=True)
    fig.update_layout(template=TEMPLATE, height=400, margin=dict(l=60, r=60, t=50, b=50),
                      title=dict(text="Prefix-cache hit rate and time to first token (sent -> first token) by round",
                                 x=0.01), legend=dict(orientation="h", y=1.02, x=1, xanchor="right", yanchor="bottom"))
    fig.update_xaxes(title_text="round", type="category")
    fig.update_yaxes(title_text="% of prompt tokens cached", range=[0, 100], secondary_y=False)
    fig.update_yaxes(title_text="ms", rangemode="tozero", secondary_y=True, showgrid=False)
    return fig


def fig_router_inflight(data: "RunData", windows: list[FaultWindow]):
    """The router's in-flight gauges (summed over workers, less the scrape itself) beside
    agentload's own requests in flight (samples.jsonl). None without such a gauge."""
    import plotly.graph_objects as go

    series = inflight_series(data.target_metrics)
    if not series:
        return None
    t0 = int(data.meta.get("t0_ns") or 0)
    fig = go.Figure()
    for i, (url, name, xs, ys) in enumerate(series):
        fig.add_trace(go.Scatter(x=xs, y=ys, name=f"router: {name}" + (f" ({url})" if len(series) > 1 else ""),
                                 mode="lines+markers", line=dict(shape="hv", color=_color(i))))
    # streamed from the samples (a day has 86,400), at most MAX_POINTS (the largest of each block)
    sx, cols = sample_series(data.samples, lambda s: round((s["t"] - t0) / 1e9, 3),
                             {"inflight": lambda s: sum((s.get("inflight") or {}).values())})
    if sx:
        fig.add_trace(go.Scatter(x=sx, y=cols["inflight"],
                                 name="agentload: requests in flight", mode="lines",
                                 line=dict(dash="dot", color="#888")))
    add_fault_bands(fig, windows)
    fig.update_layout(template=TEMPLATE, height=360, margin=dict(l=60, r=40, t=50, b=50), hovermode="x unified",
                      title=dict(text="In flight: the router's own count beside agentload's", x=0.01))
    fig.update_xaxes(title_text="seconds since the run started", rangemode="tozero")
    fig.update_yaxes(title_text="requests", rangemode="tozero")
    return fig


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"


def _ttft(tt: dict[str, Any] | None) -> str:
    return "-" if not tt else f"{fmt_ms(tt['p50_ms'])} / {fmt_ms(tt['p90_ms'])}"


def router_html(summary: dict[str, Any]) -> str:
    """The section's text: who routed what, per backend, the faults, stickiness, in flight."""
    r = summary.get("router") or {}
    out = [f"<p>{_e(router_title(r))}</p>"]
    head = ("<tr><th>backend</th><th>role</th><th>requests</th><th>share</th><th>ok</th><th>errors</th>"
            "<th>stalled</th><th>first token p50 / p90 ms</th><th>cache hit</th><th>log arrivals</th></tr>")
    rows = []
    for b in r.get("backends", []):
        bad = " class='bad'" if b["errors"] or b["stalled"] else ""
        rows.append(f"<tr><th>{_e(b['name'])}</th><td>{_e(b['role'])}</td><td>{b['requests']}</td>"
                    f"<td>{_pct(b['share'])}</td><td>{b['ok']}</td><td{bad}>{b['errors']}</td><td{bad}>{b['stalled']}</td>"
                    f"<td>{_ttft(b.get('time_to_first_token'))}</td><td>{_pct(b.get('cache_hit_rate'))}</td>"
                    f"<td>{(b.get('log') or {}).get('arrivals', '-')}</td></tr>")
    out.append(f"<table class='num'><thead>{head}</thead><tbody>{''.join(rows)}</tbody></table>")
    out.append("<p class='note'>Requests as agentload's records saw them, each attributed to the backend that named "
               "itself in system_fingerprint, else to the backend whose request log has its X-Request-ID; "
               "first token: request sent -> first token; log arrivals: lines in the backend's own request log.</p>")
    items = []
    st = r.get("stickiness") or {}
    if st.get("pairs"):
        items.append(f"stickiness: {_pct(st['share'])} ({st['same']} of {st['pairs']}) of consecutive rounds of a "
                     f"conversation went to the backend of the round before")
    items += [line for line in (conversations_line(r.get("conversations")), imbalance_line(r.get("imbalance")),
                                *router_time_lines(r.get("router_time"))) if line]
    items += [fault_line(f) for f in r.get("faults", [])]
    items += [inflight_line(x) for x in r.get("inflight", [])]
    if items:
        out.append("<ul>" + "".join(f"<li>{_e(x)}</li>" for x in items) + "</ul>")
    return "".join(out)
