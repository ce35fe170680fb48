"""Run one scenario into one run folder, with the embedded mock when it has no endpoint.

The one path `run`, `compare` and the tests share: start the mock (a separate process),
execute, stop the mock, write every report.
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentload.errors import UserError
from agentload.report.build import write_reports
from agentload.runner import RunOutcome, execute
from agentload.scenario import Scenario


def use_uvloop() -> None:
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:  # optional: the default loop works, a little slower
        pass


@dataclass
class Launched:
    outcome: RunOutcome
    summary: dict[str, Any]
    text: str


def run_to_dir(sc: Scenario, run_dir: Path, *, live: bool = True, install_signals: bool = True,
               log=lambda msg: print(msg, file=sys.stderr), metrics_port: int | None = None,
               workers: int = 1) -> Launched:
    """Run `sc` into run_dir and write every report. With workers > 1 the agents run in that many
    processes (agentload.workers), against one embedded mock shared by all of them."""
    from agentload.live import LiveLine
    from agentload.mock.process import MockProcess

    if workers > 1 and metrics_port is not None:
        raise UserError("--metrics-port is not supported with --workers yet (each worker has its own state)")
    mock = None
    view = None
    try:
        if sc.target.endpoint is None:
            mock = MockProcess.start(sc.mock)
            base_url = mock.url
        else:
            base_url = sc.target.endpoint
        log(f"agentload: running {sc.source} against {base_url}{' (embedded mock)' if mock else ''} -> {run_dir}")
        if workers > 1:
            from agentload.workers import run_workers

            outcome = run_workers(sc, run_dir, base_url, workers, embedded_mock=mock is not None,
                                  install_signals=install_signals, live=live, log=log)
        else:
            use_uvloop()
            view = LiveLine(run_dir=str(run_dir)) if live else None  # its clock starts with the run
            outcome = asyncio.run(execute(sc, run_dir, base_url, embedded_mock=mock is not None,
                                          on_tick=view, install_signals=install_signals,
                                          metrics_port=metrics_port))
    finally:
        if view is not None:
            view.close()
        if mock is not None:
            mock.stop()
    summary, text = write_reports(run_dir)
    return Launched(outcome, summary, text)
