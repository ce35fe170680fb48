"""Per-agent outcomes and the verdict: a pure function over records, samples and run.json.

The verdict is an ordered list of small rules (`RULES`). Each reads the run's facts (`Facts`,
computed once, from `FactsAccumulator`: one pass over the records that keeps the troubled records
and bounded tallies of the fine ones) and returns a `Finding` or None. Every finding is kept: the one that stopped the
most agents leads the verdict, ties go to the rule listed first, and the others follow as
secondary findings. The verdict fails closed: it is `healthy` only when no rule found anything,
and a rule that could not be computed is itself a finding (`agentload_error`), never a pass.

No finding switches another off: each rule judges the requests the others do not explain. A
server stall explains the requests that queued for a connection a stalled request held, in its
window (`StallWindows`), and how the requests it stalled ended; the pool rule judges the queueing
outside those windows, or all of it when the queue there was far longer than what the stalled
requests held (`judge_pool`); canaries that failed outside the windows are a finding of their own.

Kinds are the `Kind` enumeration; docs/verdicts.md lists every kind (tests/test_rules.py keeps the two equal).

Size: over 2,000 lines (facts, ~20 rules, naming helpers) because issues 27, 32 and 33 landed
rules here in parallel; splitting it into a package (facts / rules / naming) is issue 28's next step,
done in one pass so no rule moves while another is being written.
"""

from __future__ import annotations

import bisect
import re
import traceback
from collections import Counter
from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property
from typing import TYPE_CHECKING, Any, Callable, Iterable

from agentload.endpoint import api_url, base_path, with_version
from agentload.records import PROBE_KINDS, Record, phase_at, phase_ns, tool_calls_sendable
from agentload.records.record import TRUNCATED
from agentload.records.overflow import overflow
from agentload.records.fleet import MIN_NAMED_BACKENDS
from agentload.records.phases import SERVER_PHASES, phase_begin
from agentload.analysis.passes import one_pass, order_key
from agentload.analysis.stats import SparseHistogram, band_ranges, fmt_dur as _dur, pct_ms, percentiles_ms, quantile_ms
from agentload.analysis.tallies import CanaryTally, CodeTally, FirstSeenCounts, ReuseTally, SizeCounts, Spans
from agentload.analysis.router import RouterFacts
from agentload.analysis.target_evidence import engine_queue_evidence, engine_work, router_evidence, target_evidence
from agentload.analysis.proxies import (BURST_CHUNKS_PER_READ, BURST_MIN_CHUNKS, BURST_MIN_WAIT_MS, AdmissionLimit,
                                        BurstTally, FixedTimeout, admission_limit, fixed_timeout,
                                        inflight_at, quick_refusals, who_answered)

if TYPE_CHECKING:
    from agentload.records.rundir import RunData


class Kind(str, Enum):
    """What the verdict can say; the value is what summary.json and the report print."""

    HEALTHY = "healthy"
    NO_DATA = "no_data"  # no agent request was recorded
    AGENTLOAD_ERROR = "agentload_error"  # an agent or a background task of agentload crashed
    CLIENT_SATURATED = "client_saturated"  # agentload's own event loop lagged: its timings are suspect
    SERVER_STALL = "server_stall"  # requests made no progress past the pool, and did not all finish
    SERVER_SLOW = "server_slow"  # requests made no progress for a while (or were slow for everyone), but finished
    SERVER_QUEUE = "server_queue"  # requests waited for headers while the server served at most N others
    CLIENT_POOL = "client_pool"  # time lost waiting for a connection from the client's pool
    CONNECT = "connect"  # connections could not be opened
    DISCONNECTS = "disconnects"  # the other side closed connections, mid-answer or stale keep-alive
    RATE_LIMITED = "rate_limited"  # HTTP 429: the server (or a gateway) limited the request rate
    SERVER_ERRORS = "server_errors"  # HTTP errors or in-band error events
    BAD_RESPONSES = "bad_responses"  # answers agentload could not read as the protocol says
    PROTOCOL = "protocol"  # answers read, but the stream broke the protocol around [DONE]
    OTHER_ERRORS = "other_errors"  # request failures of a class no other rule explains
    TRUNCATED = "truncated"  # answers cut by max_tokens (finish_reason length) with a tool call in them or asked for
    MALFORMED_TOOL_CALLS = "malformed_tool_calls"  # tool calls that could not be sent back as they came
    NO_TOOL_CALLS = "no_tool_calls"  # mode model: the model answered without a tool call, agents ended early
    CANARY_FAILURES = "canary_failures"  # canaries failed while no agent finding explains it
    ROUTER_LEAK = "router_leak"  # the router still counts requests in flight after every one of agentload's ended
    CLIENT_STOPPED = "client_stopped"  # agentload proxy: a conversation got its answer, the harness never sent the next round
    PROXY_TIMEOUT = "proxy_timeout"  # failures ended at one fixed duration: a timeout in front of a server that hung
    CONCURRENCY_LIMIT = "concurrency_limit"  # quick 503s whenever N requests were in flight: a limit in front
    BUFFERED_STREAM = "buffered_stream"  # tokens came in bursts after long waits: a buffering proxy, timings distorted


# event-loop lag at which agentload's own timings stop meaning much (a 100,000-agent run on 2 shared
# cores lagged 100-350 ms in every sample, its timing error p99 217 ms: the client was the bottleneck)
SATURATION_LAG_MS = 100.0
SATURATED_SHARE = 0.5  # ... in at least this share of the samples
# ... or this much lag in that share, while the server's send stamps show agentload seeing first tokens
# late by TIMING_SATURATED_MS at p99 (the same 100,000 agents on a pool of 100: lag 50-183 ms in 61 of
# 72 samples, timing error p99 117 ms)
SATURATION_SOME_LAG_MS = 50.0
TIMING_SATURATED_MS = 50.0
SATURATED_MIN_SAMPLES = 2
# The pool explains the latency when pool_wait is this share of e2e (at p50 or p90) ...
POOL_WAIT_SHARE = 0.2
POOL_WAIT_MIN_MS = 5.0  # ... and at least this long at p90 (microseconds of queueing explain nothing)
POOL_WAITED_SHARE = 0.05  # ... and at least this share of requests waited for a connection
# A server queue: in at least this share of the samples taken while requests waited for headers past
# stall.after_s, the server was answering others (a request past headers that was not stalled) or
# completing them (the completed count grew around that sample)
QUEUE_SERVED_SHARE = 0.8
# A reused connection closed under its request after sitting idle less than this was not closed by a
# keep-alive timeout (servers keep idle connections for seconds: uvicorn, llama-server 5 s, nginx 75 s)
QUICK_CLOSE_MS = 1000.0

# Requests that queued while a server stall held connections are its consequence, unless they spent
# this many times as long queued there as the stalled requests held connections: then the pool was
# too small whatever the stall held (400 agents on a pool of 100, 50 of them hung: ~240 waiters)
POOL_BEYOND_HELD = 2.0

DISCONNECT_ERRORS = {"ServerDisconnectedError", "ClientOSError", "ClientPayloadError",
                     "ClientConnectionResetError", "incomplete_stream", "ConnectionResetError"}
CONNECT_ERRORS = {"connect_timeout", "ClientConnectorError", "ClientConnectorDNSError", "ConnectionRefusedError",
                  "tls_certificate", "tls_handshake"}
# a request that ran out of time on agentload's side (aiohttp's total or read timeout)
TIMEOUT_ERRORS = {"total_timeout", "read_timeout", "ServerTimeoutError"}
# canaries timed out "behind the same slowness" as the agents when, at the agents' own pace, a
# canary's answer takes at least this share of canary.timeout_s
SLOW_CANARY_SHARE = 0.5
# what a refused certificate's verify message means, and what to do about it
_CERT_HINTS = (
    (("unable to get local issuer", "self-signed", "self signed", "unable to verify the first"),
     "the certificate is signed by a CA agentload does not trust: give that CA's bundle with [target] tls_ca_file "
     "(or SSL_CERT_FILE), or tls_verify = false to skip verifying it"),
    (("mismatch", "not valid for"),
     "the certificate does not name the endpoint's host: use a host name the certificate was issued for"),
    (("expired", "not yet valid"),
     "the certificate is outside its validity dates: renew it (or check this machine's clock)"),
)
# answers that came back but were not what the protocol says (see agentload.run.request)
PROTOCOL_ERRORS = {"not_a_stream", "bad_response", "malformed_stream", "empty_stream", "no_finish_reason",
                   "bad_tool_call", "content_encoding"}


def is_server_error(error: str | None) -> bool:
    return bool(error) and (error.startswith("http_") or error == "inband_error")


@dataclass
class Finding:
    kind: Kind
    summary: str
    phase: str | None = None
    first_round: int | None = None
    agents_affected: int = 0
    agents_stopped: int = 0  # agents whose conversation this ended (the precedence between findings)
    evidence: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "phase": self.phase, "first_round": self.first_round,
                "agents_affected": self.agents_affected, "agents_stopped": self.agents_stopped,
                "summary": self.summary, "evidence": list(self.evidence)}


def fmt_counts(c: Counter) -> str:
    """`ServerDisconnectedError x3, http_500 x1`: most common first."""
    return ", ".join(f"{k} x{n}" for k, n in c.most_common())


def _share(part: float | None, whole: float | None) -> str:
    if not part or not whole:
        return "0%"
    return f"{100.0 * part / whole:.0f}%"


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
        self.last_order: tuple = ()
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


def _truncated(problems: list[str]) -> bool:
    return any(p.startswith(TRUNCATED + ":") for p in problems)


class FactsAccumulator:
    """The verdict's facts from one pass over the records (`add` each, then `Facts(data, acc)`).

    Keeps the troubled records themselves (stalled, failed, cut short, malformed: what the
    evidence quotes) and the canaries; of the fine ones only counts, histograms (pool_wait,
    e2e, ttfb, time to first token), each prompt size's count, and per agent its rounds and its
    last request (`AgentTally`)."""

    def __init__(self) -> None:
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
        self.ok_servers: Counter = Counter()  # the Server headers of completed answers (the first 5 kinds)
        self.bursts = BurstTally()  # answers whose tokens came in bursts (a buffering proxy)
        self.waited = Waited()
        self.troubled: list[Record] = []  # in the requests' order, once closed
        self.min_start: int | None = None  # the first start and the last end of any request (canaries too)
        self.max_end: int | None = None
        self.backends: set[str] = set()  # backend names the records gave (the first MIN_NAMED_BACKENDS)
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

    def add(self, r: Record) -> None:
        self.seq += 1
        key = order_key(r, self.seq)
        t = r.t
        s = t.get("start")
        if s is not None:
            self.min_start = s if self.min_start is None else min(self.min_start, s)
        e = t.get("end") if "end" in t else (max(t.values()) if t else None)
        if e is not None:
            self.max_end = e if self.max_end is None else max(self.max_end, e)
        if r.backend is not None and len(self.backends) < MIN_NAMED_BACKENDS:
            self.backends.add(r.backend)
        if r.kind == "canary":
            self.canary.add(r, key)
            return
        if r.kind in PROBE_KINDS:  # a stall wave's probes: a few requests per wave, a few waves a run
            if len(self._probes) < MAX_PROBE_RECORDS:
                self._probes.append((key, r))
            return
        if r.kind != "agent":
            return
        self.requests += 1
        self.max_round = r.round if self.max_round is None else max(self.max_round, r.round)
        self.conns.add(r)
        t = r.t
        st = self.agent_state.get(r.agent)
        if st is None:
            st = self.agent_state[r.agent] = AgentTally()
        st.requests += 1
        if r.protocol:
            self.protocol.add(r, r.protocol)
        problems = r.tool_call_problems
        if problems:
            (self.truncated if _truncated(problems) else self.malformed).add(r, problems)
        bad = _troubled(r)
        if bad:
            self._troubled.append((key, r))
        if r.stalled_phase:
            st.stalls += 1
        ok = r.outcome == "ok"
        if ok:
            st.completed(r.round, bool(r.stalled_phase))
            if r.call:
                self.retried_ok.add((r.agent, r.conversation, r.round))
        order = (r.round, r.call, key)
        if order >= st.last_order:
            down = t.get("down_start")
            if down is not None and st.last_end and r.round == st.last_round + 1:
                if st.gaps is None:
                    st.gaps = []
                st.gaps.append(down - st.last_end)
            st.last_end = t.get("end") or st.last_end
            st.last_order, st.last = order, (r if bad or problems else None)
            st.last_round, st.last_tools, st.last_finish, st.last_tokens = (r.round, r.tool_calls, r.finish_reason,
                                                                            r.token_chunks)
        ns = phase_ns(t, "pool_wait", r.reused)
        if ns is not None:
            self.pool_wait.record_ns(ns)
        if "queued_start" in t:
            self.waited.add(r)
        if ok:
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
        if r.server_first_token_ns is not None and "first_token" in t:
            self.timing.record_ns(t["first_token"] - r.server_first_token_ns)
        if ok and not r.stalled_phase:  # fine
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

    def close(self) -> "FactsAccumulator":
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


class Waited:
    """The requests that queued for a connection: how many, from which round, which agents."""

    __slots__ = ("n", "first_round", "agents")

    def __init__(self) -> None:
        self.n = 0
        self.first_round: int | None = None
        self.agents: set[int] = set()

    def add(self, r: Record) -> None:
        self.n += 1
        self.first_round = r.round if self.first_round is None else min(self.first_round, r.round)
        self.agents.add(r.agent)

    def __len__(self) -> int:
        return self.n


class SampleDigest:
    """What the rules read of samples.jsonl, from one walk of it (the samples of a day-long run are
    86,400 lines: streamed, never held): how many, those whose pool state could be read, the most
    waiters, the largest event-loop lag and how many samples lagged past SATURATION_LAG_MS, the
    pool samples taken while requests were stalled (those with no waiter, the most waiters among
    them), those with more
    connections in use than requests using them, and the last sample's `stalled_by` that had any."""

    def __init__(self, samples: Iterable[dict[str, Any]]):
        self.n = self.pool = self.waiters_max = self.lagged = self.some_lag = 0
        self.stalled_pool = self.stalled_free = self.stalled_waiters_max = self.leaked = 0
        self.max_lag = 0.0
        self.last_stalled_by: dict[str, int] | None = None
        # the queue: samples taken while requests waited for headers past stall.after_s, how many of
        # those found requests past headers (answered by the server), the most past headers at any
        # sample and at those, the most waiting for headers at those, and the requests completed from
        # the first of those samples to the one after the last (the server got through its work)
        self.waits = self.waits_served = self.past_headers_max = self.waiting_max = 0
        self.past_at_waits_max = 0
        self.ok_first: int | None = None
        self.ok_after_last: int | None = None
        after_wait = False
        prev_ok: int | None = None
        for s in samples:
            self.n += 1
            inflight = s.get("inflight") or {}
            past = inflight.get("ttft", 0) + inflight.get("stream", 0)
            self.past_headers_max = max(self.past_headers_max, past)
            ok = (s.get("counts") or {}).get("ok")
            if after_wait and ok is not None:  # the sample after a wait (or a wait itself)
                self.ok_after_last = ok
            after_wait = False
            by = s.get("stalled_by") or {}
            waiting = sum(n for k, n in by.items() if k.endswith("/ttfb"))
            if waiting and inflight.get("ttfb", 0):
                self.waits += 1
                self.waiting_max = max(self.waiting_max, inflight.get("ttfb", 0))
                self.past_at_waits_max = max(self.past_at_waits_max, past)
                self.waits_served += past >= 1 or (ok is not None and prev_ok is not None and ok > prev_ok)
                if self.ok_first is None:
                    self.ok_first = ok
                if ok is not None:
                    self.ok_after_last = ok
                after_wait = True
            prev_ok = ok
            lag = s.get("loop_lag_ms", 0.0)
            self.max_lag = max(self.max_lag, lag)
            self.lagged += lag >= SATURATION_LAG_MS
            self.some_lag += lag >= SATURATION_SOME_LAG_MS
            if s.get("stalled_by"):
                self.last_stalled_by = s["stalled_by"]
            pool = s.get("pool") or {}
            if "waiters" not in pool:
                continue
            self.pool += 1
            w = pool["waiters"]
            self.waiters_max = max(self.waiters_max, w)
            if s.get("stalled"):
                self.stalled_pool += 1
                self.stalled_free += w == 0
                self.stalled_waiters_max = max(self.stalled_waiters_max, w)
            if w > 0 and pool.get("in_use", 0) > sum(k for ph, k in (s.get("inflight") or {}).items()
                                                    if ph != "pool_wait"):
                self.leaked += 1
    @property
    def completed_during_waits(self) -> int:
        """Requests completed from the first sample that saw requests wait for headers to the one
        after the last."""
        if self.ok_first is None or self.ok_after_last is None:
            return 0
        return max(0, self.ok_after_last - self.ok_first)

    @property
    def queue(self) -> bool:
        """Requests waited for headers past stall.after_s while the server answered others (requests
        past headers in most of those samples) and got through them (requests completed meanwhile):
        a queue in front of the server's slots, not a hang."""
        return (bool(self.waits) and self.waits_served >= QUEUE_SERVED_SHARE * self.waits
                and self.completed_during_waits > 0)


def _end_ns(t: dict[str, int]) -> int:
    return t["end"] if "end" in t else max(t.values())


def queued_span(t: dict[str, int]) -> tuple[int, int] | None:
    """When a request waited for a connection: its last queued_start to its queued_end, or to its
    end when it was still queued then (aiohttp's connector queues a waiter again when another took
    the slot it was woken for); None when it never queued."""
    qs = t.get("queued_start")
    if qs is None:
        return None
    qe = t.get("queued_end")
    return qs, (qe if qe is not None and qe >= qs else max(qs, _end_ns(t)))


class StallWindows:
    """When requests stalled at the server held the client pool's connections: each such request
    from the moment the pool gave it a connection to its end, merged into windows. A request that
    queued for a connection inside a window waited (at least in part) for one a stalled request
    held: the stall explains that queue, up to as many requests as it held connections."""

    def __init__(self, stalled: Iterable[Record]):
        spans = sorted((phase_begin(r.t, "send") or r.t.get("start", 0), _end_ns(r.t)) for r in stalled if r.t)
        self.held_ns = sum(b - a for a, b in spans)  # connection-time the stalled requests held
        self.lo: list[int] = []
        self.hi: list[int] = []
        for a, b in spans:
            if self.hi and a <= self.hi[-1]:
                self.hi[-1] = max(self.hi[-1], b)
            else:
                self.lo.append(a)
                self.hi.append(b)
        events = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans], key=lambda x: (x[0], x[1]))
        self.max_held = run = 0  # the most connections they held at once
        for _, d in events:
            run += d
            self.max_held = max(self.max_held, run)

    @property
    def total_ns(self) -> int:
        return sum(b - a for a, b in zip(self.lo, self.hi))

    def __len__(self) -> int:
        return len(self.lo)

    def overlap_ns(self, a: int, b: int) -> int:
        """How long [a, b] lies inside the windows."""
        i = max(0, bisect.bisect_right(self.lo, a) - 1)
        out = 0
        while i < len(self.lo) and self.lo[i] <= b:
            out += max(0, min(b, self.hi[i]) - max(a, self.lo[i]))
            i += 1
        return out

    def touches(self, a: int, b: int) -> bool:
        """Whether [a, b] meets a window (a point in one counts)."""
        i = bisect.bisect_right(self.lo, b) - 1
        return i >= 0 and self.hi[i] >= a


class PoolApart:
    """The pool rule's figures over the requests a server stall does not explain, from a second
    streaming pass over the records (made only when the run had both server stalls and requests
    that queued for a connection; bounded: two histograms, counts, the agents that waited).

    A request whose wait for a connection met a stall window (or, without a wait, that started in
    one) belongs to the stall; the others (`outside`) are judged as any run's requests. `queued_ns`:
    the time requests spent queued inside the windows, to set against the connection-time the stalled
    requests held there (a queue far longer than what they held was not theirs alone)."""

    def __init__(self, data: "RunData", windows: StallWindows):
        self.pool_wait = SparseHistogram()
        self.e2e_ok = SparseHistogram()
        self.n = 0  # agent requests outside the windows
        self.waited = Waited()  # ... those that queued
        self.behind = Waited()  # requests that queued inside the windows
        self.queued_ns = 0  # queued time inside the windows, all requests
        for r in data.iter_records():
            if r.kind != "agent" or not r.t:
                continue
            t = r.t
            q = queued_span(t)
            if q is not None:
                inside = windows.touches(*q)
                self.queued_ns += windows.overlap_ns(*q)
            else:
                s = t.get("start")
                inside = s is not None and windows.touches(s, s)
            if inside:
                if q is not None:
                    self.behind.add(r)
                continue
            self.n += 1
            if q is not None:
                self.waited.add(r)
            ns = phase_ns(t, "pool_wait", r.reused)
            if ns is not None:
                self.pool_wait.record_ns(ns)
            if r.outcome == "ok":
                ns = phase_ns(t, "e2e")
                if ns is not None:
                    self.e2e_ok.record_ns(ns)


class Facts:
    """What every rule reads, computed once from the run folder's data: from the accumulator
    of the report's one pass over the records, or (without one) from a pass of its own. `router`:
    the fleet behind a router as the router analysis gives it (made here when not given)."""

    def __init__(self, data: "RunData", acc: FactsAccumulator | None = None, router: RouterFacts | None = None):
        if acc is None:
            acc = FactsAccumulator()
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
    def pool(self) -> "PoolJudgement | None":
        """The pool rule's judgement, on the requests no stall explains (None: the pool is not a finding)."""
        return judge_pool(self)

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


# ---------------------------------------------------------------- the rules, in order


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
        lag_line = None
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


def _threshold_evidence(failed: list[Record], fine: SizeCounts, verb: str) -> tuple[str | None, int | None]:
    """A clean prompt-size threshold is the strongest clue there is: say so when there is one.
    `fine`: the prompt sizes of the requests that completed without a stall."""
    if not failed:
        return None, None
    lo = min(r.prompt_tokens for r in failed)
    hi = max(r.prompt_tokens for r in failed)
    below = fine.max_below(lo)  # the largest fine prompt below lo
    above_ok = fine.count_at_least(lo)
    if not above_ok and below is not None:
        return (f"every request at or above {lo:,} prompt tokens {verb} ({len(failed)}), none below "
                f"(largest that completed: {below:,} tokens)"), lo
    if not fine.counts:  # nothing went right at any size: size tells nothing
        return (f"{verb} prompts {lo:,}-{hi:,} tokens; no request completed without it at any size, so size "
                f"does not explain it"), None
    return (f"{verb} prompts {lo:,}-{hi:,} tokens; {above_ok:,} request(s) of that size or "
            f"larger completed, so size alone does not explain it"), None


def _round_rows(rounds: Iterable[int]) -> Callable[[int], str]:
    """How evidence names a round: itself, or in a run with more than MAX_ROUND_ROWS rounds that
    have something to say, its band as the tables have it ("rounds 41-80")."""
    ranges = band_ranges(rounds)
    if ranges is None:
        return lambda r: f"round {r}"
    labels = [(lo, hi, f"round {lo}" if lo == hi else f"rounds {lo}-{hi}") for lo, hi in ranges]
    return lambda r: next(x for lo, hi, x in labels if lo <= r <= hi)


def fmt_round_counts(c: Counter) -> str:
    """"round 3: 2, round 4: 1", or by band past MAX_ROUND_ROWS rounds (a day-long run)."""
    label = _round_rows(c)
    out: Counter = Counter()
    for rnd in sorted(c):
        out[label(rnd)] += c[rnd]
    return ", ".join(f"{k}: {n}" for k, n in out.items())


def _fmt_phase_counts(c: Counter) -> str:
    label = _round_rows(rnd for rnd, _ in c)
    out: Counter = Counter()
    for (rnd, ph), n in sorted(c.items()):
        out[(label(rnd), ph)] += n
    return ", ".join(f"{k} {ph}: {n}" for (k, ph), n in out.items())


@dataclass
class SlowCanaries:
    """Canaries that timed out behind the slowness every agent met: not a failure of their own."""

    how: str  # what they did, in a clause ("they timed out at canary.timeout_s = 10 s while ...")
    need_ms: float  # what a canary's answer takes at the agents' pace
    pace_ms: float  # the agents' time a token chunk (p50)
    to_token_ms: float  # the agents' sent -> first token (p50)


def slow_canaries(f: Facts, failed: list[Record]) -> SlowCanaries | None:
    """Did `failed` (canaries) time out behind the same slowness as the agents? Each ran out of
    canary.timeout_s (a timeout of agentload's, not an error of the server's) either while its tokens
    were still coming (no gap as long as four of the agents' own) or, with no token, while the agents waited as long for
    theirs; and at the agents' own pace (their completed answers) a canary's answer takes at least
    SLOW_CANARY_SHARE of canary.timeout_s. None otherwise."""
    cfg = f.scenario.get("canary") or {}
    timeout_s = cfg.get("timeout_s")
    if not failed or not timeout_s or any(c.error not in TIMEOUT_ERRORS for c in failed):
        return None
    pace, to_token = pct_ms(f.acc.pace, 50), pct_ms(f.acc.ok_to_token, 50)
    if to_token is None:
        return None
    timeout_ms = timeout_s * 1000.0
    tokens = int(cfg.get("max_tokens") or 1)
    need = to_token + (tokens - 1) * (pace or 0.0)
    if need < SLOW_CANARY_SHARE * timeout_ms:
        return None
    # a gap of four of the agents' own (or of stall.after_s, when theirs are unknown): it stopped getting tokens
    hung_ns = 4e6 * pace if pace else f.after_s * 1e9
    got = [c for c in failed if "first_token" in c.t]
    for c in got:
        if c.max_gap_ns >= hung_ns:  # hung, not slow
            return None
    if len(got) < len(failed) and to_token < 0.8 * timeout_ms:  # no token, and the agents got theirs sooner
        return None
    how = f"{len(failed)} timed out at canary.timeout_s = {timeout_s:g} s"
    if got:
        paces = [p for p in (token_pace_ns(c) for c in got) if p is not None]
        how += (f" while their tokens were still arriving ({sum(c.token_chunks for c in got)} token chunk(s) in "
                f"{len(got)} of them" + (f", one every {_dur(quantile_ms(paces, 50))}" if paces else "") + ")")
    else:
        how += " before their first token"
    how += (f", as slow as the agents' answers (first token after {_dur(to_token)}"
            + (f", then one token chunk every {_dur(pace)} ({1000.0 / pace:.2g}/s)" if pace else "")
            + f" at p50: a canary's {tokens} token(s) would take ~{_dur(need)})")
    return SlowCanaries(how, need, pace or 0.0, to_token)


def canary_evidence(f: Facts, t0: int) -> list[str]:
    """What the canaries (a fresh connection, a short prompt, every canary.every_s) saw from t0 on.
    A canary the run cut short at its end is neither a success nor a failure."""
    ok, ok_e2e, failed = f.canary.since(t0)
    during = ok + len(failed)
    if not during:
        return []
    med = quantile_ms(ok_e2e, 50)
    quick = med is not None and med < f.after_s * 1000
    text = (f"canaries (fresh connection, short prompt) sent after the first stalled request: "
            f"{ok}/{during} succeeded" + (f", median {_dur(med)}" if med is not None else ""))
    slow = slow_canaries(f, failed)
    if slow is not None:
        text += f": {slow.how}: the server is slow for everyone, not only for these agents"
    elif not ok:
        text += ": the server is not answering anyone"
    elif len(failed) * 2 > during:
        text += ": most canaries failed too, so the server is failing for everyone, not only for these agents"
    elif not quick:
        text += (f": canaries took over stall.after_s ({f.after_s:g} s) too, so the server is slow for everyone, "
                 f"not only for these agents")
    elif not failed:
        text += ": the server is up and the hang depends on the agents' state"
    else:
        text += ": most canaries got through quickly, so the hang depends mostly on the agents' state"
    if failed and slow is None:
        timeout = (f.scenario.get("canary") or {}).get("timeout_s")
        text += (f"; failed: {fmt_counts(Counter(c.error or c.outcome for c in failed))}"
                 + (f" (a canary gives up at its own canary.timeout_s = {timeout:g} s)" if timeout else ""))
    return [text]


MAX_PROBE_RECORDS = 64  # probe records the facts keep (agentload.run.probes sends at most 4 a wave, 5 waves)
_NOT_ANSWERED = ("hung", "failed")


def _probe_state(r: Record | None, reused: bool) -> str | None:
    """answered | hung | failed | cut, or None: not sent, or not on the kind of connection it was
    meant for (a pooled connection the server had closed: the factor did not change)."""
    if r is None or (r.reused is not None and r.reused is not reused):
        return None
    if r.stalled_phase:
        return "hung"
    if r.outcome == "ok":
        return "answered"
    return "cut" if r.outcome == "cut_short" else "failed"


def _probe_cause(p: dict[str, Record]) -> str | None:
    """What one wave's probes reproduced: content | connection | nobody | either | both |
    not_reproduced, or None (inconclusive: cut short by the run's end, or not sent)."""
    b = _probe_state(p.get("probe_body_fresh"), False)
    r = _probe_state(p.get("probe_short_reused"), True)
    s = _probe_state(p.get("probe_short_fresh"), False)
    br = _probe_state(p.get("probe_body_reused"), True)
    if s in _NOT_ANSWERED and (b in _NOT_ANSWERED or r in _NOT_ANSWERED or b is None):
        return "nobody"  # a short prompt on a fresh connection did not get through either
    if b in _NOT_ANSWERED and r in _NOT_ANSWERED:
        return "either" if s == "answered" else "nobody"
    if b in _NOT_ANSWERED and (r == "answered" or s == "answered"):
        return "content"
    if b == "answered" and r in _NOT_ANSWERED:
        return "connection"
    if b == "answered" and r == "answered":
        return "both" if br in _NOT_ANSWERED else "not_reproduced"
    return None


_CAUSE = {  # the headline's clause for what the probes reproduced
    "content": "the hang follows the request's content (size or state): its own body {hung} on a fresh connection "
               "too, a short prompt on a reused one answered (probes)",
    "connection": "the hang follows the connection, not the prompt: a short prompt on a reused keep-alive "
                  "connection {hung}, the stalled request's own body on a fresh one answered (keep-alive handling "
                  "in the server or in between; probes)",
    "nobody": "the server is not answering anyone: a short prompt on a fresh connection {hung} too (probes)",
    "either": "each factor alone {hangs}: the stalled request's own body on a fresh connection and a short prompt "
              "on a reused connection both {hung}, while a short prompt on a fresh connection answered (probes)",
    "both": "the hang needs both the content and a reused connection: the stalled request's own body {hung} on a "
            "reused connection only (on a fresh one it answered, as did a short prompt on a reused one; probes)",
    "not_reproduced": "the probes did not reproduce it: the stalled request's own body on a fresh connection and a "
                      "short prompt on a reused connection both answered (it needs the agent's own connection and "
                      "content, or was transient)",
}
_CAUSE_SHORT = {"content": "it follows the content", "connection": "it follows the connection",
                "nobody": "no one is answered", "either": "each factor alone reproduces it",
                "both": "it needs both factors", "not_reproduced": "not reproduced",
                "backend": "it follows the backend"}
_KEEPS_THRESHOLD = {"content", "either", "both", "not_reproduced"}  # the others contradict a size threshold


def _probe_line(what: str, r: Record | None, state: str | None, backends: bool, backend: str | None = None,
                elsewhere: bool = False) -> str | None:
    if r is None:
        return None
    if state is None:
        text = f"{what}: went out on a {'reused' if r.reused else 'new'} connection instead, so it tells nothing"
    elif state == "answered":
        text = f"{what} answered in {_dur((phase_ns(r.t, 'e2e') or 0) / 1e6)}"
    elif state == "hung":
        text = f"{what} hung (no progress in {r.stalled_phase} for stall.after_s)"
    elif state == "failed":
        text = f"{what} failed ({r.error})"
    else:
        text = f"{what} was cut short by the run's end"
    backend = backend or r.backend
    text += f" (backend {backend})" if backends and backend else ""
    return text + (", not where the stalled requests went: it compares backends" if elsewhere else "")


def probe_reading(f: Facts, st: list[Record], thr: int | None,
                  slow: bool) -> tuple[str | None, bool, list[str]]:
    """What the stall probes (agentload.run.probes) say of the stall `st`: the headline's clause
    (None: no probe was conclusive), whether a size threshold may still lead it, and the evidence.
    Waves disagreeing: the cause most waves reproduced, ties to the earliest."""
    waves: dict[int, dict[str, Record]] = {}
    for r in f.acc.probes:
        waves.setdefault(r.call, {}).setdefault(r.kind, r)
    ev: list[str] = []
    causes: list[str] = []
    fleet = bool(f.meta.get("fleet")) or len(f.acc.backends) >= MIN_NAMED_BACKENDS  # which backend served each
    # Behind a router the backend is a third factor: a probe answered by a backend none of the stalled
    # requests went to compared backends, not the connection or the content
    where: dict[int, str | None] = {}
    stalled_on: set[str] = set()
    if fleet and waves:
        where = {k: v[0] for k, v in f.router.attribute(f.acc.probes).items()}
        stalled_on = {b for r in st if (b := f.attribution.get(id(r), (None, None))[0]) is not None}
    backend_text = ""
    for wave, p in sorted(waves.items())[:MAX_WAVE_LINES]:
        elsewhere = {k: where.get(id(r)) for k, r in p.items() if stalled_on and _probe_state(r, k.endswith("_reused"))
                     == "answered" and where.get(id(r)) not in stalled_on and where.get(id(r)) is not None}
        body_hung = [k for k in ("probe_body_fresh", "probe_body_reused")
                     if k in p and _probe_state(p[k], k.endswith("_reused")) in _NOT_ANSWERED]
        body_elsewhere = [k for k in ("probe_body_fresh", "probe_body_reused") if k in elsewhere]
        if body_elsewhere and body_hung:
            cause = "backend"
            if not backend_text:
                bad = where.get(id(p[body_hung[0]])) or "/".join(sorted(stalled_on))
                backend_text = (f"the hang follows the backend, not the content or the connection: the stalled "
                                f"request's own body answered on {elsewhere[body_elsewhere[0]]} and {{hung}} on {bad}, "
                                f"where the stalled requests went (probes)")
        else:
            cause = _probe_cause({k: r for k, r in p.items() if k not in elsewhere})
        any_r = next(iter(p.values()))
        body = p.get("probe_body_fresh") or p.get("probe_body_reused")
        parts = [x for x in (_probe_line(what, p.get(kind), _probe_state(p.get(kind), reused), fleet,
                                         where.get(id(p.get(kind))), kind in elsewhere)
                             for kind, what, reused in _PROBE_ORDER) if x]
        ev.append(f"probes of stall wave {wave} (agent {any_r.agent}'s round {any_r.round} request"
                  + (f", {body.prompt_tokens:,} prompt tokens" if body is not None else "") + "): "
                  + "; ".join(parts) + " -> " + (_CAUSE_SHORT[cause] if cause else "inconclusive"))
        if cause:
            causes.append(cause)
    if len(waves) > MAX_WAVE_LINES:
        ev.append(f"... {len(waves) - MAX_WAVE_LINES} more probed wave(s)")
    if causes:
        counts = Counter(causes)
        lead = max(counts, key=lambda c: (counts[c], -causes.index(c)))
        clause = (backend_text if lead == "backend" else _CAUSE[lead]).format(
            hung="stalled" if slow else "hung", hangs="stalls" if slow else "hangs")
        if len(counts) > 1:
            ev.append("the probed waves disagree: " + ", ".join(f"{_CAUSE_SHORT[c]} x{n}" for c, n in counts.most_common())
                      + f"; the headline takes the most common ({_CAUSE_SHORT[lead]})")
        return clause, lead in _KEEPS_THRESHOLD, ev
    # no conclusive probe: the cause rests on correlation; say which factors go together
    on = (f.scenario.get("stall") or {}).get("probes")
    why = ("probes are off ([stall] probes = false)" if on is False else
           "no probe was conclusive" if waves else
           "no probe ran during the stall" if on else "this run has no probes (recorded before agentload sent them)")
    reused = sum(1 for r in st if r.reused)
    if thr is not None and reused == len(st):
        ev.append(f"{why}: the cause rests on correlation, and prompt size and connection reuse are confounded: "
                  f"every stalled request was at or above {thr:,} prompt tokens and went out on a reused keep-alive "
                  f"connection; the stalled body on a fresh connection would tell them apart")
    elif thr is not None:
        ev.append(f"{why}: the cause rests on correlation (prompt size; {len(st) - reused} stalled request(s) "
                  f"went out on new connections, so connection reuse is not needed)")
    elif reused == len(st):
        ev.append(f"{why}: the cause rests on correlation, and the agents' content and connection reuse are "
                  f"confounded: every stalled request went out on a reused keep-alive connection")
    else:
        ev.append(f"{why}: the cause rests on correlation")
    return None, True, ev


MAX_WAVE_LINES = 5
_PROBE_ORDER = (("probe_body_fresh", "its own body on a fresh connection", False),
                ("probe_short_fresh", "a short prompt on a fresh connection", False),
                ("probe_short_reused", "a short prompt on a reused connection", True),
                ("probe_body_reused", "its own body on a reused connection", True))


def rule_server_stall(f: Facts) -> Finding | None:
    """No progress past the pool (ttfb, ttft, stream) for stall.after_s. A request stalled at the
    server holds its connection: with a small pool the requests behind it wait in pool_wait;
    that queue (in the stall's windows) is a consequence, never the cause. Pool queueing the stall
    does not explain is the pool rule's, and this summary then says which is which."""
    st = f.server_stalls
    if not st:
        return None
    phases = Counter((r.round, r.stalled_phase) for r in st)
    main_phase = Counter(r.stalled_phase for r in st).most_common(1)[0][0]
    first_round = min(r.round for r in st)
    affected = {r.agent for r in st}
    all_finished = all(r.outcome == "ok" for r in st)
    # the requests that queued for a connection a stalled request held, and stalled or timed out there
    behind = [r for r in f.pool_stalls if f.behind_stall(r)]
    behind_timeouts = [r for r in f.pool_timeouts if f.behind_stall(r)]
    theirs = {id(r) for r in behind} | {id(r) for r in behind_timeouts}
    stopped = f.stopped_by(lambda r: r.stalled_phase in SERVER_PHASES or id(r) in theirs)
    thr_text, thr = _threshold_evidence(st, f.fine_prompts, "stalled")
    sd = f.sample_digest
    work = None
    if main_phase == "ttfb" and not sd.queue:  # the engine's own counters may still show it working meanwhile
        work = engine_work(f.data, [r for r in st if r.stalled_phase == "ttfb"])
    queue = main_phase == "ttfb" and (sd.queue or work is not None)
    slots = queue_size(f, work)
    if queue:
        gave = sum(1 for r in st if r.outcome == "stalled")
        waited = max(((r.t.get("headers") or r.t.get("end") or 0) - r.t.get("sent", 0) for r in st
                      if r.stalled_phase == "ttfb" and "sent" in r.t), default=0) / 1e9
        summary = (f"server queue: the server works on at most {slots} request(s) at once and the others "
                   f"waited for response headers: {len(st)} request(s) of {len(affected)} agents waited over "
                   f"stall.after_s ({f.after_s:g} s) from round {first_round} on"
                   + (f", all answered in the end (longest wait {waited:.1f} s)" if all_finished else
                      f"; {gave} given up after stall.give_up_s, {len(stopped)} agent(s) stopped"))
    elif all_finished:
        worst = max((phase_ns(r.t, "e2e") or 0) for r in st) / 1e9
        summary = (f"server slow, not hung: {len(st)} request(s) of {len(affected)} agents made no "
                   f"progress in {main_phase} for over stall.after_s from round {first_round} on, but all finished "
                   f"(slowest {worst:.1f} s)")
    else:
        summary = (f"server stall: {len(affected)} of {len(f.agents)} agents stopped making progress in {main_phase} "
                   f"from round {first_round} on")
    cause, keep_thr, probe_ev = probe_reading(f, st, thr, all_finished)
    if thr is not None and keep_thr:  # (a correlation the probes contradict never leads)
        summary += f", every request at or above {thr:,} prompt tokens stalled"
    if cause:
        summary += f"; {cause}"
    queued_agents = {r.agent for r in behind + behind_timeouts} - affected
    try:
        pool = f.pool  # the pool's own finding, beside this one
    except Exception:  # the pool rule reports its own failure (agentload_error); the stall still stands
        pool = None
    if pool is None:
        if not queued_agents:
            summary += "; the client pool is not the cause"
        else:
            summary += (f"; they held the client pool's connections, so {len(queued_agents)} more agent(s) queued "
                        f"behind them (a consequence, not the cause)")
    else:
        summary += "; the client pool is not the cause of the stall"
        if queued_agents:
            summary += f" ({len(queued_agents)} more agent(s) queued behind it, a consequence)"
        if pool.scope == "apart":
            summary += ", but it queued requests outside the stall too: see client_pool"
        else:
            summary += ", but it queued far more requests than the stalled ones held connections: see client_pool"
    kind = Kind.SERVER_QUEUE if queue else Kind.SERVER_SLOW if all_finished else Kind.SERVER_STALL
    fnd = Finding(kind, summary, main_phase, first_round, len(affected | queued_agents), len(stopped))
    ev = fnd.evidence
    ev.append(f"stalled requests by round and phase: {_fmt_phase_counts(phases)}")
    if queue:
        ev.extend(queue_evidence(f, work, slots))
    ev.extend(f.backend_lines(st, "stalled"))  # the backend(s) behind a router, where records or logs say it
    if thr_text:
        ev.append(thr_text + ("" if keep_thr else "; a correlation only: the probes contradict it"))
    ev.extend(probe_ev)
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
    t0 = min(r.t.get("start", 0) for r in st)
    ev.extend(canary_evidence(f, t0))
    if behind:
        ev.append(f"{len(behind)} more request(s) stalled in pool_wait behind them: the stalled requests "
                  f"held the pool's connections (limit {f.limit}, up to {f.waiters_max} waiters)")
    if behind_timeouts:
        pt = (f.scenario.get("client") or {}).get("pool_timeout_s")
        ev.append(f"{len(behind_timeouts)} request(s) queued behind them timed out waiting for a connection "
                  f"(client.pool_timeout_s = {pt})")
    gave_up = sum(1 for r in st if r.outcome == "stalled")
    later_ok = sum(1 for r in st if r.outcome == "ok")
    ended = Counter(r.error for r in st if r.outcome == "error")
    ev.append(f"{gave_up} stalled request(s) were given up after give_up_s; {later_ok} finished late"
              + (f"; {sum(ended.values())} were ended by the other side ({fmt_counts(ended)})" if ended else ""))
    ft = fixed_timeout([r for r in st if r.outcome == "error"], stalled=True) if ended else None
    if ft is not None:  # a proxy's timeout longer than stall.after_s ended them
        who = who_answered(ft.records, f.acc.ok_servers).name()
        ev.append(f"{len(ft.records)} of those ended {ft.seconds:.2f} s after "
                  + " or ".join(how for how, _ in ft.after.most_common())
                  + f" (within {ft.hi_ms - ft.lo_ms:.0f} ms of each other)" + (f", by {who}" if who else "")
                  + ": a timeout in front of the server (nginx: proxy_read_timeout; haproxy: timeout server) "
                    "ended what the server never answered")
    ev.extend(target_evidence(f.data, st))  # what the router/engine metrics said meanwhile
    return fnd


def queue_size(f: Facts, work: Any = None) -> int:
    """How many requests the server works on at once: llama.cpp's slots (/props total_slots), else
    the engine's most running while requests waited, else the most past headers in the samples."""
    props = f.meta.get("server_props") or {}
    if isinstance(props.get("total_slots"), int) and props["total_slots"] > 0:
        return int(props["total_slots"])
    if work is not None:
        return int(work.running_max)
    return f.sample_digest.past_at_waits_max


def queue_evidence(f: Facts, work: Any = None, slots: int | None = None) -> list[str]:
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


@dataclass
class PoolJudgement:
    """What the pool rule found, over the requests it judges (`scope`): the whole run ("run"); beside
    a server stall, the requests outside its windows ("apart"), or every request when the queue in
    the windows was far longer than what the stalled requests held ("beyond")."""

    scope: str
    pw50: float | None
    pw90: float | None
    e50: float | None
    e90: float | None
    share50: bool
    waited: Waited
    n: int
    stalls: list[Record]  # requests stalled in pool_wait that are the pool's own
    timeouts: list[Record]  # ... and those that timed out queued


def _pool_test(scope: str, pool_wait: Any, e2e_ok: Any, waited: Waited, n: int, stalls: list[Record],
               timeouts: list[Record]) -> PoolJudgement | None:
    """The pool rule's test on one set of requests: pool_wait a large share of e2e, long enough to
    matter, met by enough of them; or requests that stalled or timed out queued."""
    pct = percentiles_ms(pool_wait, (50, 90)) or {}
    pw50, pw90 = pct.get(50), pct.get(90)
    pct = percentiles_ms(e2e_ok, (50, 90)) or {}
    e50, e90 = pct.get(50), pct.get(90)
    share50 = bool(pw50 is not None and e50 and pw50 >= POOL_WAIT_SHARE * e50)
    share_ok = share50 or bool(pw90 is not None and e90 and pw90 >= POOL_WAIT_SHARE * e90)
    slow = share_ok and (pw90 or 0) >= POOL_WAIT_MIN_MS and len(waited) >= POOL_WAITED_SHARE * n
    if not (stalls or timeouts or slow):
        return None
    return PoolJudgement(scope, pw50, pw90, e50, e90, share50, waited, n, stalls, timeouts)


def judge_pool(f: Facts) -> PoolJudgement | None:
    """The pool rule on the requests no server stall explains: the whole run without a stall;
    beside one, the requests outside its windows, else (when requests spent far longer queued in
    the windows than the stalled requests held connections) every request. The requests that
    stalled or timed out queued inside the windows stay the stall's either way."""
    if f.stall_windows is None:
        return _pool_test("run", f.acc.pool_wait, f.acc.e2e_ok, f.waited, f.requests, f.pool_stalls,
                          f.pool_timeouts)
    pa = f.pool_apart
    if pa is None:  # a server stall, and no request queued at all
        return None
    stalls = [r for r in f.pool_stalls if not f.behind_stall(r)]
    timeouts = [r for r in f.pool_timeouts if not f.behind_stall(r)]
    apart = _pool_test("apart", pa.pool_wait, pa.e2e_ok, pa.waited, pa.n, stalls, timeouts)
    if apart is not None or f.queue_beyond_stall is None:
        return apart
    return _pool_test("beyond", f.acc.pool_wait, f.acc.e2e_ok, f.waited, f.requests, stalls, timeouts)


def rule_client_pool(f: Facts) -> Finding | None:
    """Time lost queued for a connection, read from every record's own pool wait (whatever the run
    length); the once-a-second sampler only corroborates. Beside a server stall the requests that
    queued for a connection a stalled request held are the stall's consequence (that rule tells
    them); the pool is judged on the others, or on all of them when the queue there was far longer
    than what the stalled requests held."""
    pj = f.pool
    if pj is None:
        return None
    pw50, pw90, e50, e90, waited, n = pj.pw50, pj.pw90, pj.e50, pj.e90, pj.waited, pj.n
    who = pj.stalls or pj.timeouts  # else every request that waited
    first_round = min(r.round for r in who) if who else waited.first_round
    who_agents = len({r.agent for r in who}) if who else len(waited.agents)
    mine = {id(r) for r in pj.stalls} | {id(r) for r in pj.timeouts}
    stopped = f.stopped_by(lambda r: id(r) in mine)
    # the headline quotes the percentile that shows the wait: p50 when most requests wait long, else
    # p90 (a queue that a quarter of the requests meet has a p50 of 0, which would read as no queue)
    q, pw, e = ("p50", pw50, e50) if pj.share50 or pw90 is None else ("p90", pw90, e90)
    figures = f"pool_wait {q} {_dur(pw)} = {_share(pw, e)} of e2e {q} {_dur(e)}"
    w = f.stall_windows
    if pj.scope == "run":
        summary = (f"client pool exhausted: requests waited for a free connection (limit {f.limit}): {figures}; "
                   f"{len(waited)} of {n} requests waited; the server was not the bottleneck")
    elif pj.scope == "apart":
        summary = (f"client pool exhausted apart from the server stall: outside the stall windows requests waited "
                   f"for a free connection (limit {f.limit}): {figures}; {len(waited)} of {n} requests there "
                   f"waited (those queued behind the stalled requests are the stall's)")
    else:
        summary = (f"client pool exhausted beyond the server stall: requests waited for a free connection "
                   f"(limit {f.limit}): {figures}; {len(waited)} of {n} requests waited; while requests were "
                   f"stalled, requests spent {f.queue_beyond_stall:.1f}x as long queued as the stalled requests "
                   f"held connections")
    fnd = Finding(Kind.CLIENT_POOL, summary, "pool_wait", first_round, who_agents, len(stopped))
    ev = fnd.evidence
    ev.append(f"rule: pool_wait at least {POOL_WAIT_SHARE:.0%} of e2e at p50 or p90, p90 at least "
              f"{POOL_WAIT_MIN_MS:g} ms, and at least {POOL_WAITED_SHARE:.0%} of requests waited; here"
              + (" (outside the stall windows)" if pj.scope == "apart" else "")
              + f" pool_wait p50 {_dur(pw50)} / p90 {_dur(pw90)}, e2e p50 {_dur(e50)} / p90 {_dur(e90)}, "
                f"{len(waited)} of {n} requests waited")
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
    return fnd


def _error_finding(f: Facts, kind: Kind, errs: list[Record], summary: str, phase: str | None) -> Finding:
    by_round = Counter(r.round for r in errs)
    fails = {id(r) for r in errs}
    stopped = f.stopped_by(lambda r: id(r) in fails)
    fnd = Finding(kind, summary, phase, min(by_round), len({r.agent for r in errs}), len(stopped))
    fnd.evidence.append("errors by round: " + fmt_round_counts(by_round)
                        + f"; {len(stopped)} agent(s) stopped on them (error_retries exhausted)")
    fnd.evidence.extend(f.backend_lines(errs, "failed"))  # the backend(s) behind a router
    thr_text, thr = _threshold_evidence(errs, f.fine_prompts, "failed")
    if thr is not None and thr_text:
        first = min(by_round)
        later_fine = any(st.fine_rounds.hi and st.fine_rounds.hi[-1] >= first for st in f.acc.agent_state.values())
        if not later_fine:  # every request from that round on failed: size and round say the same thing
            thr_text += (f"; but no request completed from round {first} on either, so the prompt size and the "
                         f"round cannot be told apart here")
        fnd.evidence.append(thr_text)
    return fnd


def rule_connect(f: Facts) -> Finding | None:
    pool = {id(r) for r in f.pool_timeouts}
    errs = [r for r in f.errors_apart if r.error in CONNECT_ERRORS and id(r) not in pool]
    if not errs:
        return None
    fnd = _error_finding(f, Kind.CONNECT, errs,
                         f"connections failed: {len(errs)} of {f.requests} requests could not connect "
                         f"({fmt_counts(Counter(r.error for r in errs))})", "connect")
    fnd.evidence.append(f"sample message: {errs[0].error_msg}")
    certs = Counter((r.error_msg or "").rpartition(" not accepted: ")[2] for r in errs if r.error == "tls_certificate")
    for why, n in certs.most_common(3):
        hint = next((h for words, h in _CERT_HINTS if any(w in why.lower() for w in words)), None)
        fnd.evidence.append(f"certificate problem ({n} request(s)): {why}" + (f": {hint}" if hint else ""))
    if any(r.error == "tls_handshake" for r in errs):
        fnd.evidence.append("the TLS handshake failed before any certificate was checked: does the endpoint speak "
                            "TLS (https://) on that port, or plain http://?")
    return fnd


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
    fnd = _error_finding(f, Kind.PROXY_TIMEOUT, recs, summary, phase)
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
    fnd = _error_finding(
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


def rule_disconnects(f: Facts) -> Finding | None:
    """The other side closed the connection. A POST lost on a stale keep-alive connection is not
    retried by aiohttp: every one is an agent request that failed for nothing."""
    explained = f.explained()
    errs = [r for r in f.errors_apart if r.error in DISCONNECT_ERRORS and id(r) not in explained]
    if not errs:
        return None
    stale = failed_reuses(errs)
    mid = [r for r in errs if "headers" in r.t]
    fnd = _error_finding(f, Kind.DISCONNECTS, errs,
                         f"the server closed connections: {len(errs)} of {f.requests} requests failed "
                         f"({len(mid)} mid-response, {len(stale)} on a stale keep-alive connection before any answer)",
                         "stream" if len(mid) >= len(stale) else "send")
    fnd.evidence.append(f"errors: {fmt_counts(Counter(r.error for r in errs))}")
    if stale:
        fnd.evidence.extend(stale_reuse_evidence(f, stale))
    fnd.evidence.extend(router_evidence(f.data, errs, "error"))  # the worker, where the router's counters say it
    return fnd


def is_failed_reuse(r: Record) -> bool:
    """A request on a reused keep-alive connection that the other side closed before any answer
    (response headers): the POST is lost, and aiohttp does not retry it."""
    return r.outcome == "error" and r.reused is True and r.error in DISCONNECT_ERRORS and "headers" not in r.t


def failed_reuses(errors: Iterable[Record]) -> list[Record]:
    return [r for r in errors if is_failed_reuse(r)]


def stale_reuse_evidence(f: Facts, stale: list[Record]) -> list[str]:
    """Why reused connections were closed under their requests, from how long each had sat idle in
    the pool (`Record.idle_ns`) against the reuses that got an answer: longer than any of those is a
    keep-alive timeout; a few milliseconds is a server that closes after its answer, whatever its
    headers promise (llama.cpp's llama-server closes after every streamed answer)."""
    ka = (f.scenario.get("client") or {}).get("keepalive_timeout")
    c = f.acc.conns
    idle = [r.idle_ns for r in stale if r.idle_ns is not None]
    head = f"{len(stale)} POST(s) on a reused keep-alive connection closed before any answer (aiohttp does not retry these)"
    if not idle:
        return [head + ": how long their connections had sat idle was not recorded, so a keep-alive timeout cannot "
                       "be told from a server that closes after each answer"]
    lo, hi = min(idle) / 1e6, max(idle) / 1e6
    span = _dur(lo) if lo == hi else f"{_dur(lo)}-{_dur(hi)}"
    head += f"; idle in the pool before the failed reuse: {span}"
    if len(idle) < len(stale):
        head += f" ({len(idle)} of {len(stale)} known)"
    ok_max = c.answered_idle_max_ns / 1e6 if c.answered_idle_max_ns is not None else None
    total = c.new + c.reused
    rate = f"{c.reused} of {total} requests reused a connection ({_share(c.reused, total)})"
    if not c.answered_reuses:
        why = (f"no reused connection ever got an answer ({rate}, every reuse failed): the server closes its "
               f"connection after each answer, whatever its response headers promise (llama.cpp's llama-server "
               f"does so after every streamed answer), and the client sent requests into that close")
        if hi < QUICK_CLOSE_MS:
            why += f"; no keep-alive timeout is as short as {_dur(hi)}"
        return [head, why + "; client.force_close = true opens a new connection per request and avoids the race"]
    if ok_max is not None and lo > ok_max:
        return [head, f"every failed reuse had sat idle longer than any reuse that got an answer "
                      f"({c.answered_idle_n}, idle at most {_dur(ok_max)}): the server's keep-alive timeout lies "
                      f"between {_dur(ok_max)} and {_dur(lo)}, shorter than the client's keepalive_timeout ({ka} s); "
                      f"set client.keepalive_timeout below {_dur(ok_max)}"]
    if ok_max is not None:
        return [head, f"reuses that got an answer had sat idle up to {_dur(ok_max)} ({rate}), the failed ones "
                      f"{span}: a race with the server's keep-alive timeout, about {_dur(max(hi, ok_max))} (the "
                      f"server counts it from its own end of the answer, which a busy client reads later), shorter "
                      f"than the client's keepalive_timeout ({ka} s); set client.keepalive_timeout well below "
                      f"{_dur(lo)}"]
    return [head, f"the idle time of the reuses that got an answer was not recorded ({rate}): a keep-alive timeout "
                  f"cannot be told from a server that closes connections at other moments"]


def _which_layer(f: Facts, errs: list[Record]) -> str | None:
    """Whether HTTP errors came from a proxy in front (its Server header or signed HTML page, unlike
    the answers that went through) or from the server itself (the header the answers carried)."""
    if not errs:
        return None
    who = who_answered(errs, f.acc.ok_servers)
    name = who.name()
    if who.proxy is not None or (who.differs and who.html and name):
        line = f"these errors came from {name} in front of the server, not from the server ({who.how()}"
        if who.differs and f.acc.ok_servers:
            line += f"; the answers that went through carried Server: {', '.join(f.acc.ok_servers)}"
        return line + ")"
    if f.acc.ok_servers and not who.differs and not who.html:
        return f"these errors came from the server itself: the Server header the answers carried ({who.how()})"
    return None


def rule_rate_limited(f: Facts) -> Finding | None:
    """HTTP 429s: the server or a gateway in front limited the rate. How many, in which rounds, what
    Retry-After asked for, and whether the retries (after that wait) got answers."""
    errs = [r for r in f.errors_apart if r.status == 429]
    if not errs:
        return None
    a = f.scenario.get("agents") or {}
    budget, cap = a.get("rate_limit_retries"), a.get("retry_after_max_s")
    rounds = {(r.agent, r.conversation, r.round) for r in errs}
    worked = len(rounds & f.acc.retried_ok)
    stopped = f.stopped_by(lambda r: r.status == 429)
    asked = sorted(r.retry_after_s for r in errs if r.retry_after_s is not None)
    if asked:
        said = (f"Retry-After asked for {asked[0]:g} s" if asked[0] == asked[-1]
                else f"Retry-After asked for {asked[0]:g}-{asked[-1]:g} s")
        if len(asked) < len(errs):
            said += f" ({len(errs) - len(asked)} without one)"
    else:
        said = "no Retry-After header"
    if worked == len(rounds):
        outcome = f"every rate-limited round completed after its retries ({worked})"
    else:
        outcome = f"{worked} of {len(rounds)} rate-limited rounds completed after retrying, {len(stopped)} agent(s) stopped"
    fnd = _error_finding(f, Kind.RATE_LIMITED, errs,
                         f"rate limited: {len(errs)} of {f.requests} requests answered HTTP 429, first in round "
                         f"{min(r.round for r in errs)}; {said}; {outcome}", "ttfb")
    fnd.evidence[0] = fnd.evidence[0].replace("(error_retries exhausted)", "(rate_limit_retries exhausted)")
    wait = (f"agentload waited what Retry-After asked, at most agents.retry_after_max_s = {cap:g} s"
            if isinstance(cap, (int, float)) else "agentload waited what Retry-After asked")
    if asked and isinstance(cap, (int, float)) and asked[-1] > cap:
        wait += f" (the server asked for up to {asked[-1]:g} s: raise retry_after_max_s to honour it)"
    fnd.evidence.append(f"retries: {wait}; each 429 retried up to agents.rate_limit_retries = {budget} time(s)")
    fnd.evidence.append(f"sample message: {errs[0].error_msg or '(empty body)'}")
    fnd.evidence.extend(router_evidence(f.data, errs, "error"))
    return fnd


def rule_server_errors(f: Facts) -> Finding | None:
    explained = f.explained()
    errs = [r for r in f.errors_apart if is_server_error(r.error) and id(r) not in explained
            and r.status != 429]  # (429s: rule_rate_limited)
    if not errs:
        return None
    by_round = Counter(r.round for r in errs)
    fnd = _error_finding(f, Kind.SERVER_ERRORS, errs,
                         f"server errors: {len(errs)} of {f.requests} requests answered with errors "
                         f"({fmt_counts(Counter(r.error for r in errs))}), first in round {min(by_round)}", "ttfb")
    fnd.evidence.append(f"sample message: {errs[0].error_msg or '(empty body)'}")
    fnd.evidence.extend(overflow_evidence(f, errs))


    layer = _which_layer(f, [r for r in errs if r.error.startswith("http_")])
    if layer:
        fnd.evidence.append(layer)
    endpoint = str(f.meta.get("endpoint") or "")
    api = str(f.meta.get("api") or "chat")
    if endpoint and any(r.error == "http_404" for r in errs):
        try:
            url, bare = api_url(endpoint, api), not base_path(endpoint, api)
        except (ValueError, KeyError):
            url, bare = endpoint, False
        fnd.evidence.append(f"HTTP 404 from {url}: the server has no such path" + (
            f"; the endpoint has no path such as /v1, and OpenAI-compatible servers serve "
            f"{with_version(endpoint, api)} (try --endpoint {with_version(endpoint, api, full=False)})"
            if bare else ""))
    fnd.evidence.extend(router_evidence(f.data, errs, "error"))  # the worker, where the router's counters say it
    return fnd


def _span(values: list[int]) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:,}" if lo == hi else f"{lo:,}-{hi:,}"


def overflow_evidence(f: Facts, errs: list[Record]) -> list[str]:
    """Context overflows in the server's own numbers (its error body: the prompt tokens it counted
    and its n_ctx), never agentload's estimate alone; with llama.cpp's /props, whether n_ctx is one
    slot's share of the context (`-c` split over `--parallel` slots)."""
    ovs = [(r, ov) for r in errs if (ov := overflow(r.status, r.error_msg)) is not None]
    if not ovs:
        return []
    counted = [ov.prompt_tokens if ov.prompt_tokens is not None else r.server_prompt_tokens for r, ov in ovs]
    counted_known = [c for c in counted if c is not None]
    ctxs = sorted({ov.n_ctx for _, ov in ovs if ov.n_ctx is not None})
    line = f"{len(ovs)} request(s) did not fit the server's context (a context overflow"
    if counted_known and ctxs:
        line += (f"): the server counted {_span(counted_known)} prompt tokens against its n_ctx of "
                 f"{', '.join(f'{c:,}' for c in ctxs)} (its own numbers, from its error body)")
    elif counted_known:
        line += f"): the server counted {_span(counted_known)} prompt tokens (its error body gives no n_ctx)"
    else:
        line += "): the server's error body gives neither its prompt token count nor its n_ctx"
    line += f"; agentload's estimate of those prompts: {_span([r.prompt_tokens for r, _ in ovs])} tokens"
    if f.acc.fine_server_prompt_max is not None:
        line += f"; the largest prompt that completed: {f.acc.fine_server_prompt_max:,} tokens by the server's count"
    out = [line, "a prompt over the context never fits: these requests were not retried (error_retries not spent)"]
    props = f.meta.get("server_props") or {}
    slots, per = props.get("total_slots"), props.get("n_ctx_per_slot")
    if isinstance(slots, int) and isinstance(per, int) and (not ctxs or per in ctxs):
        if slots > 1:
            out.append(f"llama.cpp's /props: n_ctx {per:,} is one slot's share: total_slots = {slots} split the "
                       f"context ({slots} x {per:,} = {slots * per:,} tokens, llama-server -c over --parallel "
                       f"{slots}); a request gets one slot's {per:,}: fewer slots or a larger -c let it fit")
        else:
            out.append(f"llama.cpp's /props: one slot (total_slots = 1) with n_ctx {per:,}: the whole context")
    return out


def rule_bad_responses(f: Facts) -> Finding | None:
    """Answers that came back but did not follow the protocol: not an event stream, unparseable
    events, a stream with no token and no finish_reason. Malformed events in answers that
    otherwise completed count too: agentload did not see them go right."""
    errs = [r for r in f.errors_apart if r.error in PROTOCOL_ERRORS]
    odd = f.odd
    if not errs and not odd:
        return None
    n = f.requests
    if errs:
        fnd = _error_finding(f, Kind.BAD_RESPONSES, errs,
                             f"bad responses: {len(errs)} of {n} requests got an answer that is not a valid chat "
                             f"completion ({fmt_counts(Counter(r.error for r in errs))}), first in round "
                             f"{min(r.round for r in errs)}", "ttft")
        fnd.evidence.append(f"sample: {errs[0].error_msg}")
    else:
        fnd = Finding(Kind.BAD_RESPONSES,
                      f"bad responses: {len(odd)} of {n} answers carried malformed events (not JSON, or not the "
                      f"fields the protocol says), first in round {min(r.round for r in odd)}",
                      "stream", min(r.round for r in odd), len({r.agent for r in odd}), 0)
    if odd:
        fnd.evidence.append(f"{sum(r.bad_events for r in odd)} malformed event(s) in {len(odd)} answer(s) that "
                            f"otherwise completed")
    fnd.evidence.extend(router_evidence(f.data, errs or odd, "error"))  # the worker, where the router's counters say it
    return fnd


_PROTOCOL_WHAT = {
    "events_after_done": "data events after [DONE]",
    "held_open_after_done": "the server held the body open after [DONE]",
}
_PROTOCOL_WHY = {
    "events_after_done": "[DONE] ends the answer: an SDK client (openai-python's stream) stops there, so what "
                         "came after it reaches no agent; agentload counted none of it (tokens, finish_reason, "
                         "usage)",
    "held_open_after_done": "the answer was complete at [DONE], but the body did not end: an SDK client that reads "
                            "to the body's end waits for it, and the connection cannot serve another request; "
                            "agentload ended the read then and closed the connection (its e2e ends at the "
                            "[DONE])",
}


def rule_protocol(f: Facts) -> Finding | None:
    """Answers that were read, but whose stream broke the protocol around its [DONE]: events after
    it (never counted), a body held open past it (ended by agentload). Nothing stopped: no agent
    ended on it, but agentload did not see these go right."""
    t = f.acc.protocol
    if not t:
        return None
    lo = min(t.rounds)
    what = "; ".join(f"{_PROTOCOL_WHAT.get(code, code)} in {n}" for code, n in t.codes.most_common())
    fnd = Finding(Kind.PROTOCOL,
                  f"protocol: {t.records} of {f.requests} answers broke the stream protocol around [DONE] ({what}), "
                  f"first in round {lo}; each answer was taken up to its [DONE]",
                  "stream", lo, len(t.agents), 0)
    ev = fnd.evidence
    ev.append("answers by round: " + fmt_round_counts(t.rounds))
    for code, n in t.codes.most_common():
        ev.append(f"{code} ({n} answer(s)), the first: {t.first.get(code, '')}")
        why = _PROTOCOL_WHY.get(code)
        if why:
            ev.append(why)
    return fnd


def rule_other_errors(f: Facts) -> Finding | None:
    """Failures of a class no other rule knows: named, never dropped."""
    known = DISCONNECT_ERRORS | CONNECT_ERRORS | PROTOCOL_ERRORS
    errs = [r for r in f.errors if r.error not in known and not is_server_error(r.error)
            and not r.stalled_phase]
    if not errs:
        return None
    fnd = _error_finding(f, Kind.OTHER_ERRORS, errs,
                         f"requests failed: {len(errs)} of {f.requests} ({fmt_counts(Counter(r.error for r in errs))})",
                         None)
    fnd.evidence.append(f"sample message: {errs[0].error_msg}")
    return fnd


def _tool_call_finding(f: Facts, kind: Kind, t: CodeTally, head: str, truncated: bool) -> Finding:
    """The finding of answers with tool-call problems (`t`: those records, tallied)."""
    stopped = {a for a, r in f.tool_call_stopped.items() if _truncated(r.tool_call_problems) == truncated}
    lo = min(t.rounds)
    summary = f"{head}, first in round {lo}"
    if stopped:
        summary += (f"; {len(stopped)} of {len(f.agents)} agents ended there: agentload never sends back a "
                    f"tool call it would have to invent or repair")
    fnd = Finding(kind, summary, None, lo, len(t.agents), len(stopped))
    ev = fnd.evidence
    ev.append("answers by round: " + fmt_round_counts(t.rounds) + f"; finish_reason: {fmt_counts(t.finish)}")
    for code, n in t.codes.most_common():
        ev.append(f"{code} in {n} answer(s), the first: {t.first.get(code, '')}")
    if f.model_mode:
        ev.append("conversation.mode = \"model\": an answer whose tool calls cannot be sent back as they came "
                  "ends that agent's conversation (a real harness could not run them either); one cut after "
                  "whole tool calls goes on with them")
    else:
        ev.append("conversation.mode = \"scripted\": the agents sent their own tool calls back and went on; an "
                  "agent that runs the model's calls could not have")
    return fnd


def rule_truncated(f: Facts) -> Finding | None:
    """Answers cut by max_tokens (finish_reason length) that carried a tool call or were asked for
    one (tool_choice "required" or a tool's name): the most common way a real agent loops or stops.
    Cut mid-arguments, the call cannot be run; after whole calls, the model may have meant more."""
    t = f.acc.truncated
    if not t:
        return None
    cut = t.codes.get("bad_arguments", 0)
    head = (f"truncated: {t.records} of {f.requests} answers were cut by max_tokens (finish_reason length) "
            f"with a tool call in them or asked for"
            + (f", the tool call's arguments cut mid-JSON in {cut}" if cut else ""))
    fnd = _tool_call_finding(f, Kind.TRUNCATED, t, head, True)
    conv = f.scenario.get("conversation") or {}
    fnd.evidence.append(f"conversation.max_tokens = {conv.get('max_tokens')}: a tool call needs room for its "
                        f"whole arguments; raise it, or see why the model's answers run this long")
    return fnd


def rule_malformed_tool_calls(f: Facts) -> Finding | None:
    """Complete answers whose tool calls cannot be sent back as they came: a call without an id or a
    name, arguments that are not a JSON object, two calls on one index (which a client joins into
    one). agentload never repairs one: in mode model the conversation ends there."""
    t = f.acc.malformed
    if not t:
        return None
    what = ", ".join(f"{code} x{n}" for code, n in t.codes.most_common())
    head = (f"malformed tool calls: {t.records} of {f.requests} answers had tool calls that cannot be sent back "
            f"as they came ({what})")
    return _tool_call_finding(f, Kind.MALFORMED_TOOL_CALLS, t, head, False)


def rule_no_tool_calls(f: Facts) -> Finding | None:
    """mode = "model": an agent goes on only when the model calls a tool. One that answered without
    a tool call before the last round ended its conversation there: a run of one round is not the
    multi-round load asked for, whatever the latencies say."""
    ended = f.no_tool_call
    if not ended:
        return None
    by_round = Counter(rnd for rnd, _, _ in ended.values())
    finish = Counter(fr if fr is not None else "none" for _, fr, _ in ended.values())
    lo, hi = min(by_round), max(by_round)
    where = f"round {lo}" if lo == hi else f"rounds {lo}-{hi}"
    n = len(ended)
    fnd = Finding(Kind.NO_TOOL_CALLS,
                  f"{n} of {len(f.agents)} agents ended early: the model answered without a tool call in {where} "
                  f"(finish_reason {fmt_counts(finish)}); the conversation could not go on",
                  None, lo, n, n)
    conv = f.scenario.get("conversation") or {}
    ev = fnd.evidence
    ev.append("answers without a tool call that ended a conversation, by round: "
              + fmt_round_counts(by_round)
              + f" (agents.rounds = {f.max_rounds}); conversation.mode = \"model\" goes on only when the model "
                f"calls a tool")
    if finish.get("length"):
        ev.append(f"finish_reason length: {finish['length']} answer(s) ran into conversation.max_tokens = "
                  f"{conv.get('max_tokens')} before any tool call")
    empty = sum(1 for _, _, tokens in ended.values() if not tokens)
    if empty:
        ev.append(f"{empty} of these answers carried no token at all (an empty answer)")
    props = f.meta.get("server_props") or {}
    if conv.get("tools") == 0:
        ev.append("the conversation offers no tools (conversation.tools = 0): the model cannot call one")
    elif props.get("supports_tool_calls") is False:
        choice = conv.get("tool_choice")
        ev.append("the server cannot call tools: llama.cpp's /props says its chat template does not support tool "
                  "calls (chat_template_caps.supports_tool_calls = false)"
                  + (f"; conversation.tool_choice = \"{choice}\" was sent, and no tool_choice changes that"
                     if choice is not None else "; no tool_choice changes that")
                  + ": start llama-server with --jinja and a model (or --chat-template-file) whose template calls "
                    "tools, or use mode = \"scripted\" to keep the agents going whatever the model says")
    else:
        choice = conv.get("tool_choice")
        ev.append((f"conversation.tool_choice = \"{choice}\" was sent" if choice is not None else
                   "conversation.tool_choice was not sent (the server's default)")
                  + "; tool_choice = \"required\" or a tool's name (\"tool_0\") asks the server for a tool call "
                    "(llama-cpp-python takes a name, not \"required\"), or mode = \"scripted\" keeps the agents "
                    "going whatever the model says")
    done = [f.fine_rounds_before(a, rnd) for a, (rnd, _, _) in ended.items()]
    ev.append(f"each of them completed {min(done) if min(done) == max(done) else f'{min(done)}-{max(done)}'} "
              f"round(s) with a tool call first")
    return fnd


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
    for a, rnd, idle_s, usual_s, wait_s, own in stopped[:10]:
        gap = (f"its usual gap between rounds {_dur(usual_s * 1e3)}" if own else
               f"no gap of its own yet, the conversations' usual gap {_dur(usual_s * 1e3)}" if usual_s is not None else
               "no gap between rounds measured yet")
        ev.append(f"conversation {a}: round {rnd} answered (tool calls to run), then no request for "
                  f"{_dur(idle_s * 1e3)} before the proxy stopped ({gap}; counted as stopped past {_dur(wait_s * 1e3)}: "
                  f"{CLIENT_STOPPED_GAPS:g}x that gap, at least stall.after_s)")
    going = len(states) - n
    ev.append(f"{going} other conversation(s) went on or ended on their own: the server was answering")
    return fnd


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


def rule_canary_failures(f: Facts) -> Finding | None:
    """Canaries (a fresh connection and a short prompt every canary.every_s) that failed are
    something agentload did not see go right, even when every agent request did. A canary the run
    cut short at its end is neither a success nor a failure. Canaries that failed while requests
    stalled at the server are that rule's evidence; only those outside its windows are a finding."""
    failed = f.canary.failed()
    w = f.stall_windows
    if w is not None:
        failed = [c for c in failed if not c.t or not w.touches(c.t.get("start", 0), _end_ns(c.t))]
    if not failed:
        return None
    sent = f.canary.sent()
    timeout = (f.scenario.get("canary") or {}).get("timeout_s")
    slow = slow_canaries(f, failed)
    if slow is not None:  # they timed out behind the slowness every agent met: that is the finding
        # (beside a server stall, the stall's finding tells that slowness, these canaries in its evidence)
        return _slow_for_everyone(f, slow, failed, sent) if w is None else None
    fnd = Finding(Kind.CANARY_FAILURES,
                  f"canaries failed{' outside the server stall' if w is not None else ''}: {len(failed)} of {sent} "
                  f"(fresh connection, short prompt) "
                  f"({fmt_counts(Counter(c.error or c.outcome for c in failed))})",
                  phase_at(failed[0].t, failed[0].reused))
    fnd.evidence.append(f"sample message: {failed[0].error_msg}"
                        + (f" (a canary gives up at its own canary.timeout_s = {timeout:g} s)" if timeout else ""))
    return fnd


def _slow_for_everyone(f: Facts, slow: SlowCanaries, failed: list[Record], sent: int) -> Finding:
    """The server answered every agent, slowly (no gap of stall.after_s), and the canaries ran out of
    their own canary.timeout_s behind the same slowness."""
    e50 = pct_ms(f.acc.e2e_ok, 50)
    stream = slow.need_ms - slow.to_token_ms
    fnd = Finding(Kind.SERVER_SLOW,
                  f"server slow for everyone: answers took {_dur(e50)} at p50 (first token after "
                  f"{_dur(slow.to_token_ms)}, then a token chunk every {_dur(slow.pace_ms)}"
                  + (f" ({1000.0 / slow.pace_ms:.2g}/s)" if slow.pace_ms else "") + f"); {len(failed)} of {sent} "
                  f"canaries timed out behind the same slowness",
                  "stream" if stream >= slow.to_token_ms else "ttft", None, len(f.agents), 0)
    fnd.evidence.append(f"canaries (fresh connection, short prompt): {slow.how}; they are this slowness' "
                        f"evidence, not a failure of their own")
    fnd.evidence.append(f"every agent request that completed did so with no gap of stall.after_s "
                        f"({f.after_s:g} s): slow, not hung ({f.fine} of {f.requests} completed without a stall)")
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
    leaks = [x for x in f.router.inflight(f.acc.min_start, f.acc.max_end)
             if x["leaked"] > 0]
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


RULES: list[Callable[[Facts], Finding | None]] = [
    rule_agentload_error,
    rule_client_saturated,
    rule_server_stall,
    rule_client_pool,
    rule_connect,
    rule_proxy_timeout,
    rule_concurrency_limit,
    rule_disconnects,
    rule_rate_limited,
    rule_server_errors,
    rule_bad_responses,
    rule_protocol,
    rule_other_errors,
    rule_truncated,
    rule_malformed_tool_calls,
    rule_no_tool_calls,
    rule_client_stopped,
    rule_buffered_stream,
    rule_canary_failures,
    rule_router_leak,
    rule_killed_while_stalled,
]


def findings(f: Facts, rules: list[Callable[[Facts], Finding | None]] = RULES) -> list[Finding]:
    """Every rule's finding, the lead first: most agents stopped, then rule order."""
    out: list[tuple[int, Finding]] = []
    for i, rule in enumerate(rules):
        try:
            fnd = rule(f)
        except Exception as e:  # a finding not computed is a failure of agentload, never a pass
            tb = traceback.format_exc().strip().splitlines()
            fnd = Finding(Kind.AGENTLOAD_ERROR,
                          f"agentload could not compute the {rule.__name__.removeprefix('rule_')} rule "
                          f"({type(e).__name__}: {e}); the verdict is incomplete",
                          evidence=[tb[-3].strip() if len(tb) >= 3 else repr(e)])
        if fnd is not None:
            out.append((i, fnd))
    out.sort(key=lambda x: (-x[1].agents_stopped, x[0]))
    return [fnd for _, fnd in out]


def healthy(f: Facts) -> dict[str, Any]:
    ft = f.acc.with_token  # fine answers with a token; their sent -> first token in acc.to_token
    pct = percentiles_ms(f.acc.to_token, (50, 99)) or {}
    p50, p99 = pct.get(50), pct.get(99)
    pw90 = f.pool_wait_ms[1]
    v = Finding(Kind.HEALTHY,
                f"healthy: {f.fine} of {f.requests} requests completed without a stall over "
                f"{f.acc.max_round} round(s); pool_wait p90 {_dur(pw90)}").to_dict()
    if ft:
        v["evidence"].append(f"request sent -> first token: p50 {_dur(p50)}, p99 {_dur(p99)} "
                             f"({ft} answers with a token)")
    empty = f.acc.no_token_finish  # fine answers with no token, by finish_reason
    if len(empty):
        v["evidence"].append(f"{len(empty)} answer(s) finished with no token "
                             f"({fmt_counts(empty.counter())})")
    if f.waiters_max:
        v["evidence"].append(f"up to {f.waiters_max} waiter(s) queued for a connection, below the pool rule's "
                             f"threshold")
    return v


def diagnose(data: "RunData", acc: FactsAccumulator | None = None, router: RouterFacts | None = None) -> dict[str, Any]:
    """The verdict: the lead finding's fields, its evidence, and the others as `secondary`.
    `acc`: the facts gathered by the report's pass over the records (else a pass of its own);
    `router`: the router analysis's facts of the run (else made here)."""
    f = Facts(data, acc, router)
    found = findings(f)
    if not found:
        if not f.requests:
            v = Finding(Kind.NO_DATA, "no agent request was recorded, so there is nothing to judge").to_dict()
        else:
            v = healthy(f)
        v["secondary"] = []
        return v
    names = _backend_names(data.meta)
    v = _named(found[0].to_dict(), names)
    v["secondary"] = [_named(x.to_dict(), names) for x in found[1:]]
    return v


def _backend_names(meta: dict[str, Any]) -> list[tuple[str, str]]:
    """(url, "url (name)") of each fleet backend: a router's metrics name workers by URL only."""
    fleet = meta.get("fleet") or {}
    out = []
    for b in fleet.get("backends") or []:
        if isinstance(b, dict) and b.get("url") and b.get("name"):
            role = "" if b.get("role") in (None, "worker") else f" {b['role']}"
            out.append((b["url"], f"{b['url']} ({b['name']}{role})"))
    return out


def _named(v: dict[str, Any], names: list[tuple[str, str]]) -> dict[str, Any]:
    if names:
        def sub(text: str) -> str:
            for url, named in names:
                text = re.sub(re.escape(url) + r"(?![\d/])", named, text)
            return text

        v["evidence"] = [sub(e) for e in v.get("evidence") or []]
    return v


def agent_outcomes(data: "RunData", acc: FactsAccumulator | None = None) -> list[dict[str, Any]]:
    """summary.json's agents: how each conversation ended, from the per-agent state of the pass."""
    if acc is None:
        acc = FactsAccumulator()
        one_pass(data, [acc])
    sc = data.meta.get("scenario") or {}
    max_rounds = int((sc.get("agents") or {}).get("rounds") or 0)
    model_mode = (sc.get("conversation") or {}).get("mode") == "model"
    at_duration = data.meta.get("ended_by") == "duration"
    stopped_early = bool(data.meta.get("cut_short")) or not data.meta.get("ended", True)
    crashed = {c["agent"]: c for c in data.meta.get("crashes") or [] if c.get("where") == "agent"
               and c.get("agent") is not None}
    # a shard lost mid-run (`--ray`): its agents' last records may look fine, but they were cut short
    shard_count = int(data.meta.get("workers") or 1)
    lost = {int(x["shard"]): x for x in data.meta.get("lost_shards") or [] if isinstance(x, dict) and "shard" in x}
    out = []
    per = acc.agent_state
    for agent in sorted(per):
        st = per[agent]
        last = st.last  # the last request (by round, call), when it went wrong; None when it was fine
        entry: dict[str, Any] = {"agent": agent, "rounds_completed": len(st.ok_rounds), "requests": st.requests}
        if agent in crashed:
            c = crashed[agent]
            entry.update(outcome="crashed", error=f"{c.get('error')}: {c.get('message')}",
                         error_round=c.get("round"))
        elif last is not None and last.stalled_phase and last.outcome != "ok":
            # Given up, cut short while stalled, or ended by the server after it stalled: the stall is the story.
            entry.update(outcome="stalled", stalled_round=last.round, stalled_phase=last.stalled_phase)
            if last.outcome == "error":
                entry["error"] = last.error
        elif lost and agent % shard_count in lost:
            entry.update(outcome="cut_short", reason=f"shard {agent % shard_count} lost: "
                                                     f"{lost[agent % shard_count].get('reason')}")
        elif last is not None and last.outcome == "cut_short":
            entry["outcome"] = "cut_short"
        elif last is not None and last.outcome == "error":
            entry.update(outcome="error", error=last.error, error_round=last.round)
        elif model_mode and st.ended_on_tool_call_problems(max_rounds):
            # tool calls agentload could not send back as they came: the conversation ended there
            entry.update(outcome="bad_tool_calls", bad_tool_calls_round=st.last_round, finish_reason=st.last_finish,
                         tool_call_problems=list(last.tool_call_problems or []))
        elif model_mode and st.ended_without_tool_call(max_rounds):
            # the model answered without a tool call: the conversation had nothing to go on with
            entry.update(outcome="no_tool_call", no_tool_call_round=st.last_round, finish_reason=st.last_finish)
        elif st.last_round < max_rounds:
            # the run stopped between two of its rounds: at duration_s as planned, or early (signal)
            entry["outcome"] = "duration_reached" if at_duration else ("cut_short" if stopped_early else "done")
        else:
            entry["outcome"] = "done"
        if st.stalls and "stalled_round" not in entry:
            entry["stalls_survived"] = st.stalls
        out.append(entry)
    for agent, c in sorted(crashed.items()):  # crashed before its first request: no record at all
        if agent not in per:
            out.append({"agent": agent, "rounds_completed": 0, "requests": 0, "outcome": "crashed",
                        "error": f"{c.get('error')}: {c.get('message')}", "error_round": c.get("round")})
    return out
