"""The verdict itself: every rule run over the facts (a rule that fails is a finding, never a pass),
the finding that stopped the most agents first, else healthy or no_data."""

from __future__ import annotations

import traceback
from typing import TYPE_CHECKING, Any

from agentload.analysis.stats import fmt_dur as _dur
from agentload.analysis.stats import percentiles_ms
from agentload.analysis.verdict.facts import Facts, FactsAccumulator, RouterFacts
from agentload.analysis.verdict.kinds import Finding, Kind
from agentload.analysis.verdict.naming import (
    backend_names,
    fmt_counts,
    with_backend_names,
)
from agentload.analysis.verdict.rules import RULES, Rule

if TYPE_CHECKING:
    from agentload.records.rundir import RunData


def findings(f: Facts, rules: list[Rule] = RULES) -> list[Finding]:
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
    """The verdict when no rule found anything: how many completed, and how quickly."""
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


def diagnose(data: RunData, acc: FactsAccumulator | None = None, router: RouterFacts | None = None) -> dict[str, Any]:
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
    names = backend_names(data.meta)
    v = with_backend_names(found[0].to_dict(), names)
    v["secondary"] = [with_backend_names(x.to_dict(), names) for x in found[1:]]
    return v
