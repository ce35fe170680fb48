"""Rules on the connections: they could not be opened (connect, TLS), or the other side closed them
(mid-answer, or a stale keep-alive connection before any answer)."""

from __future__ import annotations

from collections import Counter

from agentload.analysis.stats import fmt_dur as _dur
from agentload.analysis.target_evidence import router_evidence
from agentload.analysis.verdict.error_classes import (
    CONNECT_ERRORS,
    DISCONNECT_ERRORS,
    failed_reuses,
)
from agentload.analysis.verdict.facts import Facts
from agentload.analysis.verdict.kinds import Finding, Kind
from agentload.analysis.verdict.naming import fmt_counts, share
from agentload.analysis.verdict.rules.evidence import error_finding
from agentload.records import Record

# A reused connection closed under its request after sitting idle less than this was not closed by a
# keep-alive timeout (servers keep idle connections for seconds: uvicorn, llama-server 5 s, nginx 75 s)
QUICK_CLOSE_MS = 1000.0


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


def rule_connect(f: Facts) -> Finding | None:
    pool = {id(r) for r in f.pool_timeouts}
    errs = [r for r in f.errors_apart if r.error in CONNECT_ERRORS and id(r) not in pool]
    if not errs:
        return None
    fnd = error_finding(f, Kind.CONNECT, errs,
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


def rule_disconnects(f: Facts) -> Finding | None:
    """The other side closed the connection. A POST lost on a stale keep-alive connection is not
    retried by aiohttp: every one is an agent request that failed for nothing."""
    explained = f.explained()
    errs = [r for r in f.errors_apart if r.error in DISCONNECT_ERRORS and id(r) not in explained]
    if not errs:
        return None
    stale = failed_reuses(errs)
    mid = [r for r in errs if "headers" in r.t]
    fnd = error_finding(f, Kind.DISCONNECTS, errs,
                         f"the server closed connections: {len(errs)} of {f.requests} requests failed "
                         f"({len(mid)} mid-response, {len(stale)} on a stale keep-alive connection before any answer)",
                         "stream" if len(mid) >= len(stale) else "send")
    fnd.evidence.append(f"errors: {fmt_counts(Counter(r.error for r in errs))}")
    if stale:
        fnd.evidence.extend(stale_reuse_evidence(f, stale))
    fnd.evidence.extend(router_evidence(f.data, errs, "error"))  # the worker, where the router's counters say it
    return fnd


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
    rate = f"{c.reused} of {total} requests reused a connection ({share(c.reused, total)})"
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
