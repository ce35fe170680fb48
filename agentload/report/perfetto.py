"""`agentload export RUN_DIR --format perfetto`: the run as Chrome trace-event JSON.

Opens in https://ui.perfetto.dev (Open trace file) or chrome://tracing. Layout:

- process 1 "agents": one thread (track) per agent, tid = agent number. On it, a slice per
  request ("round N", the whole request) with its phases nested inside (pool_wait, connect,
  send, ttfb, ttft, stream), and `tool` / `retry_wait` slices between requests.
- process 2 "canaries": one track with the canary requests, drawn the same way.
- counters on process 1 from samples.jsonl: requests in flight by phase, the client pool.

Every slice is a complete event (`"ph": "X"`) with `ts` and `dur` in microseconds since the
run's `t0_ns`, `pid`, `tid`, and the request id, round and outcome in `args`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from agentload.records.rundir import RunData, load_run
from agentload.report.timeline import build_lanes, request_segments

AGENTS_PID = 1
CANARY_PID = 2
CANARY_TID = 1


def _us(ns: int, t0: int) -> float:
    return round((ns - t0) / 1000.0, 3)


def build_trace(data: RunData) -> dict[str, Any]:
    """The trace of every request (one pass over the records; the trace itself holds them all)."""
    lanes, run_end = build_lanes(data)
    t0 = int(data.meta.get("t0_ns") or min((r.t.get("start", 0) for ln in lanes for r in ln.records), default=0))
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": AGENTS_PID, "tid": 0, "args": {"name": "agents"}},
        {"name": "process_sort_index", "ph": "M", "pid": AGENTS_PID, "tid": 0, "args": {"sort_index": 1}},
    ]
    if any(ln.key < 0 for ln in lanes):
        events += [
            {"name": "process_name", "ph": "M", "pid": CANARY_PID, "tid": 0, "args": {"name": "canaries"}},
            {"name": "process_sort_index", "ph": "M", "pid": CANARY_PID, "tid": 0, "args": {"sort_index": 0}},
            {"name": "thread_name", "ph": "M", "pid": CANARY_PID, "tid": CANARY_TID, "args": {"name": "canary"}},
        ]
    slices: list[dict[str, Any]] = []
    for ln in lanes:
        pid, tid = (CANARY_PID, CANARY_TID) if ln.key < 0 else (AGENTS_PID, ln.key)
        if ln.key >= 0:
            events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                           "args": {"name": f"agent {ln.key}"}})
            events.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid,
                           "args": {"sort_index": ln.key}})
        for rec in ln.records:
            segs = request_segments(rec.t)
            if not segs or "start" not in rec.t:
                continue
            begin = rec.t["start"]
            end = max(rec.t.get("end") or segs[-1][2], segs[-1][2])
            args = {"request_id": rec.request_id, "round": rec.round, "call": rec.call, "outcome": rec.outcome,
                    "prompt_tokens": rec.prompt_tokens, "messages": rec.messages,
                    "reused_connection": rec.reused}
            if rec.status is not None:
                args["status"] = rec.status
            if rec.error:
                args["error"] = rec.error
                args["error_msg"] = rec.error_msg
            if rec.stalled_phase:
                args["stalled_phase"] = rec.stalled_phase
            name = f"round {rec.round}" + (f" (retry {rec.call})" if rec.call else "")
            if rec.outcome != "ok":
                name += f" [{rec.stalled_phase + ' stall' if rec.outcome == 'stalled' and rec.stalled_phase else rec.outcome}]"
            slices.append({"name": name, "cat": "request", "ph": "X", "pid": pid, "tid": tid,
                           "ts": _us(begin, t0), "dur": _us(end, begin), "args": args})
            for kind, b, e in segs:
                if e <= b:
                    continue
                phase_args = {"request_id": rec.request_id, "round": rec.round, "outcome": rec.outcome}
                label = kind
                if rec.stalled_phase == kind:
                    label += " (stalled)"
                    phase_args["stalled"] = True
                slices.append({"name": label, "cat": "phase", "ph": "X", "pid": pid, "tid": tid,
                               "ts": _us(b, t0), "dur": _us(e, b), "args": phase_args})
        for kind, b, e in ln.gaps:
            if e > b:
                slices.append({"name": kind, "cat": "gap", "ph": "X", "pid": pid, "tid": tid,
                               "ts": _us(b, t0), "dur": _us(e, b), "args": {"agent": ln.key}})
    # Parents before children at equal timestamps, so every viewer nests them the same way.
    slices.sort(key=lambda ev: (ev["pid"], ev["tid"], ev["ts"], -ev["dur"]))
    events += slices
    for s in data.samples:
        if not isinstance(s.get("t"), int):
            continue
        ts = _us(s["t"], t0)
        inflight = {k: int(v) for k, v in sorted((s.get("inflight") or {}).items())}
        inflight["stalled"] = int(s.get("stalled", 0))
        events.append({"name": "in flight", "ph": "C", "pid": AGENTS_PID, "tid": 0, "ts": ts, "args": inflight})
        pool = s.get("pool") or {}
        events.append({"name": "client pool", "ph": "C", "pid": AGENTS_PID, "tid": 0, "ts": ts,
                       "args": {k: int(pool.get(k, 0)) for k in ("in_use", "idle", "waiters")}})
    m = data.meta
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "metadata": {"agentload_run": m.get("run"), "scenario": (m.get("scenario") or {}).get("source"),
                     "endpoint": m.get("endpoint"), "t0_unix": m.get("t0_unix"),
                     "ended": bool(m.get("ended")), "duration_us": _us(run_end, t0),
                     "client": m.get("client") or (m.get("scenario") or {}).get("client")},
    }


def export_perfetto(run_dir: Path, out: Path | None = None) -> tuple[Path, int]:
    """Write the trace; return its path and the number of slices in it."""
    data = load_run(Path(run_dir))
    trace = build_trace(data)
    path = Path(out) if out else Path(run_dir) / "trace.perfetto.json"
    path.write_bytes(orjson.dumps(trace))
    return path, sum(1 for ev in trace["traceEvents"] if ev["ph"] == "X")
