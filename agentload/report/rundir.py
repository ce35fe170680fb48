"""Reads a run folder back: the run's metadata, its records and its samples."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from agentload.errors import UserError
from agentload.records import Record, iter_record_dicts, load_records


@dataclass
class RunData:
    path: Path
    meta: dict[str, Any]
    records: list[Record]
    torn_lines: int
    samples: list[dict[str, Any]]


def _load_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [d for d in iter_record_dicts(path) if d is not None]


def load_run(path: Path) -> RunData:
    path = Path(path)
    meta_path = path / "run.json"
    rec_path = path / "records.jsonl"
    if not path.is_dir():
        raise UserError(f"{path}: not a run folder (expected a folder with run.json and records.jsonl)")
    if not meta_path.exists():
        raise UserError(f"{meta_path}: missing (expected the run's metadata written by `agentload run`)")
    try:
        meta = orjson.loads(meta_path.read_bytes())
    except orjson.JSONDecodeError as e:
        raise UserError(f"{meta_path}: not valid JSON ({e})")
    loaded = load_records(rec_path) if rec_path.exists() else None
    records = loaded.records if loaded else []
    torn = loaded.torn_lines if loaded else 0
    records.sort(key=lambda r: (r.t.get("start") or r.t.get("end") or 0))
    return RunData(path, meta, records, torn, _load_jsonl(path / "samples.jsonl"))
