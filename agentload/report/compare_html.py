"""compare.html: the side-by-side comparison as one self-contained page (plotly.js inlined once,
no CDN, opens offline). A pure function of compare.json's content, so rebuilding a comparison
from the same run folders writes the same bytes (fixed div ids, nothing from the clock)."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs
from plotly.subplots import make_subplots

from agentload.analysis.compare import PHASE_ROWS, fmt_value
from agentload.records.phases import COMPARE_CDF_PHASES
from agentload.report.markup import PLOT_CONFIG, TEMPLATE
from agentload.report.markup import esc as _e

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf")

CSS = """
body{font-family:-apple-system,Segoe UI,Roboto,Helvetica,Arial,sans-serif;margin:16px 24px;color:#222;max-width:1500px}
h1{font-size:21px;margin:4px 0}h2{font-size:17px;margin:22px 0 6px;border-bottom:1px solid #ddd;padding-bottom:3px}
pre.desc{background:#f7f7f7;padding:6px 10px;border-radius:4px;white-space:pre-wrap;font-size:12.5px}
table{border-collapse:collapse;font-size:13px}
table.cmp th,table.cmp td{border:1px solid #ddd;padding:4px 8px;text-align:right;white-space:nowrap}
table.cmp thead th{background:#f5f5f5;text-align:center;font-family:monospace;font-size:12px}
table.cmp th.row{text-align:left;font-weight:500;background:#fafafa}
td.best{background:#e8f5e9;font-weight:700}td.bad{color:#b71c1c}
table.kv th{text-align:left;color:#555;font-weight:500;padding:1px 10px 1px 0}table.kv td{font-family:monospace;padding:1px 0}
ul.legend{font-size:12.5px;color:#444}ul.notes{color:#8a5300}
.verdict{margin:6px 0;padding:6px 10px;border-radius:5px}.verdict.ok{background:#e8f5e9}.verdict.bad{background:#fdecea}
.verdict .kind{font-family:monospace;font-weight:700;margin-right:6px}.verdict .name{font-family:monospace;color:#333}
.note{color:#666;font-size:12px}.scroll{overflow-x:auto}
"""


def _fig_html(fig: go.Figure, div_id: str) -> str:
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id, config=PLOT_CONFIG,
                       default_width="100%", default_height=f"{fig.layout.height or 420}px")


def table_html(doc: dict[str, Any]) -> str:
    vs = doc["variants"]
    head = "".join(f"<th>{'<br>'.join(_e(p) for p in v['name'].split(','))}</th>" for v in vs)
    rows = []
    for row in doc["rows"]:
        cells = []
        for v in vs:
            parts = []
            best_all = True
            for k in row["keys"]:
                s = _e(fmt_value(k, v["metrics"].get(k), v["metrics"]))
                if v["name"] in row["best"][k]:
                    s = f"{s}*"
                else:
                    best_all = False
                parts.append(s)
            any_best = any(v["name"] in row["best"][k] for k in row["keys"])
            cls = "best" if any_best and best_all else ""
            if row["keys"][0] == "verdict" and v["metrics"].get("verdict") != "healthy":
                cls = (cls + " bad").strip()
            cells.append(f"<td class='{cls}'>{' / '.join(parts)}</td>")
        rows.append(f"<tr><th class='row'>{_e(row['label'])}</th>{''.join(cells)}</tr>")
    return (f"<div class='scroll'><table class='cmp'><thead><tr><th></th>{head}</tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table></div>")


def fig_phases(doc: dict[str, Any]) -> go.Figure:
    vs = doc["variants"]
    names = [v["name"] for v in vs]
    fig = make_subplots(rows=1, cols=len(PHASE_ROWS), subplot_titles=[f"{p} (ms)" for p in PHASE_ROWS],
                        horizontal_spacing=0.04)
    for col, p in enumerate(PHASE_ROWS, 1):
        for q, color in (("p50", "#9ecae1"), ("p99", "#08519c")):
            ys = [v["metrics"].get(f"{p}_{q}_ms") for v in vs]
            fig.add_trace(go.Bar(x=names, y=[None if y is None else round(y, 2) for y in ys], name=q,
                                 marker_color=color, legendgroup=q, showlegend=col == 1,
                                 hovertemplate=f"%{{x}}<br>{p} {q}: %{{y:.1f}} ms<extra></extra>"),
                          row=1, col=col)
    fig.update_layout(template=TEMPLATE, barmode="group", height=450, margin=dict(t=80, b=10, l=40, r=10),
                      legend=dict(orientation="h", y=1.12, yanchor="bottom"))
    fig.update_yaxes(rangemode="tozero")
    fig.update_xaxes(tickangle=-40, tickfont=dict(size=10))
    return fig


def fig_counts(doc: dict[str, Any]) -> go.Figure:
    vs = doc["variants"]
    names = [v["name"] for v in vs]
    m = [v["metrics"] for v in vs]
    titles = ["completed rounds", "errors (stale-conn / other)", "stalls", "connections opened", "keep-alive reuse (%)"]
    fig = make_subplots(rows=1, cols=len(titles), subplot_titles=titles, horizontal_spacing=0.05)
    fig.add_trace(go.Bar(x=names, y=[x["rounds_completed"] for x in m], marker_color="#2ca02c", showlegend=False),
                  row=1, col=1)
    fig.add_trace(go.Bar(x=names, y=[x["stale_errors"] for x in m], name="stale-conn errors",
                         marker_color="#d62728"), row=1, col=2)
    fig.add_trace(go.Bar(x=names, y=[x["errors"] - x["stale_errors"] for x in m], name="other errors",
                         marker_color="#ff9896"), row=1, col=2)
    fig.add_trace(go.Bar(x=names, y=[x["stalls"] for x in m], marker_color="#9467bd", showlegend=False),
                  row=1, col=3)
    fig.add_trace(go.Bar(x=names, y=[x["connections_opened"] for x in m], marker_color="#8c564b",
                         showlegend=False), row=1, col=4)
    fig.add_trace(go.Bar(x=names, y=[None if x["reuse_rate"] is None else round(x["reuse_rate"] * 100, 1)
                                     for x in m], marker_color="#17becf", showlegend=False), row=1, col=5)
    fig.update_layout(template=TEMPLATE, barmode="stack", height=450, margin=dict(t=80, b=10, l=40, r=10),
                      legend=dict(orientation="h", y=1.12, yanchor="bottom"))
    fig.update_yaxes(rangemode="nonnegative")
    fig.update_xaxes(tickangle=-40, tickfont=dict(size=10))
    return fig


def fig_cdf(doc: dict[str, Any]) -> go.Figure:
    phases = COMPARE_CDF_PHASES
    fig = make_subplots(rows=1, cols=len(phases), subplot_titles=[f"{p}: share of requests at or below (ms)"
                                                                  for p in phases], horizontal_spacing=0.06)
    for i, v in enumerate(doc["variants"]):
        color = PALETTE[i % len(PALETTE)]
        for col, p in enumerate(phases, 1):
            q = (v.get("quantiles_ms") or {}).get(p) or []
            if not q:
                continue
            ys = [j / (len(q) - 1) for j in range(len(q))] if len(q) > 1 else [1.0]
            fig.add_trace(go.Scatter(x=q, y=ys, mode="lines", name=v["name"], line=dict(color=color, shape="hv"),
                                     legendgroup=v["name"], showlegend=col == 1,
                                     hovertemplate=f"{_e(v['name'])}<br>{p} %{{x:.1f}} ms: %{{y:.0%}}<extra></extra>"),
                          row=1, col=col)
    fig.update_layout(template=TEMPLATE, height=420, margin=dict(t=40, b=10, l=40, r=10),
                      legend=dict(orientation="h", y=-0.15))
    fig.update_yaxes(tickformat=".0%", range=[0, 1.02])
    return fig


def fig_router(doc: dict[str, Any]) -> go.Figure | None:
    """Runs behind a router: prefix-cache hit rate and time to first token (sent -> first token)
    p50 by round, one line per run. None when no run has a router section."""
    vs = [v for v in doc["variants"] if v.get("router")]
    if not vs:
        return None
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.08,
                        subplot_titles=["prefix-cache hit rate by round (%)",
                                        "time to first token by round: p50 (solid), p90 (dotted), ms"])
    for i, v in enumerate(doc["variants"]):
        rounds = (v.get("router") or {}).get("rounds") or []
        if not rounds:
            continue
        color = PALETTE[i % len(PALETTE)]
        xs = [x["label"] for x in rounds]
        fig.add_trace(go.Scatter(x=xs, y=[None if x["cache_hit_rate"] is None else round(100 * x["cache_hit_rate"], 1)
                                          for x in rounds], mode="lines+markers", name=v["name"], legendgroup=v["name"],
                                 line=dict(color=color)), row=1, col=1)
        for q, dash in (("first_token_p50_ms", "solid"), ("first_token_p90_ms", "dot")):
            fig.add_trace(go.Scatter(x=xs, y=[x[q] for x in rounds], mode="lines+markers", name=v["name"],
                                     legendgroup=v["name"], showlegend=False, line=dict(color=color, dash=dash),
                                     hovertemplate=f"{_e(v['name'])}<br>round %{{x}} {q[12:15]}: %{{y:.1f}} ms"
                                                   f"<extra></extra>"), row=1, col=2)
    fig.update_layout(template=TEMPLATE, height=420, margin=dict(t=60, b=40, l=40, r=10),
                      legend=dict(orientation="h", y=-0.2))
    fig.update_xaxes(type="category", title_text="round")
    fig.update_yaxes(range=[0, 100], row=1, col=1)
    fig.update_yaxes(rangemode="tozero", row=1, col=2)
    return fig


def verdicts_html(doc: dict[str, Any]) -> str:
    out = []
    for v in doc["variants"]:
        vd = v["verdict"]
        ok = vd.get("kind") == "healthy"
        ev = "".join(f"<li>{_e(x)}</li>" for x in vd.get("evidence") or [])
        errs = v["metrics"].get("error_classes") or {}
        err = (f"<div class='note'>errors: {_e(', '.join(f'{k} x{n}' for k, n in errs.items()))}</div>"
               if errs else "")
        also = "".join(f"<div class='note'>also <span class='kind'>[{_e(x.get('kind'))}]</span>{_e(x.get('summary'))}"
                       f"</div>" for x in vd.get("secondary") or [])
        out.append(f"<div class='verdict {'ok' if ok else 'bad'}'><span class='name'>{_e(v['name'])}</span> "
                   f"<span class='kind'>[{_e(vd.get('kind'))}]</span>{_e(vd.get('summary'))}"
                   f"{also}{err}<details><summary class='note'>evidence; run folder {_e(v['dir'])}</summary>"
                   f"<ul>{ev}</ul></details></div>")
    return "".join(out)


def common_html(doc: dict[str, Any]) -> str:
    rows = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in doc["common"].items())
    return f"<table class='kv'>{rows}</table>"


def build_compare_html(doc: dict[str, Any]) -> str:
    w = doc["workload"]
    title = f"agentload compare: {doc.get('scenario')}"
    figs = [("fig-cmp-phases", fig_phases(doc)), ("fig-cmp-counts", fig_counts(doc)), ("fig-cmp-cdf", fig_cdf(doc))]
    router = fig_router(doc)
    if router is not None:
        figs.append(("fig-cmp-router", router))
    r = {fid: _fig_html(f, fid) for fid, f in figs}
    fp = doc.get("fingerprint") or "DIFFERENT between runs (compared with --force)"
    body = [
        f"<h1>{_e(title)}</h1>",
        f"<p>workload fingerprint <code>{_e(fp)}</code>: {_e(w.get('agents'))} agents x {_e(w.get('rounds'))} "
        f"rounds, seed {_e(w.get('seed'))}; every run sends the same conversations. "
        f"Varied: <code>{_e(', '.join(doc['varied']) or '(nothing)')}</code></p>",
        f"<pre class='desc'>{_e((doc.get('description') or '').strip())}</pre>" if doc.get("description") else "",
        "<h2>Side by side</h2>", table_html(doc),
        "<ul class='legend'>" + "".join(f"<li>{_e(x)}</li>" for x in doc["legend"]) + "</ul>",
        ("<ul class='notes'>" + "".join(f"<li>{_e(x)}</li>" for x in doc["notes"]) + "</ul>") if doc["notes"] else "",
        ("<h2>Routing</h2><ul>" + "".join(f"<li>{_e(x)}</li>" for x in doc["routing"]) + "</ul>")
        if doc.get("routing") else "",
        "<h2>Verdicts</h2>", verdicts_html(doc),
        "<h2>Phase percentiles</h2>", r["fig-cmp-phases"],
        "<h2>Rounds, errors, connections</h2>", r["fig-cmp-counts"],
        "<h2>Distributions</h2>", r["fig-cmp-cdf"],
        *(["<h2>Behind the router</h2>", r["fig-cmp-router"]] if "fig-cmp-router" in r else []),
        "<h2>Same in every run</h2>", common_html(doc),
        "<p class='note'>Rebuild from the run folders with <code>agentload compare &lt;this folder&gt;</code>; "
        "every number comes from the runs' records.jsonl.</p>",
    ]
    return ("<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            f"<title>{_e(title)}</title><style>{CSS}</style>"
            f"<script type='text/javascript'>{get_plotlyjs()}</script></head>"
            f"<body data-figures='{len(figs)}'>" + "\n".join(body) + "</body></html>\n")
