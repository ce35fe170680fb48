"""summary.json: the run, totals, per-round phase percentiles, the verdict, and warnings.

A pure function of the run folder's contents, so `agentload report RUN_DIR` rebuilds exactly
what `agentload run` wrote at its end. The records are read in one pass (`SummaryPass`, a
consumer of `agentload.analysis.passes.one_pass`, beside the HTML report's); nothing keeps a
list of every record.
"""

from __future__ import annotations

from typing import Any

from agentload.analysis.passes import one_pass
from agentload.analysis.router import RouterFacts, RouterPass
from agentload.analysis.stats import (
    RoundStats,
    SparseHistogram,
    fmt_dur,
    percentiles_ms,
)
from agentload.analysis.target_evidence import router_warnings, scrape_summary
from agentload.analysis.verdict import (
    FactsAccumulator,
    agent_outcomes,
    diagnose,
    failed_reuses,
    is_server_error,
    unstarted_agents,
    unstarted_line,
)
from agentload.records import Record
from agentload.records.rundir import RunData

MIN_SAMPLES_PER_ROUND = 10
LOOP_LAG_WARN_MS = 50.0
# agentload itself was the bottleneck when it saw the embedded mock's first tokens this late at
# p99 (its loop busy from one read to the next), or its loop lagged this much in half the samples
CLIENT_BOUND_MS = 10.0
LATE_START_WARN_MS = 50.0


class SummaryPass:
    """Everything summary.json needs from the records, in one pass (`add` each record):
    per-round and overall phase histograms, the verdict's facts (with the per-agent state the
    agents' outcomes come from), start lateness and agentload's timing error, counts, and (given
    the run's data) the router section (`analysis.router.RouterPass`)."""

    def __init__(self, data: RunData | None = None) -> None:
        # the fleet behind a router, made once for the router pass and the verdict
        self.router_facts = RouterFacts(data) if data is not None else None
        self.router = RouterPass(data, self.router_facts) if data is not None else None
        self.rounds = RoundStats()
        self.facts = FactsAccumulator.for_run(data)
        self.records = 0
        self.max_end: int | None = None  # latest end stamp (the duration of a run that never ended)
        self.cut_short = 0  # agent requests still in flight when the run ended
        self.canaries = 0
        self.canaries_ok = 0
        self.canaries_cut_short = 0  # (a canary in flight at the end is no failed canary)
        self.late = SparseHistogram()  # open loop: start - intended of first requests
        self.late_n = 0
        self.groups: dict[int, GroupTally] = {}  # [conversation] prefix_groups: per group

    @property
    def timing(self) -> SparseHistogram:
        """First token seen - the server's own send stamp (agent requests where it sent one): the
        verdict's accumulator keeps it."""
        return self.facts.timing

    @property
    def timing_n(self) -> int:
        return self.facts.timing.get_total_count()

    def add(self, r: Record) -> None:
        self.rounds.add(r)
        self.facts.add(r)
        if self.router is not None:
            self.router.add(r)
        t = r.t
        self.records += 1
        end = t.get("end", 0)
        self.max_end = end if self.max_end is None else max(self.max_end, end)
        if r.kind == "canary":
            self.canaries += 1
            self.canaries_ok += r.outcome == "ok"
            self.canaries_cut_short += r.outcome == "cut_short"
        elif r.outcome == "cut_short":
            self.cut_short += 1
        if "intended" in t and "start" in t:
            self.late.record_ns(t["start"] - t["intended"])
            self.late_n += 1
        g = r.group
        if g is not None and r.kind == "agent":
            gt = self.groups.get(g)
            if gt is None:
                gt = self.groups[g] = GroupTally()
            gt.add(r)


class GroupTally:
    """One prefix group's requests: what a cache-aware router buys it (its prompt tokens served from
    the cache) and its time to first token."""

    __slots__ = ("agents", "requests", "ok", "prompt", "cached", "reported", "ttft")

    def __init__(self) -> None:
        self.agents: set[int] = set()
        self.requests = self.ok = self.prompt = self.cached = self.reported = 0
        self.ttft = SparseHistogram()

    def add(self, r: Record) -> None:
        self.agents.add(r.agent)
        self.requests += 1
        if r.outcome != "ok":
            return
        self.ok += 1
        if r.cached_tokens is not None:  # the server reports its cache: the share it served
            self.reported += 1
            self.prompt += r.server_prompt_tokens or r.prompt_tokens
            self.cached += r.cached_tokens
        t = r.t
        if "first_token" in t and "sent" in t:
            self.ttft.record_ns(t["first_token"] - t["sent"])

    def result(self) -> dict[str, Any]:
        pct = percentiles_ms(self.ttft, (50, 99)) or {}
        return {"agents": len(self.agents), "requests": self.requests, "completed": self.ok,
                "cache_hit_rate": round(self.cached / self.prompt, 4) if self.prompt else None,
                "ttft_p50_ms": pct.get(50), "ttft_p99_ms": pct.get(99)}


def run_section(data: RunData, sp: SummaryPass) -> dict[str, Any]:
    m = data.meta
    sc = m.get("scenario", {})
    dur = None
    if m.get("t_end_ns") and m.get("t0_ns"):
        dur = round((m["t_end_ns"] - m["t0_ns"]) / 1e9, 3)
    elif sp.max_end is not None:
        dur = round((sp.max_end - m.get("t0_ns", 0)) / 1e9, 3)
    return {
        "id": m.get("run"),
        "scenario": sc.get("source"),
        "description": sc.get("description", ""),
        "fingerprint": m.get("fingerprint"),
        "endpoint": m.get("endpoint"),
        "embedded_mock": m.get("embedded_mock", False),
        "tls": tls_settings(sc),
        "model": sc.get("target", {}).get("model"),
        "api": m.get("api") or sc.get("target", {}).get("api") or "chat",
        "started_unix": m.get("t0_unix"),
        "duration_s": dur,
        "ended_normally": bool(m.get("ended_normally")),
        "cut_short": bool(m.get("cut_short")) or not m.get("ended", False) or data.torn_lines > 0,
        "stop_reason": m.get("stop_reason") or (None if m.get("ended") else "the run did not end (killed?)"),
        "client": sc.get("client", {}),
        "stall": sc.get("stall", {}),
        "agents": sc.get("agents", {}),
        "workers": m.get("workers", 1),
        # `agentload proxy`: upstream, where it listened, the session header (absent for a run)
        **({"proxy": m["proxy"]} if m.get("proxy") else {}),
        # `agentload replay`: the capture its agents play back (absent for a synthetic workload)
        **({"replay": sc["replay"]} if (sc.get("replay") or {}).get("source") else {}),
        "agents_started": m.get("agents_started"),  # of agents.count (None: a run.json from before it was counted)
        "agents_due_unstarted": m.get("agents_due_unstarted"),
        "latency_from": ("intended start of each conversation's first request (open loop: a late start counts), "
                         "actual send of later rounds") if sc.get("agents", {}).get("arrival") == "open"
        else "actual send (closed loop: each agent waits for its answer)",
        "start_late_ms": _start_lateness(sp),
    }


def tls_settings(sc: dict[str, Any]) -> dict[str, Any] | None:
    """How an https endpoint's certificate was checked (None: not https): `verify` false when it was
    not checked at all (`tls_verify = false`), `ca_file` when a bundle of the scenario's was used."""
    t = sc.get("target") or {}
    if not str(t.get("endpoint") or "").lower().startswith("https://"):
        return None
    return {"verify": t.get("tls_verify", True) is not False, "ca_file": t.get("tls_ca_file")}


def tls_note(tls: dict[str, Any] | None) -> str:
    """What the reports say next to the target about its certificate ("" for http or the default)."""
    if not tls:
        return ""
    if not tls["verify"]:
        return "TLS certificate NOT verified (tls_verify = false)"
    return f"TLS certificate verified against {tls['ca_file']}" if tls.get("ca_file") else ""


def canaries_note(totals: dict[str, Any]) -> str:
    """"canaries 5/5 ok (1 cut short at the end)": a canary still in flight when the run (or the
    proxy) was stopped counts neither way."""
    cut = totals.get("canaries_cut_short", 0)
    seen = totals["canaries"] - cut
    return f"canaries {totals['canaries_ok']}/{seen} ok" + (f" ({cut} cut short at the end)" if cut else "")


def _start_lateness(sp: SummaryPass) -> dict[str, float] | None:
    """Open loop: how late first requests went out against their intended start (ms)."""
    if not sp.late_n:
        return None
    pct = percentiles_ms(sp.late, (50, 99, 100)) or {}
    return {"n": sp.late_n, "p50": pct[50], "p99": pct[99], "max": pct[100]}


def warnings_for(data: RunData, sp: SummaryPass, verdict: dict[str, Any] | None = None) -> list[str]:
    w = []
    m = data.meta
    if not m.get("ended", False):
        w.append("run.json says the run never ended: it was killed; this report covers the records on disk")
    elif m.get("cut_short") and m.get("proxy"):
        if sp.cut_short:  # (a signal is how a proxy ends: only requests it cut off are worth a word)
            w.append(f"the proxy was stopped ({m.get('stop_reason') or 'stopped early'}) with {sp.cut_short} "
                     f"request(s) still in flight: recorded as cut_short, their answers not seen to the end")
    elif m.get("cut_short"):
        canaries = f" (and {sp.canaries_cut_short} canary request(s))" if sp.canaries_cut_short else ""
        w.append(f"the run was cut short ({m.get('stop_reason') or 'stopped early'}): conversations in progress started "
                 f"no further round; {sp.cut_short} request(s){canaries} still in flight at the end were recorded "
                 f"as cut_short")
    if data.torn_lines:
        w.append(f"{data.torn_lines} torn line(s) in records.jsonl were skipped (the run was killed mid-write)")
    tls = tls_settings(m.get("scenario") or {})
    if tls and not tls["verify"]:
        w.append("the endpoint's TLS certificate was not verified (tls_verify = false): anything could have "
                 "answered on its behalf")
    unstarted = unstarted_agents(m)
    if unstarted is not None and not unstarted["due"]:  # (due ones: the verdict's client_saturated says it)
        w.append(unstarted_line(unstarted))
    if getattr(data, "other_run_records", 0):
        w.append(f"{data.other_run_records} record(s) of other runs in this folder were skipped: this report "
                 f"covers run {m.get('run')} only (was the folder reused with --out?)")
    n_samples = n_lag = 0
    lag = m.get("max_loop_lag_ms", 0.0) or 0.0
    lags = SparseHistogram()  # the samples' lags (bounded, whatever the run's length)
    for s in data.samples:  # one walk (streamed from disk)
        n_samples += 1
        x = s.get("loop_lag_ms", 0.0) or 0.0
        lag = max(lag, x)
        n_lag += x >= LOOP_LAG_WARN_MS
        lags.record_ns(int(x * 1e6))
    if lag >= LOOP_LAG_WARN_MS:
        w.append(f"agentload's event loop lagged up to {lag:.0f} ms"
                 + (f" (in {n_lag} of {n_samples} one-second samples)" if n_samples else "")
                 + ": its own timings may be late by that much")
    # (a verdict or secondary finding of client_saturated already says it, with its evidence)
    saturated = verdict is not None and "client_saturated" in (
        [verdict.get("kind")] + [x.get("kind") for x in verdict.get("secondary") or ()])
    bound = None if saturated else client_bound(sp, m, lags, n_samples)
    if bound:
        w.append(bound)
    # Per round, a thin p99 is marked in the tables themselves (`thin` in each round's entry);
    # only a run too small as a whole is worth a warning.
    completed = sum(c[1] for c in sp.rounds.counts.values())
    if 0 < completed < MIN_SAMPLES_PER_ROUND:
        w.append(f"only {completed} completed request(s) in the whole run: its percentiles are rough")
    # a router that retried a worker's failures elsewhere: agents saw answers, the worker still failed
    seen = sum(1 for r in sp.facts.close().troubled if r.kind == "agent" and is_server_error(r.error))
    w.extend(router_warnings(data, seen))
    return w


def client_bound(sp: SummaryPass, meta: dict[str, Any], lags: SparseHistogram, n_samples: int) -> str | None:
    """The warning that agentload itself, not the target, was a bottleneck (a busy event loop
    reads every answer late, so every latency it took holds some of its own time): the embedded
    mock stamps its sends, so its first tokens show the lateness directly; elsewhere, a loop that
    lagged in most one-second samples says the same."""
    median_lag = round((percentiles_ms(lags, (50,)) or {50: 0.0})[50])
    te = timing_error(sp) if meta.get("embedded_mock") else None
    if te is not None and te["p99_ms"] >= CLIENT_BOUND_MS:
        return (f"agentload itself was a bottleneck: it read the mock's first tokens p50 {fmt_dur(te['p50_ms'])}, "
                f"p99 {fmt_dur(te['p99_ms'])} after the mock sent them (its event loop busy"
                + (f", lag p50 {median_lag} ms over {n_samples} one-second samples" if n_samples else "")
                + "): every latency here holds up to that much of agentload's own time; offer less load "
                  "per process (fewer agents, a slower start) or use --workers")
    if median_lag >= CLIENT_BOUND_MS:
        return (f"agentload itself was a bottleneck: its event loop lagged {median_lag} ms or more in half of "
                f"{n_samples} one-second samples, so it read answers late; offer less load per process "
                f"(fewer agents, a slower start) or use --workers")
    return None


def timing_error(sp: SummaryPass) -> dict[str, Any] | None:
    """agentload's own lateness where the server stamps its sends (the mock, bench/server.py):
    the client's first-token stamp minus the server's `mock_sent_ns`, same host, same clock."""
    if not sp.timing_n:
        return None
    pct = percentiles_ms(sp.timing, (50, 99, 100)) or {}
    return {"n": sp.timing_n, "p50_ms": pct[50], "p99_ms": pct[99], "max_ms": pct[100]}


def summary_pass(data: RunData) -> SummaryPass:
    """A pass over the run's records with only the summary's consumer."""
    sp = SummaryPass(data)
    one_pass(data, [sp])
    return sp


def connections_section(sp: SummaryPass) -> dict[str, Any]:
    """How agent requests got their connection: new or reused (the reuse rate), and the reuses the
    other side closed before any answer, with how long those had sat idle in the pool."""
    c = sp.facts.conns
    failed = failed_reuses(r for r in sp.facts.close().troubled if r.outcome == "error")
    idle = [r.idle_ns / 1e6 for r in failed if r.idle_ns is not None]
    rate = c.rate
    return {"new": c.new, "reused": c.reused, "reuse_rate": round(rate, 4) if rate is not None else None,
            "answered_reuse_idle_max_ms": (round(c.answered_idle_max_ns / 1e6, 3)
                                           if c.answered_idle_max_ns is not None else None),
            "failed_reuses": len(failed),
            "failed_reuse_idle_ms": {"min": round(min(idle), 3), "max": round(max(idle), 3), "n": len(idle)}
            if idle else None}


def router_section(data: RunData, sp: SummaryPass) -> dict[str, Any] | None:
    """summary.json's `router` (None without a fleet or a record that names its backend): from the
    pass when it carried the router's consumer (`SummaryPass(data)`), else from a pass of its own."""
    if sp.router is None:
        sp.router = RouterPass(data, sp.router_facts)
        one_pass(data, [sp.router])
    return sp.router.result()


def build_summary(data: RunData, sp: SummaryPass | None = None) -> dict[str, Any]:
    """summary.json from the run folder; `sp`: the summary's consumer of a pass already made."""
    if sp is None:
        sp = summary_pass(data)
    rs = sp.rounds
    overall, own = rs.overall, rs.rounds
    agents = agent_outcomes(data, sp.facts)
    if sp.router_facts is None:
        sp.router_facts = RouterFacts(data)
    verdict = diagnose(data, sp.facts, sp.router_facts)
    summary: dict[str, Any] = {
        "run": run_section(data, sp),
        "verdict": verdict,
        "totals": {
            "agents": len(agents),
            **overall.counts(),
            "canaries": sp.canaries,
            "canaries_ok": sp.canaries_ok,
            "canaries_cut_short": sp.canaries_cut_short,
            "torn_lines": data.torn_lines,
            "rounds_completed": sum(a["rounds_completed"] for a in agents),
        },
        "phases": overall.phases(),
        # every round's counts; its phases where it has a table row of its own (a run of more than
        # MAX_ROUND_ROWS rounds: rounds 1-10, and round_bands has the rest, each band exact)
        "rounds": [
            {"round": rnd, **rs.round_counts(rnd), "phases": own[rnd].phases() if rnd in own else None,
             "thin": c[1] < MIN_SAMPLES_PER_ROUND}
            for rnd, c in sorted(rs.counts.items())
        ],
        "agents": agents,
        "connections": connections_section(sp),
        "warnings": warnings_for(data, sp, verdict),
    }
    bands = rs.bands()
    if bands is not None:  # what the tables show of a long run
        summary["round_bands"] = [
            {"rounds": [lo, hi], **st.counts(), "phases": st.phases(), "thin": st.completed < MIN_SAMPLES_PER_ROUND}
            for lo, hi, st in bands
        ]
    if sp.groups:  # prefix groups: cache hit rate and time to first token by group
        summary["groups"] = {str(g): gt.result() for g, gt in sorted(sp.groups.items())}
    te = timing_error(sp)
    if te is not None:
        summary["timing_error"] = te
    tm = scrape_summary(data.target_metrics)
    if tm is not None:
        summary["target_metrics"] = tm
    router = router_section(data, sp)
    if router is not None:
        summary["router"] = router
    late = summary["run"].get("start_late_ms")
    if late and late["p99"] >= LATE_START_WARN_MS:
        summary["warnings"].append(f"open-loop starts ran late: p99 {late['p99']:.0f} ms, max {late['max']:.0f} ms "
                                   f"behind schedule (counted in e2e, which runs from the intended start)")
    return summary
