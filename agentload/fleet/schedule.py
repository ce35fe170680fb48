"""Apply the scenario's [[schedule]] faults to live backends at their times.

A thread of the launching process, timed from the run's own clock anchor (run.json `t0_ns`,
perf_counter_ns, the clock every record's stamps use), so fault windows and records line up
exactly. Each fault is applied at `at_s` and undone at `at_s + for_s`: hang/slow/errors/drop
through the mock's control endpoint (POST /mock/fault), stop (SIGTERM) and kill (SIGKILL) on the
process, which is started again on its own port when the window ends. Every applied event is
one line of `schedule.jsonl` (one write each), with its own stamp: the reports draw the windows
from what happened, not from what was planned.
"""

from __future__ import annotations

import os
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import orjson

from agentload.fleet.config import LIVE_FAULTS, ScheduledFault
from agentload.fleet.fleet import Fleet


class Schedule:
    def __init__(self, fleet: Fleet, faults: tuple[ScheduledFault, ...], path: Path,
                 log: Callable[[str], None]):
        self.fleet = fleet
        self.faults = faults
        self.path = path
        self.log = log
        self.done = threading.Event()
        self.thread: threading.Thread | None = None
        self.errors = 0

    def start(self, t0_ns: int) -> None:
        """Start the timeline at t0_ns (perf_counter_ns); returns at once."""
        if not self.faults:
            return
        self.thread = threading.Thread(target=self._run, args=(t0_ns,), name="agentload-schedule", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        """The run is over: apply no further event (windows still open get no "end" line)."""
        self.done.set()
        if self.thread is not None:
            self.thread.join(10.0)

    def _run(self, t0_ns: int) -> None:
        events: list[tuple[float, int, str]] = []
        for i, f in enumerate(self.faults):
            events.append((f.at_s, i, "start"))
            if f.for_s is not None:
                events.append((f.at_s + f.for_s, i, "end"))
        events.sort()
        for at_s, i, what in events:
            wait = t0_ns / 1e9 + at_s - time.perf_counter()
            if wait > 0 and self.done.wait(wait):
                return
            if self.done.is_set():
                return
            self._apply(i, what, at_s)

    def _apply(self, i: int, what: str, planned_s: float) -> None:
        f = self.faults[i]
        b = self.fleet.backend(f.backend)
        err = None
        try:
            if f.fault in LIVE_FAULTS:
                proc = b.proc
                if proc is None:
                    raise RuntimeError(f"backend {b.name} is not running")
                if what == "start":
                    # for_s goes along: the mock ends the fault by itself if this thread cannot
                    proc.set_fault(f.fault, for_s=f.for_s, slow_factor=f.slow_factor, error_status=f.error_status)
                else:
                    proc.set_fault("none")
            elif what == "start":
                b.stop(kill=f.fault == "kill")
            else:
                b.start(self.fleet.cfg.ready_timeout_s)
        except Exception as e:  # recorded, and the report says the fault may not have happened
            self.errors += 1
            err = f"{e.__class__.__name__}: {e}"[:300]
            self.log(f"agentload: schedule: {what} of {f.fault} on {b.name} failed: {err}")
            if os.environ.get("AGENTLOAD_DEBUG"):
                traceback.print_exc()
        line: dict[str, Any] = {"index": i, "event": what, "backend": b.name, "fault": f.fault,
                                "at_ns": time.perf_counter_ns(), "planned_s": planned_s, "ok": err is None,
                                "error": err}
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, orjson.dumps(line, option=orjson.OPT_APPEND_NEWLINE))
        finally:
            os.close(fd)
        if err is None:
            self.log(f"agentload: schedule: {f.fault} on {b.name} {'applied' if what == 'start' else 'ended'} "
                     f"at {planned_s:g} s")
