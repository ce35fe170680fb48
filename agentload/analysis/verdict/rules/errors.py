"""Rules on failed answers: HTTP 429s (rate limited), the server's HTTP errors and in-band error
events (with context overflows and which layer answered), and failures of any other class."""

from __future__ import annotations

from collections import Counter

from agentload.analysis.proxies import who_answered
from agentload.analysis.target_evidence import router_evidence
from agentload.analysis.verdict.error_classes import (
    CONNECT_ERRORS,
    DISCONNECT_ERRORS,
    PROTOCOL_ERRORS,
    is_server_error,
)
from agentload.analysis.verdict.facts import Facts
from agentload.analysis.verdict.kinds import Finding, Kind
from agentload.analysis.verdict.naming import fmt_counts, fmt_span
from agentload.analysis.verdict.rules.evidence import error_finding
from agentload.endpoint import api_url, base_path, with_version
from agentload.records import Record
from agentload.records.overflow import overflow


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
    fnd = error_finding(f, Kind.RATE_LIMITED, errs,
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
    fnd = error_finding(f, Kind.SERVER_ERRORS, errs,
                         f"server errors: {len(errs)} of {f.requests} requests answered with errors "
                         f"({fmt_counts(Counter(r.error for r in errs))}), first in round {min(by_round)}", "ttfb")
    fnd.evidence.append(f"sample message: {errs[0].error_msg or '(empty body)'}")
    fnd.evidence.extend(overflow_evidence(f, errs))


    layer = _which_layer(f, [r for r in errs if r.error is not None and r.error.startswith("http_")])
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
        line += (f"): the server counted {fmt_span(counted_known)} prompt tokens against its n_ctx of "
                 f"{', '.join(f'{c:,}' for c in ctxs)} (its own numbers, from its error body)")
    elif counted_known:
        line += f"): the server counted {fmt_span(counted_known)} prompt tokens (its error body gives no n_ctx)"
    else:
        line += "): the server's error body gives neither its prompt token count nor its n_ctx"
    line += f"; agentload's estimate of those prompts: {fmt_span([r.prompt_tokens for r, _ in ovs])} tokens"
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


def rule_other_errors(f: Facts) -> Finding | None:
    """Failures of a class no other rule knows: named, never dropped."""
    known = DISCONNECT_ERRORS | CONNECT_ERRORS | PROTOCOL_ERRORS
    errs = [r for r in f.errors if r.error not in known and not is_server_error(r.error)
            and not r.stalled_phase]
    if not errs:
        return None
    fnd = error_finding(f, Kind.OTHER_ERRORS, errs,
                         f"requests failed: {len(errs)} of {f.requests} ({fmt_counts(Counter(r.error for r in errs))})",
                         None)
    fnd.evidence.append(f"sample message: {errs[0].error_msg}")
    return fnd
