"""The terminal report: the verdict's one line first, then per-round phase tables and settings."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console
from rich.table import Table

from agentload.analysis.stats import fmt_dur as _dur
from agentload.analysis.stats import fmt_ms
from agentload.analysis.summary import canaries_note, tls_note
from agentload.records import REPORT_PHASES

_PHASE_COLS = REPORT_PHASES


_ms = fmt_ms


def round_label(r: dict[str, Any]) -> Any:
    """A per-round row's label: its round, or a band's 'first-last' (a long run)."""
    if "round" in r:
        return r["round"]
    lo, hi = r["rounds"]
    return str(lo) if lo == hi else f"{lo}-{hi}"


def _cell(ph: dict | None) -> str:
    if not ph:
        return "-"
    return f"{_ms(ph['p50_ms'])} / {_ms(ph['p99_ms'])}"


def render(summary: dict[str, Any], width: int = 120, color: bool = False) -> str:
    """The report: the verdict and every other finding, the run and its settings, the per-round
    table, the router section (a fleet behind a router), the warnings."""
    buf = io.StringIO()
    con = Console(file=buf, width=width, force_terminal=color, color_system="standard" if color else None,
                  no_color=not color, highlight=False, emoji=False, soft_wrap=False)
    _verdict(con, summary.get("verdict") or {})
    con.print()
    _run(con, summary)
    _settings(con, summary)
    _measurement(con, summary)
    con.print(_rounds_table(summary))
    if summary.get("router"):
        render_router(con, summary["router"])
    for w in summary.get("warnings", []):
        con.print(f"warning: {w}", soft_wrap=True, markup=False)
    return buf.getvalue()


def _verdict(con: Console, v: dict[str, Any]) -> None:
    # The verdict and its evidence are never wrapped: one line each, greppable.
    con.print(f"VERDICT [{v.get('kind', '?')}] {v.get('summary', '')}", soft_wrap=True, markup=False)
    for e in v.get("evidence", []):
        con.print(f"  - {e}", soft_wrap=True, markup=False)
    for sec in v.get("secondary", []):  # the other findings, in order: each one line with its evidence
        con.print(f"ALSO [{sec['kind']}] {sec['summary']}", soft_wrap=True, markup=False)
        for e in sec.get("evidence", []):
            con.print(f"  - {e}", soft_wrap=True, markup=False)


def _run(con: Console, summary: dict[str, Any]) -> None:
    """What ran against what (or the harness a proxy followed), and the totals."""
    run = summary["run"]
    tot = summary["totals"]
    state = "cut short: " + (run.get("stop_reason") or "") if run.get("cut_short") else "ended normally"
    proxy = run.get("proxy")
    if proxy:  # a harness's own traffic: its conversations are the "agents", its model its own
        if run.get("cut_short") and (run.get("stop_reason") or "").startswith("interrupted"):  # (how a proxy ends)
            state = "ended: " + (run.get("stop_reason") or "by a signal")
        con.print(f"run {run['id']}  agentload proxy on {proxy.get('listen')} -> {proxy.get('upstream')}  "
                  f"settings from {run['scenario']}  {run.get('duration_s')} s  {state}", markup=False)
        con.print("conversations inferred from the messages"
                  + (f" (or header {proxy['session_header']})" if proxy.get("session_header") else ""), markup=False)
    else:
        con.print(f"run {run['id']}  scenario {run['scenario']}  {run.get('duration_s')} s  {state}", markup=False)
        tls = tls_note(run.get("tls"))
        con.print(f"target {run['endpoint']}{' (embedded mock)' if run.get('embedded_mock') else ''}"
                  f"{f' ({tls})' if tls else ''}  model {run.get('model')}  api {run.get('api', 'chat')}",
                  markup=False, soft_wrap=True)
        if run.get("replay"):
            con.print(f"workload replayed from {replay_note(run['replay'])}", markup=False, soft_wrap=True)
    asked = int((run.get("agents") or {}).get("count") or 0)
    started = run.get("agents_started")
    never = f" (started {started:,} of {asked:,} asked)" if type(started) is int and started < asked and not proxy else ""
    con.print(f"{'conversations' if proxy else 'agents'} {tot['agents']}{never}  requests {tot['requests']}  completed {tot['completed']}  "
              f"errors {tot['errors']}  stalled {tot['stalled']} (given up {tot.get('given_up', 0)})  "
              f"cut short {tot['cut_short']}  "
              f"rounds completed {tot['rounds_completed']}  {canaries_note(tot)}")


def replay_note(replay: dict[str, Any]) -> str:
    """Which capture a replayed run played back, how it was read and how fast."""
    fmt = replay.get("format") or "auto"
    return f"{replay.get('source')} (format {fmt}, speed {replay.get('speed', 1.0):g}x)"


def _settings(con: Console, summary: dict[str, Any]) -> None:
    """The client pool and its connections, the timeouts and stall detection, the retries, the
    prefix groups."""
    run = summary["run"]
    c = run.get("client", {})
    s = run.get("stall", {})
    con.print(f"client pool: limit={c.get('limit')} limit_per_host={c.get('limit_per_host')} "
              f"keepalive_timeout={c.get('keepalive_timeout')} force_close={c.get('force_close')} "
              f"session={c.get('session')}"
              + (f" (per worker process, {run['workers']} workers)" if run.get("workers", 1) > 1 else ""),
              soft_wrap=True, markup=False)
    conns = summary.get("connections")
    if conns:
        con.print(connections_line(conns), soft_wrap=True, markup=False)
    con.print(f"timeouts (s): pool={c.get('pool_timeout_s')} connect={c.get('connect_timeout_s')} "
              f"read={c.get('read_timeout_s')} total={c.get('total_timeout_s')}  "
              f"stall after={s.get('after_s')} give_up={s.get('give_up_s')} on_give_up={s.get('on_give_up')}")
    a = run.get("agents") or {}
    if "rate_limit_retries" in a:  # (a run.json from before these limits has none to print)
        con.print(f"retries: error_retries={a.get('error_retries')} rate_limit_retries={a.get('rate_limit_retries')} "
                  f"retry_after_max_s={a.get('retry_after_max_s')}", markup=False)
    for g, x in (summary.get("groups") or {}).items():  # [conversation] prefix_groups
        hit = "not reported" if x.get("cache_hit_rate") is None else f"{100 * x['cache_hit_rate']:.0f}%"
        ttft = "-" if x.get("ttft_p50_ms") is None else f"{x['ttft_p50_ms']:.1f} / {x['ttft_p99_ms']:.1f} ms"
        con.print(f"prefix group {g}: {x['agents']} agents, {x['completed']}/{x['requests']} requests completed, "
                  f"cache hit rate {hit}, time to first token p50 / p99 {ttft}", soft_wrap=True, markup=False)


def _measurement(con: Console, summary: dict[str, Any]) -> None:
    """Where latency is measured from, how late agentload was, the target's own metrics."""
    run = summary["run"]
    late = run.get("start_late_ms")
    con.print(f"latency measured from {run.get('latency_from')}"
              + (f" (starts late by p50 {late['p50']:.1f} / p99 {late['p99']:.1f} ms)" if late else ""),
              markup=False, soft_wrap=True)
    te = summary.get("timing_error")
    if te:
        what = ("timing error vs the server's own send stamp (first token seen - sent)" if run.get("embedded_mock")
                else "first token seen - the mock's own send stamp (whatever sits between them, a router or a "
                     "proxy, counts here, not only agentload's lateness)")
        con.print(f"{what}: p50 {_dur(te['p50_ms'])}, p99 {_dur(te['p99_ms'])}, max {_dur(te['max_ms'])} over {te['n']} requests",
                  soft_wrap=True, markup=False)
    for url, st in (summary.get("target_metrics") or {}).items():
        con.print(f"target metrics {url}: {st['ok']} scrapes ok, {st['failed']} failed, {st['series']} series"
                  + (f" (e.g. {st['errors'][0]})" if st.get("errors") else "") + " -> target_metrics.jsonl",
                  soft_wrap=True, markup=False)


def _rounds_table(summary: dict[str, Any]) -> Table:
    """p50 / p99 of each phase per round (later rounds of a long run in bands), then all rounds."""
    tot = summary["totals"]
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
        table.add_row(f"{round_label(r)}{'*' if r.get('thin') else ''}", str(r["requests"]), str(r["completed"]), str(r["errors"]),
                      str(r["stalled"]), *(_cell(r["phases"].get(p)) for p in _PHASE_COLS))
    if summary["rounds"]:
        table.add_row("all", str(tot["requests"]), str(tot["completed"]), str(tot["errors"]),
                      str(tot["stalled"]), *(_cell(summary["phases"].get(p)) for p in _PHASE_COLS))
    return table


# ---------------------------------------------------------------- the router section


def connections_line(c: dict[str, Any]) -> str:
    """`connections: 4 new, 12 reused (reuse rate 75%); ...`"""
    rate = c.get("reuse_rate")
    line = (f"connections: {c.get('new', 0)} new, {c.get('reused', 0)} reused (reuse rate "
            f"{'n/a' if rate is None else f'{100 * rate:.0f}%'})")
    if c.get("answered_reuse_idle_max_ms") is not None:
        line += f", longest idle before a reuse that got an answer {_dur(c['answered_reuse_idle_max_ms'])}"
    if c.get("failed_reuses"):
        idle = c.get("failed_reuse_idle_ms")
        line += f"; {c['failed_reuses']} reuse(s) closed by the other side before any answer"
        if idle:
            line += (f" after sitting idle {_dur(idle['min'])}" if idle["min"] == idle["max"]
                     else f" after sitting idle {_dur(idle['min'])}-{_dur(idle['max'])}")
    return line


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"


def _ttft_cell(tt: dict | None) -> str:
    return "-" if not tt else f"{_ms(tt['p50_ms'])} / {_ms(tt['p90_ms'])}"


def _secs(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def router_title(r: dict[str, Any]) -> str:
    """`ROUTER smg (policy cache_aware) in front of 3 backends: ...` (the section's first line)."""
    rt = r.get("router") or {}
    kind = rt.get("kind") or "router"
    head = f"ROUTER {kind}" + (f" (policy {rt['policy']})" if rt.get("policy") else "")
    n = len({b["name"] for b in r.get("backends", [])})
    head += f" in front of {n} backend(s)" + (" (prefill/decode)" if r.get("mode") == "pd" else "")
    a = r["attribution"]
    head += (f": {a['attributed']} of {a['requests']} requests attributed to a backend ({a['by_fingerprint']} by "
             f"system_fingerprint, {a['by_log']} by the backend logs), {a['unattributed']} not")
    if a.get("retried_across_backends"):
        head += f"; {a['retried_across_backends']} request id(s) reached 2+ backends of one role (router retries)"
    return head


def fault_line(f: dict[str, Any]) -> str:
    """`fault 1: hang b2 at 60.0 s for 30 s: 14 requests sent there after it failed, ...`"""
    what = f"fault {f['number']}: {f['fault']} {f['backend']}"
    if not f.get("applied"):
        at = f.get("planned_s")
        return (what + (f" planned at {at:g} s" if at is not None else "") + ": not applied"
                + (f" ({f['error']})" if f.get("error") else " (the run ended first)"))
    what += f" at {f['start_s']:.1f} s" + (f" for {f['for_s']:g} s" if f.get("for_s") is not None else "")
    parts = []
    sent = f["sent_there"]
    if sent.get("backend_log") is not None:
        parts.append(f"{sent['backend_log']} requests sent there after it failed")
    else:
        parts.append(f"{sent['records']} requests answered from there after it failed (records; no backend log)")
    parts.append(f"{f['client_stalls']} stalled / {f['client_errors']} errors seen by clients")
    stopped = f.get("stopped_routing_after_s")
    until = "the fault ended" if f.get("ended_in_run") else "the run ended"
    if stopped == "never":
        parts.append(f"router kept routing there until {until}")
    elif stopped == 0:
        parts.append("router sent it nothing after it failed")
    elif stopped is not None:
        parts.append(f"router stopped routing there after {stopped:.1f} s")
    if f.get("ended_in_run"):
        again = f.get("used_again_after_s")
        parts.append(f"used it again {again:.1f} s after recovery" if again is not None
                     else "did not use it again after recovery")
    else:
        parts.append("the run ended during the fault")
    return what + ": " + ", ".join(parts)


def conversations_line(c: dict[str, Any] | None) -> str | None:
    """`per conversation: 80% (8 of 10) of the conversations with 2+ requests stayed on one backend; ...`"""
    if not c or not c.get("with_2_plus"):
        return None
    return (f"per conversation: {_pct(c['share'])} ({c['on_one_backend']} of {c['with_2_plus']}) of the conversations "
            f"with 2+ requests had all of them on one backend; on average {_pct(c['mean_top_share'])} of a "
            f"conversation's requests went to its most-used backend")


def imbalance_line(x: dict[str, Any] | None) -> str | None:
    """`load imbalance: 1.20 overall (b0 busiest) ...` (busiest share x backends; 1.00 = even)."""
    if not x or x.get("overall") is None:
        return None
    line = (f"load imbalance (busiest backend's share of requests x {x['backends']} backends; 1.00 = even): "
            f"{x['overall']:.2f} overall ({x['busiest']} busiest)")
    if x.get("window_max") is not None:
        line += (f", worst {x['window_s']} s window {x['window_max']:.2f} at +{x['window_max_at_s']} s (of "
                 f"{x['windows']} windows with {x['min_window_requests']}+ requests)")
    else:
        line += f", no {x['window_s']} s window with {x['min_window_requests']}+ requests"
    return line


def router_time_line(x: dict[str, Any] | None, workers: str | None = None) -> str | None:
    """`router's own time (request sent -> arrival in the backend's log, ...) p50 / p99 ms: 0.4 / 2.1; ...`;
    `workers` (PD mode: "decode worker", "prefill worker") names whose log the arrival is in."""
    if not x or not x.get("all"):
        return None
    a = x["all"]
    who = workers or "backend"
    line = ("router's own time" + (f" to the {who}s" if workers else "")
            + f" (request sent -> arrival in the {who}'s log, {x['by_traceparent']} joined by "
            f"traceparent, {x['by_id']} by request id) p50 / p99 ms: {_ms(a['p50_ms'])} / {_ms(a['p99_ms'])}")
    per = [f"{name} {_ms(h['p50_ms'])} / {_ms(h['p99_ms'])}" for name, h in (x.get("backends") or {}).items() if h]
    if per:
        line += f"; by {who}: " + ", ".join(per)
    if x.get("before_sent"):
        line += f"; {x['before_sent']} arrived before the send stamp (left out)"
    return line


def router_time_lines(x: dict[str, Any] | None) -> list[str | None]:
    """The router's own time to the main role's backends; in PD mode to the decode workers, then
    the prefill workers."""
    if not x or "prefill" not in x:
        return [router_time_line(x)]
    return [router_time_line(x, "decode worker"), router_time_line(x["prefill"], "prefill worker")]


def inflight_line(x: dict[str, Any]) -> str:
    line = (f"router in flight: {x['url']} {x['gauge']} = {x['at_last_scrape']:g} at the last scrape "
            f"(+{x['last_scrape_s']:.1f} s)")
    if x.get("before_run") is not None:
        line += f", {x['before_run']:g} before the run"
    if x.get("self_count"):
        line += f", {x['self_count']} of it the scrape itself"
    if x.get("agentload_idle"):
        line += "; agentload had none in flight" + (f": {x['leaked']:g} leaked" if x.get("leaked") else "")
    else:
        line += "; agentload may still have had requests in flight (not compared)"
    return line


def render_router(con: Console, r: dict[str, Any]) -> None:
    """The ROUTER section: attribution, per backend, cache hit and time to first token by round,
    stickiness, the scheduled faults, the router's in-flight gauges against agentload's."""
    con.print()
    con.print(router_title(r), soft_wrap=True, markup=False)
    con.print("per backend: requests as the records saw them (log: arrivals in the backend's own request log); "
              "first token: request sent -> first token", soft_wrap=True, markup=False)
    t = Table(show_edge=False, pad_edge=False)
    for col in ("backend", "role", "req", "share", "ok", "err", "stall", "first token p50 / p90 ms", "cache hit", "log"):
        t.add_column(col, justify="left" if col in ("backend", "role") else "right")
    for b in r.get("backends", []):
        log = b.get("log")
        t.add_row(b["name"], b["role"], str(b["requests"]), _pct(b["share"]), str(b["ok"]), str(b["errors"]),
                  str(b["stalled"]), _ttft_cell(b.get("time_to_first_token")), _pct(b.get("cache_hit_rate")),
                  str(log["arrivals"]) if log else "-")
    con.print(t)
    rows = r.get("round_bands") or r.get("rounds") or []
    if rows:
        con.print("by round: prefix-cache hit rate (cached / prompt tokens of the requests that report cached "
                  "tokens) and time to first token (sent -> first token)", soft_wrap=True, markup=False)
        t = Table(show_edge=False, pad_edge=False)
        for col in ("round", "req", "cache hit", "reporting", "first token p50 / p90 ms"):
            t.add_column(col, justify="right")
        for x in rows:
            t.add_row(str(round_label(x)), str(x["requests"]), _pct(x["cache_hit_rate"]), str(x["reporting_cache"]),
                      _ttft_cell(x.get("time_to_first_token")))
        t.add_row("all", str(sum(x["requests"] for x in r.get("rounds", []))), _pct(r.get("cache_hit_rate")),
                  str(r.get("cache_reporting", 0)), _ttft_cell(r.get("time_to_first_token")))
        con.print(t)
    st = r.get("stickiness") or {}
    if st.get("pairs"):
        con.print(f"stickiness: {_pct(st['share'])} ({st['same']} of {st['pairs']}) of consecutive rounds of a "
                  f"conversation went to the backend of the round before", soft_wrap=True, markup=False)
    for line in (conversations_line(r.get("conversations")), imbalance_line(r.get("imbalance")),
                 *router_time_lines(r.get("router_time"))):
        if line:
            con.print(line, soft_wrap=True, markup=False)
    for f in r.get("faults", []):
        con.print(fault_line(f), soft_wrap=True, markup=False)
    for x in r.get("inflight", []):
        con.print(inflight_line(x), soft_wrap=True, markup=False)
