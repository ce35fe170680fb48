"""The verdict's facts: one pass over the records (`FactsAccumulator`: the troubled records kept, the
fine ones tallied in bounded structures), then what every rule reads (`Facts`: computed once; the
costlier parts, such as a second pass for the pool beside a stall, only when a rule asks).

This module is the verdict's one door to the router analysis (`agentload.analysis.router`): its
`RouterFacts` (made once by the summary's pass, else here) says which backend served a request, a
finding's backend evidence, the router's in-flight gauges. Rules reach those through `Facts`, never
by importing the router analysis themselves.
"""

from __future__ import annotations

from collections import Counter
from functools import cached_property
from typing import TYPE_CHECKING, Any, Callable

from agentload.analysis.passes import one_pass, order_key
from agentload.analysis.proxies import (
    AdmissionLimit,
    BurstTally,
    FixedTimeout,
    admission_limit,
    fixed_timeout,
    inflight_at,
    quick_refusals,
)
from agentload.analysis.router import (
    RouterFacts as RouterFacts,  # (judge's diagnose takes one too)
)
from agentload.analysis.stats import SparseHistogram, percentiles_ms
from agentload.analysis.tallies import (
    CanaryTally,
    CodeTally,
    FirstSeenCounts,
    ReuseTally,
    SizeCounts,
    Spans,
    TimeCounts,
)
from agentload.analysis.verdict.error_classes import PROTOCOL_ERRORS
from agentload.analysis.verdict.pool import (
    POOL_BEYOND_HELD,
    PoolApart,
    PoolJudgement,
    StallWindows,
    Waited,
    pool_test,
    queued_span,
)
from agentload.analysis.verdict.samples import SampleDigest
from agentload.records import PROBE_KINDS, Record, phase_ns, tool_calls_sendable
from agentload.records.fleet import MIN_NAMED_BACKENDS
from agentload.records.phases import SERVER_PHASES, end_stamp
from agentload.records.record import TRUNCATED

if TYPE_CHECKING:
    from agentload.records.rundir import RunData

MAX_PROBE_RECORDS = 64  # probe records the facts keep (agentload.run.probes sends at most 4 a wave, 5 waves)


class AgentTally:
    """One agent's conversation as the pass saw it: what summary.json's agents and the verdict's
    "stopped" read. Its last request (by round, then call, then the requests' order) is kept as
    a record only when it went wrong; otherwise its round and tool calls are enough."""

    __slots__ = ("requests", "ok_rounds", "_fine", "stalls", "last_order", "last", "last_round", "last_tools",
                 "last_finish", "last_tokens", "last_end", "gaps")

    def __init__(self) -> None:
        self.requests = 0
        self.ok_rounds = Spans()  # rounds with a completed request (late ones too)
        self._fine: Spans | None = None  # rounds completed without a stall, once they differ from ok_rounds
        self.stalls = 0
        self.last_order: tuple[Any, ...] = ()  # (round, call, order_key) of the last request
        self.last: Record | None = None
        self.last_round = 0
        self.last_tools = 0
        self.last_finish: str | None = None  # the last request's finish_reason
        self.last_tokens = 0  # ... and its token chunks
        self.last_end = 0  # ... and its end stamp
        # `agentload proxy` only (records with `down_start`): the harness's gaps between an answer and
        # its next round's request, ns (a conversation's own rhythm)
        self.gaps: list[int] | None = None

    def completed(self, rnd: int, stalled: bool) -> None:
        """A request of round `rnd` completed (after a stall, or not)."""
        if stalled and self._fine is None and rnd not in self.ok_rounds:
            self._fine = Spans()  # from here on the two differ: keep the fine rounds apart
            for lo, hi in zip(self.ok_rounds.lo, self.ok_rounds.hi):
                self._fine.lo.append(lo)
                self._fine.hi.append(hi)
        self.ok_rounds.add(rnd)
        if not stalled and self._fine is not None:
            self._fine.add(rnd)

    def saw(self, r: Record, key: tuple[int, int], keep: bool) -> None:
        """`r` (at `key` in the requests' order) may be the agent's last request: by round, then call,
        then that order. Keeps it as a record only when `keep` (it went wrong), and in `agentload proxy`
        the harness's gap before it when it opened the next round."""
        order = (r.round, r.call, key)
        if order < self.last_order:
            return
        t = r.t
        down = t.get("down_start")
        if down is not None and self.last_end and r.round == self.last_round + 1:
            if self.gaps is None:
                self.gaps = []
            self.gaps.append(down - self.last_end)
        self.last_end = t.get("end") or self.last_end
        self.last_order, self.last = order, (r if keep else None)
        self.last_round, self.last_tools, self.last_finish, self.last_tokens = (r.round, r.tool_calls, r.finish_reason,
                                                                                r.token_chunks)

    @property
    def fine_rounds(self) -> Spans:
        """Rounds with a request that completed without a stall."""
        return self.ok_rounds if self._fine is None else self._fine

    def ended_without_tool_call(self, max_rounds: int) -> bool:
        """In mode model: its last request completed before the last round with no tool call, so the
        agent had nothing to go on with (agent.run_agent ends the conversation there). An answer with
        tool-call problems is `ended_on_tool_call_problems`'s."""
        return ((self.last is None or (self.last.outcome == "ok" and not self.last.tool_call_problems))
                and self.last_tools == 0 and 0 < self.last_round < max_rounds)

    def ended_on_tool_call_problems(self, max_rounds: int) -> bool:
        """In mode model: its last request completed before the last round with tool calls that could
        not be sent back as they came (or cut by max_tokens with none), so agent.run_agent ended the
        conversation there."""
        last = self.last
        return (last is not None and last.outcome == "ok" and bool(last.tool_call_problems)
                and (not tool_calls_sendable(last.tool_call_problems) or self.last_tools == 0)
                and 0 < self.last_round < max_rounds)


def token_pace_ns(r: Record) -> int | None:
    """The time one token chunk took after the first, over the answer (its end less its first
    token, over the chunks after the first): None under two token chunks."""
    n = r.token_chunks
    t = r.t
    if n < 2 or "first_token" not in t or "end" not in t:
        return None
    return (t["end"] - t["first_token"]) // (n - 1)


def _troubled(r: Record) -> bool:
    """A request the verdict may quote: it stalled, did not complete, or carried malformed events."""
    return bool(r.stalled_phase) or r.outcome != "ok" or bool(getattr(r, "bad_events", 0))


def is_truncated(problems: list[str] | None) -> bool:
    """Tool-call problems that include an answer cut by max_tokens."""
    return any(p.startswith(TRUNCATED + ":") for p in problems or ())


class FactsAccumulator:
    """The verdict's facts from one pass over the records (`add` each, then `Facts(data, acc)`).

    Keeps the troubled records themselves (stalled, failed, cut short, malformed: what the
    evidence quotes) and the canaries; of the fine ones only counts, histograms (pool_wait,
    e2e, ttfb, time to first token), each prompt size's count, and per agent its rounds and its
    last request (`AgentTally`)."""

    def __init__(self, t0_ns: int = 0) -> None:
        self.seq = 0
        self.requests = 0
        self.agent_state: dict[int, AgentTally] = {}
        self.max_round: int | None = None
        self._troubled: list[tuple[tuple[int, int], Record]] = []
        self.canary = CanaryTally()  # completed canaries as (start, e2e), the others as records
        self.fine = 0
        self.fine_prompts = SizeCounts()
        self.with_token = 0
        self.no_token_finish = FirstSeenCounts()
        self.pool_wait = SparseHistogram()
        self.e2e_ok = SparseHistogram()
        self.ttfb_ok = SparseHistogram()
        self.to_token = SparseHistogram()
        self.timing = SparseHistogram()  # first token seen - the server's own send stamp, where it sent one
        # completed answers (stalled on the way or not): sent -> first token, and the time a token
        # chunk took after the first (the server's pace as every agent met it)
        self.ok_to_token = SparseHistogram()
        self.pace = SparseHistogram()
        self.ok_servers: Counter[str] = Counter()  # the Server headers of completed answers (the first 5 kinds)
        self.bursts = BurstTally()  # answers whose tokens came in bursts (a buffering proxy)
        self.waited = Waited()
        self.troubled: list[Record] = []  # in the requests' order, once closed
        self.min_start: int | None = None  # the first start and the last end of any request (canaries too)
        self.max_end: int | None = None
        self.backends: set[str] = set()  # backend names the records gave (the first MIN_NAMED_BACKENDS)
        # completed agent requests by the backend their records name, over time (when they ended): which
        # backends answered while others' requests waited (t0: run.json's t0_ns, the cells' origin)
        self.done_on = TimeCounts(t0_ns)
        self.conns = ReuseTally()  # agent requests on new and on reused connections
        self.fine_server_prompt_max: int | None = None  # the largest prompt that completed, by the server's count
        self._probes: list[tuple[tuple[int, int], Record]] = []
        self.probes: list[Record] = []  # the stall probes' records, in the requests' order once closed
        self.protocol = CodeTally()  # agent records with `protocol` notes (events after [DONE], ...)
        self.truncated = CodeTally()  # agent records with tool-call problems, one of them `truncated`
        self.malformed = CodeTally()  # ... and the others
        # (agent, conversation, round) of completed retries (call > 0): did a round that failed end well?
        # At most one per failed request, so bounded by the troubled records.
        self.retried_ok: set[tuple[int, int, int]] = set()
        self._closed = False

    @classmethod
    def for_run(cls, data: "RunData | None") -> "FactsAccumulator":
        """An accumulator for `data`'s records (its time counts from run.json's t0_ns; 0 without data)."""
        return cls(int(data.meta.get("t0_ns") or 0) if data is not None else 0)

    def add(self, r: Record) -> None:
        self.seq += 1
        key = order_key(r, self.seq)
        self._extend_run(r)
        if r.kind == "canary":
            self.canary.add(r, key)
        elif r.kind in PROBE_KINDS:  # a stall wave's probes: a few requests per wave, a few waves a run
            if len(self._probes) < MAX_PROBE_RECORDS:
                self._probes.append((key, r))
        elif r.kind == "agent":
            self._add_agent_request(r, key)

    def _extend_run(self, r: Record) -> None:
        """The run's first start and last end (any request's, canaries too) and the backends named."""
        t = r.t
        s = t.get("start")
        if s is not None:
            self.min_start = s if self.min_start is None else min(self.min_start, s)
        e = end_stamp(t) if t else None
        if e is not None:
            self.max_end = e if self.max_end is None else max(self.max_end, e)
        if r.backend is not None and len(self.backends) < MIN_NAMED_BACKENDS:
            self.backends.add(r.backend)

    def _add_agent_request(self, r: Record, key: tuple[int, int]) -> None:
        """An agent's request: its agent's tally, the troubled records, then its timings."""
        self.requests += 1
        self.max_round = r.round if self.max_round is None else max(self.max_round, r.round)
        self.conns.add(r)
        st = self.agent_state.get(r.agent)
        if st is None:
            st = self.agent_state[r.agent] = AgentTally()
        st.requests += 1
        if r.protocol:
            self.protocol.add(r, r.protocol)
        problems = r.tool_call_problems
        if problems:
            (self.truncated if is_truncated(problems) else self.malformed).add(r, problems)
        bad = _troubled(r)
        if bad:
            self._troubled.append((key, r))
        if r.stalled_phase:
            st.stalls += 1
        ok = r.outcome == "ok"
        if ok:
            st.completed(r.round, bool(r.stalled_phase))
            if r.backend is not None and "end" in r.t:
                self.done_on.add(r.backend, r.t["end"])
            if r.call:
                self.retried_ok.add((r.agent, r.conversation, r.round))
        st.saw(r, key, keep=bad or bool(problems))
        self._add_timings(r, ok)
        if ok and not r.stalled_phase:
            self._add_fine(r, key)

    def _add_timings(self, r: Record, ok: bool) -> None:
        """Every request's pool wait and timing error; a completed answer's latencies, pace and Server."""
        t = r.t
        ns = phase_ns(t, "pool_wait", r.reused)
        if ns is not None:
            self.pool_wait.record_ns(ns)
        if "queued_start" in t:
            self.waited.add(r)
        if ok:
            self._add_answered(r)
        if r.server_first_token_ns is not None and "first_token" in t:
            self.timing.record_ns(t["first_token"] - r.server_first_token_ns)

    def _add_answered(self, r: Record) -> None:
        """A completed answer (stalled on the way or not): e2e, ttfb, first token, pace, Server, bursts."""
        t = r.t
        ns = phase_ns(t, "e2e")
        if ns is not None:
            self.e2e_ok.record_ns(ns)
        ns = phase_ns(t, "ttfb")
        if ns is not None:
            self.ttfb_ok.record_ns(ns)
        srv = r.server
        if srv is not None and (srv in self.ok_servers or len(self.ok_servers) < 5):
            self.ok_servers[srv] += 1
        self.bursts.add(r)
        ft = t.get("first_token")
        if ft is not None:
            if "sent" in t:
                self.ok_to_token.record_ns(ft - t["sent"])
            pace = token_pace_ns(r)
            if pace is not None:
                self.pace.record_ns(pace)

    def _add_fine(self, r: Record, key: tuple[int, int]) -> None:
        """A request that completed without a stall: counted, its prompt size, its first token."""
        t = r.t
        self.fine += 1
        self.fine_prompts.add(r.prompt_tokens)
        sp = r.server_prompt_tokens
        if sp is not None and (self.fine_server_prompt_max is None or sp > self.fine_server_prompt_max):
            self.fine_server_prompt_max = sp
        if "first_token" in t:
            self.with_token += 1
            if "sent" in t:
                self.to_token.record_ns(t["first_token"] - t["sent"])
        else:
            self.no_token_finish.add(str(r.finish_reason), key)

    def close(self) -> FactsAccumulator:
        """Puts what was kept in the requests' order (as the records sorted by start)."""
        if not self._closed:
            self._troubled.sort(key=lambda x: x[0])
            self.troubled = [r for _, r in self._troubled]
            self._troubled = []
            self._probes.sort(key=lambda x: x[0])
            self.probes = [r for _, r in self._probes]
            self.canary.close()
            self._closed = True
        return self


class Facts:
    """What every rule reads, computed once from the run folder's data: from the accumulator
    of the report's one pass over the records, or (without one) from a pass of its own. `router`:
    the fleet behind a router as the router analysis gives it (made here when not given)."""

    def __init__(self, data: RunData, acc: FactsAccumulator | None = None, router: RouterFacts | None = None) -> None:
        if acc is None:
            acc = FactsAccumulator.for_run(data)
            one_pass(data, [acc])
        acc.close()
        self.acc = acc
        self.data = data
        self.router = router if router is not None else RouterFacts(data)
        self.meta = data.meta
        sc = data.meta.get("scenario") or {}
        self.scenario = sc
        self.requests = acc.requests  # agent requests
        self.canary = acc.canary
        self.samples = data.samples
        self.agents = set(acc.agent_state)
        self.after_s = float((sc.get("stall") or {}).get("after_s") or 10.0)
        self.limit = (sc.get("client") or {}).get("limit", 0)
        troubled = acc.troubled
        self.stalled = [r for r in troubled if r.stalled_phase]
        self.errors = [r for r in troubled if r.outcome == "error"]
        # ... but those that stalled at the server first: that stall's finding tells how they ended
        self.errors_apart = [r for r in self.errors if r.stalled_phase not in SERVER_PHASES]
        # requests that completed but carried malformed events
        self.odd = [r for r in troubled if getattr(r, "bad_events", 0) and r.error not in PROTOCOL_ERRORS]
        self.fine = acc.fine  # how many completed without a stall
        self.fine_prompts = acc.fine_prompts
        # aiohttp's connect timeout also covers the wait for a pool slot: one that fired while
        # the request was still queued is the pool's, not the network's. A waiter woken for a slot
        # another request took first queues again (aiohttp's connector loops): its last
        # queued_start is then after its queued_end, and it was still queued when it timed out
        # (100,000 agents on a pool of 100: 80 such, once called connection failures)
        self.pool_timeouts = [r for r in self.errors if r.error == "connect_timeout" and "queued_start" in r.t
                              and ("queued_end" not in r.t or r.t["queued_end"] < r.t["queued_start"])]
        self.server_stalls = [r for r in self.stalled if r.stalled_phase in SERVER_PHASES]
        self.pool_stalls = [r for r in self.stalled if r.stalled_phase == "pool_wait"]
        sd = SampleDigest(self.samples)  # one walk of the samples (streamed from disk)
        self.sample_digest = sd
        self.n_samples = sd.n
        # samples whose pool state could be read (an aiohttp whose internals changed leaves it "unknown")
        self.pool_samples = sd.pool
        self.waiters_max = sd.waiters_max
        self.max_lag = max(sd.max_lag, self.meta.get("max_loop_lag_ms") or 0.0)
        # the last record of each agent, where it went wrong: what its conversation ended on
        self.last = {a: st.last for a, st in acc.agent_state.items() if st.last is not None}
        self.waited = acc.waited
        # mode model: agents whose model answered without a tool call before the last round, with
        # that round, the answer's finish_reason and its token chunks (their conversation could not go on)
        self.max_rounds = int((sc.get("agents") or {}).get("rounds") or 0)
        self.model_mode = (sc.get("conversation") or {}).get("mode") == "model"
        crashed = {c.get("agent") for c in self.meta.get("crashes") or [] if c.get("where") == "agent"}
        self.no_tool_call: dict[int, tuple[int, str | None, int]] = {
            a: (st.last_round, st.last_finish, st.last_tokens) for a, st in acc.agent_state.items()
            if self.model_mode and a not in crashed and st.ended_without_tool_call(self.max_rounds)}
        # mode model: agents whose conversation ended on an answer with tool-call problems (its record)
        self.tool_call_stopped: dict[int, Record] = {
            a: st.last for a, st in acc.agent_state.items()
            if self.model_mode and a not in crashed and st.last is not None
            and st.ended_on_tool_call_problems(self.max_rounds)}

    def stopped_by(self, pred: Callable[[Record], bool]) -> set[int]:
        """Agents whose last request failed in a way `pred` accepts (their conversation ended there)."""
        return {a for a, r in self.last.items() if r.outcome in ("error", "stalled") and pred(r)}

    def fine_rounds_before(self, agent: int, rnd: int) -> int:
        """How many rounds before `rnd` the agent completed without a stall."""
        st = self.acc.agent_state.get(agent)
        return st.fine_rounds.count_below(rnd) if st is not None else 0

    @cached_property
    def attribution(self) -> dict[int, tuple[str | None, str | None]]:
        """The backend (and in PD mode the prefill worker) of every troubled record: its own
        `backend`, else the backend logs' line with its request id (read once, for these only)."""
        return self.router.attribute(self.acc.troubled)

    def backend_lines(self, bad: list[Record], what: str) -> list[str]:
        """Which backend(s) served `bad` (the requests a finding is about), and the scheduled fault there."""
        return self.router.backend_lines(bad, what, self.attribution, len(self.acc.backends))

    @property
    def backends_known(self) -> bool:
        """Whether the run can tell which backend served a request: a fleet, or records naming several."""
        return bool(self.meta.get("fleet")) or len(self.acc.backends) >= MIN_NAMED_BACKENDS

    def backends_of(self, records: list[Record]) -> dict[int, str | None]:
        """{id(record): the backend that served it} for a few records (the stall probes)."""
        return {k: v[0] for k, v in self.router.attribute(records).items()}

    def router_inflight(self) -> list[dict[str, Any]]:
        """The router's in-flight gauges at its last scrape against agentload's own requests (`leaked`)."""
        return self.router.inflight(self.acc.min_start, self.acc.max_end)

    @cached_property
    def stall_windows(self) -> StallWindows | None:
        """When requests stalled at the server held connections (None without a server stall)."""
        return StallWindows(self.server_stalls) if self.server_stalls else None

    def behind_stall(self, r: Record) -> bool:
        """`r` queued for a connection inside a stall window: it waited for one a stalled request held."""
        w = self.stall_windows
        q = queued_span(r.t) if w is not None else None
        return q is not None and w is not None and w.touches(*q)

    @cached_property
    def pool_apart(self) -> PoolApart | None:
        """The pool's figures apart from the stall (None without a server stall or a request that queued)."""
        w = self.stall_windows
        return PoolApart(self.data, w) if w is not None and len(self.waited) else None

    @cached_property
    def queue_beyond_stall(self) -> float | None:
        """How many times the connection-time the stalled requests held the requests spent queued in
        the stall windows, where that is at least POOL_BEYOND_HELD (the pool was short of connections
        whatever the stall held); else None."""
        pa, w = self.pool_apart, self.stall_windows
        if pa is None or w is None or not w.held_ns:
            return None
        ratio = pa.queued_ns / w.held_ns
        return ratio if ratio >= POOL_BEYOND_HELD else None

    @cached_property
    def pool(self) -> PoolJudgement | None:
        """The pool rule's judgement on the requests no server stall explains (None: the pool is not a
        finding): the whole run without a stall; beside one, the requests outside its windows, else
        (when requests spent far longer queued in the windows than the stalled requests held
        connections) every request. The requests that stalled or timed out queued inside the windows
        stay the stall's either way."""
        if self.stall_windows is None:
            return pool_test("run", self.acc.pool_wait, self.acc.e2e_ok, self.waited, self.requests,
                             self.pool_stalls, self.pool_timeouts)
        pa = self.pool_apart
        if pa is None:  # a server stall, and no request queued at all
            return None
        stalls = [r for r in self.pool_stalls if not self.behind_stall(r)]
        timeouts = [r for r in self.pool_timeouts if not self.behind_stall(r)]
        apart = pool_test("apart", pa.pool_wait, pa.e2e_ok, pa.waited, pa.n, stalls, timeouts)
        if apart is not None or self.queue_beyond_stall is None:
            return apart
        return pool_test("beyond", self.acc.pool_wait, self.acc.e2e_ok, self.waited, self.requests, stalls, timeouts)

    @cached_property
    def proxy_timeout(self) -> FixedTimeout | None:
        """Failures that ended at one fixed duration: a timeout in front of the server (see proxies)."""
        return fixed_timeout(self.errors)

    @cached_property
    def refusals(self) -> list[Record]:
        """503s answered before any work (within REFUSED_WITHIN_MS of the send)."""
        return quick_refusals(self.errors)

    @cached_property
    def admission(self) -> AdmissionLimit | None:
        """A concurrency limit in front: the requests in flight at every quick refusal (one more
        streamed pass over the records, only when there are such refusals)."""
        if len(self.refusals) < 2:
            return None
        return admission_limit(inflight_at(self.data, self.refusals))

    def explained(self) -> set[int]:
        """ids of the failures a layer in front explains (a proxy's timeout, a concurrency limit):
        the error rules leave them to those rules."""
        out = set()
        if self.proxy_timeout is not None:
            out |= self.proxy_timeout.ids
        if self.admission is not None:
            out |= {id(r) for r in self.refusals}
        return out

    @cached_property
    def pool_wait_ms(self) -> tuple[float | None, float | None]:
        pct = percentiles_ms(self.acc.pool_wait, (50, 90)) or {}
        return pct.get(50), pct.get(90)

    @cached_property
    def e2e_ms(self) -> tuple[float | None, float | None]:
        pct = percentiles_ms(self.acc.e2e_ok, (50, 90)) or {}
        return pct.get(50), pct.get(90)
