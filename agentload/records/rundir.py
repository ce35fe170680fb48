"""Reads a run folder back: the run's metadata, its records and its samples.

A run with `--workers N` has one records file and one samples file per worker process
(records-w0.jsonl, samples-w0.jsonl, ...): `load_run` reads them all, so every report, the
histograms and the verdict are computed over the whole run. Records are simply all of them;
samples (one a second per worker) are merged into one sample a second for the whole run
(`merge_worker_samples`).

Only the records of run.json's run id are read: a folder another run appended to (an `--out`
reused before agentload refused that) keeps its other records out of this run's numbers, and
`RunData.other_run_records` counts them (the summary warns). Records are read through
`agentload.redact`, so a secret this process knows never reaches a report.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from agentload.errors import UserError
from agentload.records import Record, iter_record_dicts, load_records, redact_record
from agentload.redact import has_secrets, register_target


@dataclass
class RunData:
    path: Path
    meta: dict[str, Any]
    records: list[Record]
    torn_lines: int
    samples: list[dict[str, Any]]
    other_run_records: int = 0  # records of other run ids in the folder, skipped


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
    run_id = meta.get("run")
    records: list[Record] = []
    torn = 0
    others = 0
    for f in worker_files(path, "records", ".jsonl"):
        loaded = load_records(f)
        mine = [r for r in loaded.records if run_id is None or r.run == run_id]
        others += len(loaded.records) - len(mine)
        records.extend(map(redact_record, mine) if has_secrets() else mine)
        torn += loaded.torn_lines
    records.sort(key=lambda r: (r.t.get("start") or r.t.get("end") or 0))
    sample_files = worker_files(path, "samples", ".jsonl")
    if len(sample_files) <= 1:
        samples = _load_jsonl(sample_files[0]) if sample_files else []
    else:
        samples = merge_worker_samples([_load_jsonl(f) for f in sample_files], int(meta.get("t0_ns") or 0))
    if others:  # samples carry no run id: keep those taken while this run was going
        lo, hi = int(meta.get("t0_ns") or 0), int(meta.get("t_end_ns") or 0) or None
        samples = [s for s in samples if isinstance(s.get("t"), int) and s["t"] >= lo and (hi is None or s["t"] <= hi)]
    return RunData(path, meta, records, torn, samples, others)
