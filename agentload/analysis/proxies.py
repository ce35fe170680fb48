"""What sits between agentload and the server, read from the records: a proxy's fixed timeout, a
concurrency limit in front, a proxy that buffers the stream, and which layer answered an error.

Pure functions over records (the verdict's rules in `verdict/rules/` read them):

- `fixed_timeout(errors)`: failures (a 502/503/504/408, or a stream cut after a silence) that
  ended at one common duration after they were sent (or after their last token): a timeout of
  that length in front of the server (nginx's `proxy_read_timeout`, haproxy's `timeout server`)
  ended requests the server had not answered.
- `inflight_at(data, refused)`: a second streamed pass over the records (run only when fast
  refusals exist) counting, at each refusal, the other requests in flight: a limit in front
  refuses only while its limit is reached, so that count is the same at every refusal.
- `BurstTally`: answers whose tokens came many to a read after a long wait (a buffering proxy
  delivers a whole answer, or ~4 KB, at once): bounded counts, fed per record.
- `who_answered(records, ok_servers)`: the layer an error came from, by its `Server` header and
  its body (nginx and haproxy sign their error pages), told apart from the answers that went through.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable

from agentload.records import Record

if TYPE_CHECKING:
    from agentload.records.rundir import RunData

# a proxy's answer when its own timeout fired (or its upstream failed), besides a cut stream
TIMEOUT_STATUSES = {"http_502", "http_503", "http_504", "http_408"}
# the other side closed the connection (agentload.analysis.verdict.error_classes.DISCONNECT_ERRORS)
CUT_ERRORS = {"ServerDisconnectedError", "ClientOSError", "ClientPayloadError", "ClientConnectionResetError",
              "incomplete_stream", "ConnectionResetError"}
FIXED_TIMEOUT_MIN_S = 0.5  # shorter than this, a common duration is an answer, not a timeout
FIXED_TIMEOUT_TOL_MS = 100.0  # "the same duration": within this (timer granularity, a busy proxy or machine) ...
FIXED_TIMEOUT_TOL_SHARE = 0.03  # ... or this share of it, whichever is larger
FIXED_TIMEOUT_LATE_MS = 250.0  # a timer fires late on a busy machine, never early: members may be this late ...
FIXED_TIMEOUT_LATE_SHARE = 0.1  # ... or this share of the duration, whichever is larger
FIXED_TIMEOUT_SHARE = 0.8  # at least this share of the candidate failures ended at it
FIXED_TIMEOUT_SEARCH = 1000  # candidates the common duration is looked for among (all are counted)

REFUSAL_STATUSES = {"http_503"}  # nginx's limit_conn / limit_req answer (limit_*_status 503)
REFUSED_WITHIN_MS = 50.0  # refused before any work: headers this soon after the send
REFUSALS_KEPT = 10_000  # refusal stamps the second pass counts in-flight requests at
ADMISSION_SHARE = 0.8  # at least this share of the refusals saw exactly the limit in flight

BURST_MIN_CHUNKS = 8  # an answer this long or longer can show bursts
BURST_CHUNKS_PER_READ = 4.0  # its token chunks came at least this many to a read, on average ...
BURST_MIN_WAIT_MS = 250.0  # ... each read this long after the one before it (or after the send)
BURST_SHARE = 0.5  # bursts in at least this share of the answers that could show them
BURST_MIN_ANSWERS = 2


@dataclass
class FixedTimeout:
    """Failures that ended `seconds` after their send (or after their last token), all within `lo`-`hi`."""

    seconds: float
    records: list[Record]  # the failures that ended at it, in the requests' order
    candidates: int  # failures that could have (HTTP 502/503/504/408, streams cut after a silence)
    lo_ms: float
    hi_ms: float
    after: Counter[str] = field(default_factory=Counter)  # "send" / "the last token": how many ended so

    @property
    def ids(self) -> set[int]:
        return {id(r) for r in self.records}


def _silence_before_end(r: Record) -> int | None:
    """A cut body's silence since its last token (the read path puts it in its largest gap, ending
    at its end), or None."""
    end = r.t.get("end")
    if r.max_gap_at and end is not None and r.max_gap_at == end:
        return r.max_gap_ns
    return None


def timeout_candidates(errors: Iterable[Record], stalled: bool = False) -> list[tuple[Record, list[tuple[int, str]]]]:
    """Each failure that a timeout in front could have ended, with the durations it could have ended
    at: an HTTP 502/503/504/408 (send -> its headers), a stream cut after a silence of at least half
    its time (send -> end, and the silence). A stalled request is the stall rule's (`stalled`: take them)."""
    out = []
    for r in errors:
        t = r.t
        if (r.stalled_phase and not stalled) or "sent" not in t or "end" not in t:
            continue
        if r.error in TIMEOUT_STATUSES:
            out.append((r, [(t.get("headers", t["end"]) - t["sent"], "send")]))
        elif r.error in CUT_ERRORS and "headers" in t:
            d = t["end"] - t["sent"]
            silence = _silence_before_end(r)
            if silence is None or 2 * silence < d:  # cut while bytes flowed: not a timeout of silence
                continue
            out.append((r, [(d, "send"), (silence, "the last token" if "first_token" in t else "the headers")]))
    return out


def _tol(ns: float) -> float:
    return max(FIXED_TIMEOUT_TOL_MS * 1e6, FIXED_TIMEOUT_TOL_SHARE * ns)


def fixed_timeout(errors: Iterable[Record], stalled: bool = False) -> FixedTimeout | None:
    """The common duration most candidate failures ended at, when at least FIXED_TIMEOUT_SHARE of
    them (and two or more) did, and it is FIXED_TIMEOUT_MIN_S or longer (`stalled`: stalled ones too)."""
    cands = timeout_candidates(errors, stalled)
    if len(cands) < 2:
        return None
    vals = sorted((v, i) for i, (_, vs) in enumerate(cands[:FIXED_TIMEOUT_SEARCH]) for v, _ in vs)
    best, spread, centre = 0, 0, 0
    j = 0
    for i, (lo, _) in enumerate(vals):  # the window of values within the tolerance of each value
        j = max(j, i)
        while j < len(vals) and vals[j][0] - lo <= _tol(lo):
            j += 1
        n = len({k for _, k in vals[i:j]})  # failures with a value in it (the tighter window on a tie)
        if n > best or n == best and vals[j - 1][0] - lo < spread:
            best, spread, centre = n, vals[j - 1][0] - lo, vals[(i + j - 1) // 2][0]
    if best < 2:
        return None
    tol = _tol(centre)
    late = max(tol, FIXED_TIMEOUT_LATE_MS * 1e6, FIXED_TIMEOUT_LATE_SHARE * centre)
    matched: list[Record] = []
    ended: list[int] = []
    after: Counter[str] = Counter()
    for r, vs in cands:
        hit = next(((v, how) for v, how in vs if -tol <= v - centre <= late), None)
        if hit is not None:
            matched.append(r)
            ended.append(hit[0])
            after[hit[1]] += 1
    if len(matched) < FIXED_TIMEOUT_SHARE * len(cands) or centre < FIXED_TIMEOUT_MIN_S * 1e9:
        return None
    ended.sort()
    return FixedTimeout(ended[len(ended) // 2] / 1e9, matched, len(cands), ended[0] / 1e6, ended[-1] / 1e6, after)


# ---------------------------------------------------------------- which layer answered


_SIGNATURES = (  # (what an error body or Server header says, the layer it names)
    ("nginx", "nginx"),
    ("the server didn't respond in time", "haproxy"),  # haproxy's own 504, 503 and 502 pages
    ("no server is available to handle this request", "haproxy"),
    ("the server returned an invalid or incomplete response", "haproxy"),
    ("haproxy", "haproxy"),
    ("upstream request timeout", "envoy"),
    ("upstream connect error", "envoy"),
    ("envoy", "envoy"),
    ("cloudflare", "Cloudflare"),
    ("awselb", "AWS ELB"),
    ("traefik", "Traefik"),
    ("caddy", "Caddy"),
    ("litellm", "LiteLLM"),
)


@dataclass
class Answerer:
    """Who answered some errors: the `Server` header they carried, the proxy their body or header
    names, and whether that header differs from the answers that went through."""

    servers: Counter[str]  # Server header -> count ("(none)" when absent)
    proxy: str | None  # "nginx", "haproxy", ... when a signature matched
    html: bool  # their body is an HTML page (a proxy's; an engine answers JSON)
    differs: bool  # their Server header is not the one the answers that went through carried
    sample: str  # the first error body, as recorded (redacted, first 300 characters)

    def name(self) -> str | None:
        """"nginx/1.22.1", "haproxy", ...: the layer, when something names it (else None)."""
        named = [s for s in self.servers if s != "(none)"]
        if self.proxy is not None:
            exact = next((s for s in named if self.proxy.lower() in s.lower()), None)
            return exact or self.proxy
        if self.differs and named:
            return named[0]
        return None

    def how(self) -> str:
        """What tells it: "its Server header and its HTML error page", ..."""
        parts = []
        if any(s != "(none)" for s in self.servers):
            parts.append("Server: " + ", ".join(f"{s}" + (f" x{n}" if len(self.servers) > 1 else "")
                                                for s, n in self.servers.most_common(3)))
        else:
            parts.append("no Server header")
        if self.html:
            parts.append("an HTML error page" + (f" ({self.proxy}'s)" if self.proxy else ""))
        return "; ".join(parts)


def who_answered(records: list[Record], ok_servers: Counter[str]) -> Answerer:
    """The layer `records` (errors) came from, against `ok_servers` (the Server headers of the answers
    that went through)."""
    servers: Counter[str] = Counter((r.server or "(none)") for r in records)
    sample = next((r.error_msg for r in records if r.error_msg), "") or ""
    texts = [s.lower() for s in servers if s != "(none)"] + [(r.error_msg or "").lower() for r in records[:20]]
    proxy = next((name for sig, name in _SIGNATURES if any(sig in x for x in texts)), None)
    html = any((r.error_msg or "").lstrip()[:1] == "<" for r in records[:20])
    differs = bool(set(servers) - set(ok_servers)) if ok_servers else any(s != "(none)" for s in servers)
    return Answerer(servers, proxy, html, differs, sample)


# ---------------------------------------------------------------- a concurrency limit in front


def quick_refusals(errors: Iterable[Record]) -> list[Record]:
    """503s answered within REFUSED_WITHIN_MS of the send: refused before any work was done."""
    out = []
    for r in errors:
        t = r.t
        if r.error in REFUSAL_STATUSES and "sent" in t and "headers" in t \
                and t["headers"] - t["sent"] <= REFUSED_WITHIN_MS * 1e6:
            out.append(r)
    return out


def _key(r: Record) -> tuple[str, int | None]:
    return r.request_id, r.t.get("start")


def inflight_at(data: "RunData", refused: list[Record]) -> list[int]:
    """At each refusal's send (the first REFUSALS_KEPT, in `refused`'s order), how many other
    requests (agents' and canaries', refused ones left out) were on the wire: sent, not ended. One
    more streamed pass over the records: per record a bisect into the sorted refusal stamps."""
    refused = refused[:REFUSALS_KEPT]
    times = sorted(r.t["sent"] for r in refused)
    skip = {_key(r) for r in refused}
    diff = [0] * (len(times) + 1)
    for r in data.iter_records():
        t = r.t
        s, e = t.get("sent"), t.get("end")
        if s is None or e is None or r.error in REFUSAL_STATUSES and _key(r) in skip:
            continue
        lo, hi = bisect_left(times, s), bisect_left(times, e)
        if lo < hi:
            diff[lo] += 1
            diff[hi] -= 1
    out, n = [], 0
    for d in diff[:-1]:
        n += d
        out.append(n)
    return out


@dataclass
class AdmissionLimit:
    limit: int  # the requests in flight at every refusal (never fewer)
    at_limit: int  # refusals that saw exactly that many
    counted: int  # refusals counted
    spread: Counter[int]  # in flight -> refusals


def admission_limit(counts: list[int]) -> AdmissionLimit | None:
    """A limit of N in front: every refusal saw N or more in flight, and at least ADMISSION_SHARE of
    them exactly N (N at least 1)."""
    if len(counts) < 2:
        return None
    c = Counter(counts)
    n = min(c)
    if n < 1 or c[n] < ADMISSION_SHARE * len(counts):
        return None
    return AdmissionLimit(n, c[n], len(counts), c)


# ---------------------------------------------------------------- a buffering proxy


class BurstTally:
    """Answers that came in bursts: token chunks many to a read (BURST_CHUNKS_PER_READ on average),
    each read BURST_MIN_WAIT_MS or more after the one before (after the send, for the first): what a
    proxy that buffers the stream delivers. Bounded: counts, a few Server headers, agents."""

    __slots__ = ("eligible", "bursty", "one_read", "agents", "servers", "per_read", "waits", "first_round",
                 "stamped", "held")

    def __init__(self) -> None:
        self.eligible = 0  # completed answers of BURST_MIN_CHUNKS token chunks or more, with reads counted
        self.bursty = 0
        self.one_read = 0  # ... of which every token came in one read
        self.agents: set[int] = set()
        self.servers: Counter[str] = Counter()
        self.per_read: list[float] = []  # chunks a read of the first 1,000 bursty answers
        self.waits: list[int] = []  # send -> first token of the first 1,000 (ns)
        self.first_round: int | None = None
        self.stamped = 0  # bursty answers with the server's own first-token send stamp ...
        self.held: list[int] = []  # ... and how long after it agentload saw that token (first 1,000, ns)

    def add(self, r: Record) -> None:
        """A completed agent answer."""
        n, reads = r.token_chunks, r.token_reads
        if n < BURST_MIN_CHUNKS or reads <= 0:
            return
        self.eligible += 1
        t = r.t
        sent, first, end = t.get("sent"), t.get("first_token"), t.get("end")
        if sent is None or first is None or end is None or n < BURST_CHUNKS_PER_READ * reads \
                or (end - sent) < BURST_MIN_WAIT_MS * 1e6 * reads:
            return
        self.bursty += 1
        self.one_read += reads == 1
        self.agents.add(r.agent)
        if len(self.servers) < 5 or r.server in self.servers:
            self.servers[r.server or "(none)"] += 1
        self.first_round = r.round if self.first_round is None else min(self.first_round, r.round)
        if len(self.per_read) < 1000:
            self.per_read.append(n / reads)
            self.waits.append(first - sent)
        if r.server_first_token_ns is not None:
            self.stamped += 1
            if len(self.held) < 1000:
                self.held.append(first - r.server_first_token_ns)

    def found(self) -> bool:
        return self.bursty >= BURST_MIN_ANSWERS and self.bursty >= BURST_SHARE * self.eligible
