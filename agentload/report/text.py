"""The terminal report: the verdict's one line first, then per-round phase tables and settings."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console
from rich.table import Table

from agentload.records import REPORT_PHASES
from agentload.analysis.stats import fmt_ms

_PHASE_COLS = REPORT_PHASES




_ms = fmt_ms


def _cell(ph: dict | None) -> str:
    if not ph:
        return "-"
    return f"{_ms(ph['p50_ms'])} / {_ms(ph['p99_ms'])}"


def render(summary: dict[str, Any], width: int = 120, color: bool = False) -> str:
    buf = io.StringIO()
    con = Console(file=buf, width=width, force_terminal=color, color_system="standard" if color else None,
                  no_color=not color, highlight=False, emoji=False, soft_wrap=False)
    v = summary.get("verdict") or {}
    run = summary["run"]
    tot = summary["totals"]
    # The verdict and its evidence are never wrapped: one line each, greppable.
    con.print(f"VERDICT [{v.get('kind', '?')}] {v.get('summary', '')}", soft_wrap=True, markup=False)
    for e in v.get("evidence", []):
        con.print(f"  - {e}", soft_wrap=True, markup=False)
    for sec in v.get("secondary", []):  # the other findings, in order: each one line with its evidence
        con.print(f"ALSO [{sec['kind']}] {sec['summary']}", soft_wrap=True, markup=False)
        for e in sec.get("evidence", []):
            con.print(f"  - {e}", soft_wrap=True, markup=False)
    con.print()
    state = "cut short: " + (run.get("stop_reason") or "") if run.get("cut_short") else "ended normally"
    con.print(f"run {run['id']}  scenario {run['scenario']}  {run.get('duration_s')} s  {state}", markup=False)
    con.print(f"target {run['endpoint']}{' (embedded mock)' if run.get('embedded_mock') else ''}  "
              f"model {run.get('model')}", markup=False)
    con.print(f"agents {tot['agents']}  requests {tot['requests']}  completed {tot['completed']}  "
              f"errors {tot['errors']}  stalled {tot['stalled']} (given up {tot.get('given_up', 0)})  "
              f"cut short {tot['cut_short']}  "
              f"rounds completed {tot['rounds_completed']}  canaries {tot['canaries_ok']}/{tot['canaries']} ok")
    c = run.get("client", {})
    s = run.get("stall", {})
    con.print(f"client pool: limit={c.get('limit')} limit_per_host={c.get('limit_per_host')} "
              f"keepalive_timeout={c.get('keepalive_timeout')} force_close={c.get('force_close')} "
              f"session={c.get('session')}"
              + (f" (per worker process, {run['workers']} workers)" if run.get("workers", 1) > 1 else ""),
              soft_wrap=True, markup=False)
    con.print(f"timeouts (s): pool={c.get('pool_timeout_s')} connect={c.get('connect_timeout_s')} "
              f"read={c.get('read_timeout_s')} total={c.get('total_timeout_s')}  "
              f"stall after={s.get('after_s')} give_up={s.get('give_up_s')} on_give_up={s.get('on_give_up')}")
    late = run.get("start_late_ms")
    con.print(f"latency measured from {run.get('latency_from')}"
              + (f" (starts late by p50 {late['p50']:.1f} / p99 {late['p99']:.1f} ms)" if late else ""),
              markup=False, soft_wrap=True)
    te = summary.get("timing_error")
    if te:
        what = ("timing error vs the server's own send stamp (first token seen - sent)" if run.get("embedded_mock")
                else "first token seen - the mock's own send stamp (whatever sits between them, a router or a "
                     "proxy, counts here, not only agentload's lateness)")
        con.print(f"{what}: p50 {fmt_ms(te['p50_ms'])} "
                  f"ms, p99 {fmt_ms(te['p99_ms'])} ms, max {fmt_ms(te['max_ms'])} ms over {te['n']} requests",
                  soft_wrap=True, markup=False)
    for url, st in (summary.get("target_metrics") or {}).items():
        con.print(f"target metrics {url}: {st['ok']} scrapes ok, {st['failed']} failed, {st['series']} series"
                  + (f" (e.g. {st['errors'][0]})" if st.get("errors") else "") + " -> target_metrics.jsonl",
                  soft_wrap=True, markup=False)
    rows = summary.get("round_bands") or summary["rounds"]  # a long run: later rounds in bands
    thin = any(r.get("thin") for r in rows)
    title = "per round: p50 / p99 ms" + ("  (* fewer than 10 completed: p99 is about the max)" if thin else "")
    if summary.get("round_bands"):
        first_band = next(b["rounds"][0] for b in summary["round_bands"] if b["rounds"][0] != b["rounds"][1])
        title += f"  (rounds {first_band}+ in bands)"
    table = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    for col in ("round", "req", "ok", "err", "stall"):
        table.add_column(col, justify="right")
    for p in _PHASE_COLS:
        table.add_column(p, justify="right")
    for r in rows:
        label = str(r["round"]) if "round" in r else (
            str(r["rounds"][0]) if r["rounds"][0] == r["rounds"][1] else f"{r['rounds'][0]}-{r['rounds'][1]}")
        table.add_row(f"{label}{'*' if r.get('thin') else ''}", str(r["requests"]), str(r["completed"]), str(r["errors"]),
                      str(r["stalled"]), *(_cell(r["phases"].get(p)) for p in _PHASE_COLS))
    if summary["rounds"]:
        table.add_row("all", str(tot["requests"]), str(tot["completed"]), str(tot["errors"]),
                      str(tot["stalled"]), *(_cell(summary["phases"].get(p)) for p in _PHASE_COLS))
    con.print(table)
    for w in summary.get("warnings", []):
        con.print(f"warning: {w}", soft_wrap=True, markup=False)
    return buf.getvalue()
