"""Per-agent outcomes and the verdict: a pure function over records, samples and run.json.

The verdict is an ordered list of small rules (`RULES`). Each reads the run's facts (`Facts`,
computed once, from `FactsAccumulator`: one pass over the records that keeps the troubled records
and bounded tallies of the fine ones) and returns a `Finding` or None. Every finding is kept: the one
that stopped the most agents leads the verdict, ties go to the rule listed first, and the others
follow as secondary findings. The verdict fails closed: it is `healthy` only when no rule found
anything, and a rule that could not be computed is itself a finding (`agentload_error`), never a pass.

No finding switches another off: each rule judges the requests the others do not explain. A
server stall explains the requests that queued for a connection a stalled request held, in its
window (`StallWindows`), and how the requests it stalled ended; the pool rule judges the queueing
outside those windows, or all of it when the queue there was far longer than what the stalled
requests held (`Facts.pool`); canaries that failed outside the windows are a finding of their own.

The package is laid out so that each module reads as one thing, and the arrows point one way:
kinds, error_classes, naming -> samples, pool -> facts -> rules -> judge, outcomes.

- `kinds`: what the verdict can say (`Kind`, docs/verdicts.md lists every one) and a `Finding`;
- `error_classes`: the classes of request errors the rules sort failures by;
- `naming`: how evidence says counts, rounds, spans and a fleet's backends;
- `samples`, `pool`: what the rules read of the one-second samples, and of the client pool beside a
  server stall (its windows, the second pass apart from them);
- `facts`: the one pass over the records and the `Facts` every rule reads; the verdict's only door
  to the router analysis (rules reach backends and router gauges through `Facts`);
- `rules/`: the rules by where the trouble sits (client, server, connections, errors, between,
  answers), `RULES` giving their order;
- `judge`: the verdict (`diagnose`): every rule run, the lead first, else healthy or no_data;
- `outcomes`: summary.json's agents, how each conversation ended.

A new rule: `rule_<name>(f: Facts) -> Finding | None` in the `rules/` module of its family, added
to `RULES` at its place in the order, its `Kind` with a line in docs/verdicts.md.
"""

from __future__ import annotations

from agentload.analysis.verdict.error_classes import (
                                                      CONNECT_ERRORS,
                                                      DISCONNECT_ERRORS,
                                                      PROTOCOL_ERRORS,
                                                      TIMEOUT_ERRORS,
                                                      failed_reuses,
                                                      is_failed_reuse,
                                                      is_server_error,
)
from agentload.analysis.verdict.facts import (
                                                      AgentTally,
                                                      Facts,
                                                      FactsAccumulator,
                                                      token_pace_ns,
)
from agentload.analysis.verdict.judge import diagnose, findings, healthy
from agentload.analysis.verdict.kinds import Finding, Kind
from agentload.analysis.verdict.naming import fmt_counts, fmt_round_counts
from agentload.analysis.verdict.outcomes import agent_outcomes
from agentload.analysis.verdict.rules import RULES, Rule
from agentload.analysis.verdict.rules.client import unstarted_agents, unstarted_line

__all__ = [
    "AgentTally", "CONNECT_ERRORS", "DISCONNECT_ERRORS", "Facts", "FactsAccumulator", "Finding", "Kind",
    "PROTOCOL_ERRORS", "RULES", "Rule", "TIMEOUT_ERRORS", "agent_outcomes", "diagnose", "failed_reuses",
    "findings", "fmt_counts", "fmt_round_counts", "healthy", "is_failed_reuse", "is_server_error",
    "token_pace_ns", "unstarted_agents", "unstarted_line",
]
