"""Pool state, in-flight counts, event-loop lag and agentload's own health, once a second ->
samples.jsonl.

One line per full snapshot (`agentload.run.snapshot`: the watchdog's first tick of each second):
`t` is when the snapshot was taken, and the pool, the in-flight counts, the stalled requests and
the counters all come from that one instant; the sampler never walks the in-flight registry.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from agentload.run.health import ProcessHealth
from agentload.run.snapshot import InflightSnapshot, follow

if TYPE_CHECKING:
    from agentload.run.context import RunContext

SAMPLE_EVERY_S = 1.0  # a full snapshot comes once a second


class Sampler:
    """Pool state, in-flight counts and event-loop lag over time -> samples.jsonl."""

    def __init__(self, ctx: "RunContext", path: Path):
        self.ctx = ctx
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.health = ProcessHealth()
        self.last_seq = 0  # the snapshot of the last line written

    async def probe_lag(self) -> None:
        """Event-loop lag (`ctx.loop_lag`): each sample's `loop_lag_ms` is its largest since the last."""
        await self.ctx.loop_lag.probe()

    async def run(self) -> None:
        await follow(self.ctx.snapshots, self.sample, full=True)

    def sample(self, snap: InflightSnapshot | None = None) -> None:
        """One line of samples.jsonl from `snap` (default: the latest full snapshot)."""
        snap = snap if snap is not None else self.ctx.snapshots.latest_full
        if snap.seq <= self.last_seq:  # none taken yet, or already written: no line twice
            return
        self.last_seq = snap.seq
        # stalled_by, "round/phase" -> count: lets a report of a killed run still say where agents
        # were stuck, though the stalled requests themselves never got a record.
        s = {"t": snap.t, "pool": dict(snap.pool), "inflight": dict(snap.inflight), "stalled": snap.stalled_total,
             "stalled_by": snap.stalled_by, "loop_lag_ms": round(self.ctx.loop_lag.take(), 3),
             "counts": dict(snap.counts), "proc": self.health.sample()}
        os.write(self.fd, orjson.dumps(s, option=orjson.OPT_APPEND_NEWLINE))

    def close(self) -> None:
        os.close(self.fd)
