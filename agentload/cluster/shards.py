"""Shards of one run, and bringing their records onto one clock.

A shard is the one-process run path (`runner.InProcess` over `executor.part_of`) over the agents
i with i % N == I. Every stamp a shard writes is its host's `perf_counter_ns` (CLOCK_MONOTONIC):
exact for the phases of a request (one host, one clock), but another host's monotonic clock has
another zero. To draw all shards on one timeline the driver moves each shard's stamps by the
shard's offset:

- by round trips (`ClockSample`s, `--ray`): the driver reads its clock, asks the shard for its
  clock, reads its clock again; offset = shard - midpoint, uncertainty = half the round trip; of
  several samples the one with the smallest round trip is kept (NTP's rule);
- by wall-clock anchors (`--shard I/N` runs merged later): each run.json has (t0_ns, t0_unix) taken
  together; offset = t0_ns - t0_unix of the shard minus that of the base, as good as the hosts'
  wall clocks agree (NTP grade: milliseconds), which the merged run.json says.

Durations (phases) never change: a shift adds the same number to every stamp of a record.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import orjson

from agentload.errors import UserError

SHARD_FILES = ("records", "samples")


@dataclass(frozen=True)
class ClockSample:
    before_ns: int  # driver clock, before asking
    shard_ns: int  # the shard's clock, as it answered
    after_ns: int  # driver clock, after the answer

    @property
    def rtt_ns(self) -> int:
        return self.after_ns - self.before_ns

    @property
    def offset_ns(self) -> int:
        """shard clock - driver clock at the same moment (best guess: the midpoint)."""
        return self.shard_ns - (self.before_ns + self.after_ns) // 2


@dataclass(frozen=True)
class ClockOffset:
    offset_ns: int  # add -offset_ns to a shard stamp to get the driver's clock
    uncertainty_ns: int  # +/- this
    method: str  # "round-trip" | "wall-clock"

    def to_json(self) -> dict[str, Any]:
        return {"offset_ns": self.offset_ns, "uncertainty_ns": self.uncertainty_ns, "method": self.method,
                "uncertainty": fmt_uncertainty(self.uncertainty_ns)}


def estimate_offset(ask: Callable[[], int], samples: int = 7) -> ClockOffset:
    """Offset of a remote clock by round trips: `ask()` returns the remote perf_counter_ns."""
    best: ClockSample | None = None
    for _ in range(samples):
        before = time.perf_counter_ns()
        remote = ask()
        s = ClockSample(before, remote, time.perf_counter_ns())
        if best is None or s.rtt_ns < best.rtt_ns:
            best = s
    assert best is not None
    return ClockOffset(best.offset_ns, (best.rtt_ns + 1) // 2, "round-trip")


def wall_offset(meta: dict[str, Any], base: dict[str, Any]) -> ClockOffset:
    """Offset of a run's monotonic clock against `base`'s, from their (t0_ns, t0_unix) anchors."""
    mine = int(meta["t0_ns"]) - round(float(meta["t0_unix"]) * 1e9)
    theirs = int(base["t0_ns"]) - round(float(base["t0_unix"]) * 1e9)
    # the anchors are two clock reads a few us apart, and time.time() is NTP-disciplined: the
    # hosts' wall clocks decide, typically within a few ms of each other on a LAN
    return ClockOffset(mine - theirs, WALL_CLOCK_UNCERTAINTY_NS, "wall-clock")


WALL_CLOCK_UNCERTAINTY_NS = 5_000_000  # what NTP on one LAN typically holds; stated, not measured


def fmt_uncertainty(ns: int) -> str:
    if ns < 1_000_000:
        return f"+/- {ns / 1e3:.0f} us" if ns >= 1000 else f"+/- {ns} ns"
    return f"+/- {ns / 1e6:.1f} ms"


# ---------------------------------------------------------------- moving stamps


def shift_record(d: dict[str, Any], delta_ns: int, shard: int) -> dict[str, Any]:
    """A record (as a dict) with every stamp moved by delta_ns and its shard set."""
    t = d.get("t")
    if isinstance(t, dict):
        d["t"] = {k: v + delta_ns for k, v in t.items()}
    for key in ("server_first_token_ns", "max_gap_at"):
        v = d.get(key)
        if isinstance(v, int) and v:
            d[key] = v + delta_ns
    d["shard"] = shard
    return d


def shift_sample(d: dict[str, Any], delta_ns: int, shard: int) -> dict[str, Any]:
    if isinstance(d.get("t"), int):
        d["t"] += delta_ns
    d["shard"] = shard
    return d


def shift_lines(data: bytes, shift: Callable[[dict[str, Any], int, int], dict[str, Any]], delta_ns: int,
                shard: int, run_id: str | None = None) -> tuple[bytes, int]:
    """Whole JSONL lines moved onto the driver's clock; a torn line is kept as it is (the reader
    counts it). Returns (bytes, lines)."""
    out = []
    n = 0
    for line in data.splitlines():
        if not line.strip():
            continue
        n += 1
        try:
            d = orjson.loads(line)
        except orjson.JSONDecodeError:
            out.append(line + b"\n")
            continue
        if isinstance(d, dict):
            d = shift(d, delta_ns, shard)
            if run_id is not None and "run" in d:
                d["run"] = run_id
        out.append(orjson.dumps(d, option=orjson.OPT_APPEND_NEWLINE))
    return b"".join(out), n


class FileTail:
    """Reads a growing JSONL file by whole lines: `read()` returns what was added since."""

    def __init__(self, path: Path, limit: int = 8 << 20):
        self.path = path
        self.offset = 0
        self.limit = limit  # bounded per call: a far-behind reader catches up over several calls

    def read(self) -> bytes:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read(self.limit)
        except FileNotFoundError:
            return b""
        end = data.rfind(b"\n")
        if end < 0:
            return b""
        self.offset += end + 1
        return data[: end + 1]

    def rest(self) -> bytes:
        """Everything left, a torn last line included (the shard is over)."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return b""
        self.offset += len(data)
        return data


def append(path: Path, data: bytes) -> None:
    if not data:
        return
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


# ---------------------------------------------------------------- the parts of one run


def split(agents: int, workers: int) -> list[list[int]]:
    """The deterministic split: worker w gets the agents i with i % workers == w."""
    return [list(range(w, agents, workers)) for w in range(workers)]


def last_line(path: Path) -> dict[str, Any] | None:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 65536))
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            d = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(d, dict):
            return d
    return None


def live_line(run_dir: Path, n: int, elapsed_s: float) -> str:
    """One plain line from the workers' latest samples (the single-process live view needs the
    in-process run state, which the parent does not have)."""
    counts: dict[str, int] = {}
    inflight: dict[str, int] = {}
    stalled = 0
    lag = 0.0
    seen = 0
    for w in range(n):
        s = last_line(run_dir / f"samples-w{w}.jsonl")
        if s is None:
            continue
        seen += 1
        for k, v in (s.get("counts") or {}).items():
            counts[k] = counts.get(k, 0) + int(v or 0)
        for k, v in (s.get("inflight") or {}).items():
            inflight[k] = inflight.get(k, 0) + int(v or 0)
        stalled += int(s.get("stalled") or 0)
        lag = max(lag, float(s.get("loop_lag_ms") or 0.0))
    fl = ", ".join(f"{k} {v}" for k, v in inflight.items()) or "none"
    return (f"agentload: {elapsed_s:5.0f}s  {seen}/{n} workers  requests {counts.get('requests', 0)}  "
            f"ok {counts.get('ok', 0)}  errors {counts.get('error', 0)}  stalled {counts.get('stalled', 0) + stalled}  "
            f"in flight: {fl}  loop lag max {lag:.0f} ms")


def merge_meta(meta: dict[str, Any], metas: list[dict[str, Any] | None], codes: list[int | None],
               interrupted: bool) -> dict[str, Any]:
    """run.json of the whole run from the workers' run-wI.json."""
    got = [m for m in metas if m is not None]
    reasons = []
    for w, (m, code) in enumerate(zip(metas, codes)):
        if m is None or not m.get("ended"):
            reasons.append(f"worker {w} did not end its run (exit status {code})")
        elif code not in (0, None):
            reasons.append(f"worker {w} exited with status {code}")
    stop = next((m.get("stop_reason") for m in got if m.get("stop_reason") not in (None, "all agents finished")),
                None) or (got[0].get("stop_reason") if got else None)
    crashes: list[dict[str, Any]] = []
    crash_count = 0
    for w, (m, code) in enumerate(zip(metas, codes)):
        for c in (m or {}).get("crashes") or []:
            crashes.append({**c, "worker": w})
        crash_count += int((m or {}).get("crash_count") or len((m or {}).get("crashes") or []))
        if code is not None and code > 0:  # an exception ended the process (a signal's kill is negative)
            crash_count += 1
            crashes.append({"where": "worker", "agent": None, "round": None, "error": "WorkerExit",
                            "message": f"worker {w} exited with status {code}"
                                       + ("" if m is not None and m.get("ended") else " before its run ended"),
                            "traceback": "", "worker": w})
    by = [m.get("ended_by") for m in got]
    if any(c["where"] == "worker" for c in crashes) or "crashed" in by:
        ended_by = "crashed"
    elif interrupted or reasons or "interrupted" in by:
        ended_by = "interrupted"
    elif "duration" in by:
        ended_by = "duration"
    else:
        ended_by = "finished"
    meta.update({
        "ended": True,
        "ended_normally": not interrupted and not reasons and all(m.get("ended_normally") for m in got),
        "cut_short": interrupted or bool(reasons) or any(m.get("cut_short") for m in got),
        "ended_by": ended_by,
        "crashes": crashes,
        "crash_count": crash_count,
        "stop_reason": "; ".join(reasons + ([stop] if stop else [])) or None,
        "t_end_ns": max([m.get("t_end_ns") or 0 for m in got] or [0]) or None,
        "t_end_unix": max([m.get("t_end_unix") or 0 for m in got] or [0]) or None,
        "records": sum(m.get("records") or 0 for m in got),
        # (only when every worker said: a worker that left no run-wI.json started an unknown number)
        **{k: sum(m[k] for m in got) for k in ("agents_asked", "agents_started", "agents_due_unstarted")
           if len(got) == len(metas) and all(type(m.get(k)) is int for m in got)},
        "max_loop_lag_ms": max([m.get("max_loop_lag_ms") or 0.0 for m in got] or [0.0]),
        "workers": len(metas),
        "worker_runs": [{"worker": w, "pid": (m or {}).get("pid"), "exit": code, "records": (m or {}).get("records"),
                         "max_loop_lag_ms": (m or {}).get("max_loop_lag_ms"), "stop_reason": (m or {}).get("stop_reason")}
                        for w, (m, code) in enumerate(zip(metas, codes))],
    })
    for key in ("intervals", "target_metrics", "server_props"):  # (server_props: worker 0 asks)
        for m in got:
            if key in m and key not in meta:
                meta[key] = m[key]
    return meta


class Interrupts:
    """SIGINT/SIGTERM while a driver waits for its parts: counted, and each passed on with
    `forward(signum, count)` (a part stops as a one-process run does; a second signal stops it
    now). The handlers are installed only when asked, and the old ones come back on exit."""

    def __init__(self, forward: Callable[[int, int], None], install: bool):
        self.forward = forward
        self.install = install
        self.count = 0
        self.old: dict[int, Any] = {}

    def on_signal(self, signum: int, frame: Any) -> None:
        self.count += 1
        self.forward(signum, self.count)

    def __enter__(self) -> Interrupts:
        if self.install:
            for sig in (signal.SIGINT, signal.SIGTERM):
                self.old[sig] = signal.signal(sig, self.on_signal)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, h in self.old.items():
            signal.signal(sig, h)


def read_part_metas(run_dir: Path, n: int) -> list[dict[str, Any] | None]:
    """Each part's run-wI.json (None: the part left none, or a torn one)."""
    metas: list[dict[str, Any] | None] = []
    for w in range(n):
        try:
            metas.append(orjson.loads((run_dir / f"run-w{w}.json").read_bytes()))
        except (OSError, orjson.JSONDecodeError):
            metas.append(None)
    return metas


# ---------------------------------------------------------------- agentload merge


def _read_meta(d: Path) -> dict[str, Any]:
    try:
        meta = orjson.loads((d / "run.json").read_bytes())
    except FileNotFoundError:
        raise UserError(f"{d}: not a run folder (no run.json)") from None
    except orjson.JSONDecodeError as e:
        raise UserError(f"{d}/run.json: expected JSON ({e})") from e
    if not isinstance(meta, dict) or "t0_ns" not in meta or "t0_unix" not in meta:
        raise UserError(f"{d}/run.json: expected t0_ns and t0_unix (the clock anchors of a run)")
    return meta


def merge_dirs(dirs: Iterable[Path], out: Path) -> dict[str, Any]:
    """Merge the run folders of `--shard I/N` runs into `out`: records and samples moved onto the
    first folder's clock by wall-clock anchors (records-wI.jsonl, samples-wI.jsonl), one run.json.
    Returns that run.json."""
    dirs = [Path(d) for d in dirs]
    if len(dirs) < 2:
        raise UserError("merge: expected two or more run folders")
    metas = [_read_meta(d) for d in dirs]
    shards = []
    for d, m in zip(dirs, metas):
        sh = m.get("shard")
        if not (isinstance(sh, list) and len(sh) == 2):
            raise UserError(f"{d}/run.json: expected a run made with --shard I/N (no shard in run.json)")
        shards.append(tuple(sh))
    counts = {n for _, n in shards}
    if len(counts) != 1:
        raise UserError(f"merge: the folders come from different shard counts ({sorted(counts)})")
    n = counts.pop()
    idx = sorted(i for i, _ in shards)
    if idx != sorted(set(idx)):
        raise UserError(f"merge: shard given twice ({idx})")
    fps = {m.get("fingerprint") for m in metas}
    if len(fps) != 1:
        raise UserError("merge: the folders ran different workloads (workload fingerprints differ)")
    out.mkdir(parents=True, exist_ok=True)
    if any(out.iterdir()):
        raise UserError(f"{out}: expected a new or empty folder for the merged run")
    order = sorted(range(len(dirs)), key=lambda k: shards[k][0])
    base = metas[order[0]]
    run_id = base["run"]
    per_shard = []
    for k in order:
        d, m = dirs[k], metas[k]
        i = shards[k][0]
        off = wall_offset(m, base)
        for stem, shift in (("records", shift_record), ("samples", shift_sample)):
            src = d / f"{stem}.jsonl"
            if src.exists():
                data, _ = shift_lines(src.read_bytes(), shift, -off.offset_ns, i,
                                      run_id if stem == "records" else None)
                append(out / f"{stem}-w{i}.jsonl", data)
        per_shard.append({"shard": i, "from": str(d), "run": m.get("run"), **off.to_json()})
    meta = dict(base)
    meta.pop("shard", None)
    merge_meta(meta, [metas[k] for k in order], [0] * len(order), False)
    missing = sorted(set(range(n)) - set(idx))
    meta.update({"shards": per_shard, "shard_count": n, "merged_from": [str(dirs[k]) for k in order],
                 "clock_alignment": f"wall-clock anchors (NTP grade), {fmt_uncertainty(WALL_CLOCK_UNCERTAINTY_NS)}"})
    if missing:
        meta["cut_short"] = True
        meta["ended_normally"] = False
        meta["stop_reason"] = f"shards {missing} of {n} missing from the merge"
    (out / "run.json").write_bytes(orjson.dumps(meta, option=orjson.OPT_INDENT_2))
    return meta
