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
               log=lambda msg: print(msg, file=sys.stderr)) -> Launched:
    from agentload.live import LiveLine
    from agentload.mock.process import MockProcess

    mock = None
    try:
        if sc.target.endpoint is None:
            mock = MockProcess.start(sc.mock)
            base_url = mock.url
        else:
            base_url = sc.target.endpoint
        log(f"agentload: running {sc.source} against {base_url}{' (embedded mock)' if mock else ''} -> {run_dir}")
        use_uvloop()
        outcome = asyncio.run(execute(sc, run_dir, base_url, embedded_mock=mock is not None,
                                      on_tick=LiveLine() if live else None, install_signals=install_signals))
    finally:
        if mock is not None:
            mock.stop()
    summary, text = write_reports(run_dir)
    return Launched(outcome, summary, text)
