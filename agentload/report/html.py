"""report.html: one self-contained file (plotly.js inlined once, no CDN) that opens offline.

A pure function of the run folder (records, run.json, samples) and the summary built from
it, so `agentload report RUN_DIR` writes the same bytes as the end of `agentload run`: every
figure gets a fixed div id, nothing depends on the clock or on randomness. The records are read
once, in the pass that also builds the summary: what the charts need of them is gathered by
`agentload.report.html_view.HtmlView` (a bounded lane sample, counters and bins).

Contents, top to bottom: the verdict and its evidence, every other finding (ALSO) with its own
(and a banner when the run was cut short), the run's settings, the agents' swim lanes, per-round
phase percentiles, (a run with prefix groups) each group's cache hit rate and time to first token,
stall and error counts by round x phase, stall probability against prompt size, the run over time,
the target's own metrics, and (a run with a fleet behind a router) the router section
(`agentload.report.router_chart`, with the load imbalance over time). A run with scheduled faults has their windows shaded on every
chart whose axis is time.

This module lays out the page and its tables; the run's own figures are built in
`agentload.report.figures`.
"""

from __future__ import annotations

import pkgutil
from collections import Counter
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

from agentload.analysis.stats import band_ranges
from agentload.analysis.summary import canaries_note, tls_note
from agentload.records import REPORT_PHASES
from agentload.records.rundir import RunData
from agentload.redact import redact
from agentload.report.figures import (
    fig_groups,
    fig_over_time,
    fig_prompt,
    fig_rounds,
    fig_timeline,
)
from agentload.report.html_view import MAX_LANES, HtmlView, html_view  # noqa: F401  (MAX_LANES: tests)
from agentload.report.markup import PLOT_CONFIG
from agentload.report.markup import esc as _e
from agentload.report.markup import ms as _ms
from agentload.report.router_chart import (
    fault_windows,
    fig_router_imbalance,
    fig_router_inflight,
    fig_router_rounds,
    fig_router_share,
    router_html,
)
from agentload.report.target_chart import fig_target_metrics
from agentload.report.text import replay_note, round_label
from agentload.report.timeline import REQUEST_PHASES


def _figure_html(fig: go.Figure, div_id: str) -> str:
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id, config=PLOT_CONFIG,
                       default_width="100%", default_height=f"{fig.layout.height or 450}px")


# ---------------------------------------------------------------- per round


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
        rows.append(f"<tr><th>{_e(round_label(r))}</th><td>{r['requests']}</td><td>{r['completed']}</td>"
                    f"<td>{r['errors']}</td><td>{r['stalled']}</td><td>{r.get('cut_short', 0)}</td>{''.join(cells)}</tr>")
    return (f"<table class='num'><thead><tr><th>round</th><th>requests</th><th>ok</th><th>errors</th>"
            f"<th>stalled</th><th>cut short</th>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>")


def table_groups(summary: dict[str, Any]) -> str:
    """Per prefix group: its agents, requests, cache hit rate and time to first token."""
    rows = []
    for g, x in (summary.get("groups") or {}).items():
        hit = "not reported" if x.get("cache_hit_rate") is None else f"{100 * x['cache_hit_rate']:.0f}%"
        rows.append(f"<tr><th>{_e(g)}</th><td>{x['agents']}</td><td>{x['completed']} / {x['requests']}</td>"
                    f"<td>{hit}</td><td>{_ms(x.get('ttft_p50_ms'))} / {_ms(x.get('ttft_p99_ms'))}</td></tr>")
    return ("<table class='num'><thead><tr><th>prefix group</th><th>agents</th><th>completed / requests</th>"
            "<th>cache hit</th><th>first token p50 / p99 ms</th></tr></thead><tbody>" + "".join(rows)
            + "</tbody></table><p class='note'>Agents of one group share a system prompt and tool list "
            "([conversation] prefix_groups); cache hit: the prompt tokens the server says it served from its "
            "cache, of the requests that report it; first token: request sent -> first token.</p>")


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
        **({"replayed from": replay_note(run["replay"])} if run.get("replay") else {}),
        "started (unix)": run.get("started_unix"),
        "duration s": run.get("duration_s"),
        "ended": "normally" if run.get("ended_normally") and not run.get("cut_short")
        else f"{run.get('stop_reason')} (how a proxy ends)" if run.get("proxy") and m.get("ended")
        and (run.get("stop_reason") or "").startswith("interrupted")
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
        elif run.get("proxy") and (run.get("stop_reason") or "").startswith("interrupted"):
            cut = (summary.get("totals") or {}).get("cut_short") or 0
            msg = [f"The proxy was stopped ({_e(run.get('stop_reason'))}) with {cut} request(s) in flight: "
                   f"recorded as cut_short."] if cut else []
        else:
            msg = [f"This run was cut short: {_e(run.get('stop_reason') or 'it did not end normally')}."]
        if data.torn_lines:
            msg.append(f"{data.torn_lines} torn line(s) at the end of records.jsonl were skipped.")
        if msg:
            out.append("<div class='banner'>" + " ".join(msg) + "</div>")
    if summary.get("warnings"):
        out.append("<ul class='warnings'>" + "".join(f"<li>warning: {_e(w)}</li>" for w in summary["warnings"])
                   + "</ul>")
    tot = summary["totals"]
    outcomes = Counter(a.get("outcome") for a in summary.get("agents", []))
    out.append(f"<p class='totals'>agents {tot['agents']} ({', '.join(f'{k} {n}' for k, n in sorted(outcomes.items()))})"
               f" · requests {tot['requests']} · completed {tot['completed']} · errors {tot['errors']} · "
               f"stalled {tot['stalled']} · cut short {tot['cut_short']} · rounds completed {tot['rounds_completed']} · "
               f"{canaries_note(tot)}</p>")
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
    makers: list[tuple[str, Any]] = [("fig-rounds", lambda: fig_rounds(summary)),
                                     ("fig-groups", lambda: fig_groups(summary)),  # [conversation] prefix_groups
                                     ("fig-prompt", lambda: fig_prompt(view)),
                                     ("fig-over-time", lambda: fig_over_time(data, view, faults)),
                                     # [target] metrics_urls: the router's/engines' own series
                                     ("fig-target", lambda: fig_target_metrics(data, faults=faults))]
    if summary.get("router"):
        makers += [("fig-router-share", lambda: fig_router_share(summary, faults)),
                   ("fig-router-imbalance", lambda: fig_router_imbalance(summary, faults)),
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
        *(["<h2>Prefix groups</h2>", table_groups(summary), rendered["fig-groups"]] if "fig-groups" in rendered else []),
        "<h2>Stalls and errors by round x phase</h2>", table_stalls(view),
        "<h2>Stall probability against prompt size</h2>", rendered["fig-prompt"],
        "<h2>Over time</h2>", rendered["fig-over-time"],
        *(["<h2>The target's metrics</h2>", "<p class='note'>Scraped from [target] metrics_urls during the run "
           "(target_metrics.jsonl), on the same clock as the requests; dashed: agentload's own view.</p>",
           rendered["fig-target"]] if "fig-target" in rendered else []),
        *(["<h2>Router and backends</h2>", router_html(summary), rendered["fig-router-share"],
           rendered.get("fig-router-imbalance", ""), rendered["fig-router-rounds"], rendered.get("fig-router-inflight", "")] if summary.get("router") else []),
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
