"""The router pass: one consumer of `analysis.passes.one_pass` that counts, per record, which
backend served it (its `backend`, else the backend logs' line with its request id), per backend,
round, conversation, time window and scheduled fault; `result()` is summary.json's `router`."""

from __future__ import annotations

from collections import Counter
from typing import Any

from agentload.analysis.router import section
from agentload.analysis.router.log_index import id_hash
from agentload.analysis.router.state import (
    IMBALANCE_WINDOW_S,
    MAX_BACKENDS,
    OTHER,
    UNATTRIBUTED,
    AgentSticky,
    PassState,
)
from agentload.analysis.router.tallies import BackendTally, RoundTally, rate, ttft_ns
from agentload.records.phases import end_stamp
from agentload.records.record import Record


class RouterPass(PassState):
    """summary.json's `router` section from one pass over the records (`add` each, then
    `result()`): the backend logs, the schedule and the router's scrapes are read when it is made."""

    # ---- the pass

    def _name(self, idx: int | None) -> str | None:
        return None if idx is None else self.backends[idx].name

    def add(self, r: Record) -> None:
        t = r.t
        s, e = t.get("start"), t.get("end")
        if s is not None:
            self.min_start = s if self.min_start is None else min(self.min_start, s)
        end = end_stamp(t) if t else None
        if end is not None:
            self.max_end = end if self.max_end is None else max(self.max_end, end)
        if r.kind != "agent":
            return
        self.requests += 1
        backend, prefill = self._attribute(r)
        tt = ttft_ns(r)
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
            self.over_time.add(backend if backend is not None else UNATTRIBUTED, sent)
        rt = self.rounds.get(r.round)
        if rt is None:
            rt = self.rounds[r.round] = RoundTally()
        rt.add(r)
        h = self.ttft_rows.get(r.round)
        if tt is not None:
            h.record_ns(tt)
        self._sticky(r, backend)
        if s is not None:
            for ft in self.faults:
                ft.record(r, ft.fault.backend in (backend, prefill), sent, s, e)

    def _attribute(self, r: Record) -> tuple[str | None, str | None]:
        """(the backend that answered, the prefill worker in PD mode): the logs are asked only for
        what the record does not say."""
        backend = r.backend
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
        return backend, prefill

    def _spread(self, r: Record, backend: str, sent: int | None) -> None:
        """A request of the main role on `backend`: its conversation's counts and its window's."""
        k = (r.agent, r.conversation)
        c = self.convs.get(k)
        if c is None:
            c = self.convs[k] = Counter()
        c[backend] += 1
        self.load[backend] += 1
        if sent is not None:
            w = (sent - self.t0) // (IMBALANCE_WINDOW_S * 1_000_000_000)
            wc = self.windows.get(w)
            if wc is None:
                wc = self.windows[w] = Counter()
            wc[backend] += 1

    def _hop(self, r: Record, sent: int) -> None:
        """The router's own time for this request, per role (the main one; the prefill workers too
        in PD mode): the earliest arrival of it in a backend log of the role (joined by traceparent
        where the log has it, else by request id) - sent."""
        for role, tally in self.hop.items():
            hit = None
            if self.has_tp and r.traceparent:
                hit = self.tp_index.first(role, id_hash(r.traceparent))
                if hit is not None:
                    tally.by_tp += 1
            if hit is None and r.id_sent:
                hit = self.index.first(role, id_hash(r.id_sent))
                if hit is not None:
                    tally.by_id += 1
            if hit is not None:
                tally.record(self.backends[hit[0]].name, hit[1], sent)

    def _tally(self, name: str, role: str) -> BackendTally:
        k = (name, role)
        t = self.tallies.get(k)
        if t is None:
            t = self.tallies[k] = BackendTally()
        return t

    def _sticky(self, r: Record, backend: str | None) -> None:
        """Each round's backend is its last attempt's; a pair of consecutive rounds of one
        conversation counts once the later round is over (the next one began, or the pass ended)."""
        st = self._agent.get(r.agent)
        if st is None:
            self._agent[r.agent] = AgentSticky(r.conversation, r.round, backend)
            return
        if (r.conversation, r.round) == (st.conversation, st.round):
            st.backend = backend  # a retry of the round: the last attempt's backend counts
            return
        self._close(st)
        st.closed, st.closed_backend = (st.conversation, st.round), st.backend
        st.conversation, st.round, st.backend = r.conversation, r.round, backend

    def _close(self, st: AgentSticky) -> None:
        prev, prev_b = st.closed, st.closed_backend
        if prev is None or prev[0] != st.conversation or prev[1] != st.round - 1 or prev_b is None \
                or st.backend is None:
            return
        self.sticky_pairs += 1
        self.sticky_same += prev_b == st.backend

    # ---- after the pass

    def present(self) -> bool:
        return self.facts.present(len(self.named))

    def result(self) -> dict[str, Any] | None:
        """summary.json's `router` section; None when the run had no fleet and its records named
        fewer than MIN_NAMED_BACKENDS backends."""
        if not self.present():
            return None
        for st in self._agent.values():
            self._close(st)
            st.closed = None  # closed once
        fleet = self.fleet or {}
        router = fleet.get("router") if isinstance(fleet.get("router"), dict) else None
        return {
            "mode": fleet.get("mode"),
            "router": router,
            "attribution": section.attribution(self),
            "backends": section.backends(self),
            "over_time": section.over_time(self),
            **section.rounds(self),
            "stickiness": {"pairs": self.sticky_pairs, "same": self.sticky_same,
                           "share": rate(self.sticky_same, self.sticky_pairs)},
            "conversations": section.conversations(self),
            "imbalance": section.imbalance(self),
            "router_time": section.router_time(self),
            "faults": [section.fault(self, ft) for ft in self.faults],
            "inflight": self.facts.inflight(self.min_start, self.max_end),
        }
