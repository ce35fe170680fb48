"""The live fault (POST /mock/fault): the one fault in force, and the engine clock a hang stops.

`running` is cleared while a "hang" lasts: every write waits for it. When the hang ends its length
is added to `paused_s` before the waiters wake, so `pace` moves each request's schedule by it: the
engine was stopped, and resumes where it stood. "slow" is the factor in `slow`; "errors" and
"drop" are read by the handler as it goes (`fault`, `error_status`).
"""

from __future__ import annotations

import asyncio
from typing import Any

from agentload.mock.config import LiveFault


class LiveFaults:
    def __init__(self) -> None:
        self.fault: str | None = None
        self.slow = 1.0  # the factor in force: 1 unless "slow" is live
        self.error_status = 503
        self.running = asyncio.Event()  # cleared while "hang" is live; every write waits for it
        self.running.set()
        self.paused_s = 0.0  # seconds hung in all hangs that have ended
        self._paused_at: float | None = None  # loop time the current hang began
        self._since: float | None = None
        self._until: float | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._applied = 0

    def set(self, spec: LiveFault) -> None:
        """Replace the live fault; "none" clears it. A `for_s` ends it on the loop clock."""
        loop = asyncio.get_running_loop()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        name = None if spec.fault == "none" else spec.fault
        self._apply(name, spec.slow_factor, int(spec.error_status), loop.time())
        self._applied += 1
        if name is not None and spec.for_s is not None:
            self._until = loop.time() + spec.for_s
            self._timer = loop.call_later(spec.for_s, self._expire)

    def cancel_timer(self) -> None:
        """At shutdown: the loop may close before the timer fires."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self) -> None:
        self._timer = None
        self._apply(None, 1.0, self.error_status, asyncio.get_running_loop().time())

    def _apply(self, name: str | None, slow_factor: float, error_status: int, now: float) -> None:
        if name == "hang":
            if self._paused_at is None:
                self._paused_at = now
                self.running.clear()
        elif self._paused_at is not None:
            # first the hang's length, then the wake-up: waiters read it to shift their schedules
            self.paused_s += now - self._paused_at
            self._paused_at = None
            self.running.set()
        self.fault = name
        self.slow = slow_factor if name == "slow" else 1.0
        self.error_status = error_status
        self._since = now
        self._until = None

    def state(self) -> dict[str, Any]:
        """What GET /mock/fault answers."""
        now = asyncio.get_running_loop().time()
        since, until = self._since, self._until
        return {"fault": self.fault,
                "since_s_ago": None if since is None else round(now - since, 3),
                "remaining_s": None if until is None else round(max(0.0, until - now), 3),
                "applied": self._applied}

    async def until_running(self) -> None:
        """Wait while a hang lasts (no polling; a client disconnect cancels it)."""
        while not self.running.is_set():
            await self.running.wait()

    async def pace(self, t: float, base: float) -> tuple[float, float]:
        """Wait until loop time `t` and while hung. A hang that passes meanwhile moves `t` by
        its length: the engine was stopped, so its schedule resumes where it stood. `base` is
        `paused_s` as of the schedule `t` was computed in; returns both, brought up to date."""
        loop = asyncio.get_running_loop()
        running = self.running
        while True:
            if not running.is_set():
                await running.wait()  # no polling; a client disconnect cancels it
            if self.paused_s != base:
                t += self.paused_s - base
                base = self.paused_s
            delay = t - loop.time()
            if delay <= 0:
                return t, base
            await asyncio.sleep(delay)
