"""Rules on agentload's own side: it crashed, its event loop saturated (or it could not start the
agents asked for), its connection pool queued requests, or the harness behind `agentload proxy`
stopped sending its next round."""

from __future__ import annotations

from collections import Counter
from typing import Any

from agentload.analysis.stats import fmt_dur as _dur
from agentload.analysis.stats import pct_ms, percentiles_ms
from agentload.analysis.verdict.facts import Facts
from agentload.analysis.verdict.kinds import Finding, Kind
from agentload.analysis.verdict.naming import fmt_counts, fmt_round_counts, share
from agentload.analysis.verdict.pool import (
    POOL_BEYOND_HELD,
    POOL_WAIT_MIN_MS,
    POOL_WAIT_SHARE,
    POOL_WAITED_SHARE,
    PoolJudgement,
)
from agentload.analysis.verdict.samples import (
    SATURATED_MIN_SAMPLES,
    SATURATED_SHARE,
    SATURATION_LAG_MS,
    SATURATION_SOME_LAG_MS,
    TIMING_SATURATED_MS,
)


def rule_agentload_error(f: Facts) -> Finding | None:
    """An agent or a background task (watchdog, sampler, canaries) of agentload crashed."""
    crashes = f.meta.get("crashes") or []
    if not crashes:
        return None
    agents = {c.get("agent") for c in crashes if c.get("where") == "agent" and c.get("agent") is not None}
    tasks = Counter(c.get("where", "?") for c in crashes if c.get("where") != "agent")
    first = crashes[0]
    what = []
    if agents:
        what.append(f"{len(agents)} agent(s) crashed")
    if tasks:
        what.append("background task(s) died: " + fmt_counts(tasks))
    rounds = [c["round"] for c in crashes if c.get("round") is not None]
    fnd = Finding(Kind.AGENTLOAD_ERROR,
                  f"agentload itself failed: {'; '.join(what)} ({first.get('error')}: {first.get('message')}); "
                  f"what it measured after that is incomplete, so it cannot call the run healthy",
                  first_round=min(rounds) if rounds else None,
                  agents_affected=len(agents) if agents else len(f.agents), agents_stopped=len(agents))
    for c in crashes[:5]:
        where = c.get("where", "?") + (f" {c['agent']}" if c.get("agent") is not None else "")
        where += f" in round {c['round']}" if c.get("round") is not None else ""
        where += f" (worker {c['worker']})" if c.get("worker") is not None else ""
        tb = (c.get("traceback") or "").strip().splitlines()
        fnd.evidence.append(f"{where}: {c.get('error')}: {c.get('message')}"
                            + (f" at {tb[-2].strip()}" if len(tb) >= 2 else ""))
    total = max(int(f.meta.get("crash_count") or 0), len(crashes))  # run.json keeps the first 50
    if total > 5:
        fnd.evidence.append(f"... {total - 5} more crash(es) ({total} in all; run.json lists the first {len(crashes)})")
    if tasks.get("watchdog"):
        fnd.evidence.append("the watchdog died: stalls after that point may not have been detected")
    return fnd


def rule_client_saturated(f: Facts) -> Finding | None:
    """agentload's own loop lagged in most samples: every timing it took is suspect. A single
    spike (start-up, a noisy neighbour) is a warning in the report, not a verdict."""
    def most(k: int) -> bool:
        return k >= SATURATED_MIN_SAMPLES and k >= SATURATED_SHARE * f.n_samples

    te = percentiles_ms(f.acc.timing, (50, 99))
    lagged, some = f.sample_digest.lagged, f.sample_digest.some_lag
    unstarted = unstarted_agents(f.meta)
    if most(lagged):
        lag_line = f"event-loop lag at or above {SATURATION_LAG_MS:.0f} ms in {lagged} of "
    elif most(some) and te is not None and te[99] >= TIMING_SATURATED_MS:
        lagged, lag_line = some, f"event-loop lag at or above {SATURATION_SOME_LAG_MS:.0f} ms in {some} of "
    elif unstarted is not None and unstarted["due"]:
        lag_line = ""
    else:
        return None
    if unstarted is not None and unstarted["due"]:
        # The load asked for was not applied: whatever the server did, it did it for fewer agents.
        # agentload's side (it could not start them in time), so this kind, never healthy; no agent
        # of the server's was stopped by it, so a server finding still leads when there is one.
        fnd = Finding(Kind.CLIENT_SATURATED,
                      f"agentload started only {unstarted['started']:,} of {unstarted['asked']:,} agents: "
                      f"{unstarted['due']:,} were due before the run ended and never started, so the load asked "
                      f"for was not applied; run fewer agents per process, use --workers, or a longer duration_s",
                      agents_affected=unstarted["due"], evidence=[unstarted_line(unstarted)])
        if lag_line:
            fnd.evidence.append(lag_line + f"{f.n_samples} one-second samples; largest {f.max_lag:.0f} ms")
        return fnd
    fnd = Finding(Kind.CLIENT_SATURATED,
                  f"agentload's own event loop lagged {f.max_lag:.0f} ms: its timings are not to be trusted; "
                  f"run fewer agents per process or use --workers",
                  agents_affected=len(f.agents),
                  evidence=[lag_line + f"{f.n_samples} one-second samples; largest {f.max_lag:.0f} ms"])
    if te is not None:  # where the server stamps its sends: how late agentload itself saw the first tokens
        fnd.evidence.append(f"first token seen - the server's own send stamp: p50 {_dur(te[50])}, p99 "
                            f"{_dur(te[99])} over {f.acc.timing.get_total_count()} requests (agentload's "
                            f"own lateness, and whatever sits between it and the server)")
    return fnd


def unstarted_agents(meta: dict[str, Any]) -> dict[str, int] | None:
    """Agents of agents.count that never started (run.json's counts; None: none, or a run.json from
    before they were written): asked, started, due (due before the run ended), late (due after)."""
    if meta.get("proxy"):
        return None  # (a proxy's conversations are the harness's: the scenario's agents.count asks for none)
    started = meta.get("agents_started")
    asked = int(((meta.get("scenario") or {}).get("agents") or {}).get("count") or 0)
    if type(started) is not int or not asked or started >= asked:
        return None
    due = min(int(meta.get("agents_due_unstarted") or 0), asked - started)
    return {"asked": asked, "started": started, "due": due, "after_end": asked - started - due}


def unstarted_line(u: dict[str, int]) -> str:
    """One line on the agents that never started (a warning, and the finding's evidence)."""
    parts = []
    if u["due"]:
        parts.append(f"{u['due']:,} were due before the run ended (agentload could not start them in time)")
    if u["after_end"]:
        parts.append(f"{u['after_end']:,} were due only after the run ended (agents.duration_s, the ramp "
                     f"agents.start or the open-loop rate)")
    return (f"{u['asked'] - u['started']:,} of {u['asked']:,} agents asked for never started: "
            + "; ".join(parts))


def rule_client_pool(f: Facts) -> Finding | None:
    """Time lost queued for a connection, read from every record's own pool wait (whatever the run
    length); the once-a-second sampler only corroborates. Beside a server stall the requests that
    queued for a connection a stalled request held are the stall's consequence (that rule tells
    them); the pool is judged on the others, or on all of them when the queue there was far longer
    than what the stalled requests held."""
    pj = f.pool
    if pj is None:
        return None
    waited = pj.waited
    who = pj.stalls or pj.timeouts  # else every request that waited
    first_round = min(r.round for r in who) if who else waited.first_round
    who_agents = len({r.agent for r in who}) if who else len(waited.agents)
    mine = {id(r) for r in pj.stalls} | {id(r) for r in pj.timeouts}
    stopped = f.stopped_by(lambda r: id(r) in mine)
    fnd = Finding(Kind.CLIENT_POOL, _pool_headline(f, pj), "pool_wait", first_round, who_agents, len(stopped))
    fnd.evidence.append(f"rule: pool_wait at least {POOL_WAIT_SHARE:.0%} of e2e at p50 or p90, p90 at least "
                        f"{POOL_WAIT_MIN_MS:g} ms, and at least {POOL_WAITED_SHARE:.0%} of requests waited; here"
                        + (" (outside the stall windows)" if pj.scope == "apart" else "")
                        + f" pool_wait p50 {_dur(pj.pw50)} / p90 {_dur(pj.pw90)}, e2e p50 {_dur(pj.e50)} / p90 "
                          f"{_dur(pj.e90)}, {len(waited)} of {pj.n} requests waited")
    fnd.evidence.extend(_beside_stall_evidence(f, pj))
    fnd.evidence.extend(_pool_state_evidence(f, pj))
    return fnd


def _pool_headline(f: Facts, pj: PoolJudgement) -> str:
    """The pool's figures over the requests judged: the whole run, apart from a stall, or beyond it."""
    # the headline quotes the percentile that shows the wait: p50 when most requests wait long, else
    # p90 (a queue that a quarter of the requests meet has a p50 of 0, which would read as no queue)
    q, pw, e = ("p50", pj.pw50, pj.e50) if pj.share50 or pj.pw90 is None else ("p90", pj.pw90, pj.e90)
    figures = f"pool_wait {q} {_dur(pw)} = {share(pw, e)} of e2e {q} {_dur(e)}"
    waited, n = pj.waited, pj.n
    if pj.scope == "run":
        return (f"client pool exhausted: requests waited for a free connection (limit {f.limit}): {figures}; "
                f"{len(waited)} of {n} requests waited; the server was not the bottleneck")
    if pj.scope == "apart":
        return (f"client pool exhausted apart from the server stall: outside the stall windows requests waited "
                f"for a free connection (limit {f.limit}): {figures}; {len(waited)} of {n} requests there "
                f"waited (those queued behind the stalled requests are the stall's)")
    return (f"client pool exhausted beyond the server stall: requests waited for a free connection "
            f"(limit {f.limit}): {figures}; {len(waited)} of {n} requests waited; while requests were "
            f"stalled, requests spent {f.queue_beyond_stall:.1f}x as long queued as the stalled requests "
            f"held connections")


def _beside_stall_evidence(f: Facts, pj: PoolJudgement) -> list[str]:
    """Beside a server stall: its windows, the requests queued in them (the stall's, or the pool's
    too when they queued far longer than the stalled requests held), those that stalled there."""
    ev: list[str] = []
    w = f.stall_windows
    if w is not None and f.pool_apart is not None:
        pa = f.pool_apart
        span = (f"{len(w)} stall window(s), {w.total_ns / 1e9:.1f} s in all, while requests stalled at the server "
                f"held up to {w.max_held} of the pool's connections (limit {f.limit or 'unlimited'})")
        behind = f"{len(pa.behind)} request(s) of {len(pa.behind.agents)} agent(s) queued inside them"
        ratio = pa.queued_ns / w.held_ns if w.held_ns else 0.0
        if pj.scope == "apart" and f.queue_beyond_stall is None:
            ev.append(f"{span}; {behind}, for connections the stalled requests held: the stall's consequence, "
                      f"not counted here")
        elif pj.scope == "apart":
            ev.append(f"{span}; {behind} and spent {ratio:.1f}x as long queued as the stalled requests held "
                      f"connections (at least {POOL_BEYOND_HELD:g}x: the pool was short whatever they held), not "
                      f"counted here")
        else:
            ev.append(f"{span}; {behind} and spent {ratio:.1f}x as long queued as the stalled requests held "
                      f"connections (at least {POOL_BEYOND_HELD:g}x: the pool was short whatever they held), so "
                      f"every request counts here")
    behind_stalls = [r for r in f.pool_stalls + f.pool_timeouts if f.behind_stall(r)]
    if w is not None and behind_stalls:
        ev.append(f"{len(behind_stalls)} request(s) that stalled or timed out queued inside the stall windows are "
                  f"the stall's (its finding counts them), not counted here")
    return ev


def _pool_state_evidence(f: Facts, pj: PoolJudgement) -> list[str]:
    """The requests that stalled or timed out queued, what the sampler saw of the pool (waiters,
    leaked connections), and the server's own answer time once sent."""
    ev: list[str] = []
    if pj.stalls:
        ev.append(f"{len(pj.stalls)} request(s) stalled in pool_wait (no connection for stall.after_s)")
    if pj.timeouts:
        pt = (f.scenario.get("client") or {}).get("pool_timeout_s")
        ev.append(f"{len(pj.timeouts)} request(s) failed waiting for a connection (connect_timeout while "
                  f"queued: client.pool_timeout_s = {pt})")
    if f.waiters_max:
        ev.append(f"the one-second sampler saw up to {f.waiters_max} request(s) queued for a connection at "
                  f"limit {f.limit}")
    elif f.pool_samples:
        ev.append(f"the one-second sampler caught no waiter in any of its {f.pool_samples} sample(s) (queues shorter "
                  f"than its tick); the records above are the evidence")
    leak = f.sample_digest.leaked
    if leak:
        ev.append(f"in {leak} sample(s) more connections were in use than requests were using them: "
                  f"connections leaked (responses not read to the end or not released)")
    ttfb = pct_ms(f.acc.ttfb_ok, 50)
    ev.append(f"once sent, the server answered: ttfb p50 {_dur(ttfb)}")
    return ev


# `agentload proxy`: a conversation idle this many times its usual gap between rounds (and at least
# stall.after_s) after an answer with tool calls has stopped: the harness never sent the next round
CLIENT_STOPPED_GAPS = 3.0


def rule_client_stopped(f: Facts) -> Finding | None:
    """`agentload proxy` only: conversations whose last request was answered whole, with tool calls to
    act on, and then no next request came for CLIENT_STOPPED_GAPS times the conversation's usual gap
    between rounds (its own, else the median of every conversation's; never less than stall.after_s)
    before the proxy stopped. The harness is stuck on its side: the server did its part."""
    if not f.meta.get("proxy"):
        return None
    end = int(f.meta.get("t_end_ns") or f.acc.max_end or 0)
    states = f.acc.agent_state
    every_gap = sorted(g for st in states.values() for g in (st.gaps or ()))
    fleet_gap = every_gap[len(every_gap) // 2] if every_gap else None
    stopped: list[tuple[int, int, float, float | None, float, bool]] = []
    for a, st in states.items():
        if st.last is not None or not st.last_tools or not st.last_end or not end:
            continue  # its last request went wrong (another rule's), or the answer asked for nothing more
        own = sorted(st.gaps) if st.gaps else None
        usual = own[len(own) // 2] if own else fleet_gap
        wait_s = max(f.after_s, CLIENT_STOPPED_GAPS * usual / 1e9 if usual else 0.0)
        idle_s = (end - st.last_end) / 1e9
        if idle_s > wait_s:
            stopped.append((a, st.last_round, idle_s, usual / 1e9 if usual else None, wait_s, own is not None))
    if not stopped:
        return None
    stopped.sort()
    n = len(stopped)
    rounds = Counter(rnd for _, rnd, *_ in stopped)
    lo = min(rounds)
    names = ", ".join(str(a) for a, *_ in stopped[:10]) + (", ..." if n > 10 else "")
    fnd = Finding(Kind.CLIENT_STOPPED,
                  f"client stopped: {n} of {len(states)} conversation(s) ({names}) got a whole answer with tool "
                  f"calls and never sent the next round; the server answered, the harness did not go on",
                  "tool", lo + 1, n, n)
    ev = fnd.evidence
    ev.append("last round answered before the harness stopped, by round: " + fmt_round_counts(rounds))
    for a, rnd, idle_s, usual_s, wait_s, has_own in stopped[:10]:
        gap = ("no gap between rounds measured yet" if usual_s is None else
               f"its usual gap between rounds {_dur(usual_s * 1e3)}" if has_own else
               f"no gap of its own yet, the conversations' usual gap {_dur(usual_s * 1e3)}")
        ev.append(f"conversation {a}: round {rnd} answered (tool calls to run), then no request for "
                  f"{_dur(idle_s * 1e3)} before the proxy stopped ({gap}; counted as stopped past {_dur(wait_s * 1e3)}: "
                  f"{CLIENT_STOPPED_GAPS:g}x that gap, at least stall.after_s)")
    going = len(states) - n
    ev.append(f"{going} other conversation(s) went on or ended on their own: the server was answering")
    return fnd
