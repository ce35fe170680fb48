"""Reads a run folder back: the run's metadata, its samples, and a stream of its records.

`load_run(path)` reads run.json and the samples, and gives a `RunData` whose `iter_records()`
streams the records from disk, one at a time, each time it is called: no report holds a list of
every record (they are consumers of one pass: `agentload.analysis.passes`). The run's other
inputs are read once, through the same object: `meta` (run.json), `samples`, and
`target_metrics` (target_metrics.jsonl, on first use).

A run with `--workers N` has one records file and one samples file per worker process
(records-w0.jsonl, samples-w0.jsonl, ...): the stream walks them all in worker order, so every
report, the histograms and the verdict cover the whole run; samples (one a second per worker)
are merged into one sample a second for the whole run (`merge_worker_samples`).

Records come in file order (an agent's requests are sequential, so its records are in order;
across agents, by when each request ended). Consumers that need the order of the requests'
starts sort what they keep by `start_key` and their position in the stream.

Only the records of run.json's run id are yielded: a folder another run appended to (an `--out`
reused before agentload refused that) keeps its other records out of this run's numbers, and
`RunData.other_run_records` counts them (the summary warns; the samples are then cut to this
run's time span). Torn lines (a run killed mid-write) are skipped and counted (`torn_lines`).
Both counts are known once a stream has been read to its end. Records are read through
`agentload.redact`, so a secret this process knows never reaches a report.

`RunData.from_records(...)` makes one from records in memory (tests, tools).
"""

from __future__ import annotations

import re
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator

import orjson

from agentload.errors import UserError
from agentload.records import Record, iter_record_dicts, redact_record
from agentload.redact import has_secrets, register_target

if TYPE_CHECKING:
    from agentload.records.target_metrics import TargetMetrics


def start_key(rec: Record) -> int:
    """Where a record sorts among the run's requests: its start (else its end)."""
    t = rec.t
    return t.get("start") or t.get("end") or 0


class RunData:
    """One run folder read back: `meta` (run.json), `samples`, and `iter_records()`.

    Disk-backed (`load_run`) it holds no record; made with `from_records` it streams that list."""

    def __init__(self, path: Path, meta: dict[str, Any], samples: list[dict[str, Any]], *,
                 files: Iterable[Path] = (), records: Iterable[Record] | None = None,
                 torn_lines: int = 0, other_run_records: int = 0):
        self.path = Path(path)
        self.meta = meta
        self._raw_samples = samples
        self._files = list(files)
        self._memory = list(records) if records is not None else None
        # counted by the last stream read to its end (None: no stream has been, yet)
        self._torn: int | None = torn_lines if records is not None else None
        self._others: int | None = other_run_records if records is not None else None

    @classmethod
    def from_records(cls, path: Path, meta: dict[str, Any], records: Iterable[Record],
                     samples: Iterable[dict[str, Any]] = (), torn_lines: int = 0,
                     other_run_records: int = 0) -> "RunData":
        """A run held in memory (tests, tools): `iter_records()` walks these records in this order."""
        return cls(path, meta, list(samples), records=records, torn_lines=torn_lines,
                   other_run_records=other_run_records)

    # ---- the records: a stream

    def iter_records(self) -> Iterator[Record]:
        """A fresh stream of the run's own records (redacted). Reading it to its end counts the
        torn lines and the other runs' records (`torn_lines`, `other_run_records`)."""
        if self._memory is not None:
            yield from self._memory
            return
        run_id = self.meta.get("run")
        redacting = has_secrets()
        torn = others = 0
        for f in self._files:
            for d in iter_record_dicts(f):
                if d is None:
                    torn += 1
                    continue
                try:
                    rec = Record.from_dict(d)
                except (TypeError, KeyError):
                    torn += 1
                    continue
                if run_id is not None and rec.run != run_id:
                    others += 1
                    continue
                yield redact_record(rec) if redacting else rec
        self._torn, self._others = torn, others

    @property
    def records(self) -> list[Record]:
        """Every record in a list, sorted by start: materialises the whole run, for tests and
        small tools. No report uses it (they read `iter_records()` once)."""
        recs = list(self.iter_records())
        recs.sort(key=start_key)
        return recs

    def _counted(self) -> None:
        if self._torn is None or self._others is None:
            for _ in self.iter_records():
                pass

    @property
    def torn_lines(self) -> int:
        """Lines that did not parse (a run killed mid-write)."""
        self._counted()
        assert self._torn is not None
        return self._torn

    @property
    def other_run_records(self) -> int:
        """Records of other run ids in the folder, skipped."""
        self._counted()
        assert self._others is not None
        return self._others

    # ---- the other inputs, each read once

    @property
    def samples(self) -> list[dict[str, Any]]:
        """One sample a second (merged over the workers); when the folder holds other runs'
        records, only those taken while this run was going (samples carry no run id)."""
        if self._raw_samples and self.other_run_records:
            lo, hi = int(self.meta.get("t0_ns") or 0), int(self.meta.get("t_end_ns") or 0) or None
            return [s for s in self._raw_samples
                    if isinstance(s.get("t"), int) and s["t"] >= lo and (hi is None or s["t"] <= hi)]
        return self._raw_samples

    @cached_property
    def target_metrics(self) -> "TargetMetrics":
        """target_metrics.jsonl read back (empty when the run scraped nothing)."""
        from agentload.records.target_metrics import load_target_metrics

        return load_target_metrics(self.path, int(self.meta.get("t0_ns") or 0), meta=self.meta)


def _load_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [d for d in iter_record_dicts(path) if d is not None]


def worker_files(run_dir: Path, stem: str, ext: str) -> list[Path]:
    """`stem+ext` if it exists, then `stem-wI+ext` of each worker process, in worker order."""
    run_dir = Path(run_dir)
    out = [run_dir / f"{stem}{ext}"] if (run_dir / f"{stem}{ext}").exists() else []
    pat = re.compile(re.escape(stem) + r"-w(\d+)" + re.escape(ext) + "$")
    found = []
    for p in run_dir.glob(f"{stem}-w*{ext}"):
        m = pat.match(p.name)
        if m:
            found.append((int(m.group(1)), p))
    return out + [p for _, p in sorted(found)]


# Sample keys that are a maximum over the workers, not a sum.
_MAX_KEYS = frozenset({"t", "loop_lag_ms"})


def _merge_into(acc: dict[str, Any], s: dict[str, Any]) -> None:
    for k, v in s.items():
        if isinstance(v, bool) or v is None:
            acc.setdefault(k, v)
        elif isinstance(v, (int, float)):
            cur = acc.get(k)
            if not isinstance(cur, (int, float)) or isinstance(cur, bool):
                acc[k] = v
            else:
                acc[k] = max(cur, v) if k in _MAX_KEYS else cur + v
        elif isinstance(v, dict):
            sub = acc.get(k)
            if not isinstance(sub, dict):
                sub = acc[k] = {}
            _merge_into(sub, v)
        else:
            acc.setdefault(k, v)


def merge_worker_samples(per_worker: list[list[dict[str, Any]]], t0_ns: int, every_s: float = 1.0) -> list[dict[str, Any]]:
    """One sample per `every_s` for the whole run from each worker's own samples.

    Samples are put in slots of `every_s` since t0_ns (the workers share that anchor); within a
    slot the last sample of each worker counts, and the workers' values are added up (pool in
    use/idle/waiters/limit, in-flight by phase, stalled, counts, process RSS and fds) except
    `t` and `loop_lag_ms`, which take the maximum. `workers` says how many workers a slot has.
    """
    if len(per_worker) == 1:
        return per_worker[0]
    slots: dict[int, dict[int, dict[str, Any]]] = {}
    period = max(1, int(every_s * 1e9))
    for w, samples in enumerate(per_worker):
        for s in samples:
            t = s.get("t")
            if not isinstance(t, int):
                continue
            slots.setdefault((t - t0_ns) // period, {})[w] = s
    out = []
    for k in sorted(slots):
        acc: dict[str, Any] = {}
        for w in sorted(slots[k]):
            _merge_into(acc, slots[k][w])
        acc["workers"] = len(slots[k])
        out.append(acc)
    return out


def load_run(path: Path) -> RunData:
    """The run folder at `path`: run.json and the samples read, the records left on disk."""
    path = Path(path)
    meta_path = path / "run.json"
    if not path.is_dir():
        raise UserError(f"{path}: not a run folder (expected a folder with run.json and records.jsonl)")
    if not meta_path.exists():
        raise UserError(f"{meta_path}: missing (expected the run's metadata written by `agentload run`)")
    try:
        meta = orjson.loads(meta_path.read_bytes())
    except orjson.JSONDecodeError as e:
        raise UserError(f"{meta_path}: not valid JSON ({e})")
    if not isinstance(meta, dict):
        raise UserError(f"{meta_path}: expected a JSON object (the run's metadata written by `agentload run`)")
    register_target((meta.get("scenario") or {}).get("target") or {})  # the secrets this environment holds
    sample_files = worker_files(path, "samples", ".jsonl")
    if len(sample_files) <= 1:
        samples = _load_jsonl(sample_files[0]) if sample_files else []
    else:
        samples = merge_worker_samples([_load_jsonl(f) for f in sample_files], int(meta.get("t0_ns") or 0))
    return RunData(path, meta, samples, files=worker_files(path, "records", ".jsonl"))
