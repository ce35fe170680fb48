"""Synthetic runs for the verdict's unit tests: records with stamps built from phase durations,
samples and run.json metadata, as a RunData that `diagnose` reads like one loaded from disk.

    run = RunBuilder(agents=4, rounds=3)
    run.ok(agent=0, rnd=1, ttfb_ms=5)                      # one completed request
    run.stalled(agent=1, rnd=2, phase="ttfb")              # given up after no progress in ttfb
    run.error(agent=2, rnd=2, error="http_500")
    diagnose(run.data())

A router soak run (a fleet of backends behind a router; see agentload.analysis.router):

    run = RunBuilder(agents=2, rounds=3).fleet(3)                    # b0, b1, b2 behind smg
    run.fault(0, "b2", "hang", at_s=60, for_s=30)                   # planned in run.json ...
    run.applied(0, start_s=60.0, end_s=90.0)                         # ... and schedule.jsonl's lines
    rec = run.ok(0, 1, backend="b1", cached_tokens=80, at_ms=61_000) # a record naming its backend
    run.log("b1", rec)                                               # its line in fleet/b1.requests.jsonl
    data = run.write(tmp_path)                                       # the folder on disk, loaded back
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from agentload.records import RECORD_VERSION, Record
from agentload.records.rundir import RunData, load_run

MS = 1_000_000
S = 1_000_000_000


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
        self.logs: dict[str, list[dict[str, Any]]] = {}  # backend -> fleet/<name>.requests.jsonl lines
        self.schedule: list[dict[str, Any]] | None = None  # schedule.jsonl lines (None: no file)
        self.scrapes: list[dict[str, Any]] = []  # target_metrics.jsonl lines

    def add(self, agent: int, rnd: int, *, outcome: str = "ok", pool_wait_ms: float = 0.0,
            connect_ms: float | None = None, ttfb_ms: float | None = 5.0, ttft_ms: float | None = 20.0,
            stream_ms: float | None = 10.0, error: str | None = None, error_msg: str | None = None,
            stalled_phase: str | None = None, reused: bool | None = True, prompt_tokens: int | None = None,
            call: int = 0, bad_events: int = 0, comments: int = 0, kind: str = "agent",
            finish_reason: str | None = "tool_calls", status: int | None = 200, backend: str | None = None,
            cached_tokens: int | None = None, conversation: int = 0, id_sent: str | None = None,
            at_ms: float | None = None, held_ms: float | None = None, idle_ms: float | None = None,
            tool_calls: int | None = None, proxied: bool = False, token_chunks: int | None = None,
            token_reads: int = 0, server: str | None = None, max_gap_ms: float = 0.0,
            sent_ms: float = 0.1, protocol: list[str] | None = None,
            tool_call_problems: list[str] | None = None, traceparent: str | None = None,
            retry_after_s: float | None = None) -> Record:
        """One request whose phases last as given; a None phase (and every one after it) never happened.
        `at_ms`: its start (ms on the records' clock, t0 = 0), else right after the previous one.
        `held_ms`: a request that did not complete ends this long after its last stamp (a hang: the
        time it held its connection with no progress), else 1 ms after it. `proxied`: a request of
        `agentload proxy` (the harness's leg: `down_start` 0.1 ms before `start`, `down_end` at `end`).
        `token_chunks` (4 by default when a token came), `token_reads`, `server` (its Server header),
        `max_gap_ms` (its largest gap, ending at its end); `sent_ms`: the send's duration."""
        t: dict[str, int] = {}
        now = self.clock if at_ms is None else int(at_ms * MS)
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
        for key, dur in (("sent", sent_ms), ("headers", ttfb_ms), ("first_token", ttft_ms), ("end", stream_ms)):
            if dur is None:
                break
            now += int(dur * MS)
            t[key] = now
        t.setdefault("end", now + (int(held_ms * MS) if held_ms is not None else MS))
        self.clock = max(self.clock, t["end"] + MS)
        if proxied:
            t["down_start"] = t["start"] - MS // 10
            t["down_end"] = t["end"]
        extra = {"bad_events": bad_events} if "bad_events" in Record.__dataclass_fields__ else {}
        if backend is not None or cached_tokens is not None or conversation or id_sent is not None:
            extra.update(backend=backend, cached_tokens=cached_tokens, conversation=conversation, id_sent=id_sent)
        if traceparent is not None:
            extra["traceparent"] = traceparent
        if idle_ms is not None:  # a reused connection's idle time in the pool
            extra["idle_ns"] = int(idle_ms * MS)
        if token_reads or server is not None:
            extra.update(token_reads=token_reads, server=server)
        if token_chunks is None:
            token_chunks = 4 if "first_token" in t else 0
        if protocol is not None or tool_call_problems is not None:
            extra.update(protocol=protocol, tool_call_problems=tool_call_problems)
        if retry_after_s is not None:
            extra["retry_after_s"] = retry_after_s
        rec = Record(v=RECORD_VERSION, run="synthetic", kind=kind, agent=agent, round=rnd, call=call,
                     request_id=f"synthetic-a{agent}-k{conversation}-r{rnd}-c{call}" if conversation else
                     f"synthetic-a{agent}-r{rnd}-c{call}", messages=2 * rnd, prompt_bytes=400 * rnd,
                     prompt_tokens=prompt_tokens if prompt_tokens is not None else 100 * rnd,
                     server_prompt_tokens=None, output_tokens=7, status=status, outcome=outcome, error=error,
                     error_msg=error_msg, stalled_phase=stalled_phase, reused=reused, finish_reason=finish_reason,
                     tool_calls=(1 if outcome == "ok" else 0) if tool_calls is None else tool_calls,
                     chunks=token_chunks + 1, token_chunks=token_chunks, comments=comments,
                     max_gap_ns=int(max_gap_ms * MS), max_gap_at=t["end"] if max_gap_ms else 0, t=t, **extra)
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

    # ---- a router soak run: run.json's fleet, schedule.jsonl, fleet/<name>.requests.jsonl, scrapes

    def fleet(self, n: int = 3, mode: str = "plain", roles: list[str] | None = None, router: str = "smg",
              policy: str | None = "cache_aware", logs: bool = True) -> "RunBuilder":
        """run.json's `fleet`: backends b0..b<n-1> (roles: every one a worker, or as given) behind a router."""
        roles = roles or ["worker"] * n
        self.meta["fleet"] = {
            "mode": mode,
            "backends": [{"index": i, "name": f"b{i}", "role": roles[i], "url": f"http://127.0.0.1:{8100 + i}",
                          "request_log": f"fleet/b{i}.requests.jsonl" if logs else None} for i in range(n)],
            "router": {"kind": router, "policy": policy, "endpoint": "http://127.0.0.1:30000/v1",
                       "metrics_url": "http://127.0.0.1:29000/metrics"},
            "schedule": [],
        }
        if logs:
            for i in range(n):
                self.logs.setdefault(f"b{i}", [])
        return self

    def fault(self, index: int, backend: str, fault: str, at_s: float, for_s: float | None) -> None:
        """A fault planned in run.json's schedule."""
        self.meta["fleet"]["schedule"].append({"index": index, "at_s": at_s, "backend": backend, "fault": fault,
                                               "for_s": for_s})

    def applied(self, index: int, start_s: float | None, end_s: float | None = None, ok: bool = True,
                error: str | None = None) -> None:
        """schedule.jsonl's start (and end) line of a planned fault, at these times since t0."""
        p = next(x for x in self.meta["fleet"]["schedule"] if x["index"] == index)
        self.schedule = self.schedule if self.schedule is not None else []
        t0 = self.meta["t0_ns"]
        if start_s is not None:
            self.schedule.append({"index": index, "event": "start", "backend": p["backend"], "fault": p["fault"],
                                  "at_ns": t0 + int(start_s * S), "planned_s": p["at_s"], "ok": ok, "error": error})
        if end_s is not None:
            self.schedule.append({"index": index, "event": "end", "backend": p["backend"], "fault": p["fault"],
                                  "at_ns": t0 + int(end_s * S), "planned_s": p["at_s"], "ok": True, "error": None})

    def log(self, backend: str, rec: Record | None = None, *, id: str | None = None, recv_ms: float | None = None,
            outcome: str | None = None, fault: str | None = None, cached_tokens: int | None = None,
            traceparent: str | None = None) -> dict:
        """A line of fleet/<backend>.requests.jsonl: for a record (its id_sent, else its request_id;
        received when it was sent), or for an id alone at `recv_ms`."""
        if rec is not None:
            id = id or rec.id_sent or rec.request_id
            recv = rec.t.get("sent", rec.t["start"]) if recv_ms is None else int(recv_ms * MS)
            end = rec.t.get("end", recv)
            outcome = outcome or ("ok" if rec.outcome == "ok" else "error")
            rnd, prompt = rec.round, rec.prompt_tokens
        else:
            recv = int((recv_ms or 0) * MS)
            end, rnd, prompt = recv + 5 * MS, 1, 100
            outcome = outcome or "ok"
        line = {"id": id, "backend": backend, "recv_ns": recv, "end_ns": end, "round": rnd, "prompt_tokens": prompt,
                "cached_tokens": cached_tokens, "status": 200 if outcome == "ok" else None, "outcome": outcome,
                "fault": fault, "stream": True}
        if traceparent is not None:
            line["traceparent"] = traceparent
        self.logs.setdefault(backend, []).append(line)
        return line

    def scrape(self, at_s: float, values: dict[str, float], url: str = "http://127.0.0.1:29000/metrics") -> None:
        """A full scrape of the router's /metrics at `at_s` since t0 ({series key: value})."""
        t = self.meta["t0_ns"] + int(at_s * S)
        self.scrapes.append({"t": t, "t_start": t - 1000, "url": url, "ms": 1.0, "full": True, "v": values})

    def write(self, path: Path) -> RunData:
        """The run as a folder on disk (run.json, records.jsonl, samples.jsonl, schedule.jsonl,
        fleet/<name>.requests.jsonl, target_metrics.jsonl), loaded back as `agentload report` reads it."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.path = path
        meta = dict(self.meta)
        meta.setdefault("t0_unix", 0.0)

        def jsonl(lines) -> bytes:
            return b"".join(orjson.dumps(x) + b"\n" for x in lines)

        (path / "run.json").write_bytes(orjson.dumps(meta))
        (path / "records.jsonl").write_bytes(b"".join(r.to_json() + b"\n" for r in self.records))
        if self.samples:
            (path / "samples.jsonl").write_bytes(jsonl(self.samples))
        if self.schedule is not None:
            (path / "schedule.jsonl").write_bytes(jsonl(self.schedule))
        for name, lines in self.logs.items():
            (path / "fleet").mkdir(exist_ok=True)
            (path / "fleet" / f"{name}.requests.jsonl").write_bytes(jsonl(lines))
        if self.scrapes:
            (path / "target_metrics.jsonl").write_bytes(jsonl(self.scrapes))
        return load_run(path)
