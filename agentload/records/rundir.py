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

Samples are read once too, and kept compressed (`Samples`: a sequence of dicts parsed again from
zlib-compressed JSON lines each time it is walked): a day-long run has 86,400 of them, which as
dicts would outweigh everything else a report keeps.

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

import heapq
import re
import zlib
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Sequence, overload

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

    def __init__(self, path: Path, meta: dict[str, Any], samples: "Sequence[dict[str, Any]]", *,
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
    def samples(self) -> "Sequence[dict[str, Any]]":
        """One sample a second (merged over the workers); when the folder holds other runs'
        records, only those taken while this run was going (samples carry no run id)."""
        if self._raw_samples and self.other_run_records:
            lo, hi = int(self.meta.get("t0_ns") or 0), int(self.meta.get("t_end_ns") or 0) or None
            if isinstance(self._raw_samples, Samples):
                return self._raw_samples.within(lo, hi)
            return [s for s in self._raw_samples if _within(s, lo, hi)]
        return self._raw_samples

    @cached_property
    def target_metrics(self) -> "TargetMetrics":
        """target_metrics.jsonl read back (empty when the run scraped nothing)."""
        from agentload.records.target_metrics import load_target_metrics

        return load_target_metrics(self.path, int(self.meta.get("t0_ns") or 0), meta=self.meta)


def _within(s: dict[str, Any], lo: int, hi: int | None) -> bool:
    t = s.get("t")
    return isinstance(t, int) and t >= lo and (hi is None or t <= hi)


class Samples(Sequence[dict[str, Any]]):
    """The run's samples (samples.jsonl; the workers' samples-wI.jsonl merged a second at a time, as
    `merge_worker_samples` does), read from disk once and kept as their JSON lines in zlib-compressed
    blocks: a sequence of dicts parsed again each time it is walked. A day-long run has 86,400
    samples; as dicts they would outweigh everything else a report keeps (~1.4 KB each), as
    compressed lines they take a few MB. Indexing walks it (the last sample, `[-1]`, is the usual
    ask). `within(lo, hi)`: only the samples taken in that span of the records' clock."""

    BLOCK = 1024  # lines per compressed block

    def __init__(self, lines: Iterable[bytes] = ()):
        self._blocks: list[bytes] = []
        self._n = 0
        buf: list[bytes] = []
        for line in lines:
            buf.append(line)
            if len(buf) == self.BLOCK:
                self._flush(buf)
        self._flush(buf)

    def _flush(self, buf: list[bytes]) -> None:
        if buf:
            self._blocks.append(zlib.compress(b"\n".join(buf), 1))
            self._n += len(buf)
            buf.clear()

    @classmethod
    def read(cls, files: list[Path], t0_ns: int) -> "Samples":
        """Each file read once (one walk of all of them together, for the workers' merge)."""
        if len(files) == 1:
            return cls(_object_lines(files[0]))
        merged = iter_merged_samples([(d for d in iter_record_dicts(f) if d is not None) for f in files], t0_ns)
        return cls(orjson.dumps(d) for d in merged)

    def within(self, lo: int, hi: int | None) -> "Samples":
        return Samples(orjson.dumps(d) for d in self if _within(d, lo, hi))

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for block in self._blocks:
            for line in zlib.decompress(block).split(b"\n"):
                yield orjson.loads(line)

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, i: int) -> dict[str, Any]: ...

    @overload
    def __getitem__(self, i: slice) -> list[dict[str, Any]]: ...

    def __getitem__(self, i: int | slice) -> dict[str, Any] | list[dict[str, Any]]:
        if isinstance(i, slice):
            return list(self)[i]
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError("sample index out of range")
        block = zlib.decompress(self._blocks[i // self.BLOCK]).split(b"\n")
        sample: dict[str, Any] = orjson.loads(block[i % self.BLOCK])
        return sample

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (list, tuple, Samples)):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Samples({self._n} samples)"


def _object_lines(path: Path) -> Iterator[bytes]:
    """The lines of a JSONL file that hold a JSON object (as `iter_record_dicts` yields them)."""
    with open(path, "rb") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                d = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if isinstance(d, dict):
                yield line


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


def iter_merged_samples(per_worker: list[Iterable[dict[str, Any]]], t0_ns: int,
                        every_s: float = 1.0) -> Iterator[dict[str, Any]]:
    """`merge_worker_samples` as a stream: each worker's samples come in time order (the sampler
    writes them so), so the slots come one after the other and only one slot is held at a time."""
    if len(per_worker) == 1:
        yield from per_worker[0]
        return
    period = max(1, int(every_s * 1e9))

    def keyed(w: int, it: Iterable[dict[str, Any]]) -> Iterator[tuple[int, int, dict[str, Any]]]:
        for s in it:
            t = s.get("t")
            if isinstance(t, int):
                yield (t - t0_ns) // period, w, s

    slot: dict[int, dict[str, Any]] = {}
    cur: int | None = None
    for k, w, s in heapq.merge(*(keyed(w, it) for w, it in enumerate(per_worker)), key=lambda x: (x[0], x[1])):
        if k != cur and slot:
            yield _merged_slot(slot)
            slot = {}
        cur = k
        slot[w] = s
    if slot:
        yield _merged_slot(slot)


def _merged_slot(slot: dict[int, dict[str, Any]]) -> dict[str, Any]:
    acc: dict[str, Any] = {}
    for w in sorted(slot):
        _merge_into(acc, slot[w])
    acc["workers"] = len(slot)
    return acc


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
        raise UserError(f"{meta_path}: not valid JSON ({e})") from e
    if not isinstance(meta, dict):
        raise UserError(f"{meta_path}: expected a JSON object (the run's metadata written by `agentload run`)")
    register_target((meta.get("scenario") or {}).get("target") or {})  # the secrets this environment holds
    sample_files = worker_files(path, "samples", ".jsonl")
    samples: Sequence[dict[str, Any]] = Samples.read(sample_files, int(meta.get("t0_ns") or 0)) if sample_files else []
    return RunData(path, meta, samples, files=worker_files(path, "records", ".jsonl"))
