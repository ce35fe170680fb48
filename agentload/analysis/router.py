"""How a router in front of a fleet of backends behaved (the router soak bench): summary.json's
`router` section, the verdict's evidence by backend and its router-leak facts. Pure functions of
the run folder, so `agentload report RUN_DIR` rebuilds them byte for byte.

Inputs, all in the run folder:

- the records, streamed once (`RouterPass` is a consumer of `analysis.passes.one_pass`): each one's
  `backend` (the backend's name from `system_fingerprint`), `cached_tokens`, `conversation` and
  `id_sent` (the X-Request-ID value sent);
- run.json's `fleet` (mode, backends and their roles, the router, the planned schedule), `t0_ns`;
- `schedule.jsonl`: each scheduled fault as applied (start and end stamps on the records' clock);
  without it, the planned times of run.json's schedule;
- `fleet/<name>.requests.jsonl`: one line per request a backend received (its X-Request-ID, when it
  arrived, how it ended); a killed backend loses the lines of the requests it had in flight;
- target_metrics.jsonl: the router's in-flight gauges (`target_evidence.RouterFamily.inflight`).

A record is attributed to the backend it names (`backend`), else to the backend whose log has a
line with its request id (the latest arrival, when a router retried it elsewhere); in PD mode a
record also gets its prefill worker from the prefill workers' logs. The backend logs are read
before the pass into `LogIndex`: per line a 64-bit hash of the id, the backend and the arrival
(20 bytes a line in numpy arrays, no Python object per line); the pass itself keeps counters,
histograms, per-agent state (stickiness) and time cells, never a list of the records.

Size: over 1,000 lines (fleet metadata, backend logs, the router pass, evidence); its split into
a package, with the log reading moved into records/, is issue 28's next step.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import numpy as np

from agentload.analysis.stats import RoundRows, SparseHistogram, percentiles_ms
from agentload.analysis.tallies import TimeCounts
from agentload.analysis.target_evidence import family_of
from agentload.records import Record, iter_record_dicts
from agentload.records.target_metrics import TargetMetrics

if TYPE_CHECKING:
    from agentload.records.rundir import RunData

SCHEDULE_FILE = "schedule.jsonl"
ROLE_WORDS = {"worker": "backend", "prefill": "prefill worker", "decode": "decode worker"}
UNATTRIBUTED = "unattributed"
OVER_TIME_BUCKETS = 60
# "kept routing there until the fault ended": an arrival at the faulty backend in the window's last
# stretch: a tenth of the window, at least a second, at least three of the gaps between arrivals
# there before the fault (a backend that got a request every 5 s is not abandoned by a 4 s gap),
# at most half the window
NEVER_TAIL_SHARE = 0.1
NEVER_TAIL_MIN_S = 1.0
NEVER_TAIL_GAPS = 3
MAX_RETRY_EXAMPLES = 5
# Without a fleet in run.json, records must name this many backends for the run to count as one
# behind a router (agentload's embedded mock names itself too: one name is one server, not a fleet)
MIN_NAMED_BACKENDS = 2
MAX_BACKENDS = 256  # distinct names kept apart; more (a server whose fingerprint varies) go in OTHER
OTHER = "other"
# load imbalance (vllm-router's `hotspot`): the busiest backend's share of requests x the number of
# backends (1.0: even; n: all on one), overall and per window of this many seconds; a window counts
# when it has at least this many requests per backend (one request alone is always a "hotspot")
IMBALANCE_WINDOW_S = 10
IMBALANCE_MIN_PER_BACKEND = 2


def _s(ns: int | None, t0: int) -> float | None:
    return None if ns is None else round((ns - t0) / 1e9, 3)


# ---------------------------------------------------------------- the fleet, as run.json describes it


@dataclass(frozen=True)
class Backend:
    name: str
    role: str  # worker | prefill | decode
    index: int | None = None
    url: str | None = None
    log: str | None = None  # the request log, relative to the run folder

    @property
    def label(self) -> str:
        """`backend b2`, `decode worker b3`: how the reports name it."""
        return f"{ROLE_WORDS.get(self.role, 'backend')} {self.name}"


def fleet_of(meta: dict[str, Any]) -> dict[str, Any] | None:
    f = meta.get("fleet")
    return f if isinstance(f, dict) else None


def is_pd(meta: dict[str, Any]) -> bool:
    return (fleet_of(meta) or {}).get("mode") == "pd"


def backends_of(meta: dict[str, Any]) -> list[Backend]:
    """The fleet's backends in run.json's order (none without a fleet)."""
    out = []
    for i, b in enumerate((fleet_of(meta) or {}).get("backends") or []):
        if isinstance(b, dict) and b.get("name"):
            out.append(Backend(str(b["name"]), str(b.get("role") or "worker"), b.get("index", i), b.get("url"),
                               b.get("request_log")))
    return out


def main_role(meta: dict[str, Any]) -> str:
    """The role of the backend that streams an answer (a record's `backend`)."""
    return "decode" if is_pd(meta) else "worker"


# ---------------------------------------------------------------- scheduled faults


@dataclass
class Fault:
    """One scheduled fault: where and what, and its window as applied (perf_counter_ns)."""

    index: int
    backend: str
    fault: str
    planned_s: float | None
    for_s: float | None
    start_ns: int | None  # None: never applied (the run ended first, or applying it failed)
    end_ns: int | None  # None: the run ended during the fault (or it has no end)
    applied: bool
    error: str | None = None
    source: str = SCHEDULE_FILE  # or "run.json" (planned times: no schedule.jsonl in the folder)

    @property
    def number(self) -> int:
        """How reports count faults: 1, 2, ..."""
        return self.index + 1

    def overlaps(self, start: int, end: int | None) -> bool:
        if self.start_ns is None:
            return False
        return (end is None or end >= self.start_ns) and (self.end_ns is None or start < self.end_ns)


def faults_of(data: "RunData") -> list[Fault]:
    """The scheduled faults, from schedule.jsonl (as applied), else run.json's planned times; in
    the schedule's order. A fault schedule.jsonl has no start line for was not applied."""
    meta = data.meta
    t0 = int(meta.get("t0_ns") or 0)
    planned = [s for s in (fleet_of(meta) or {}).get("schedule") or [] if isinstance(s, dict)]
    path = Path(data.path) / SCHEDULE_FILE
    events: list[dict[str, Any]] = []
    have_file = path.exists()
    if have_file:  # a torn line (a killed run) or one without an index is left out
        events = [d for d in iter_record_dicts(path) if d is not None and isinstance(d.get("index"), int)]
    by_index: dict[int, dict[str, Any]] = {}
    for i, p in enumerate(planned):
        by_index[p["index"] if isinstance(p.get("index"), int) else i] = p
    for ev in events:  # an event of a fault run.json does not list still counts
        by_index.setdefault(ev["index"], {"backend": ev.get("backend"), "fault": ev.get("fault"),
                                                       "at_s": ev.get("planned_s")})
    end = int(meta.get("t_end_ns") or 0) or None
    out = []
    for idx in sorted(by_index):
        p = by_index[idx]
        at_s, for_s = p.get("at_s"), p.get("for_s")
        f = Fault(idx, str(p.get("backend")), str(p.get("fault")), at_s, for_s, None, None, False)
        if have_file:
            start = next((e for e in events if e.get("index") == idx and e.get("event") == "start"), None)
            stop = next((e for e in events if e.get("index") == idx and e.get("event") == "end"), None)
            if start is not None:
                f.applied = bool(start.get("ok", True))
                f.error = start.get("error")
                f.start_ns = int(start["at_ns"]) if f.applied and start.get("at_ns") is not None else None
                f.applied = f.start_ns is not None
            if f.applied and stop is not None and stop.get("at_ns") is not None:
                f.end_ns = int(stop["at_ns"])
        elif at_s is not None:  # planned times only: a fault planned past the run's end never happened
            f.source = "run.json"
            s = t0 + int(float(at_s) * 1e9)
            if end is None or s < end:
                f.start_ns, f.applied = s, True
                if for_s is not None:
                    e = s + int(float(for_s) * 1e9)
                    f.end_ns = e if end is None or e < end else None
        out.append(f)
    return out


def fault_text(f: Fault, t0: int) -> str:
    """`hang at 60 s`: what and when (as applied, else as planned)."""
    at = _s(f.start_ns, t0) if f.start_ns is not None else f.planned_s
    return f"{f.fault} at {float(at):.1f} s" if at is not None else f.fault


# ---------------------------------------------------------------- the backend logs


def id_hash(s: str) -> int:
    """A request id as 64 bits (stable across processes, unlike hash(): the reports are rebuilt
    byte for byte)."""
    return int.from_bytes(hashlib.blake2b(s.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")


def log_lines(run_dir: Path, b: Backend) -> Iterator[dict[str, Any]]:
    """A backend's request log, line by line (torn lines skipped); nothing when it has none."""
    if not b.log:
        return
    path = Path(run_dir) / b.log
    if not path.exists():
        return
    for d in iter_record_dicts(path):
        if d is not None and isinstance(d.get("id"), str):
            yield d


class LogIndex:
    """Every backend log line as (hash of its id, backend, arrival), per role, sorted by id then
    arrival: which backend(s) of a role got a request id, in numpy arrays (20 bytes a line)."""

    def __init__(self) -> None:
        self._raw: dict[str, tuple[array, array, array]] = {}
        self.h: dict[str, np.ndarray] = {}
        self.b: dict[str, np.ndarray] = {}
        self.t: dict[str, np.ndarray] = {}

    def add(self, role: str, h: int, backend: int, recv: int) -> None:
        raw = self._raw.get(role)
        if raw is None:
            raw = self._raw[role] = (array("Q"), array("i"), array("q"))
        raw[0].append(h)
        raw[1].append(backend)
        raw[2].append(recv)

    def freeze(self) -> "LogIndex":
        for role, (h, b, t) in self._raw.items():
            ha = np.frombuffer(h, dtype=np.uint64) if len(h) else np.zeros(0, np.uint64)
            ba = np.frombuffer(b, dtype=np.int32) if len(b) else np.zeros(0, np.int32)
            ta = np.frombuffer(t, dtype=np.int64) if len(t) else np.zeros(0, np.int64)
            order = np.lexsort((ta, ha))
            self.h[role], self.b[role], self.t[role] = ha[order], ba[order], ta[order]
        self._raw = {}
        return self

    def __bool__(self) -> bool:
        return any(len(h) for h in self.h.values())

    def latest(self, role: str, h: int) -> int | None:
        """The backend whose log has the latest arrival of this id among the role's backends."""
        hs = self.h.get(role)
        if hs is None or not len(hs):
            return None
        key = np.uint64(h)
        i = int(np.searchsorted(hs, key, side="right")) - 1
        if i >= 0 and hs[i] == key:
            return int(self.b[role][i])
        return None

    def first(self, role: str, h: int) -> tuple[int, int] | None:
        """(backend, arrival) of the earliest arrival of this id among the role's backends (a line
        without an arrival stamp counts as none)."""
        hs = self.h.get(role)
        if hs is None or not len(hs):
            return None
        key = np.uint64(h)
        lo = int(np.searchsorted(hs, key, side="left"))
        hi = int(np.searchsorted(hs, key, side="right"))
        for i in range(lo, hi):
            if int(self.t[role][i]) > 0:
                return int(self.b[role][i]), int(self.t[role][i])
        return None

    def repeats(self, role: str) -> tuple[int, int, list[int]]:
        """(ids at 2+ backends of the role, ids twice or more at one backend, the first hashes of
        the former): a router's retries, across backends and on the same one."""
        hs = self.h.get(role)
        if hs is None or len(hs) < 2:
            return 0, 0, []
        bs = self.b[role]
        order = np.lexsort((bs, hs))
        h2, b2 = hs[order], bs[order]
        same_id = h2[1:] == h2[:-1]
        other = same_id & (b2[1:] != b2[:-1])
        same = same_id & (b2[1:] == b2[:-1])
        across = np.unique(h2[1:][other])
        again = np.unique(h2[1:][same])
        return int(len(across)), int(len(again)), [int(x) for x in across[:MAX_RETRY_EXAMPLES]]


# ---------------------------------------------------------------- per backend, per round, per fault


class _BackendTally:
    __slots__ = ("requests", "ok", "errors", "stalled", "cut_short", "ttft", "cached", "prompt")

    def __init__(self) -> None:
        self.requests = self.ok = self.errors = self.stalled = self.cut_short = 0
        self.ttft = SparseHistogram()
        self.cached = self.prompt = 0

    def add(self, r: Record, ttft_ns: int | None) -> None:
        self.requests += 1
        self.ok += r.outcome == "ok"
        self.errors += r.outcome == "error"
        self.cut_short += r.outcome == "cut_short"
        self.stalled += r.stalled_phase is not None
        if ttft_ns is not None:
            self.ttft.record_ns(ttft_ns)
        if r.cached_tokens is not None:
            self.cached += r.cached_tokens
            self.prompt += _prompt(r)


class _RoundTally:
    """A round's (or a band's) counts; its time to first token is kept per row of the table
    (`RouterPass.ttft_rows`), not per round."""

    __slots__ = ("requests", "reporting", "cached", "prompt")

    def __init__(self) -> None:
        self.requests = self.reporting = self.cached = self.prompt = 0

    def merge(self, o: "_RoundTally") -> None:
        self.requests += o.requests
        self.reporting += o.reporting
        self.cached += o.cached
        self.prompt += o.prompt

    def to_dict(self, ttft: SparseHistogram | None) -> dict[str, Any]:
        return {"requests": self.requests, "reporting_cache": self.reporting, "cached_tokens": self.cached,
                "prompt_tokens": self.prompt, "cache_hit_rate": _rate(self.cached, self.prompt),
                "time_to_first_token": _ttft(ttft) if ttft is not None else None}


@dataclass
class _FaultTally:
    fault: Fault
    before: int = 0  # arrivals at its backend in as long a stretch before the fault
    during: int = 0  # arrivals at its backend during the window (the backend's log)
    last_during: int | None = None
    first_after: int | None = None
    log_outcomes: Counter = field(default_factory=Counter)
    records_there: int = 0  # records attributed to its backend, sent during the window
    errors: int = 0  # client-visible errors and stalls of requests that overlapped the window
    stalls: int = 0
    errors_there: int = 0  # ... of those, attributed to its backend
    stalls_there: int = 0


def _prompt(r: Record) -> int:
    return r.server_prompt_tokens if r.server_prompt_tokens is not None else r.prompt_tokens


def _rate(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


def _ttft(h: SparseHistogram) -> dict[str, Any] | None:
    pct = percentiles_ms(h, (50, 90))
    if pct is None:
        return None
    return {"n": h.get_total_count(), "p50_ms": pct[50], "p90_ms": pct[90]}


def _hop_pct(h: SparseHistogram) -> dict[str, Any] | None:
    pct = percentiles_ms(h, (50, 99))
    if pct is None:
        return None
    return {"n": h.get_total_count(), "p50_ms": pct[50], "p99_ms": pct[99]}


def ttft_ns(r: Record) -> int | None:
    """Time to first token: request sent -> first token (what the verdict's healthy line says)."""
    t = r.t
    if "first_token" in t and "sent" in t:
        return t["first_token"] - t["sent"]
    return None


class RouterPass:
    """summary.json's `router` section from one pass over the records (`add` each, then
    `result()`): the backend logs, the schedule and the router's scrapes are read when it is made."""

    def __init__(self, data: "RunData"):
        meta = data.meta
        self.data = data
        self.meta = meta
        self.t0 = int(meta.get("t0_ns") or 0)
        self.fleet = fleet_of(meta)
        self.pd = is_pd(meta)
        self.role = main_role(meta)
        self.backends: list[Backend] = backends_of(meta)
        self.by_name: dict[str, Backend] = {b.name: b for b in self.backends}
        self.tallies: dict[tuple[str, str], _BackendTally] = {}
        self.rounds: dict[int, _RoundTally] = {}
        # time to first token per row of the by-round table (rounds one by one, else 1-10 and bands)
        self.ttft_rows: RoundRows[SparseHistogram] = RoundRows(SparseHistogram, SparseHistogram.add)
        self.over_time = TimeCounts(self.t0, OVER_TIME_BUCKETS)
        self.requests = self.by_fingerprint = self.by_log = self.unattributed = 0
        self.prefill_attributed = 0
        self.sticky_pairs = self.sticky_same = 0
        self._agent: dict[int, list] = {}  # agent -> [conversation, round, backend, closed round, its backend]
        self.min_start: int | None = None
        self.max_end: int | None = None
        self.named: set[str] = set()  # distinct backend names the records gave (at most MAX_BACKENDS)
        self.faults = [_FaultTally(f) for f in faults_of(data)] if self.fleet else []
        self.log_counts: dict[str, Counter] = {}
        self.log_arrivals: dict[str, int] = {}
        # per conversation (agent, conversation): its requests by backend (main role, attributed)
        self._convs: dict[tuple[int, int], Counter] = {}
        self._windows: dict[int, Counter] = {}  # IMBALANCE_WINDOW_S window -> backend -> requests
        self._load: Counter = Counter()  # backend -> requests (main role, attributed)
        # the router's own time: backend log arrival - request sent, per backend of the arrival
        self.hop: dict[str, SparseHistogram] = {}
        self.hop_by_tp = self.hop_by_id = self.hop_before_sent = 0
        self.tp_index = LogIndex()  # the log lines' traceparents, as `index` has their ids
        self.index = self._read_logs()
        self.has_index = bool(self.index)
        self.has_tp = bool(self.tp_index)

    # ---- before the pass

    def _read_logs(self) -> LogIndex:
        index = LogIndex()
        for bi, b in enumerate(self.backends):
            if not b.log:
                continue
            mine = [ft for ft in self.faults if ft.fault.backend == b.name and ft.fault.start_ns is not None]
            outcomes: Counter = Counter()
            n = 0
            for line in log_lines(self.data.path, b):
                n += 1
                outcomes[str(line.get("outcome"))] += 1
                recv = line.get("recv_ns")
                index.add(b.role, id_hash(line["id"]), bi, int(recv) if isinstance(recv, int) else 0)
                tp = line.get("traceparent")
                if isinstance(tp, str) and tp and isinstance(recv, int):
                    self.tp_index.add(b.role, id_hash(tp), bi, int(recv))
                if isinstance(recv, int):
                    for ft in mine:
                        self._arrival(ft, recv, line)
            self.log_counts[b.name] = outcomes
            self.log_arrivals[b.name] = n
        self.tp_index.freeze()
        return index.freeze()

    @staticmethod
    def _arrival(ft: _FaultTally, recv: int, line: dict[str, Any]) -> None:
        f = ft.fault
        s, e = f.start_ns, f.end_ns
        assert s is not None
        length = (e - s) if e is not None else None
        if length is not None and s - length <= recv < s:
            ft.before += 1
        if recv >= s and (e is None or recv < e):
            ft.during += 1
            ft.last_during = recv if ft.last_during is None else max(ft.last_during, recv)
            ft.log_outcomes[str(line.get("outcome"))] += 1
        if e is not None and recv >= e:
            ft.first_after = recv if ft.first_after is None else min(ft.first_after, recv)

    # ---- the pass

    def _name(self, idx: int | None) -> str | None:
        return None if idx is None else self.backends[idx].name

    def add(self, r: Record) -> None:
        t = r.t
        s, e = t.get("start"), t.get("end")
        if s is not None:
            self.min_start = s if self.min_start is None else min(self.min_start, s)
        end = e if e is not None else (max(t.values()) if t else None)
        if end is not None:
            self.max_end = end if self.max_end is None else max(self.max_end, end)
        if r.kind != "agent":
            return
        self.requests += 1
        backend = r.backend
        # the logs are asked only for what the record does not say (its prefill worker in PD mode)
        h = id_hash(r.id_sent) if r.id_sent and self.has_index and (backend is None or self.pd) else None
        if backend is not None:
            if backend not in self.named and backend not in self.by_name:
                if len(self.named) >= MAX_BACKENDS:
                    backend = OTHER
                else:
                    self.named.add(backend)
            self.by_fingerprint += 1
        elif h is not None:
            backend = self._name(self.index.latest(self.role, h))
            if backend is not None:
                self.by_log += 1
        if backend is None:
            self.unattributed += 1
        prefill = self._name(self.index.latest("prefill", h)) if self.pd and h is not None else None
        self.prefill_attributed += prefill is not None
        tt = ttft_ns(r)
        label = backend if backend is not None else UNATTRIBUTED
        sent = t.get("sent") or s
        if backend is not None:
            role = self.by_name[backend].role if backend in self.by_name else self.role
            self._tally(backend, role).add(r, tt)
            if role == self.role:
                self._spread(r, backend, sent)
        if prefill is not None:
            self._tally(prefill, "prefill").add(r, tt)
        if self.has_index and "sent" in t:
            self._hop(r, t["sent"])
        if sent is not None:
            self.over_time.add(label, sent)
        rt = self.rounds.get(r.round)
        if rt is None:
            rt = self.rounds[r.round] = _RoundTally()
        rt.requests += 1
        if r.cached_tokens is not None:
            rt.reporting += 1
            rt.cached += r.cached_tokens
            rt.prompt += _prompt(r)
        h = self.ttft_rows.get(r.round)
        if tt is not None:
            h.record_ns(tt)
        self._sticky(r, backend)
        if self.faults and s is not None:
            bad_error, bad_stall = r.outcome == "error", r.stalled_phase is not None
            for ft in self.faults:
                f = ft.fault
                there = f.backend in (backend, prefill)
                if there and sent is not None and f.start_ns is not None and sent >= f.start_ns \
                        and (f.end_ns is None or sent < f.end_ns):
                    ft.records_there += 1
                if (bad_error or bad_stall) and f.overlaps(s, e):
                    ft.errors += bad_error
                    ft.stalls += bad_stall
                    ft.errors_there += bad_error and there
                    ft.stalls_there += bad_stall and there

    def _spread(self, r: Record, backend: str, sent: int | None) -> None:
        """A request of the main role on `backend`: its conversation's counts and its window's."""
        k = (r.agent, r.conversation)
        c = self._convs.get(k)
        if c is None:
            c = self._convs[k] = Counter()
        c[backend] += 1
        self._load[backend] += 1
        if sent is not None:
            w = (sent - self.t0) // (IMBALANCE_WINDOW_S * 1_000_000_000)
            wc = self._windows.get(w)
            if wc is None:
                wc = self._windows[w] = Counter()
            wc[backend] += 1

    def _hop(self, r: Record, sent: int) -> None:
        """The router's own time for this request: the earliest arrival of it in a backend log of
        the main role (joined by traceparent where the log has it, else by request id) - sent."""
        hit = None
        if self.has_tp and r.traceparent:
            hit = self.tp_index.first(self.role, id_hash(r.traceparent))
            if hit is not None:
                self.hop_by_tp += 1
        if hit is None and r.id_sent:
            hit = self.index.first(self.role, id_hash(r.id_sent))
            if hit is not None:
                self.hop_by_id += 1
        if hit is None:
            return
        bi, recv = hit
        if recv < sent:  # arrived before agentload's send stamp: not a time the router took
            self.hop_before_sent += 1
            return
        name = self.backends[bi].name
        h = self.hop.get(name)
        if h is None:
            h = self.hop[name] = SparseHistogram()
        h.record_ns(recv - sent)

    def _tally(self, name: str, role: str) -> _BackendTally:
        k = (name, role)
        t = self.tallies.get(k)
        if t is None:
            t = self.tallies[k] = _BackendTally()
        return t

    def _sticky(self, r: Record, backend: str | None) -> None:
        """Each round's backend is its last attempt's; a pair of consecutive rounds of one
        conversation counts once the later round is over (the next one began, or the pass ended)."""
        st = self._agent.get(r.agent)
        if st is None:
            self._agent[r.agent] = [r.conversation, r.round, backend, None, None]
            return
        if (r.conversation, r.round) == (st[0], st[1]):
            st[2] = backend  # a retry of the round: the last attempt's backend counts
            return
        self._close(st)
        st[3], st[4] = (st[0], st[1]), st[2]
        st[0], st[1], st[2] = r.conversation, r.round, backend

    def _close(self, st: list) -> None:
        prev, prev_b = st[3], st[4]
        if prev is None or prev[0] != st[0] or prev[1] != st[1] - 1 or prev_b is None or st[2] is None:
            return
        self.sticky_pairs += 1
        self.sticky_same += prev_b == st[2]

    # ---- after the pass

    def present(self) -> bool:
        return self.fleet is not None or len(self.named) >= MIN_NAMED_BACKENDS

    def run_end(self) -> int:
        return int(self.meta.get("t_end_ns") or 0) or (self.max_end if self.max_end is not None else self.t0)

    def result(self) -> dict[str, Any] | None:
        """summary.json's `router` section; None when the run had no fleet and its records named
        fewer than MIN_NAMED_BACKENDS backends."""
        if not self.present():
            return None
        for st in self._agent.values():
            self._close(st)
            st[3] = None  # closed once
        fleet = self.fleet or {}
        router = fleet.get("router") if isinstance(fleet.get("router"), dict) else None
        return {
            "mode": fleet.get("mode"),
            "router": router,
            "attribution": self._attribution(),
            "backends": self._backends(),
            "over_time": self._over_time(),
            **self._rounds(),
            "stickiness": {"pairs": self.sticky_pairs, "same": self.sticky_same,
                           "share": _rate(self.sticky_same, self.sticky_pairs)},
            "conversations": self._conversations(),
            "imbalance": self._imbalance(),
            "router_time": self._router_time(),
            "faults": [self._fault(ft) for ft in self.faults],
            "inflight": router_inflight(self.data.target_metrics, self.meta, self.min_start, self.max_end),
        }

    def _conversations(self) -> dict[str, Any]:
        """Stickiness per conversation: of the conversations with 2+ requests attributed to a
        backend (of the main role), how many had them all on one backend, and the mean share of a
        conversation's requests on its most-used backend."""
        multi = one = 0
        top_share = 0.0
        for c in self._convs.values():
            n = sum(c.values())
            if n < 2:
                continue
            multi += 1
            top = max(c.values())
            one += top == n
            top_share += top / n
        return {"conversations": len(self._convs), "with_2_plus": multi, "on_one_backend": one,
                "share": _rate(one, multi), "mean_top_share": round(top_share / multi, 4) if multi else None}

    def _imbalance(self) -> dict[str, Any]:
        """Load imbalance (vllm-router's hotspot): the busiest backend's share of the requests x the
        number of backends, overall and its worst IMBALANCE_WINDOW_S window (of those with at least
        IMBALANCE_MIN_PER_BACKEND requests per backend)."""
        names = {b.name for b in self.backends if b.role == self.role} | set(self._load)
        n = len(names)
        total = sum(self._load.values())
        out: dict[str, Any] = {"backends": n, "requests": total, "overall": None, "busiest": None,
                               "window_s": IMBALANCE_WINDOW_S, "min_window_requests": IMBALANCE_MIN_PER_BACKEND * n,
                               "windows": 0, "window_max": None, "window_max_at_s": None}
        if not total or not n:
            return out
        busiest, top = max(self._load.items(), key=lambda x: (x[1], x[0]))
        out["overall"] = round(top / total * n, 4)
        out["busiest"] = busiest
        worst: tuple[float, int] | None = None
        for w in sorted(self._windows):
            c = self._windows[w]
            wt = sum(c.values())
            if wt < IMBALANCE_MIN_PER_BACKEND * n:
                continue
            out["windows"] += 1
            v = round(max(c.values()) / wt * n, 4)
            if worst is None or v > worst[0]:
                worst = (v, w)
        if worst is not None:
            out["window_max"] = worst[0]
            out["window_max_at_s"] = worst[1] * IMBALANCE_WINDOW_S
        return out

    def _router_time(self) -> dict[str, Any]:
        """The router's own time per request: a backend log's arrival - the record's `sent` stamp
        (one clock on one host), per backend of the arrival."""
        total = SparseHistogram()
        per = {}
        order = [b.name for b in self.backends if b.name in self.hop]
        order += sorted(k for k in self.hop if k not in order)
        for name in order:
            h = self.hop[name]
            total.add(h)
            per[name] = _hop_pct(h)
        return {"what": "backend log arrival - request sent", "by_traceparent": self.hop_by_tp,
                "by_id": self.hop_by_id, "before_sent": self.hop_before_sent, "all": _hop_pct(total),
                "backends": per}

    def _attribution(self) -> dict[str, Any]:
        out: dict[str, Any] = {"requests": self.requests, "attributed": self.by_fingerprint + self.by_log,
                               "by_fingerprint": self.by_fingerprint, "by_log": self.by_log,
                               "unattributed": self.unattributed}
        if self.pd:
            out["prefill_attributed"] = self.prefill_attributed
        across = again = 0
        examples: set[int] = set()
        for role in sorted(self.index.h):
            a, g, ex = self.index.repeats(role)
            across += a
            again += g
            examples.update(ex)
        out["retried_across_backends"] = across
        out["repeated_at_one_backend"] = again
        out["retried_examples"] = self._examples(sorted(examples)[:MAX_RETRY_EXAMPLES]) if examples else []
        return out

    def _examples(self, hashes: list[int]) -> list[dict[str, Any]]:
        """The ids behind the first retried hashes, with the backends that got each, by arrival."""
        want = set(hashes)
        seen: dict[int, list[tuple[int, str, str]]] = {}
        for b in self.backends:
            for line in log_lines(self.data.path, b):
                h = id_hash(line["id"])
                if h in want:
                    recv = line.get("recv_ns") if isinstance(line.get("recv_ns"), int) else 0
                    seen.setdefault(h, []).append((recv, b.name, line["id"]))
        out = []
        for h in hashes:
            hits = sorted(seen.get(h, []))
            if hits:
                out.append({"id": hits[0][2], "backends": [n for _, n, _ in hits]})
        return out

    def _backends(self) -> list[dict[str, Any]]:
        order = [(b.name, b.role) for b in self.backends]
        order += sorted(k for k in self.tallies if k not in order)
        role_total = Counter()
        for (_name, role), t in self.tallies.items():
            role_total[role] += t.requests
        out = []
        for name, role in order:
            t = self.tallies.get((name, role)) or _BackendTally()
            b = self.by_name.get(name)
            entry: dict[str, Any] = {
                "name": name, "role": role, "url": b.url if b else None,
                "requests": t.requests, "share": _rate(t.requests, role_total[role]),
                "ok": t.ok, "errors": t.errors, "stalled": t.stalled, "cut_short": t.cut_short,
                "time_to_first_token": _ttft(t.ttft), "cache_hit_rate": _rate(t.cached, t.prompt),
                "log": None,
            }
            if name in self.log_arrivals:
                entry["log"] = {"arrivals": self.log_arrivals[name],
                                "outcomes": dict(sorted(self.log_counts[name].items()))}
            out.append(entry)
        return out

    def _over_time(self) -> dict[str, Any]:
        width, rows = self.over_time.result(self.run_end())
        names = [b.name for b in self.backends if b.role == self.role]
        names += sorted(str(k) for k in rows if k not in names and k != UNATTRIBUTED)
        if UNATTRIBUTED in rows:
            names.append(UNATTRIBUTED)
        nb = max((len(v) for v in rows.values()), default=0)
        return {"width_s": width, "buckets": nb, "by": "request sent",
                "backends": {n: rows.get(n, [0] * nb) for n in names}}

    def _rounds(self) -> dict[str, Any]:
        total = _RoundTally()
        for rt in self.rounds.values():
            total.merge(rt)
        ttft = SparseHistogram()
        for h in self.ttft_rows.all():
            ttft.add(h)
        own = self.ttft_rows.own
        out: dict[str, Any] = {
            "cache_hit_rate": _rate(total.cached, total.prompt),
            "cache_reporting": total.reporting,
            "time_to_first_token": _ttft(ttft),
            # every round's counts; its time to first token where it has a table row of its own
            "rounds": [{"round": r, **self.rounds[r].to_dict(own.get(r))} for r in sorted(self.rounds)],
        }
        rows = self.ttft_rows.rows()
        if rows is not None:
            bands = []
            for lo, hi, h in rows:
                band = _RoundTally()
                for r in self.rounds:
                    if lo <= r <= hi:
                        band.merge(self.rounds[r])
                bands.append({"rounds": [lo, hi], **band.to_dict(h)})
            out["round_bands"] = bands
        return out

    def _fault(self, ft: _FaultTally) -> dict[str, Any]:
        f, t0 = ft.fault, self.t0
        b = self.by_name.get(f.backend)
        end = f.end_ns if f.end_ns is not None else self.run_end()
        has_log = b is not None and f.backend in self.log_arrivals
        stopped: float | str | None = None
        if f.start_ns is not None and has_log:
            if ft.last_during is None:
                stopped = 0.0
            else:
                length = max(0, end - f.start_ns)
                gap = length / ft.before if ft.before and f.end_ns is not None else 0
                tail = min(length / 2, max(NEVER_TAIL_MIN_S * 1e9, NEVER_TAIL_SHARE * length, NEVER_TAIL_GAPS * gap))
                stopped = "never" if end - ft.last_during <= tail else round((ft.last_during - f.start_ns) / 1e9, 3)
        again = None
        if f.end_ns is not None and ft.first_after is not None:
            again = round((ft.first_after - f.end_ns) / 1e9, 3)
        return {
            "index": f.index, "number": f.number, "backend": f.backend, "role": b.role if b else None,
            "fault": f.fault, "planned_s": f.planned_s, "for_s": f.for_s, "applied": f.applied,
            "error": f.error, "source": f.source,
            "start_s": _s(f.start_ns, t0), "end_s": _s(f.end_ns, t0),
            "ended_in_run": f.end_ns is not None,
            "window_end_s": _s(end, t0) if f.start_ns is not None else None,
            "sent_there": {"backend_log": ft.during if has_log else None, "records": ft.records_there},
            "log_outcomes": dict(sorted(ft.log_outcomes.items())) if has_log else None,
            "client_errors": ft.errors, "client_stalls": ft.stalls,
            "errors_there": ft.errors_there, "stalls_there": ft.stalls_there,
            "last_arrival_s": _s(ft.last_during, t0),
            "stopped_routing_after_s": stopped,
            "used_again_after_s": again,
        }


# ---------------------------------------------------------------- the router's in-flight gauges


def router_inflight(tm: TargetMetrics, meta: dict[str, Any], min_start: int | None,
                    max_end: int | None) -> list[dict[str, Any]]:
    """Per router URL and in-flight gauge (`RouterFamily.inflight`), what it said at the last
    scrape against agentload's own requests: `leaked` is how many requests the router still counts
    in flight (above what the gauge read before the run, and the scrape itself where it counts)
    when agentload had none (the run ended and every request ended before that scrape); 0 when
    agentload cannot say it had none (a killed run, a request that ended after the scrape)."""
    if not tm:
        return []
    t0 = tm.t0_ns
    out = []
    for url in tm.urls:
        fam = family_of(tm, url)
        times = tm.scrape_times.get(url) or []
        if fam is None or not times:
            continue
        last, first = times[-1], times[0]
        for name, self_count, what in fam.inflight:
            series = tm.family(url, name)
            if not series:
                continue
            at_last = sum(s.at(last) or 0.0 for s in series)
            before = None
            if min_start is None or first < min_start:  # the first scrape was before any request
                before = sum(s.at(first) or 0.0 for s in series)
            floor = max(float(self_count), before if before is not None else float(self_count))
            idle = bool(meta.get("ended")) and (max_end is None or max_end <= last)
            per_worker = {}
            if fam.worker_label and any(fam.worker_label in s.labels for s in series):
                for s in series:
                    w = s.labels.get(fam.worker_label, "?")
                    per_worker[w] = per_worker.get(w, 0.0) + (s.at(last) or 0.0)
            out.append({
                "url": url, "router": fam.name, "gauge": name, "what": what, "self_count": self_count,
                "before_run": before, "at_last_scrape": at_last, "last_scrape_s": round((last - t0) / 1e9, 3),
                "scrapes": len(times),
                "agentload_idle": idle,
                "agentload_last_end_s": _s(max_end, t0),
                "per_worker": dict(sorted(per_worker.items())) if per_worker else None,
                "leaked": max(0.0, at_last - floor) if idle else 0.0,
            })
    return out


def inflight_series(tm: TargetMetrics) -> list[tuple[str, str, list[float], list[float]]]:
    """(url, gauge, seconds since t0, value less the scrape itself) of every router in-flight gauge,
    summed over its workers at each scrape: the chart beside agentload's own in-flight count."""
    out = []
    if not tm:
        return out
    for url in tm.urls:
        fam = family_of(tm, url)
        times = tm.scrape_times.get(url) or []
        if fam is None or not times:
            continue
        for name, self_count, _ in fam.inflight:
            series = tm.family(url, name)
            if not series:
                continue
            xs = [round((t - tm.t0_ns) / 1e9, 3) for t in times]
            ys = [max(0.0, sum(s.at(t) or 0.0 for s in series) - self_count) for t in times]
            out.append((url, name, xs, ys))
    return out


# ---------------------------------------------------------------- the verdict's evidence by backend


def attribute(data: "RunData", records: list[Record]) -> dict[int, tuple[str | None, str | None]]:
    """{id(record): (backend that answered, prefill worker)} for a few records (the ones a finding
    is about): their own `backend`, else the backend log with their request id; the logs are read
    once, keeping only lines of these ids."""
    meta = data.meta
    pd, role = is_pd(meta), main_role(meta)
    backends = backends_of(meta)
    want: dict[str, list[Record]] = {}
    for r in records:
        if r.id_sent and (r.backend is None or pd):
            want.setdefault(r.id_sent, []).append(r)
    found: dict[tuple[str, str], tuple[int, str]] = {}  # (id, role) -> (latest arrival, backend)
    if want:
        for b in backends:
            for line in log_lines(data.path, b):
                if line["id"] in want:
                    recv = line.get("recv_ns") if isinstance(line.get("recv_ns"), int) else 0
                    k = (line["id"], b.role)
                    if k not in found or recv >= found[k][0]:
                        found[k] = (recv, b.name)
    out = {}
    for r in records:
        main = r.backend
        if main is None and r.id_sent:
            main = (found.get((r.id_sent, role)) or (0, None))[1]
        pre = (found.get((r.id_sent, "prefill")) or (0, None))[1] if pd and r.id_sent else None
        out[id(r)] = (main, pre)
    return out


def _names(counts: Counter, n: int, what: str, label_of, faults_of_backend) -> str | None:
    """One line naming where `n` requests (counts by backend, None: not attributed) were served."""
    missing = counts.get(None, 0)
    known = Counter({k: v for k, v in counts.items() if k is not None})
    if not known:
        return None
    top, k = max(known.items(), key=lambda x: (x[1], x[0]))
    fault = faults_of_backend(top)
    where = f"{label_of(top)}" + (f" ({fault})" if fault else "")
    if k == n:
        return f"the {what} request was served by {where}" if n == 1 else f"all {n} {what} requests were served by {where}"
    rest = [f"{name} x{v}" for name, v in sorted(known.items(), key=lambda x: (-x[1], x[0])) if name != top]
    if missing:
        rest.append(f"{missing} not attributed to a backend")
    if k > n - k:
        return f"{k} of {n} {what} requests were served by {where}; the others: {', '.join(rest)}"
    return (f"{what} requests by backend: {', '.join(f'{name} x{v}' for name, v in known.most_common())}"
            + (f", {missing} not attributed" if missing else ""))


def backend_evidence(data: "RunData", bad: list[Record], what: str,
                     attribution: dict[int, tuple[str | None, str | None]] | None = None,
                     named_backends: int | None = None) -> list[str]:
    """Evidence lines naming the backend(s) that served the requests a finding is about (`what`:
    "stalled", "failed"), with the scheduled fault on that backend that overlapped them; in PD mode
    the decode and the prefill workers. Nothing for a run without a fleet whose records named fewer
    than MIN_NAMED_BACKENDS backends (`named_backends`: how many the whole run's records named,
    else those of `bad`): one server naming itself is no router's fleet."""
    if not bad:
        return []
    meta = data.meta
    attribution = attribution if attribution is not None else attribute(data, bad)
    mains = Counter(attribution.get(id(r), (None, None))[0] for r in bad)
    if named_backends is None:
        named_backends = len(set(mains) - {None})
    if fleet_of(meta) is None and named_backends < MIN_NAMED_BACKENDS:
        return []
    backends = {b.name: b for b in backends_of(meta)}
    t0 = int(meta.get("t0_ns") or 0)
    faults = [f for f in faults_of(data) if f.start_ns is not None] if fleet_of(meta) else []
    role = main_role(meta)

    def label_of(name: str, default_role: str = role) -> str:
        b = backends.get(name)
        return b.label if b else Backend(name, default_role).label

    def fault_on(name: str, which: int) -> str | None:
        hits = Counter()
        for f in faults:
            if f.backend != name:
                continue
            for r in bad:
                if attribution.get(id(r), (None, None))[which] == name and f.overlaps(r.t.get("start") or 0,
                                                                                      r.t.get("end")):
                    hits[f.index] += 1
        if not hits:
            return None
        chosen = [f for f in faults if f.index in hits]
        chosen.sort(key=lambda f: (-hits[f.index], f.index))
        return ", ".join(f"scheduled {fault_text(f, t0)}" for f in chosen[:2])

    n = len(bad)
    out = []
    line = _names(mains, n, what, label_of, lambda name: fault_on(name, 0))
    if line is None:
        out.append(f"none of the {n} {what} requests could be attributed to a backend (no system_fingerprint "
                   f"in their answers, and no backend log line with their request id)")
    else:
        out.append(line)
    if is_pd(meta):
        pres = Counter(attribution.get(id(r), (None, None))[1] for r in bad)
        pline = _names(pres, n, what, lambda name: label_of(name, "prefill"), lambda name: fault_on(name, 1))
        if pline is not None:
            out.append("their prefill: " + pline)
    return out


__all__ = ["Backend", "Fault", "LogIndex", "RouterPass", "attribute", "backend_evidence",
           "backends_of", "fault_text", "faults_of", "fleet_of", "id_hash", "inflight_series", "is_pd",
           "router_inflight", "ttft_ns"]
