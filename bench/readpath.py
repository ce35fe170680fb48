"""The read path alone, timed natively: one answer of the bench server's stream fed to agentload's
`SSEBody` and its API's reader, read by read, against the raw loop's split and orjson parse of the
same reads (bench/baseline.py's `worker_json`, without aiohttp); several copies of the agentload
package, alternated in one process.

Where whole runs on a shared machine move by 10-20% and instruction counts miss what costs natively
(a split on a long needle: few instructions, slow), a change of a few microseconds on the read path
is judged here: the best and median of `--reps` rounds of `--n` answers each, every copy timed in
turn within each round.

    python -m bench.readpath                              # this copy, burst answers of each API
    python -m bench.readpath --code /tmp/before --paced   # + another copy (a git archive), paced
"""

from __future__ import annotations

import argparse
import gc
import importlib
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import orjson

from bench.baseline import TOKEN
from bench.server import Settings, Shape

_STAMP = 123456789012


def _unframe(frames: bytes) -> bytes:
    """The body bytes of HTTP/1.1 chunks."""
    out, i = [], 0
    while i < len(frames):
        j = frames.index(b"\r\n", i)
        n = int(frames[i:j], 16)
        if n == 0:
            break
        out.append(frames[j + 2:j + 2 + n])
        i = j + 2 + n + 2
    return b"".join(out)


def answer_reads(shape: Shape, paced: bool) -> list[bytes]:
    """One answer as the client's reads carry it: the role events, then the first token (with the
    server's send stamp) and the rest all at once (burst) or one event a read (paced)."""
    first = shape.token[:shape.stamp_at] + b'"mock_sent_ns":%d,' % _STAMP + shape.token[shape.stamp_at:]
    role = _unframe(shape.role_frame)
    if paced:
        n = shape.burst_rest.count(shape.token_frame)
        return [role, first] + [shape.token] * n + [_unframe(shape.tail_frames)]
    return [role, first + _unframe(shape.burst_rest)]


def raw_loop(reads: list[bytes], is_token: Callable[[dict], bool]) -> int:
    """bench.baseline's per-read work: events split, every data line parsed, the first token found."""
    loads = orjson.loads
    rest = b""
    chunks = first = 0
    for data in reads:
        events = (rest + data).split(b"\n\n") if rest else data.split(b"\n\n")
        rest = events.pop()
        for ev in events:
            i = ev.find(b"data: ")
            if i < 0:
                continue
            chunks += 1
            payload = ev[i + 6:]
            if payload == b"[DONE]":
                continue
            obj = loads(payload)
            if not first and is_token(obj):
                first = 1
    return chunks


def load_copy(where: Path | None, apis: list[str]) -> tuple[Any, dict[str, Any], Any]:
    """SSEBody, each API's reader class and Trace of the agentload package in `where` (None: this
    one), all imported while that copy is the one on the path (a reader module imported later
    would be the last copy's)."""
    for name in [m for m in sys.modules if m == "agentload" or m.startswith("agentload.")]:
        del sys.modules[name]
    if where is not None:
        sys.path.insert(0, str(where))
    try:
        sse_body = importlib.import_module("agentload.run.sse_body")
        readers = {api: importlib.import_module("agentload.run.apis").get(api).Stream for api in apis}
        records = importlib.import_module("agentload.records")
    finally:
        if where is not None:
            sys.path.remove(str(where))
    return sse_body.SSEBody, readers, records.Trace


def agentload_answer(copy: tuple[Any, dict[str, Any], Any], api: str) -> Callable[[list[bytes]], Any]:
    sse_body, readers, trace_cls = copy
    stream_cls = readers[api]

    def one(reads: list[bytes]) -> Any:
        body = sse_body(trace_cls("agent", 0, 1, 0, "r", 2, 0, 0), stream_cls)
        for i, r in enumerate(reads):
            body.feed(r, 1000 + i)
        return body.finish()

    return one


def raw_answer(api: str) -> Callable[[list[bytes]], Any]:
    is_token = TOKEN[api]
    return lambda reads: raw_loop(reads, is_token)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.readpath")
    ap.add_argument("--apis", default="chat,messages,responses")
    ap.add_argument("--code", type=Path, action="append", default=[],
                    help="another copy of the agentload package (a folder holding agentload/), timed beside this one")
    ap.add_argument("--paced", action="store_true", help="one event a read (default: the burst's two reads)")
    ap.add_argument("--chunks", type=int, default=32)
    ap.add_argument("--n", type=int, default=2000, help="answers per timing")
    ap.add_argument("--reps", type=int, default=7)
    a = ap.parse_args(argv)
    settings = Settings(50.0, a.chunks, 5.0 if a.paced else 0.0)
    apis = [x.strip() for x in a.apis.split(",") if x.strip()]
    copies = [("agentload", load_copy(None, apis))] + [(f"agentload ({c})", load_copy(c, apis)) for c in a.code]
    print(f"us per answer, {'paced' if a.paced else 'burst'}, {a.chunks} tokens: best / median of {a.reps} x {a.n}")
    for api in apis:
        reads = answer_reads(getattr(settings, api), a.paced)
        clients = [(name, agentload_answer(copy, api)) for name, copy in copies] + [("raw loop", raw_answer(api))]
        times: dict[str, list[float]] = {name: [] for name, _ in clients}
        for _ in range(a.reps):
            for name, fn in clients:
                gc.disable()
                t0 = time.perf_counter()
                for _ in range(a.n):
                    fn(reads)
                times[name].append((time.perf_counter() - t0) / a.n * 1e6)
                gc.enable()
        print(f"{api:9s} " + "   ".join(f"{name} {min(v):.1f} / {statistics.median(v):.1f}" for name, v in times.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
