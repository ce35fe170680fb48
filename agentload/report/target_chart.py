"""The chart of the target's own metrics (target_metrics.jsonl) beside agentload's view.

A renderer: the series come from `RunData.target_metrics` (read once per run folder), the
choice of series from agentload.records.target_metrics.chosen_series.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentload.records.target_metrics import chosen_series, series_label
from agentload.report.html_view import sample_series
from agentload.report.router_chart import FaultWindow, add_fault_bands

if TYPE_CHECKING:
    from agentload.records.rundir import RunData


def fig_target_metrics(data: "RunData", names: list[str] | None = None, faults: list[FaultWindow] | None = None):
    """Chosen target series over time, one row per scraped URL, with agentload's own requests in
    flight and stalled (from samples.jsonl) dashed on the same axes, and the scheduled fault
    windows shaded (`faults`). None without target metrics."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    t0 = int(data.meta.get("t0_ns") or 0)
    tm = data.target_metrics
    if not tm:
        return None
    if names is None:
        names = ((data.meta.get("scenario") or {}).get("target") or {}).get("metrics_series") or None
    chosen = chosen_series(tm, names)
    rows = len(tm.urls)
    titles = [f"{u}  ({tm.scrapes[u]['ok']} scrapes ok, {tm.scrapes[u]['failed']} failed)" for u in tm.urls]
    fig = make_subplots(rows=rows, cols=1, shared_xaxes=True, subplot_titles=titles, vertical_spacing=0.08)
    # streamed from the samples (a day has 86,400), at most MAX_POINTS (the largest of each block)
    sx, own = sample_series(data.samples, lambda s: (s["t"] - t0) / 1e9,
                            {"inflight": lambda s: sum((s.get("inflight") or {}).values()),
                             "stalled": lambda s: s.get("stalled", 0)})
    samples = bool(sx)
    own_inflight, own_stalled = own["inflight"], own["stalled"]
    for row, url in enumerate(tm.urls, start=1):
        for s in (x for x in chosen if x.url == url):
            fig.add_trace(go.Scatter(x=s.t_s, y=s.values, name=series_label(s), mode="lines",
                                     line=dict(shape="hv"), legendgroup=url), row=row, col=1)
        if samples:
            fig.add_trace(go.Scatter(x=sx, y=own_inflight, name="agentload: requests in flight", mode="lines",
                                     line=dict(dash="dot", color="#888"), showlegend=row == 1,
                                     legendgroup="own"), row=row, col=1)
            fig.add_trace(go.Scatter(x=sx, y=own_stalled, name="agentload: stalled", mode="lines",
                                     line=dict(dash="dash", color="#d62728"), showlegend=row == 1,
                                     legendgroup="own2"), row=row, col=1)
        fig.update_yaxes(title_text="value", rangemode="tozero", row=row, col=1)
    add_fault_bands(fig, faults or [], rows=rows)
    fig.update_xaxes(title_text="seconds since the run started", row=rows, col=1)
    fig.update_layout(template="plotly_white", height=max(320, 300 * rows), margin=dict(l=60, r=40, t=60, b=50),
                      title=dict(text="The target's own metrics (scraped), beside agentload's view", x=0.01))
    return fig
