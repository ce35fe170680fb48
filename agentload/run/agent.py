"""One agent's loop over rounds: request, (the model's or scripted) tool calls, tool work, results.

Every request goes through `attempt`, which registers its Trace in the in-flight registry
(so the watchdog can see it stall and fire its give-up timeout) and always leaves exactly
one record, whether it completed, failed, stalled or was cut short. Reading the response into
that record is guarded too: an answer agentload's own code cannot read (a `usage` that is not
an object, ...) becomes an `error` record plus a crash entry in run.json (`ctx.record_crash`),
never an agent that dies with its measurement. An exception of a programming-error type
(`AGENTLOAD_BUGS`) out of the send path is recorded the same way: the request as an error,
the fault as agentload's own, so the verdict does not blame the server for it.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from hashlib import blake2b as _blake
from typing import TYPE_CHECKING, Any

from agentload.errors import drop_tracebacks
from agentload.records import Record, Trace, tool_calls_sendable
from agentload.records.overflow import overflow
from agentload.run.answer import Result
from agentload.run.context import AgentState
from agentload.run.conversation import (  # numpy Generator per agent
    Conversation,
    agent_rng,
)
from agentload.run.replay import new_conversation
from agentload.run.request import Tap, classify_exception, send, sent_request_id
from agentload.run.request_body import ConversationBody

if TYPE_CHECKING:
    from agentload.run.context import RunContext

_now = time.perf_counter_ns
_current_task = asyncio.current_task

# How long past a stream's [DONE] its body's end is waited for (the end of the chunked body usually
# comes in the same read or the next); a body still open then is ended and its connection closed
# (`request.SSEBody`). At most half of stall.after_s, so a held-open body is never a stall.
DONE_GRACE_S = 1.0


# Exceptions that mean agentload's own code is wrong, not the network or the server: a request
# that ends in one is still recorded (outcome error), and run.json gets a crash entry for it.
AGENTLOAD_BUGS = (TypeError, AttributeError, KeyError, IndexError, NameError, AssertionError,
                  ZeroDivisionError, RecursionError)


def _int_or_none(v: object) -> int | None:
    return v if type(v) is int else None


def _record(ctx: "RunContext", trace: Trace, result: Result) -> Record:
    """The record of a finished request: everything read from the response is read here."""
    cs = result.stream
    if result.error == "stall_give_up":
        outcome = "stalled"
    elif result.error is not None:
        outcome = "error"
    else:
        outcome = "ok"
    usage = cs.usage if cs is not None else None
    if not isinstance(usage, dict):  # "usage": "n/a", a list, ...: not usage
        usage = None
    fr = cs.finish_reason if cs is not None else None
    fp = cs.fingerprint if cs is not None else None
    conv = ctx.scenario.conversation
    details = usage.get("prompt_tokens_details") if usage else None
    spt = _int_or_none(usage.get("prompt_tokens")) if usage else None
    if spt is None and outcome == "error":  # a context overflow's body: the server's own count of the prompt
        ov = overflow(result.status, result.error_msg)
        spt = ov.prompt_tokens if ov is not None else None
    return Record.from_trace(
        ctx.run_id, trace, outcome=outcome, status=result.status, error=result.error,
        error_msg=result.error_msg,
        server_prompt_tokens=spt,
        output_tokens=_int_or_none(usage.get("completion_tokens")) if usage else None,
        finish_reason=fr if isinstance(fr, str) else None,
        tool_calls=cs.tool_call_count if cs is not None else 0,
        backend=fp[:200] if type(fp) is str and fp else None,
        cached_tokens=_int_or_none(details.get("cached_tokens")) if type(details) is dict else None,
        protocol=result.protocol,
        tool_call_problems=(cs.tool_call_problems(conv.tool_call_asked(), conv.max_tokens)
                            if cs is not None and trace.kind == "agent" and result.error is None else None),
        retry_after_s=result.retry_after_s,
    )


class _GiveUp:
    """The give-up of one request, fired by the watchdog (`Trace.timeout_cm.reschedule(now)`): a
    cancel of the request's task, which `attempt` tells from any other cancel (the run's teardown)
    by `Trace.gave_up` and the task's count of cancel requests, the rule of `asyncio.timeout`,
    without its context manager per request (a third of the cost)."""

    __slots__ = ("task",)

    def __init__(self, task: asyncio.Task):
        self.task = task

    def reschedule(self, when: float | None) -> None:
        self.task.cancel()


def _gave_up(ctx: "RunContext", trace: Trace) -> Result:
    if trace.kind.startswith("probe_"):  # a probe is given up as soon as it stalls (agentload.run.probes)
        return Result(None, None, "stall_give_up", f"no progress in {trace.stalled_phase} for stall.after_s = "
                                                   f"{ctx.scenario.stall.after_s:g}s: a probe ends once it stalls")
    return Result(None, None, "stall_give_up",
                  f"no progress in {trace.stalled_phase} for {ctx.scenario.stall.give_up_s:g}s")


def _context_headers(ctx: "RunContext", trace: Trace, headers: dict[str, str] | None) -> dict[str, str]:
    """The request's trace context (`traceparent`: a trace per conversation, a span per request) and
    session header (`[target] session_header`), beside `headers` (a harness's own, through the proxy,
    win: its traceparent is what the servers log)."""
    target = ctx.scenario.target
    out = dict(headers) if headers else {}
    own = {k.lower() for k in headers} if headers else ()  # (a run's agents: none, no set per request)
    if target.traceparent:
        if "traceparent" in own:
            trace.traceparent = next(v for k, v in out.items() if k.lower() == "traceparent")
        else:
            trace.traceparent = out["traceparent"] = traceparent(ctx.run_id, trace)
    name = target.session_header
    if name and name.lower() not in own:
        out[name] = (f"{ctx.run_id}-g{trace.group}" if target.session_scope == "group" and trace.group is not None
                     else f"{ctx.run_id}-a{trace.agent}-k{trace.conversation}")
    return out


def traceparent(run_id: str, trace: Trace) -> str:
    """W3C trace context: version 00, a trace id per conversation (run, agent, conversation), a span id
    per request (from the request id sent, else the readable one), sampled."""
    key = (run_id, trace.agent, trace.conversation)
    tid = _TRACE_IDS.get(key)
    if tid is None:  # a conversation's first request (or one the bounded cache let go)
        if len(_TRACE_IDS) >= _TRACE_IDS_MAX:
            _TRACE_IDS.clear()
        tid = _TRACE_IDS[key] = _blake(f"{run_id}-a{trace.agent}-k{trace.conversation}".encode(),
                                       digest_size=16).hexdigest()
    sid = trace.id_sent.replace("-", "")[:16] if trace.id_sent and len(trace.id_sent) >= 32 else \
        _blake(trace.request_id.encode(), digest_size=8).hexdigest()
    return f"00-{tid}-{sid}-01"


# Each conversation's trace id, hashed once (its rounds' requests share it), the last few thousand
# conversations' (10,000 agents in turn: they are hashed again, nothing else lost).
_TRACE_IDS: dict[tuple[str, int, int], str] = {}
_TRACE_IDS_MAX = 4096


def _client_gone(trace: Trace) -> Result:
    ph = trace.phase()
    waited = (_now() - trace.t.get("start", _now())) / 1e9
    return Result(None, None, "client_gone",
                  f"the client closed its connection in {ph} after {waited:.1f}s; the upstream request was cancelled")


async def attempt(ctx: "RunContext", session, trace: Trace, body: "bytes | ConversationBody", *,
                  url: str | None = None, headers: dict[str, str] | None = None,
                  tap: "Tap | None" = None, stream_cls: Any = None) -> tuple[Record, Result | None]:
    """Send one request under the give-up timeout; return its record (already written).

    `url`, `headers`, `tap` (`agentload proxy`): where it goes instead of the run's endpoint, the
    harness's headers, where the answer goes on to; a request the harness gave up on (it closed its
    connection, `tap.client_gone()`) is recorded as `client_gone`, its upstream request cancelled."""
    ctx.inflight[trace.request_id] = trace
    target = ctx.scenario.target
    id_header = target.request_id_header
    if id_header:  # the id the server sees, derived once per request from the readable one
        trace.id_sent = sent_request_id(trace.request_id, target.request_id_format)
    if target.traceparent or target.session_header:
        headers = _context_headers(ctx, trace, headers)
    result: Result | None = None
    bug: BaseException | None = None
    caught: BaseException | None = None
    task: asyncio.Task = _current_task()  # type: ignore[assignment]  # (a request is always sent from a task)
    cancelling = task.cancelling()
    try:
        trace.timeout_cm = _GiveUp(task)
        result = await send(session, url or ctx.url, body, trace, extra_headers=headers, id_header=id_header,
                            tap=tap, stream_cls=stream_cls or ctx.stream_cls,
                            done_grace_s=min(DONE_GRACE_S, ctx.scenario.stall.after_s / 2))
    except TimeoutError as e:
        caught = e
        if trace.gave_up:
            task.uncancel()
            result = _gave_up(ctx, trace)
        else:
            err, msg = classify_exception(e)
            result = Result(None, None, err, msg)
    except asyncio.CancelledError as e:
        if trace.gave_up and task.uncancel() <= cancelling:  # the watchdog's cancel, no one else's
            caught = e
            result = _gave_up(ctx, trace)
        elif tap is not None and tap.client_gone() and not ctx.stopping:
            task.uncancel()  # (the server's cancel of a handler whose client left: it ends here)
            caught = e
            result = _client_gone(trace)
        else:
            # The run is being torn down: keep what was measured, then let the cancel go on.
            trace.t.setdefault("end", _now())
            rec = Record.from_trace(ctx.run_id, trace, outcome="cut_short", error="cut_short",
                                    error_msg="run ended while the request was in flight")
            ctx.emit(rec)
            ctx.inflight.pop(trace.request_id, None)
            raise
    except Exception as e:  # every failure becomes a record; nothing measured is lost
        caught = e
        if trace.gave_up:  # (the give-up's cancel came out as something else)
            task.uncancel()
        err, msg = classify_exception(e)
        result = Result(None, None, err, msg)
        if isinstance(e, AGENTLOAD_BUGS):
            bug = e
        elif tap is not None and tap.client_gone():
            result = _client_gone(trace)
    finally:
        trace.timeout_cm = None
    ctx.inflight.pop(trace.request_id, None)
    trace.t.setdefault("end", _now())
    try:
        rec = _record(ctx, trace, result)
    except Exception as e:  # agentload could not read the answer: still a record, and a crash entry
        bug = e
        err, msg = classify_exception(e)
        result = Result(result.status if result is not None else None, None, err,
                        f"agentload could not read the response: {msg}"[:300])
        rec = Record.from_trace(ctx.run_id, trace, outcome="error", status=result.status, error=err,
                                error_msg=result.error_msg)
    ctx.emit(rec)
    if bug is not None:
        ctx.record_crash(trace.kind, bug, agent=trace.agent if trace.kind == "agent" else None,
                         round=trace.round if trace.kind == "agent" else None, request_id=trace.request_id)
    if caught is not None:  # (the cycle it made: see drop_tracebacks)
        drop_tracebacks(caught)
        caught = bug = None
    return rec, result


async def run_agent(ctx: "RunContext", agent: int, intended_start: int | None = None) -> AgentState:
    sc = ctx.scenario
    conv_cfg = sc.conversation
    st = ctx.agent_states[agent] = AgentState(agent)
    rng = agent_rng(sc.agents.seed, agent)
    session = ctx.transport.session_for(agent)
    intended = intended_start
    try:
        # With agents.restart, a finished conversation is followed by a new one (round 1 again, from
        # the same seeded stream) until the run stops: prompt sizes keep their distribution for hours.
        for k in itertools.count():
            if k and (ctx.stopping or not sc.agents.restart):
                break
            plans = ctx.replay_plans
            conv = (Conversation(conv_cfg, sc.target.model, rng, agent, ctx.tools, sc.target.api) if plans is None
                    else new_conversation(conv_cfg, sc.target.model, rng, agent, ctx.tools,
                                          plans[agent % len(plans)], sc.replay.speed, sc.target.api))
            if await _conversation(ctx, st, conv, session, k, intended) != "done":
                return st
            intended = None
            st.conversations = k + 1
        if st.state not in ("cut_short",):
            st.state = "done"
        return st
    finally:
        if sc.client.session == "per_agent":
            await ctx.transport.close_agent(agent)


async def _conversation(ctx: "RunContext", st: AgentState, conv: Conversation, session, k: int,
                        intended: int | None) -> str:
    """One conversation of `sc.agents.rounds` rounds; "done" when it ran its course, else the state the
    agent ends in (stalled, error, cut_short; also set on `st`)."""
    sc = ctx.scenario
    for rnd in range(1, sc.agents.rounds + 1):
        if ctx.stopping:
            st.state = "cut_short"
            break
        st.round = rnd
        got = await _answered(ctx, st, conv, session, k, rnd, intended)
        intended = None
        if isinstance(got, str):
            return got
        rec, res = got
        st.rounds_completed += 1 if (res is not None) else 0
        assistant = _assistant_turn(sc.conversation, conv, rnd, rec, res)
        if assistant is None:
            return "done"
        if rnd == sc.agents.rounds or rnd == conv.last_round:
            break
        # nothing of this request is needed in the tool time: let it go (10,000 sleeping agents)
        del got, rec, res
        st.state, st.since = "tool", _now()
        delay = conv.tool_latency_s()
        if delay > 0:
            conv.body()  # the appended answer joined in now: orjson's bytes hold 4 KiB each while the agent sleeps
            await ctx.sleep(delay)
        for msg in conv.tool_results(assistant):
            conv.append(msg)
        if not assistant.get("tool_calls"):
            conv.next_user_turn()
    return "cut_short" if st.state == "cut_short" else "done"


async def _answered(ctx: "RunContext", st: AgentState, conv: Conversation, session, k: int, rnd: int,
                    intended: int | None) -> "tuple[Record, Result | None] | str":
    """Round `rnd`'s request, sent again as the retry rules allow until it is answered: its record and
    result (None: a stall given up with `on_give_up = "next_round"`), else the state the agent ends in."""
    sc = ctx.scenario
    agent = st.agent
    call = errors = 0
    limited = 0  # HTTP 429s in this round
    while True:
        body = ConversationBody(conv)  # the bytes stay with the conversation: parked there while queued
        rid = f"{ctx.run_id}-a{agent}-k{k}-r{rnd}-c{call}" if k else f"{ctx.run_id}-a{agent}-r{rnd}-c{call}"
        trace = Trace("agent", agent, rnd, call, rid, conv.n_messages, body.size, conv.tokens,
                      intended, conversation=k)
        trace.group = conv.group
        intended = None
        st.state, st.since, st.trace = "request", _now(), trace
        rec, res = await attempt(ctx, session, trace, body)
        st.trace = None
        if rec.outcome == "ok":
            return rec, res
        if ctx.stopping:
            st.state = "cut_short"
            return st.state
        if rec.outcome == "stalled":
            policy = sc.stall.on_give_up
            if policy == "retry" and call < sc.stall.max_retries:
                call += 1
                continue
            if policy == "next_round":
                return rec, None
            st.state = "stalled"
            return st.state
        if rec.status == 429:  # rate limited: its own budget, the wait its Retry-After asks for
            limited += 1
            n, budget = limited, sc.agents.rate_limit_retries
        else:
            errors += 1
            n, budget = errors, sc.agents.error_retries
        if n > budget or overflow(rec.status, rec.error_msg) is not None:
            # (a prompt over the server's context never fits: the same request again cannot succeed)
            st.state = "error"
            return st.state
        call += 1
        asked = res.retry_after_s if res is not None else None
        await ctx.sleep(min(asked if asked is not None else 0.2 * n, sc.agents.retry_after_max_s))
        if ctx.stopping:
            st.state = "cut_short"
            return st.state


def _assistant_turn(conv_cfg: Any, conv: Conversation, rnd: int, rec: Record, res: "Result | None") -> dict | None:
    """The assistant turn appended after round `rnd`: what the model said (model mode) or what the
    script decides. None: the conversation ends there (model mode: no tool call to go on with, or
    tool calls that cannot be sent back)."""
    if conv_cfg.mode == "model" and res is not None and res.stream is not None:
        if not tool_calls_sendable(rec.tool_call_problems):
            # tool calls that cannot be sent back as they came (no id, arguments cut mid-JSON,
            # two calls on one index): a real harness cannot run them either, and agentload never
            # invents or repairs one. The conversation ends here; the record says why.
            return None
        assistant = res.stream.assistant_message(conv_cfg.assistant_content)
        conv.append(assistant)
        if not assistant.get("tool_calls"):
            return None
        if conv_cfg.responses_chain:  # the server keeps the context: the next request sends what is new
            conv.chain(res.stream.id if type(res.stream.id) is str and res.stream.id else None)
        return assistant
    assistant = conv.scripted_assistant(rnd)
    conv.append(assistant)
    return assistant
