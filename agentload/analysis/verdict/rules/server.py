"""Rules on the server's side: requests that made no progress past the pool (a stall; a queue in
front of the server's slots; a server slow for everyone but finishing), and a run killed while
requests hung. The stall probes (`probes`) and the canaries (`canaries`) are its evidence."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from agentload.analysis.proxies import fixed_timeout, who_answered
from agentload.analysis.target_evidence import (
    EngineWork,
    engine_queue_evidence,
    engine_work,
    target_evidence,
)
from agentload.analysis.verdict.facts import Facts
from agentload.analysis.verdict.kinds import Finding, Kind
from agentload.analysis.verdict.naming import fmt_counts, fmt_phase_counts
from agentload.analysis.verdict.rules.canaries import canary_evidence
from agentload.analysis.verdict.rules.evidence import threshold_evidence
from agentload.analysis.verdict.rules.probes import probe_reading
from agentload.records import Record, phase_ns
from agentload.records.phases import SERVER_PHASES, end_stamp


@dataclass
class _Stall:
    """A server stall as the rule reads it, before it says anything."""

    st: list[Record]  # the requests stalled at the server
    main_phase: str
    first_round: int
    affected: set[int]  # their agents
    all_finished: bool
    behind: list[Record]  # requests that stalled queued for a connection a stalled request held
    behind_timeouts: list[Record]  # ... and those that timed out queued there
    stopped: set[int]  # agents whose conversation it ended
    work: EngineWork | None  # the engine kept working meanwhile (its own counters)
    queue: bool  # a queue in front of the server's slots, not a hang
    elsewhere: str | None  # why it is no queue although others were answered: they were, on other backends
    slots: int
    thr_text: str | None  # a prompt-size threshold
    thr: int | None
    cause: str | None  # what the probes reproduced (the headline's clause)
    keep_thr: bool  # ... and whether the threshold may still lead it
    probe_ev: list[str]

    @property
    def queued_agents(self) -> set[int]:
        """Agents that only queued behind the stalled requests."""
        return {r.agent for r in self.behind + self.behind_timeouts} - self.affected

    @property
    def kind(self) -> Kind:
        return Kind.SERVER_QUEUE if self.queue else Kind.SERVER_SLOW if self.all_finished else Kind.SERVER_STALL


def rule_server_stall(f: Facts) -> Finding | None:
    """No progress past the pool (ttfb, ttft, stream) for stall.after_s. A request stalled at the
    server holds its connection: with a small pool the requests behind it wait in pool_wait;
    that queue (in the stall's windows) is a consequence, never the cause. Pool queueing the stall
    does not explain is the pool rule's, and this summary then says which is which."""
    s = _read_stall(f)
    if s is None:
        return None
    summary = _stall_headline(f, s) + _pool_clause(f, s)
    fnd = Finding(s.kind, summary, s.main_phase, s.first_round, len(s.affected | s.queued_agents), len(s.stopped))
    fnd.evidence.extend(_stalled_evidence(f, s))
    fnd.evidence.extend(_around_evidence(f, s))
    return fnd


def _read_stall(f: Facts) -> _Stall | None:
    st = f.server_stalls
    if not st:
        return None
    main_phase = Counter(r.stalled_phase for r in st).most_common(1)[0][0]
    assert main_phase is not None  # (server_stalls: every one stalled in a server phase)
    # the requests that queued for a connection a stalled request held, and stalled or timed out there
    behind = [r for r in f.pool_stalls if f.behind_stall(r)]
    behind_timeouts = [r for r in f.pool_timeouts if f.behind_stall(r)]
    theirs = {id(r) for r in behind} | {id(r) for r in behind_timeouts}
    stopped = f.stopped_by(lambda r: r.stalled_phase in SERVER_PHASES or id(r) in theirs)
    thr_text, thr = threshold_evidence(st, f.fine_prompts, "stalled")
    work = None
    if main_phase == "ttfb" and not f.sample_digest.queue:  # the engine's own counters may still show it working
        work = engine_work(f.data, [r for r in st if r.stalled_phase == "ttfb"])
    queue = main_phase == "ttfb" and (f.sample_digest.queue or work is not None)
    elsewhere = _answered_elsewhere(f, [r for r in st if r.stalled_phase == "ttfb"]) if queue else None
    queue = queue and elsewhere is None
    all_finished = all(r.outcome == "ok" for r in st)
    cause, keep_thr, probe_ev = probe_reading(f, st, thr, all_finished)
    return _Stall(st, main_phase, min(r.round for r in st), {r.agent for r in st}, all_finished, behind,
                  behind_timeouts, stopped, work, queue, elsewhere, queue_size(f, work), thr_text, thr, cause, keep_thr,
                  probe_ev)


def _answered_elsewhere(f: Facts, waiting: list[Record]) -> str | None:
    """Requests waited for headers while others were answered: behind a router, were those answered
    by the waiting requests' own backend(s)? When every waiting request's backend is known and, while
    they waited, requests completed on other backends and none on theirs, the answers seen were
    elsewhere: no queue in front of their backend's slots (a hang there). The evidence line; None
    otherwise (unknown backends, or their backend answered too: the queue reading stands)."""
    if not waiting or not f.backends_known:
        return None
    att = f.backends_of(waiting)
    theirs = {att.get(id(r)) for r in waiting}
    if None in theirs:
        return None
    lo = min(r.t.get("sent", r.t.get("start", 0)) for r in waiting)
    hi = max(end_stamp(r.t) for r in waiting)
    done = f.acc.done_on.within(lo, hi)
    others = {b: n for b, n in done.items() if b not in theirs}
    if not others or any(done.get(b) for b in theirs):
        return None
    names = ", ".join(sorted(str(b) for b in theirs))  # (None is not among them: checked above)
    return (f"while the requests waited for headers, {sum(others.values())} request(s) completed on other backends "
            f"({', '.join(f'{b} {n}' for b, n in sorted(others.items()))}) and none on "
            f"{names}, where they went: the answers the samples saw came from elsewhere, so this is no queue in "
            f"front of {names}'s slots")


def _stall_headline(f: Facts, s: _Stall) -> str:
    """What happened (a queue, a slow server, a stall), a size threshold, and what the probes reproduced."""
    st = s.st
    if s.queue:
        gave = sum(1 for r in st if r.outcome == "stalled")
        waited = max(((r.t.get("headers") or r.t.get("end") or 0) - r.t.get("sent", 0) for r in st
                      if r.stalled_phase == "ttfb" and "sent" in r.t), default=0) / 1e9
        summary = (f"server queue: the server works on at most {s.slots} request(s) at once and the others "
                   f"waited for response headers: {len(st)} request(s) of {len(s.affected)} agents waited over "
                   f"stall.after_s ({f.after_s:g} s) from round {s.first_round} on"
                   + (f", all answered in the end (longest wait {waited:.1f} s)" if s.all_finished else
                      f"; {gave} given up after stall.give_up_s, {len(s.stopped)} agent(s) stopped"))
    elif s.all_finished:
        worst = max((phase_ns(r.t, "e2e") or 0) for r in st) / 1e9
        summary = (f"server slow, not hung: {len(st)} request(s) of {len(s.affected)} agents made no "
                   f"progress in {s.main_phase} for over stall.after_s from round {s.first_round} on, but all "
                   f"finished (slowest {worst:.1f} s)")
    else:
        summary = (f"server stall: {len(s.affected)} of {len(f.agents)} agents stopped making progress in "
                   f"{s.main_phase} from round {s.first_round} on")
    if s.thr is not None and s.keep_thr:  # (a correlation the probes contradict never leads)
        summary += f", every request at or above {s.thr:,} prompt tokens stalled"
    if s.cause:
        summary += f"; {s.cause}"
    return summary


def _pool_clause(f: Facts, s: _Stall) -> str:
    """Whether the client pool is part of it: never the cause; the queue behind the stalled requests
    is a consequence; queueing the stall does not explain is the pool rule's (see client_pool)."""
    queued_agents = s.queued_agents
    try:
        pool = f.pool  # the pool's own finding, beside this one
    except Exception:  # the pool rule reports its own failure (agentload_error); the stall still stands
        pool = None
    if pool is None:
        if not queued_agents:
            return "; the client pool is not the cause"
        return (f"; they held the client pool's connections, so {len(queued_agents)} more agent(s) queued "
                f"behind them (a consequence, not the cause)")
    clause = "; the client pool is not the cause of the stall"
    if queued_agents:
        clause += f" ({len(queued_agents)} more agent(s) queued behind it, a consequence)"
    if pool.scope == "apart":
        return clause + ", but it queued requests outside the stall too: see client_pool"
    return clause + ", but it queued far more requests than the stalled ones held connections: see client_pool"


def _stalled_evidence(f: Facts, s: _Stall) -> list[str]:
    """What stalled: by round and phase, the queue, the backends, the prompt sizes, the probes, the
    rounds each agent completed before, the SSE comments that still came."""
    st = s.st
    ev = [f"stalled requests by round and phase: {fmt_phase_counts(Counter((r.round, r.stalled_phase) for r in st))}"]
    if s.queue:
        ev.extend(queue_evidence(f, s.work, s.slots))
    elif s.elsewhere:
        ev.append(s.elsewhere)
    ev.extend(f.backend_lines(st, "stalled"))  # the backend(s) behind a router, where records or logs say it
    if s.thr_text:
        ev.append(s.thr_text + ("" if s.keep_thr else "; a correlation only: the probes contradict it"))
    ev.extend(s.probe_ev)
    first_stall: dict[int, int] = {}
    for r in st:
        first_stall[r.agent] = min(first_stall.get(r.agent, r.round), r.round)
    before = [f.fine_rounds_before(a, rnd) for a, rnd in first_stall.items()]
    if before and min(before) > 0:
        lo, hi = min(before), max(before)
        ev.append(f"each affected agent completed {lo if lo == hi else f'{lo}-{hi}'} round(s) before its first stall")
    pings = sum(r.comments for r in st)
    if pings:
        ev.append(f"{pings} SSE comment(s) (': ping') arrived on stalled requests: bytes flowed, tokens did not")
    return ev


def _around_evidence(f: Facts, s: _Stall) -> list[str]:
    """What happened around it: the pool meanwhile, the connections, the canaries, the requests queued
    behind, how the stalled requests ended (a proxy's timeout?), the router's and engine's metrics."""
    st = s.st
    ev: list[str] = []
    sd = f.sample_digest
    stalled_samples, queued = sd.stalled_pool, sd.stalled_pool - sd.stalled_free
    if stalled_samples and not queued:
        ev.append(f"the pool had no waiters queued in any of the {stalled_samples} samples taken while requests "
                  f"were stalled (limit {f.limit or 'unlimited'})")
    elif stalled_samples:
        ev.append(f"the pool had waiters queued in {queued} of {stalled_samples} samples taken while requests "
                  f"were stalled (max {sd.stalled_waiters_max}; limit {f.limit or 'unlimited'}, of which the "
                  f"stalled requests held up to {f.stall_windows.max_held if f.stall_windows else 0})")
    ev.append(f"stalled requests on reused keep-alive connections: {sum(1 for r in st if r.reused)}, on new "
              f"connections: {sum(1 for r in st if r.reused is False)}")
    ev.extend(canary_evidence(f, min(r.t.get("start", 0) for r in st)))
    if s.behind:
        ev.append(f"{len(s.behind)} more request(s) stalled in pool_wait behind them: the stalled requests "
                  f"held the pool's connections (limit {f.limit}, up to {f.waiters_max} waiters)")
    if s.behind_timeouts:
        pt = (f.scenario.get("client") or {}).get("pool_timeout_s")
        ev.append(f"{len(s.behind_timeouts)} request(s) queued behind them timed out waiting for a connection "
                  f"(client.pool_timeout_s = {pt})")
    ev.extend(_how_they_ended(f, st))
    ev.extend(target_evidence(f.data, st))  # what the router/engine metrics said meanwhile
    return ev


def _how_they_ended(f: Facts, st: list[Record]) -> list[str]:
    """Given up, finished late, or ended by the other side (at one fixed duration: a proxy's timeout)."""
    gave_up = sum(1 for r in st if r.outcome == "stalled")
    later_ok = sum(1 for r in st if r.outcome == "ok")
    ended = Counter(r.error for r in st if r.outcome == "error")
    ev = [f"{gave_up} stalled request(s) were given up after give_up_s; {later_ok} finished late"
          + (f"; {sum(ended.values())} were ended by the other side ({fmt_counts(ended)})" if ended else "")]
    ft = fixed_timeout([r for r in st if r.outcome == "error"], stalled=True) if ended else None
    if ft is not None:  # a proxy's timeout longer than stall.after_s ended them
        who = who_answered(ft.records, f.acc.ok_servers).name()
        ev.append(f"{len(ft.records)} of those ended {ft.seconds:.2f} s after "
                  + " or ".join(how for how, _ in ft.after.most_common())
                  + f" (within {ft.hi_ms - ft.lo_ms:.0f} ms of each other)" + (f", by {who}" if who else "")
                  + ": a timeout in front of the server (nginx: proxy_read_timeout; haproxy: timeout server) "
                    "ended what the server never answered")
    return ev


def queue_size(f: Facts, work: EngineWork | None = None) -> int:
    """How many requests the server works on at once: llama.cpp's slots (/props total_slots), else
    the engine's most running while requests waited, else the most past headers in the samples."""
    props = f.meta.get("server_props") or {}
    if isinstance(props.get("total_slots"), int) and props["total_slots"] > 0:
        return int(props["total_slots"])
    if work is not None:
        return int(work.running_max)
    return f.sample_digest.past_at_waits_max


def queue_evidence(f: Facts, work: EngineWork | None = None, slots: int | None = None) -> list[str]:
    """Why requests that waited for headers are a queue: the samples taken meanwhile (or the engine's
    own work counter, when the samples saw no answer move: a slow prompt holds every slot), and the
    engine's own counts (llama.cpp's busy slots and deferred requests) where they were scraped."""
    sd = f.sample_digest
    slots = slots if slots is not None else queue_size(f, work)
    ev = [f"in {sd.waits_served} of {sd.waits} one-second sample(s) taken while requests waited for headers past "
          f"stall.after_s, the server was answering others (up to {sd.past_at_waits_max} past headers, up to "
          f"{sd.waiting_max} waiting for headers; at most {sd.past_headers_max} past headers at any sample of the "
          f"run), and {sd.completed_during_waits} request(s) completed meanwhile"
          + (f": a queue in front of the server's {slots} slot(s), not a hang" if work is None else "")]
    if work is not None:
        ev.append(f"while they waited, the engine kept working: {work.counter} grew by {work.grew:g} over "
                  f"{work.scrapes} scrapes of {work.url}, with up to {work.running_max:g} running and "
                  f"{work.waiting_max:g} waiting: a queue in front of the server's {slots} slot(s), not a hang "
                  f"(the requests it worked on were slow themselves)")
    engine = engine_queue_evidence(f.data.target_metrics)
    ev.extend(engine)
    props = f.meta.get("server_props") or {}
    if isinstance(props.get("total_slots"), int):
        ev.append(f"llama.cpp's /props: total_slots = {props['total_slots']} (llama-server --parallel): the server "
                  f"works on at most that many requests at once")
        if not engine:
            ev.append("its own count of the queue is in llama-server's /metrics (llamacpp:requests_processing, "
                      "llamacpp:requests_deferred): "
                      + ("add it to [target] metrics_urls" if props.get("endpoint_metrics") else
                         "start llama-server with --metrics and add it to [target] metrics_urls"))
    ev.append("each waiting request holds its connection and waits for a free slot: more slots (llama-server "
              "--parallel, vLLM --max-num-seqs), fewer agents, or a stall.after_s above the queue's wait if the "
              "queue is what was meant")
    return ev


def rule_killed_while_stalled(f: Facts) -> Finding | None:
    """A run killed while requests hung has no record of them: the last sample still knows. Requests
    stalled at the server hold their connections: those stalled in pool_wait beside them queued
    behind them (however many more they were), so the server's phase is named whenever there is one."""
    if f.meta.get("ended", True):
        return None
    last_stalled = f.sample_digest.last_stalled_by
    if not last_stalled:
        return None
    stalls = [(tuple(k.split("/")), n) for k, n in last_stalled.items()]
    at_server = [x for x in stalls if x[0][1] in SERVER_PHASES]
    (rnd, phase), _ = max(at_server or stalls, key=lambda x: x[1])
    total = sum(last_stalled.values())
    queued = sum(n for (_, ph), n in stalls if ph == "pool_wait")
    if at_server and queued:
        what = (f"{total - queued} request(s) were stalled at the server (most in round {rnd}, {phase}) and "
                f"{queued} more queued in pool_wait behind them")
    else:
        what = f"{total} request(s) were stalled (most in round {rnd}, {phase})"
    return Finding(Kind.SERVER_STALL if at_server else Kind.CLIENT_POOL,
                   f"run killed while {what}; they left no record, this comes from the last in-flight sample",
                   phase, min(int(k.split("/")[0]) for k in last_stalled), total, total,
                   ["stalled in flight at the last sample: " + ", ".join(
                       f"round {k.split('/')[0]} {k.split('/')[1]}: {n}" for k, n in sorted(last_stalled.items()))])
