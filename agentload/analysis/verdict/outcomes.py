"""summary.json's agents: how each agent's conversation ended, read from the facts' per-agent tallies."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agentload.analysis.passes import one_pass
from agentload.analysis.verdict.facts import FactsAccumulator

if TYPE_CHECKING:
    from agentload.records.rundir import RunData


def agent_outcomes(data: RunData, acc: FactsAccumulator | None = None) -> list[dict[str, Any]]:
    """summary.json's agents: how each conversation ended, from the per-agent state of the pass."""
    if acc is None:
        acc = FactsAccumulator.for_run(data)
        one_pass(data, [acc])
    sc = data.meta.get("scenario") or {}
    max_rounds = int((sc.get("agents") or {}).get("rounds") or 0)
    model_mode = (sc.get("conversation") or {}).get("mode") == "model"
    at_duration = data.meta.get("ended_by") == "duration"
    # (a signal is how a proxy ends: the harness's conversations were not stopped by it, whether they
    # stopped on their own is the client_stopped rule's question)
    stopped_early = (bool(data.meta.get("cut_short")) and not data.meta.get("proxy")) or not data.meta.get("ended", True)
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
        elif model_mode and last is not None and st.ended_on_tool_call_problems(max_rounds):
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
