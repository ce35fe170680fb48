"""The mock's counters, served at GET /mock/stats and zeroed by POST /mock/reset, so tests can
assert on what the server really did."""

from __future__ import annotations

import asyncio
import collections
from typing import Any


class Stats:
    """What the server did since it started or was last reset."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.requests_total = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.queued = 0
        self.max_queued = 0
        self.completed = 0
        self.by_status: collections.Counter[int] = collections.Counter()
        self.hung = 0
        self.hangs_given_up = 0
        self.stalled = 0
        self.pings = 0
        self.dropped = 0
        self.errors_injected = 0
        self.client_gone = 0
        self.protocol_violations = 0
        self.last_request_ids: collections.deque[str] = collections.deque(maxlen=100)
        self.rounds_seen: collections.Counter[int] = collections.Counter()
        self.max_prompt_tokens = 0
        self.request_log_errors = 0

    def snapshot(self) -> dict[str, Any]:
        return {
            "requests_total": self.requests_total,
            "in_flight": self.in_flight,
            "max_in_flight": self.max_in_flight,
            "queued": self.queued,
            "max_queued": self.max_queued,
            "completed": self.completed,
            "by_status": {str(k): v for k, v in sorted(self.by_status.items())},
            "hung": self.hung,
            "hangs_given_up": self.hangs_given_up,
            "stalled": self.stalled,
            "pings": self.pings,
            "dropped": self.dropped,
            "errors_injected": self.errors_injected,
            "client_gone": self.client_gone,
            "protocol_violations": self.protocol_violations,
            "last_request_ids": list(self.last_request_ids),
            "rounds_seen": {str(k): v for k, v in sorted(self.rounds_seen.items())},
            "max_prompt_tokens": self.max_prompt_tokens,
            "request_log_errors": self.request_log_errors,
            # lets tests check that hung/cancelled requests leave no task behind
            "tasks": len(asyncio.all_tasks()),
        }
