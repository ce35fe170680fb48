"""The router pass's state: every counter `collect.RouterPass` keeps (per backend, round,
conversation, time window and scheduled fault) and the backend logs' index, read when it is made;
`section` turns it into summary.json's `router` section."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from agentload.analysis.router.facts import RouterFacts
from agentload.analysis.router.log_index import LogIndex, id_hash
from agentload.analysis.router.tallies import (
    BackendTally,
    FaultTally,
    HopTally,
    RoundTally,
)
from agentload.analysis.stats import RoundRows, SparseHistogram
from agentload.analysis.tallies import TimeCounts
from agentload.records.fleet import log_lines

if TYPE_CHECKING:
    from agentload.records.rundir import RunData

UNATTRIBUTED = "unattributed"
OVER_TIME_BUCKETS = 60
MAX_BACKENDS = 256  # distinct names kept apart; more (a server whose fingerprint varies) go in OTHER
OTHER = "other"
# load imbalance (vllm-router's `hotspot`): the busiest backend's share of requests x the number of
# backends (1.0: even; n: all on one), overall and per window of this many seconds
IMBALANCE_WINDOW_S = 10


class AgentSticky:
    """One agent's last rounds, for stickiness: a pair of consecutive rounds of one conversation
    counts once the later round is over (the next one began, or the pass ended)."""

    __slots__ = ("conversation", "round", "backend", "closed", "closed_backend")

    def __init__(self, conversation: int, rnd: int, backend: str | None) -> None:
        self.conversation, self.round, self.backend = conversation, rnd, backend
        self.closed: tuple[int, int] | None = None  # the round before, once over
        self.closed_backend: str | None = None


class PassState:
    """What the router pass counts, and the backend logs read into `index` (`tp_index`: their
    traceparents) with each fault's arrivals at its backend. `facts`: the run's fleet as the
    verdict gets it (made here when not given)."""

    def __init__(self, data: "RunData", facts: RouterFacts | None = None) -> None:
        self.facts = facts if facts is not None else RouterFacts(data)
        self.data = data
        self.meta = data.meta
        self.t0 = self.facts.t0
        self.fleet = self.facts.fleet
        self.pd = self.facts.pd
        self.role = self.facts.role
        self.backends = self.facts.backends
        self.by_name = self.facts.by_name
        self.tallies: dict[tuple[str, str], BackendTally] = {}
        self.rounds: dict[int, RoundTally] = {}
        # time to first token per row of the by-round table (rounds one by one, else 1-10 and bands)
        self.ttft_rows: RoundRows[SparseHistogram] = RoundRows(SparseHistogram, SparseHistogram.add)
        self.over_time = TimeCounts(self.t0, OVER_TIME_BUCKETS)
        self.requests = self.by_fingerprint = self.by_log = self.unattributed = 0
        self.prefill_attributed = 0
        self.sticky_pairs = self.sticky_same = 0
        self._agent: dict[int, AgentSticky] = {}
        self.min_start: int | None = None
        self.max_end: int | None = None
        self.named: set[str] = set()  # distinct backend names the records gave (at most MAX_BACKENDS)
        self.faults = [FaultTally(f) for f in self.facts.faults]
        self.log_counts: dict[str, Counter[str]] = {}
        self.log_arrivals: dict[str, int] = {}
        # per conversation (agent, conversation): its requests by backend (main role, attributed)
        self.convs: dict[tuple[int, int], Counter[str]] = {}
        self.windows: dict[int, Counter[str]] = {}  # IMBALANCE_WINDOW_S window -> backend -> requests
        self.load: Counter[str] = Counter()  # backend -> requests (main role, attributed)
        # the router's own time: backend log arrival - request sent, per role (the main one, and
        # the prefill workers in PD mode: both get each request) and backend of the arrival
        self.hop: dict[str, HopTally] = {self.role: HopTally()}
        if self.pd:
            self.hop["prefill"] = HopTally()
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
            outcomes: Counter[str] = Counter()
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
                        ft.arrival(recv, str(line.get("outcome")))
            self.log_counts[b.name] = outcomes
            self.log_arrivals[b.name] = n
        self.tp_index.freeze()
        return index.freeze()

    def run_end(self) -> int:
        return int(self.meta.get("t_end_ns") or 0) or (self.max_end if self.max_end is not None else self.t0)
