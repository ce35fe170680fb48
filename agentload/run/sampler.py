"""Pool state, in-flight counts, event-loop lag and agentload's own health, once a second ->
samples.jsonl."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from agentload.run.health import ProcessHealth

if TYPE_CHECKING:
    from agentload.run.context import RunContext

_now = time.perf_counter_ns

SAMPLE_EVERY_S = 1.0
LOOP_LAG_PROBE_S = 0.1


class Sampler:
    """Pool state, in-flight counts and event-loop lag over time -> samples.jsonl."""

    def __init__(self, ctx: "RunContext", path: Path):
        self.ctx = ctx
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.max_lag_ms = 0.0
        self.lag_ms = 0.0
        self.health = ProcessHealth()

    async def probe_lag(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            t = loop.time()
            await asyncio.sleep(LOOP_LAG_PROBE_S)
            lag = (loop.time() - t - LOOP_LAG_PROBE_S) * 1000.0
            self.lag_ms = max(self.lag_ms, lag)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(SAMPLE_EVERY_S)
            self.sample()

    def sample(self) -> None:
        ctx = self.ctx
        phases: dict[str, int] = {}
        stalled = 0
        # "round/phase" -> count: lets a report of a killed run still say where agents were stuck,
        # though the stalled requests themselves never got a record.
        stalled_by: dict[str, int] = {}
        for tr in list(ctx.inflight.values()):
            if tr.kind != "agent":
                continue
            p = tr.phase()
            phases[p] = phases.get(p, 0) + 1
            if tr.stalled_phase is not None:
                stalled += 1
                key = f"{tr.round}/{tr.stalled_phase}"
                stalled_by[key] = stalled_by.get(key, 0) + 1
        s = {"t": _now(), "pool": ctx.transport.pool_state(), "inflight": phases, "stalled": stalled,
             "stalled_by": stalled_by,
             "loop_lag_ms": round(self.lag_ms, 3), "counts": dict(ctx.counts), "proc": self.health.sample()}
        self.max_lag_ms = max(self.max_lag_ms, self.lag_ms)
        self.lag_ms = 0.0
        os.write(self.fd, orjson.dumps(s, option=orjson.OPT_APPEND_NEWLINE))

    def close(self) -> None:
        os.close(self.fd)
