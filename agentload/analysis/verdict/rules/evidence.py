"""Evidence several rules build alike: a finding over failed requests (`error_finding`: by round,
the agents stopped, the backends behind a router, a prompt-size threshold) and the threshold itself."""

from __future__ import annotations

from collections import Counter

from agentload.analysis.tallies import SizeCounts
from agentload.analysis.verdict.facts import Facts
from agentload.analysis.verdict.kinds import Finding, Kind
from agentload.analysis.verdict.naming import fmt_round_counts
from agentload.records import Record


def threshold_evidence(failed: list[Record], fine: SizeCounts, verb: str) -> tuple[str | None, int | None]:
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


def error_finding(f: Facts, kind: Kind, errs: list[Record], summary: str, phase: str | None) -> Finding:
    """The finding of failed requests `errs`, with the evidence every error rule starts from."""
    by_round = Counter(r.round for r in errs)
    fails = {id(r) for r in errs}
    stopped = f.stopped_by(lambda r: id(r) in fails)
    fnd = Finding(kind, summary, phase, min(by_round), len({r.agent for r in errs}), len(stopped))
    fnd.evidence.append("errors by round: " + fmt_round_counts(by_round)
                        + f"; {len(stopped)} agent(s) stopped on them (error_retries exhausted)")
    fnd.evidence.extend(f.backend_lines(errs, "failed"))  # the backend(s) behind a router
    thr_text, thr = threshold_evidence(errs, f.fine_prompts, "failed")
    if thr is not None and thr_text:
        first = min(by_round)
        later_fine = any(st.fine_rounds.hi and st.fine_rounds.hi[-1] >= first for st in f.acc.agent_state.values())
        if not later_fine:  # every request from that round on failed: size and round say the same thing
            thr_text += (f"; but no request completed from round {first} on either, so the prompt size and the "
                         f"round cannot be told apart here")
        fnd.evidence.append(thr_text)
    return fnd
