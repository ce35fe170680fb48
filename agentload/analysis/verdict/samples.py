"""What the rules read of the one-second samples (samples.jsonl): `SampleDigest`, one streamed walk,
and the thresholds on agentload's own event-loop lag and on a server queue that it counts against."""

from __future__ import annotations

from typing import Any, Iterable

# event-loop lag at which agentload's own timings stop meaning much (a 100,000-agent run on 2 shared
# cores lagged 100-350 ms in every sample, its timing error p99 217 ms: the client was the bottleneck)
SATURATION_LAG_MS = 100.0
SATURATED_SHARE = 0.5  # ... in at least this share of the samples
# ... or this much lag in that share, while the server's send stamps show agentload seeing first tokens
# late by TIMING_SATURATED_MS at p99 (the same 100,000 agents on a pool of 100: lag 50-183 ms in 61 of
# 72 samples, timing error p99 117 ms)
SATURATION_SOME_LAG_MS = 50.0
TIMING_SATURATED_MS = 50.0
SATURATED_MIN_SAMPLES = 2


# A server queue: in at least this share of the samples taken while requests waited for headers past
# stall.after_s, the server was answering others (a request past headers that was not stalled) or
# completing them (the completed count grew around that sample)
QUEUE_SERVED_SHARE = 0.8


class SampleDigest:
    """What the rules read of samples.jsonl, from one walk of it (the samples of a day-long run are
    86,400 lines: streamed, never held): how many, those whose pool state could be read, the most
    waiters, the largest event-loop lag and how many samples lagged past SATURATION_LAG_MS, the
    pool samples taken while requests were stalled (those with no waiter, the most waiters among
    them), those with more connections in use than requests using them, and the last sample's `stalled_by` that had any."""

    def __init__(self, samples: Iterable[dict[str, Any]]) -> None:
        self.n = self.pool = self.waiters_max = self.lagged = self.some_lag = 0
        self.stalled_pool = self.stalled_free = self.stalled_waiters_max = self.leaked = 0
        self.max_lag = 0.0
        self.last_stalled_by: dict[str, int] | None = None
        # the queue: samples taken while requests waited for headers past stall.after_s, how many of
        # those found requests past headers (answered by the server), the most past headers at any
        # sample and at those, the most waiting for headers at those, and the requests completed from
        # the first of those samples to the one after the last (the server got through its work)
        self.waits = self.waits_served = self.past_headers_max = self.waiting_max = 0
        self.past_at_waits_max = 0
        self.ok_first: int | None = None
        self.ok_after_last: int | None = None
        after_wait = False
        prev_ok: int | None = None
        for s in samples:
            self.n += 1
            inflight = s.get("inflight") or {}
            past = inflight.get("ttft", 0) + inflight.get("stream", 0)
            self.past_headers_max = max(self.past_headers_max, past)
            ok = (s.get("counts") or {}).get("ok")
            if after_wait and ok is not None:  # the sample after a wait (or a wait itself)
                self.ok_after_last = ok
            after_wait = False
            by = s.get("stalled_by") or {}
            waiting = sum(n for k, n in by.items() if k.endswith("/ttfb"))
            if waiting and inflight.get("ttfb", 0):
                self.waits += 1
                self.waiting_max = max(self.waiting_max, inflight.get("ttfb", 0))
                self.past_at_waits_max = max(self.past_at_waits_max, past)
                self.waits_served += past >= 1 or (ok is not None and prev_ok is not None and ok > prev_ok)
                if self.ok_first is None:
                    self.ok_first = ok
                if ok is not None:
                    self.ok_after_last = ok
                after_wait = True
            prev_ok = ok
            lag = s.get("loop_lag_ms", 0.0)
            self.max_lag = max(self.max_lag, lag)
            self.lagged += lag >= SATURATION_LAG_MS
            self.some_lag += lag >= SATURATION_SOME_LAG_MS
            if s.get("stalled_by"):
                self.last_stalled_by = s["stalled_by"]
            pool = s.get("pool") or {}
            if "waiters" not in pool:
                continue
            self.pool += 1
            w = pool["waiters"]
            self.waiters_max = max(self.waiters_max, w)
            if s.get("stalled"):
                self.stalled_pool += 1
                self.stalled_free += w == 0
                self.stalled_waiters_max = max(self.stalled_waiters_max, w)
            if w > 0 and pool.get("in_use", 0) > sum(k for ph, k in (s.get("inflight") or {}).items()
                                                    if ph != "pool_wait"):
                self.leaked += 1

    @property
    def completed_during_waits(self) -> int:
        """Requests completed from the first sample that saw requests wait for headers to the one
        after the last."""
        if self.ok_first is None or self.ok_after_last is None:
            return 0
        return max(0, self.ok_after_last - self.ok_first)

    @property
    def queue(self) -> bool:
        """Requests waited for headers past stall.after_s while the server answered others (requests
        past headers in most of those samples) and got through them (requests completed meanwhile):
        a queue in front of the server's slots, not a hang."""
        return (bool(self.waits) and self.waits_served >= QUEUE_SERVED_SHARE * self.waits
                and self.completed_during_waits > 0)
