"""Per-agent outcomes and the verdict: a pure function over records and samples.

The verdict names one kind of problem, the phase it shows in, the first round it appears
in and how many agents it touched, in one plain sentence, with checkable evidence. The
order of the checks matters: agentload's own saturation makes every timing suspect, so it
comes first; a server stall is never blamed on the pool just because many requests were in
flight (the pool must really have been full, with waiters queued, for `client_pool`).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import TYPE_CHECKING, Any

from agentload.records import Record, phase_ns
from agentload.target_evidence import target_evidence

if TYPE_CHECKING:
    from agentload.report.rundir import RunData

SATURATION_LAG_MS = 200.0  # event-loop lag at which agentload's own timings stop meaning much
SATURATED_SHARE = 0.5  # ... in at least this share of the samples
SATURATED_MIN_SAMPLES = 2
POOL_WAIT_SHARE = 0.2  # pool_wait p90 this share of e2e p90 and waiters seen: the pool explains it
SLOW_POOL_WAIT_MS = 100.0
ERROR_SHARE = 0.05
DISCONNECT_ERRORS = {"ServerDisconnectedError", "ClientOSError", "ClientPayloadError",
                     "ClientConnectionResetError", "incomplete_stream", "ConnectionResetError"}
CONNECT_ERRORS = {"connect_timeout", "ClientConnectorError", "ClientConnectorDNSError", "ConnectionRefusedError"}


def agent_outcomes(data: "RunData") -> list[dict[str, Any]]:
    per: dict[int, list[Record]] = defaultdict(list)
    for r in data.records:
        if r.kind == "agent":
            per[r.agent].append(r)
    sc = data.meta.get("scenario") or {}
    max_rounds = int((sc.get("agents") or {}).get("rounds") or 0)
    model_mode = (sc.get("conversation") or {}).get("mode") == "model"
    stopped_early = bool(data.meta.get("cut_short")) or not data.meta.get("ended", True)
    out = []
    for agent in sorted(per):
        recs = per[agent]
        recs.sort(key=lambda r: (r.round, r.call))
        ok_rounds = {r.round for r in recs if r.outcome == "ok"}
        last = recs[-1]
        entry: dict[str, Any] = {"agent": agent, "rounds_completed": len(ok_rounds), "requests": len(recs)}
        if last.stalled_phase and last.outcome != "ok":
            # Given up, cut short while stalled, or ended by the server after it stalled: the stall is the story.
            entry.update(outcome="stalled", stalled_round=last.round, stalled_phase=last.stalled_phase)
            if last.outcome == "error":
                entry["error"] = last.error
        elif last.outcome == "cut_short":
            entry["outcome"] = "cut_short"
        elif last.outcome == "error":
            entry.update(outcome="error", error=last.error, error_round=last.round)
        elif stopped_early and last.round < max_rounds and not (model_mode and last.tool_calls == 0):
            entry["outcome"] = "cut_short"  # the run stopped (duration, signal) between two of its rounds
        else:
            entry["outcome"] = "done"
        stalls = [r for r in recs if r.stalled_phase]
        if stalls and "stalled_round" not in entry:
            entry["stalls_survived"] = len(stalls)
        out.append(entry)
    return out


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))]


def _threshold_evidence(stalled: list[Record], fine: list[Record]) -> tuple[str | None, int | None]:
    """A clean prompt-size threshold is the strongest clue there is: say so when there is one."""
    if not stalled:
        return None, None
    lo_stalled = min(r.prompt_tokens for r in stalled)
    hi_stalled = max(r.prompt_tokens for r in stalled)
    below = [r.prompt_tokens for r in fine if r.prompt_tokens < lo_stalled]
    above_ok = [r.prompt_tokens for r in fine if r.prompt_tokens >= lo_stalled]
    if not above_ok and below:
        return (f"every request at or above {lo_stalled:,} prompt tokens stalled ({len(stalled)}), none below "
                f"(largest that completed: {max(below):,} tokens)"), lo_stalled
    return (f"stalled prompts {lo_stalled:,}-{hi_stalled:,} tokens; {len(above_ok)} request(s) of that size or "
            f"larger completed, so size alone does not explain it"), None


def _fmt_phase_counts(c: Counter) -> str:
    return ", ".join(f"round {rnd} {ph}: {n}" for (rnd, ph), n in sorted(c.items()))


def diagnose(data: "RunData") -> dict[str, Any]:
    recs = [r for r in data.records if r.kind == "agent"]
    canaries = [r for r in data.records if r.kind == "canary"]
    samples = data.samples
    agents = {r.agent for r in recs}
    v: dict[str, Any] = {"kind": "healthy", "phase": None, "first_round": None, "agents_affected": 0,
                         "summary": "", "evidence": []}
    if not recs:
        v.update(kind="no_data", summary="no agent request was recorded, so there is nothing to judge")
        return v
    ev: list[str] = v["evidence"]
    after_s = float((data.meta.get("scenario", {}).get("stall", {}) or {}).get("after_s") or 10.0)
    max_lag = max([s.get("loop_lag_ms", 0.0) for s in samples] + [data.meta.get("max_loop_lag_ms") or 0.0])

    stalled = [r for r in recs if r.stalled_phase]
    fine = [r for r in recs if not r.stalled_phase and r.outcome == "ok"]
    errors = [r for r in recs if r.outcome == "error"]
    disconnects = [r for r in errors if r.error in DISCONNECT_ERRORS]
    connects = [r for r in errors if r.error in CONNECT_ERRORS]
    http_errors = [r for r in errors if r.error and (r.error.startswith("http_") or r.error == "inband_error")]
    waiters_max = max([s.get("pool", {}).get("waiters", 0) for s in samples] + [0])
    limit = (data.meta.get("scenario", {}).get("client", {}) or {}).get("limit", 0)

    # 1. agentload itself could not keep up: nothing else it says can be trusted. A single
    # spike (start-up, a noisy neighbour) is a warning in the report, not a verdict: the lag
    # must be sustained over most of the run's samples.
    lagged = [s for s in samples if s.get("loop_lag_ms", 0.0) >= SATURATION_LAG_MS]
    if len(lagged) >= SATURATED_MIN_SAMPLES and len(lagged) >= SATURATED_SHARE * len(samples):
        v.update(kind="client_saturated", agents_affected=len(agents),
                 summary=(f"agentload's own event loop lagged {max_lag:.0f} ms: its timings are not to be trusted; "
                          f"run fewer agents per process or use --workers"))
        ev.append(f"event-loop lag at or above {SATURATION_LAG_MS:.0f} ms in {len(lagged)} of {len(samples)} "
                  f"one-second samples; largest {max_lag:.0f} ms")
        return v

    # 2. A real pool bottleneck: time spent queued for a slot, with waiters queued at the limit.
    pool_waits = [phase_ns(r.t, "pool_wait", r.reused) or 0 for r in recs]
    pool_stalls = [r for r in stalled if r.stalled_phase == "pool_wait"]
    e2e = [phase_ns(r.t, "e2e") or 0 for r in recs if r.outcome == "ok"]
    pw90 = _pct(pool_waits, 0.9) / 1e6
    e2e90 = _pct(e2e, 0.9) / 1e6
    queued = [r for r in recs if "queued_start" in r.t]
    server_stalls = [r for r in stalled if r.stalled_phase in ("ttfb", "ttft", "stream")]
    pool_explains = bool(waiters_max > 0 and queued and (
        pool_stalls or (pw90 >= SLOW_POOL_WAIT_MS and pw90 >= POOL_WAIT_SHARE * max(e2e90, 1e-9))))

    # A request stalled at the server holds its connection: with a small pool, the requests
    # behind it then wait in pool_wait. That queue is a consequence, never the cause, so any
    # stall past the pool makes this a server stall.
    if server_stalls:
        phases = Counter((r.round, r.stalled_phase) for r in server_stalls)
        main_phase = Counter(r.stalled_phase for r in server_stalls).most_common(1)[0][0]
        first_round = min(r.round for r in server_stalls)
        affected = {r.agent for r in server_stalls}
        all_finished = all(r.outcome == "ok" for r in server_stalls)
        v.update(kind="server_slow" if all_finished else "server_stall", phase=main_phase,
                 first_round=first_round, agents_affected=len(affected))
        thr_text, thr = _threshold_evidence(server_stalls, fine)
        if all_finished:
            worst = max((phase_ns(r.t, "e2e") or 0) for r in server_stalls) / 1e9
            summary = (f"server slow, not hung: {len(server_stalls)} request(s) of {len(affected)} agents made no "
                       f"progress in {main_phase} for over stall.after_s from round {first_round} on, but all finished "
                       f"(slowest {worst:.1f} s)")
        else:
            summary = (f"server stall: {len(affected)} of {len(agents)} agents stopped making progress in {main_phase} "
                       f"from round {first_round} on")
        if thr is not None:
            summary += f", every request at or above {thr:,} prompt tokens stalled"
        queued_agents = {r.agent for r in pool_stalls} - affected
        if not pool_stalls:
            summary += "; the client pool is not the cause"
        else:
            summary += (f"; they held the client pool's connections, so {len(queued_agents)} more agent(s) queued "
                        f"behind them (a consequence, not the cause)")
            v["agents_affected"] = len(affected | queued_agents)
        v["summary"] = summary
        ev.append(f"stalled requests by round and phase: {_fmt_phase_counts(phases)}")
        if thr_text:
            ev.append(thr_text)
        first_stall: dict[int, int] = {}
        for r in server_stalls:
            first_stall[r.agent] = min(first_stall.get(r.agent, r.round), r.round)
        before = [len({f.round for f in fine if f.agent == a and f.round < rnd}) for a, rnd in first_stall.items()]
        if before and min(before) > 0:
            lo, hi = min(before), max(before)
            ev.append(f"each affected agent completed {lo if lo == hi else f'{lo}-{hi}'} round(s) before its first stall")
        pings = sum(r.comments for r in server_stalls)
        if pings:
            ev.append(f"{pings} SSE comment(s) (': ping') arrived on stalled requests: bytes flowed, tokens did not")
        free = [s for s in samples if s.get("stalled") and s.get("pool", {}).get("waiters", 0) == 0]
        if samples and any(s.get("stalled") for s in samples):
            ev.append(f"the pool had no waiters queued in {len(free)} of "
                      f"{sum(1 for s in samples if s.get('stalled'))} samples taken while requests were stalled "
                      f"(limit {limit or 'unlimited'}, max waiters seen {waiters_max})")
        reused = sum(1 for r in server_stalls if r.reused)
        ev.append(f"stalled requests on reused keep-alive connections: {reused}, on new connections: "
                  f"{sum(1 for r in server_stalls if r.reused is False)}")
        if server_stalls:
            t0 = min(r.t.get("start", 0) for r in server_stalls)
            during = [c for c in canaries if c.t.get("start", 0) >= t0]
            ok = [c for c in during if c.outcome == "ok"]
            if during:
                lat = sorted((phase_ns(c.t, "e2e") or 0) / 1e6 for c in ok)
                med = lat[len(lat) // 2] if lat else None
                quick = med is not None and med < after_s * 1000
                text = (f"canaries (fresh connection, short prompt) sent after the first stalled request: "
                        f"{len(ok)}/{len(during)} succeeded" + (f", median {med:.0f} ms" if med is not None else ""))
                if ok and len(ok) == len(during) and quick:
                    text += ": the server is up and the hang depends on the agents' state"
                elif ok and not quick:
                    text += ": canaries were slow too, so the server is slow for everyone, not only for these agents"
                elif not ok:
                    text += ": the server is not answering anyone"
                ev.append(text)
        if pool_stalls:
            ev.append(f"{len(pool_stalls)} more request(s) stalled in pool_wait behind them: the stalled requests "
                      f"held the pool's connections (limit {limit}, up to {waiters_max} waiters)")
        gave_up = sum(1 for r in server_stalls if r.outcome == "stalled")
        later_ok = sum(1 for r in server_stalls if r.outcome == "ok")
        ended = Counter(r.error for r in server_stalls if r.outcome == "error")
        ev.append(f"{gave_up} stalled request(s) were given up after give_up_s; {later_ok} finished late"
                  + (f"; {sum(ended.values())} were ended by the other side ("
                     + ", ".join(f"{k} x{n}" for k, n in ended.most_common()) + ")" if ended else ""))
        ev.extend(target_evidence(data, server_stalls))  # what the router/engine metrics said meanwhile
        return v

    if pool_explains:
        affected = {r.agent for r in (pool_stalls or queued)}
        first_round = min(r.round for r in (pool_stalls or queued))
        v.update(kind="client_pool", phase="pool_wait", first_round=first_round, agents_affected=len(affected),
                 summary=(f"client pool exhausted: requests waited for a free connection (limit {limit}), "
                          f"pool_wait p90 {pw90:.0f} ms of e2e p90 {e2e90:.0f} ms; the server was not the bottleneck"))
        ev.append(f"up to {waiters_max} request(s) queued for a connection at limit {limit}")
        leak = [s for s in samples if s.get("pool", {}).get("waiters", 0) > 0
                and s["pool"].get("in_use", 0) > sum(n for ph, n in (s.get("inflight") or {}).items() if ph != "pool_wait")]
        if leak:
            ev.append(f"in {len(leak)} sample(s) more connections were in use than requests were using them: "
                      f"connections leaked (responses not read to the end or not released)")
        ev.append(f"{len(queued)} of {len(recs)} requests waited in the pool; pool_wait p90 {pw90:.0f} ms")
        if pool_stalls:
            ev.append(f"{len(pool_stalls)} request(s) stalled in pool_wait (no connection for stall.after_s)")
        ttfb = [(phase_ns(r.t, 'ttfb') or 0) / 1e6 for r in recs if r.outcome == "ok"]
        ev.append(f"once sent, the server answered: ttfb p50 {_pct(ttfb, 0.5):.0f} ms")
        return v

    if connects and len(connects) >= ERROR_SHARE * len(recs):
        v.update(kind="connect", phase="connect", first_round=min(r.round for r in connects),
                 agents_affected=len({r.agent for r in connects}),
                 summary=f"connections failed: {len(connects)} of {len(recs)} requests could not connect")
        ev.append(f"errors: {dict(Counter(r.error for r in connects))}")
        return v

    stale = [r for r in disconnects if r.reused and "headers" not in r.t]
    # A POST lost on a stale keep-alive connection is not retried by aiohttp: every one is an
    # agent request that failed for nothing, so any number of them is worth a verdict.
    if disconnects and (stale or len(disconnects) >= max(1, ERROR_SHARE * len(recs))):
        mid = [r for r in disconnects if "headers" in r.t]
        first = min(r.round for r in disconnects)
        phase = "stream" if len(mid) >= len(stale) else "send"
        v.update(kind="disconnects", phase=phase, first_round=first,
                 agents_affected=len({r.agent for r in disconnects}),
                 summary=(f"the server closed connections: {len(disconnects)} of {len(recs)} requests failed "
                          f"({len(mid)} mid-response, {len(stale)} on a stale keep-alive connection before any answer)"))
        ev.append(f"errors: {dict(Counter(r.error for r in disconnects))}")
        if stale:
            ev.append(f"{len(stale)} POST(s) on a reused keep-alive connection closed before headers: aiohttp does "
                      f"not retry these; the server's keep-alive timeout is shorter than the client's "
                      f"({(data.meta.get('scenario', {}).get('client', {}) or {}).get('keepalive_timeout')} s)")
        return v

    if http_errors and len(http_errors) >= max(1, ERROR_SHARE * len(recs)):
        by_round = Counter(r.round for r in http_errors)
        first = min(by_round)
        v.update(kind="server_errors", phase="ttfb", first_round=first,
                 agents_affected=len({r.agent for r in http_errors}),
                 summary=(f"server errors: {len(http_errors)} of {len(recs)} requests answered with errors "
                          f"({', '.join(f'{k} x{n}' for k, n in Counter(r.error for r in http_errors).most_common())}), "
                          f"first in round {first}"))
        ev.append("errors by round: " + ", ".join(f"round {k}: {n}" for k, n in sorted(by_round.items())))
        ev.append(f"sample message: {http_errors[0].error_msg}")
        return v

    # A run killed while requests hung has no record of them: the last sample still knows.
    last_stalled = next((s.get("stalled_by") for s in reversed(samples) if "stalled_by" in s), None)
    if last_stalled and not data.meta.get("ended", True):
        (rnd, phase), n = max(((tuple(k.split("/")), n) for k, n in last_stalled.items()), key=lambda x: x[1])
        total = sum(last_stalled.values())
        kind = "client_pool" if phase == "pool_wait" else "server_stall"
        v.update(kind=kind, phase=phase, first_round=min(int(k.split("/")[0]) for k in last_stalled),
                 agents_affected=total,
                 summary=(f"run killed while {total} request(s) were stalled (most in round {rnd}, {phase}); "
                          f"they left no record, this comes from the last in-flight sample"))
        ev.append("stalled in flight at the last sample: " + ", ".join(
            f"round {k.split('/')[0]} {k.split('/')[1]}: {n}" for k, n in sorted(last_stalled.items())))
        return v

    v["summary"] = (f"healthy: {len(fine)} of {len(recs)} requests completed without a stall over "
                    f"{max(r.round for r in recs)} round(s); no pool queueing that mattered")
    ttft = [((phase_ns(r.t, 'ttfb') or 0) + (phase_ns(r.t, 'ttft') or 0)) / 1e6 for r in fine]
    ev.append(f"time to first token p50 {_pct(ttft, 0.5):.0f} ms, p99 {_pct(ttft, 0.99):.0f} ms")
    if errors:
        ev.append(f"{len(errors)} error(s) below the {ERROR_SHARE:.0%} threshold: {dict(Counter(r.error for r in errors))}")
    if waiters_max:
        ev.append(f"up to {waiters_max} waiter(s) queued for a connection, pool_wait p90 {pw90:.0f} ms")
    return v
