"""One pass over a run's records, feeding every consumer (vegeta's reporters: `add`, then read).

Reports never hold a list of every record: `one_pass(data, consumers)` streams
`RunData.iter_records()` once and hands each record to every consumer in turn; each keeps only
what it needs (histograms, counters, per-agent state, the troubled records, a sample of lanes).
A consumer is anything with `add(record)`; what it found is read after the pass.

Records come in file order, not sorted by start: a consumer that keeps records and needs them
in the requests' order sorts what it kept by `order_key` (start, then position in the stream:
the order `RunData.records` gives) once the pass is over.

Who consumes what (for `agentload report` / the end of a run):

- `analysis.summary.SummaryPass`: per-round and overall PhaseStats, the verdict's facts
  (`analysis.verdict.FactsAccumulator`, which also holds the per-agent state behind
  summary.json's agents), start lateness and timing-error histograms, counts, and (a fleet behind
  a router) `analysis.router.RouterPass`: per backend, per round, per scheduled fault;
- `report.html_view.HtmlView`: the timeline's lane sample (`report.timeline.LaneSampler`),
  stalls and errors by round x phase, requests by prompt size, completions by end time;
- `analysis.compare.CompareTally` (for `agentload compare`): connection and error counts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Protocol

from agentload.records import Record
from agentload.records.rundir import start_key

if TYPE_CHECKING:
    from agentload.records.rundir import RunData


class Consumer(Protocol):
    def add(self, rec: Record) -> None: ...


def one_pass(data: "RunData", consumers: Iterable[Consumer]) -> int:
    """Stream the run's records once through every consumer; returns how many there were."""
    adds = [c.add for c in consumers]
    n = 0
    for rec in data.iter_records():
        n += 1
        for add in adds:
            add(rec)
    return n


def order_key(rec: Record, seq: int) -> tuple[int, int]:
    """Where a record stands among the run's requests: its start, then its place in the stream."""
    return start_key(rec), seq
