"""Rules on answers that were read but were not right: not the protocol (bad responses, a stream that
broke around [DONE]), tool calls cut by max_tokens or malformed, and in mode model answers without a
tool call that ended a conversation."""

from __future__ import annotations

from collections import Counter

from agentload.analysis.tallies import CodeTally
from agentload.analysis.target_evidence import router_evidence
from agentload.analysis.verdict.error_classes import PROTOCOL_ERRORS
from agentload.analysis.verdict.facts import Facts, is_truncated
from agentload.analysis.verdict.kinds import Finding, Kind
from agentload.analysis.verdict.naming import fmt_counts, fmt_round_counts
from agentload.analysis.verdict.rules.evidence import error_finding


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
        fnd = error_finding(f, Kind.BAD_RESPONSES, errs,
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


def _tool_call_finding(f: Facts, kind: Kind, t: CodeTally, head: str, truncated: bool) -> Finding:
    """The finding of answers with tool-call problems (`t`: those records, tallied)."""
    stopped = {a for a, r in f.tool_call_stopped.items() if is_truncated(r.tool_call_problems) == truncated}
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
