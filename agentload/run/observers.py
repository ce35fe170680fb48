"""What watches a run besides the agents: the target's metrics, the interval log, the exporter.

Started by the in-process run (`runner.InProcess`) before any traffic and closed after the last request:

- `TargetScraper` (`[target] metrics_urls`) -> target_metrics.jsonl
- `IntervalLog` -> intervals.hlog (HdrHistogram intervals of e2e and ttft; constant memory)
- `Exporter` (`--metrics-port`) -> agentload's live state at 127.0.0.1:PORT/metrics (it reads
  the watchdog's snapshot of each tick, `ctx.snapshots`)

Their loops are handed to the runner as jobs (`Observers.jobs()`: a name and a coroutine
function), which it runs supervised: a crash is a crash entry in run.json, then a restart.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from agentload.errors import UserError
from agentload.records.interval_log import IntervalLog
from agentload.run.exporter import Exporter
from agentload.run.scraper import TargetScraper

if TYPE_CHECKING:
    from agentload.run.context import RunContext


@dataclass
class Observers:
    scraper: TargetScraper | None = None
    intervals: IntervalLog | None = None
    exporter: Exporter | None = None
    _jobs: list[tuple[str, Callable[[], Awaitable[Any]]]] = field(default_factory=list)

    def jobs(self) -> list[tuple[str, Callable[[], Awaitable[Any]]]]:
        """(name, coroutine function) of each background loop, for the runner to start supervised
        (a crash recorded, the loop restarted) and cancel with its own at the end."""
        return list(self._jobs)

    async def close(self) -> None:
        if self.exporter is not None:
            await self.exporter.stop()
        if self.scraper is not None:
            await self.scraper.aclose()
        if self.intervals is not None:
            self.intervals.close()


async def start_observers(ctx: "RunContext", out_dir: Path, meta: dict[str, Any],
                          metrics_port: int | None) -> Observers:
    obs = Observers()
    if metrics_port is not None:  # first: a port already in use fails the run before anything else
        obs.exporter = Exporter(ctx, metrics_port)
        port = await obs.exporter.start()
        meta["metrics_port"] = port
        print(f"agentload: live metrics at http://127.0.0.1:{port}/metrics", file=sys.stderr, flush=True)
    tgt = ctx.scenario.target
    sfx = meta.get("files_suffix", "")  # one process of --workers N: its own files; worker 0 scrapes
    if tgt.metrics_urls and meta.get("worker", 0) == 0:
        key = os.environ.get(tgt.metrics_api_key_env) if tgt.metrics_api_key_env else None
        if tgt.metrics_api_key_env and not key:  # launch's check_secrets says it first, up front
            raise UserError(f"target.metrics_api_key_env: environment variable {tgt.metrics_api_key_env} is "
                            f"not set; expected the secret in it")
        obs.scraper = TargetScraper(tgt.metrics_urls, tgt.metrics_every_s, out_dir / "target_metrics.jsonl",
                                    api_key=key)
        await obs.scraper.baseline()  # before any traffic; each scrape is bounded by its timeout
        obs._jobs.append(("target-metrics", obs.scraper.run))
        if obs.exporter is not None:
            obs.exporter.collector.extra["scraper"] = obs.scraper
        meta["target_metrics"] = "target_metrics.jsonl"
    obs.intervals = IntervalLog(out_dir / f"intervals{sfx}.hlog", meta["t0_ns"], meta["t0_unix"])
    ctx.listeners.append(obs.intervals.add)
    obs._jobs.append(("intervals", obs.intervals.run))
    meta["intervals"] = {"file": f"intervals{sfx}.hlog", "every_s": obs.intervals.every_s, "tags": ["e2e", "ttft"],
                         "unit": "us"}
    return obs
