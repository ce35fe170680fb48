"""RecordWriter: one line per record, whole lines per write(2); in a run, one write per loop step."""

from __future__ import annotations

import asyncio
import os

import pytest

import agentload.records.record as record_mod
from agentload.records import RecordWriter, load_records
from records_factory import RunBuilder


def _records(n: int):
    b = RunBuilder()
    for i in range(n):
        b.ok(i, 1)
    return b.records


def _spy_writes(monkeypatch) -> list[int]:
    sizes: list[int] = []
    real = os.write

    def write(fd, data):
        sizes.append(len(data))
        return real(fd, data)

    monkeypatch.setattr(record_mod.os, "write", write)
    return sizes


def test_without_a_loop_each_record_is_on_disk_when_write_returns(tmp_path, monkeypatch):
    sizes = _spy_writes(monkeypatch)
    w = RecordWriter(tmp_path / "records.jsonl")
    recs = _records(3)
    for i, r in enumerate(recs, 1):
        w.write(r)
        assert (tmp_path / "records.jsonl").read_bytes().count(b"\n") == i
    w.close()
    assert len(sizes) == 3 and w.count == 3
    assert load_records(tmp_path / "records.jsonl").records == recs


async def test_records_of_one_loop_step_go_out_in_one_write_at_its_end(tmp_path, monkeypatch):
    sizes = _spy_writes(monkeypatch)
    path = tmp_path / "records.jsonl"
    w = RecordWriter(path, loop=asyncio.get_running_loop())
    recs = _records(5)
    for r in recs[:4]:
        w.write(r)
    assert path.read_bytes() == b""  # still this step
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert len(sizes) == 1 and path.read_bytes().count(b"\n") == 4
    w.write(recs[4])  # a later step: its own write
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert len(sizes) == 2
    w.close()
    loaded = load_records(path)
    assert loaded.records == recs and loaded.torn_lines == 0 and w.count == 5


async def test_close_writes_what_the_step_still_held(tmp_path):
    path = tmp_path / "records.jsonl"
    w = RecordWriter(path, loop=asyncio.get_running_loop())
    recs = _records(3)
    for r in recs:
        w.write(r)
    w.close()  # before the step ended: nothing may be lost
    assert load_records(path).records == recs
    await asyncio.sleep(0)  # the flush scheduled for the step finds nothing left, and no descriptor
    assert load_records(path).records == recs


async def test_a_batched_write_that_failed_is_raised_by_the_next_write(tmp_path, monkeypatch):
    w = RecordWriter(tmp_path / "records.jsonl", loop=asyncio.get_running_loop())
    recs = _records(2)

    def full_disk(fd, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(record_mod.os, "write", full_disk)
    w.write(recs[0])
    await asyncio.sleep(0)
    await asyncio.sleep(0)  # the step's write failed in a loop callback: kept for the next writer
    monkeypatch.undo()
    assert w.count == 0  # the line that did not reach the disk is not counted
    with pytest.raises(OSError, match="No space left"):
        w.write(recs[1])  # (an agent's emit: its request is recorded as agentload's crash)
    w.close()
