"""The canaries (a fresh connection, a short prompt, every canary.every_s): their evidence beside a
server stall, their own finding when they failed outside one, and the server slow for everyone when
they timed out behind the same slowness as the agents."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from agentload.analysis.stats import fmt_dur as _dur
from agentload.analysis.stats import pct_ms, quantile_ms
from agentload.analysis.verdict.error_classes import TIMEOUT_ERRORS
from agentload.analysis.verdict.facts import Facts, token_pace_ns
from agentload.analysis.verdict.kinds import Finding, Kind
from agentload.analysis.verdict.naming import fmt_counts
from agentload.records import Record, phase_at
from agentload.records.phases import end_stamp

# canaries timed out "behind the same slowness" as the agents when, at the agents' own pace, a
# canary's answer takes at least this share of canary.timeout_s
SLOW_CANARY_SHARE = 0.5


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
    """What the canaries (a fresh connection, a short prompt, every canary.every_s) in flight at t0 or
    sent after it saw. A canary the run cut short at its end is neither a success nor a failure."""
    ok, ok_e2e, failed = f.canary.in_flight_from(t0)
    during = ok + len(failed)
    if not during:
        return []
    med = quantile_ms(ok_e2e, 50)
    quick = med is not None and med < f.after_s * 1000
    text = (f"canaries (fresh connection, short prompt) in flight from the first stalled request on: "
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


def rule_canary_failures(f: Facts) -> Finding | None:
    """Canaries (a fresh connection and a short prompt every canary.every_s) that failed are
    something agentload did not see go right, even when every agent request did. A canary the run
    cut short at its end is neither a success nor a failure. Canaries that failed while requests
    stalled at the server are that rule's evidence; only those outside its windows are a finding."""
    failed = f.canary.failed()
    w = f.stall_windows
    if w is not None:
        failed = [c for c in failed if not c.t or not w.touches(c.t.get("start", 0), end_stamp(c.t))]
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
