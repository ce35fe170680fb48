"""The records layer: what a run leaves on disk and how it is read back.

Written by the run path, read by analysis and the reports; imports nothing above it.

- `phases`: the phase table, the one definition of the phases (stamps, order, labels, colours,
  which are the server's, which the reports show) and what derives from it (`phase_ns`,
  `phase_at`, `PHASES`, `REPORT_PHASES`, `STAMPS`, re-exported here through `record`);
- `record`: one immutable record per request (and the in-flight Trace it comes from), its writer
  and loader;
- `rundir`: a run folder read back as one `RunData`: run.json, samples, target metrics, and a
  stream of its records (`iter_records`; no list of every record);
- `interval_log`: the HdrHistogram interval log (`intervals.hlog`) writer;
- `target_metrics`: the target's Prometheus scrapes (`target_metrics.jsonl`) read back.
- `fleet`: a fleet behind a router as the run folder records it (run.json's `fleet`, the fault
  schedule as applied, each backend's request log).
"""

from agentload.records.record import (  # the names every layer uses
    OUTCOMES,
    PHASES,
    PROBE_KINDS,
    RECORD_VERSION,
    REPORT_PHASES,
    STAMPS,
    LoadedRecords,
    Record,
    RecordWriter,
    Trace,
    iter_record_dicts,
    load_records,
    phase_at,
    phase_ns,
    redact_record,
    tool_calls_sendable,
)

__all__ = [
    "OUTCOMES", "PHASES", "PROBE_KINDS", "RECORD_VERSION", "REPORT_PHASES", "STAMPS", "LoadedRecords", "Record",
    "RecordWriter", "Trace", "iter_record_dicts", "load_records", "phase_at", "phase_ns", "redact_record",
    "tool_calls_sendable",
]
