"""Synthetic runs for the verdict's unit tests: records with stamps built from phase durations,
samples and run.json metadata, as a RunData that `diagnose` reads like one loaded from disk.

    run = RunBuilder(agents=4, rounds=3)
    run.ok(agent=0, rnd=1, ttfb_ms=5)                      # one completed request
    run.stalled(agent=1, rnd=2, phase="ttfb")              # given up after no progress in ttfb
    run.error(agent=2, rnd=2, error="http_500")
    diagnose(run.data())
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentload.records import RECORD_VERSION, Record
from agentload.records.rundir import RunData

MS = 1_000_000


class RunBuilder:
    def __init__(self, agents: int = 4, rounds: int = 3, limit: int = 100, after_s: float = 5.0,
                 path: Path = Path("/nonexistent-run")):
        self.records: list[Record] = []
        self.samples: list[dict[str, Any]] = []
        self.path = path
        self.meta: dict[str, Any] = {
            "run": "synthetic", "endpoint": "http://127.0.0.1:9/v1", "ended": True, "ended_normally": True,
            "cut_short": False, "t0_ns": 0,
            "scenario": {"agents": {"count": agents, "rounds": rounds},
                         "client": {"limit": limit, "keepalive_timeout": 15.0},
                         "stall": {"after_s": after_s, "give_up_s": 3 * after_s},
                         "conversation": {"mode": "scripted"}},
        }
        self.clock = 1_000 * MS

    def add(self, agent: int, rnd: int, *, outcome: str = "ok", pool_wait_ms: float = 0.0,
            connect_ms: float | None = None, ttfb_ms: float | None = 5.0, ttft_ms: float | None = 20.0,
            stream_ms: float | None = 10.0, error: str | None = None, error_msg: str | None = None,
            stalled_phase: str | None = None, reused: bool | None = True, prompt_tokens: int | None = None,
            call: int = 0, bad_events: int = 0, comments: int = 0, kind: str = "agent",
            finish_reason: str | None = "tool_calls", status: int | None = 200) -> Record:
        """One request whose phases last as given; a None phase (and every one after it) never happened."""
        t: dict[str, int] = {}
        now = self.clock
        t["start"] = now
        if pool_wait_ms:
            t["queued_start"] = now
            now += int(pool_wait_ms * MS)
            t["queued_end"] = now
        if connect_ms is not None:
            t["conn_start"] = now
            now += int(connect_ms * MS)
            t["conn_end"] = now
            reused = False
        for key, dur in (("sent", 0.1), ("headers", ttfb_ms), ("first_token", ttft_ms), ("end", stream_ms)):
            if dur is None:
                break
            now += int(dur * MS)
            t[key] = now
        t.setdefault("end", now + MS)
        self.clock = t["end"] + MS
        extra = {"bad_events": bad_events} if "bad_events" in Record.__dataclass_fields__ else {}
        rec = Record(v=RECORD_VERSION, run="synthetic", kind=kind, agent=agent, round=rnd, call=call,
                     request_id=f"synthetic-a{agent}-r{rnd}-c{call}", messages=2 * rnd, prompt_bytes=400 * rnd,
                     prompt_tokens=prompt_tokens if prompt_tokens is not None else 100 * rnd,
                     server_prompt_tokens=None, output_tokens=7, status=status, outcome=outcome, error=error,
                     error_msg=error_msg, stalled_phase=stalled_phase, reused=reused, finish_reason=finish_reason,
                     tool_calls=1 if outcome == "ok" else 0, chunks=5, token_chunks=4 if "first_token" in t else 0,
                     comments=comments, max_gap_ns=0, max_gap_at=0, t=t, **extra)
        self.records.append(rec)
        return rec

    def ok(self, agent: int, rnd: int, **kw) -> Record:
        return self.add(agent, rnd, **kw)

    def stalled(self, agent: int, rnd: int, phase: str = "ttfb", **kw) -> Record:
        """Given up: no progress in `phase` for give_up_s."""
        cut = {"ttfb": dict(ttfb_ms=None), "ttft": dict(ttft_ms=None), "stream": dict(stream_ms=None),
               "pool_wait": dict(pool_wait_ms=15_000, ttfb_ms=None)}[phase]
        return self.add(agent, rnd, outcome="stalled", stalled_phase=phase, error="stall_give_up",
                        error_msg=f"no progress in {phase}", status=None, **{**cut, **kw})

    def error(self, agent: int, rnd: int, error: str = "http_500", **kw) -> Record:
        kw.setdefault("error_msg", f"{error} happened")
        if error.startswith("http_"):
            kw.setdefault("status", int(error[5:]))
            kw.setdefault("ttft_ms", None)
        return self.add(agent, rnd, outcome="error", error=error, finish_reason=None, **kw)

    def agents_done(self, agents: range, rounds: range, **kw) -> None:
        for rnd in rounds:
            for a in agents:
                self.ok(a, rnd, **kw)

    def sample(self, **kw) -> dict[str, Any]:
        s = {"t": self.clock, "pool": {"in_use": 0, "idle": 0, "waiters": 0, "limit": 100}, "inflight": {},
             "stalled": 0, "stalled_by": {}, "loop_lag_ms": 1.0}
        s.update(kw)
        self.samples.append(s)
        return s

    def data(self) -> RunData:
        return RunData.from_records(self.path, self.meta, self.records, self.samples)
