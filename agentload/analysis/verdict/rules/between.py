"""Rules on the layers between agentload and the server: a proxy's fixed timeout that ended what the
server never answered, a concurrency limit that refused requests in front, a proxy that buffered the
stream, and a router whose in-flight count leaked (its gauges, through `Facts`)."""

from __future__ import annotations

from collections import Counter

from agentload.analysis.proxies import (
    BURST_CHUNKS_PER_READ,
    BURST_MIN_CHUNKS,
    BURST_MIN_WAIT_MS,
    who_answered,
)
from agentload.analysis.stats import SparseHistogram, pct_ms, percentiles_ms
from agentload.analysis.stats import fmt_dur as _dur
from agentload.analysis.verdict.error_classes import is_server_error
from agentload.analysis.verdict.facts import Facts
from agentload.analysis.verdict.kinds import Finding, Kind
from agentload.analysis.verdict.naming import fmt_counts
from agentload.analysis.verdict.rules.evidence import error_finding


def rule_proxy_timeout(f: Facts) -> Finding | None:
    """Failures (a 504 or 502/503/408, or a stream cut after a silence) that all ended at one fixed
    duration after their send (or after their last token): a timeout in front of the server (nginx's
    proxy_read_timeout, haproxy's timeout server) ended requests the server had not answered. The
    hang is the server's; the layer that ended it is named by its Server header and error page."""
    ft = f.proxy_timeout
    if ft is None:
        return None
    recs = ft.records
    who = who_answered(recs, f.acc.ok_servers)
    layer = who.name()
    classes = Counter(r.error for r in recs)
    http = sum(n for e, n in classes.items() if is_server_error(e))
    cut = len(recs) - http
    what = " and ".join(x for x in (
        (f"{http} answered {', '.join(sorted({e.removeprefix('http_') for e in classes if is_server_error(e)}))}"
         if http else ""),
        f"{cut} stream(s) cut" if cut else "") if x)
    after = " or ".join(f"after {how}" for how, _ in ft.after.most_common())
    by = f" by {layer}" if layer else ""
    summary = (f"proxy timeout: {len(recs)} of {f.requests} requests ended {ft.seconds:.2f} s {after} ({what}{by}): "
               f"a fixed timeout of {ft.seconds:.1f} s " + ("in front of the server" if layer else
                                                            "between agentload and the server (or the server's own)")
               + " ended requests the server had not answered; the hang is the server's")
    phase = "ttfb" if http >= cut else ("stream" if any("first_token" in r.t for r in recs) else "ttft")
    fnd = error_finding(f, Kind.PROXY_TIMEOUT, recs, summary, phase)
    ev = fnd.evidence
    ev.append(f"they ended {ft.lo_ms / 1000:.3f}-{ft.hi_ms / 1000:.3f} s {after} (within "
              f"{ft.hi_ms - ft.lo_ms:.0f} ms of each other; {len(recs)} of the {ft.candidates} 5xx answers and cut "
              f"streams): a timer, not the server's own answers ({fmt_counts(classes)})")
    if layer is None and not http:  # cut streams that name nobody
        line = (f"the layer that cut them names itself nowhere: {who.how()}, as on the answers that went through: "
                f"a proxy that passes the server's header on (haproxy does), or the server itself")
    else:
        line = f"the layer that ended them: {who.how()}"
        if who.differs and f.acc.ok_servers:
            line += f"; the answers that went through carried Server: {', '.join(f.acc.ok_servers)}"
        sample = next((r.error_msg for r in recs if is_server_error(r.error) and r.error_msg), None)
        if sample:
            line += f"; its answer: {sample[:160]}"
    ev.append(line)
    if http >= cut:
        silent = f"no response header in those {ft.seconds:.1f} s"
    else:
        gaps = sorted(r.max_gap_ns for r in recs if r.max_gap_at == r.t.get("end"))
        silent = f"nothing for {gaps[len(gaps) // 2] / 1e9:.2f} s (p50) before the cut (the largest gap of each)"
    ev.append(f"the server behind it sent {silent}: the hang is the server's, the "
              f"proxy only ended it (nginx: proxy_read_timeout; haproxy: timeout server); a stall.after_s below "
              f"{ft.seconds:.1f} s (now {f.after_s:g} s) shows the hang itself, with its round and phase")
    if ft.candidates > len(recs):
        ev.append(f"{ft.candidates - len(recs)} other 5xx answer(s) or cut stream(s) ended at other durations")
    return fnd


def rule_concurrency_limit(f: Facts) -> Finding | None:
    """503s answered within REFUSED_WITHIN_MS of the send, each while the same number N of other
    requests was in flight (never fewer): a limit of N concurrent requests in front of the server
    (nginx's limit_conn) refused the rest before the server saw them."""
    lim = f.admission
    if lim is None:
        return None
    recs = f.refusals
    who = who_answered(recs, f.acc.ok_servers)
    layer = who.name()
    quick = max(r.t["headers"] - r.t["sent"] for r in recs) / 1e6
    fnd = error_finding(
        f, Kind.CONCURRENCY_LIMIT, recs,
        f"concurrency limit in front of the server: {len(recs)} of {f.requests} requests were refused with 503 "
        f"within {_dur(quick)} of their send" + (f" by {layer}" if layer else "")
        + f", each while {lim.limit} other request(s) were in flight (never fewer): a limit of {lim.limit} "
          f"concurrent request(s) refuses the rest before the server sees them", "ttfb")
    ev = fnd.evidence
    ev.append("requests in flight at each refusal: " + ", ".join(f"{k}: {n}" for k, n in sorted(lim.spread.items()))
              + f" ({lim.at_limit} of {lim.counted} refusals at exactly {lim.limit}); a server's own errors "
                f"come whatever the load, these only at the limit")
    line = f"the layer that refused them: {who.how()}"
    if who.differs and f.acc.ok_servers:
        line += f"; the answers that went through carried Server: {', '.join(f.acc.ok_servers)}"
    if who.sample:
        line += f"; its answer: {who.sample[:160]}"
    ev.append(line)
    ev.append(f"raise the limit in front (nginx: limit_conn; haproxy: maxconn on the server line), or send at most "
              f"{lim.limit} at once (client.limit = {lim.limit} queues the rest in agentload's pool)")
    return fnd


def rule_buffered_stream(f: Facts) -> Finding | None:
    """Tokens came many to a read after long waits (or all at once): a proxy that buffers the stream
    (nginx's default proxy_buffering on) held what the server sent. Every agent got its answers, but
    ttfb/ttft hold the server's whole generation and the token pace cannot be read: not healthy.
    Not when the server's own send stamp shows it sent the first token late itself, nor when the
    waits are within twice agentload's own largest loop lag (its late reads gather tokens too)."""
    b = f.acc.bursts
    if not b.found():
        return None
    per = sorted(b.per_read)
    waits = percentiles_ms(_hist(b.waits), (50, 99)) or {}
    wait50 = waits.get(50) or 0.0
    held = pct_ms(_hist(b.held), 50) if b.held else None
    if held is not None and held < 0.5 * wait50:
        return None  # the server's own stamp: it sent the first token late itself, nothing held it on the way
    if wait50 < 2 * f.max_lag:
        return None  # agentload's own loop lagged that long: its late reads may have gathered the tokens
    named = [s for s in b.servers if s != "(none)"]
    fnd = Finding(Kind.BUFFERED_STREAM,
                  f"a buffering proxy? {b.bursty} of {b.eligible} answers came in bursts ({per[len(per) // 2]:.0f} "
                  f"token chunks a read at p50, all at once in {b.one_read}) after waits of {_dur(waits.get(50))} "
                  f"(p50): something between the server and agentload held the stream; ttfb and ttft include the "
                  f"server's generation, and its token pace cannot be read", "ttfb", b.first_round, len(b.agents), 0)
    ev = fnd.evidence
    ev.append(f"rule: answers of {BURST_MIN_CHUNKS}+ token chunks whose chunks came {BURST_CHUNKS_PER_READ:g}+ to a "
              f"read, each read {BURST_MIN_WAIT_MS:g} ms or more after the one before (or the send); here "
              f"{b.bursty} of {b.eligible}, chunks a read {per[0]:.0f}-{per[-1]:.0f}, send -> first token p50 "
              f"{_dur(waits.get(50))}, p99 {_dur(waits.get(99))}")
    if held is not None:
        ev.append(f"the server's own send stamp: it sent the first token {_dur(held)} (p50) before "
                  f"agentload read it, in {b.stamped} of these answers: held on the way, not late at the server")
    if named:
        ev.append("their Server header: " + ", ".join(f"{s} x{n}" for s, n in b.servers.most_common()))
    ev.append("the fix, where a proxy sits in front: nginx `proxy_buffering off;` (with `proxy_http_version 1.1; "
              "proxy_set_header Connection \"\";`), or the server's `X-Accel-Buffering: no` header; haproxy: "
              "`option http-no-delay`; other proxies: turn response buffering off for text/event-stream")
    return fnd


def _hist(ns: list[int]) -> SparseHistogram:
    h = SparseHistogram()
    for v in ns:
        h.record_ns(v)
    return h


def rule_router_leak(f: Facts) -> Finding | None:
    """The router still counts requests in flight (its own gauge, at its last scrape) after every
    one of agentload's requests ended: its accounting leaked, and a load-aware policy sees a worker
    busier than it is. Read only when agentload knows it had none in flight (the run ended, and its
    last request ended before that scrape)."""
    leaks = [x for x in f.router_inflight() if x["leaked"] > 0]
    if not leaks:
        return None
    top = max(leaks, key=lambda x: x["leaked"])
    n = top["leaked"]
    after = (top["last_scrape_s"] - top["agentload_last_end_s"]) if top["agentload_last_end_s"] is not None else None
    fnd = Finding(Kind.ROUTER_LEAK,
                  f"router leak: {top['url']} ({top['router']}) still reports {n:g} request(s) in flight "
                  f"({top['gauge']}) at its last scrape, after agentload had none in flight"
                  + (f" (its last request ended {after:.1f} s before that scrape)" if after is not None else ""))
    for x in leaks:
        line = (f"{x['gauge']} = {x['at_last_scrape']:g} at {x['url']}'s last scrape (+{x['last_scrape_s']:.1f} s; "
                f"{x['what']})")
        if x["before_run"] is not None:
            line += f"; {x['before_run']:g} at the scrape before the run"
        if x["self_count"]:
            line += f"; the scrape itself counts {x['self_count']}"
        line += f": {x['leaked']:g} request(s) the router never saw end"
        if x["per_worker"]:
            line += "; per worker: " + ", ".join(f"{w} {v:g}" for w, v in x["per_worker"].items())
        fnd.evidence.append(line)
    fnd.evidence.append("agentload had no request in flight then: the run ended and every request's record "
                        "ended before that scrape; a load-aware routing policy reads these gauges, so the "
                        "workers they name look busier than they are")
    return fnd
