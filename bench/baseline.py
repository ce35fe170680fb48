"""The baseline: a plain aiohttp (+uvloop) closed loop, as little as a streaming client can do.

`--concurrency` workers share one ClientSession (pool limit = concurrency); each sends
`--requests` POSTs one after the other and reads each SSE body with `readany()` to the end.

`--parse json` (the baseline): events are split from each read and every data payload is
parsed with orjson; the first token is the first chunk whose delta has content, and the
server's `mock_sent_ns` is read from it. That is the least a client can do that tells a token
from a role-only chunk, i.e. that can measure time to first token at all.

`--parse none` (the floor): per read it only counts events (`data.count(b"\\n\\n")`) and finds
the first token by the server's stamp in the bytes, no JSON parsing: what the event loop and
aiohttp cost on their own.

agentload, which parses every chunk, stamps every phase and writes a record per request, is
measured against both.

`--api messages` / `--api responses`: the same loop against `<url>/messages` or `<url>/responses`
(a body of that API's shape), each event's `data:` line parsed (`--parse json`); the first token is
the first `content_block_delta` with text / `response.output_text.delta` with a delta; the body is
read to its end, which comes after the terminal event (`message_stop`, `response.completed`).

Writes its result as JSON to the file `--result` names (else prints it as one line): requests,
chunks, wall and CPU seconds of the load window, peak RSS, and the timing errors (first-token read
- server send, ns) of every request (so at 512 x 40 requests the result is a few hundred KB).

    python -m bench.baseline --url http://127.0.0.1:PORT/v1 --concurrency 64 --requests 20
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import sys
import time
from pathlib import Path
from typing import Callable

import aiohttp
import orjson

from agentload.atomic import write_atomic

_now = time.perf_counter_ns
_STAMP = b'"mock_sent_ns":'


def body_of(size: int, api: str = "chat") -> bytes:
    """A request of `api` of about `size` bytes (the server does not parse it)."""
    if api == "messages":
        base = {"model": "bench", "max_tokens": 32, "stream": True, "system": "",
                "messages": [{"role": "user", "content": "hello"}]}
    elif api == "responses":
        base = {"model": "bench", "max_output_tokens": 32, "stream": True, "store": False, "instructions": "",
                "input": [{"type": "message", "role": "user", "content": "hello"}]}
    else:
        base = {"model": "bench", "max_tokens": 32, "stream": True, "stream_options": {"include_usage": True},
                "messages": [{"role": "system", "content": ""}, {"role": "user", "content": "hello"}]}
    pad = max(0, size - len(orjson.dumps(base)))
    text = ("lorem ipsum " * (pad // 12 + 1))[:pad]
    if api == "messages":
        base["system"] = text
    elif api == "responses":
        base["instructions"] = text
    else:
        base["messages"][0]["content"] = text
    return orjson.dumps(base)


def chat_token(obj: dict) -> bool:
    """A chat chunk that carries text (not the role-only first chunk, not the usage chunk)."""
    choices = obj.get("choices")
    return bool(choices and (choices[0].get("delta") or {}).get("content"))


def event_token(token_type: str, text_key: str) -> Callable[[dict], bool]:
    """The same for a stream of named events (Messages, Responses): an event of `token_type` whose
    delta carries text (`text_key` in it; "": the delta itself is the text)."""

    def is_token(obj: dict) -> bool:
        if obj.get("type") != token_type:
            return False
        d = obj.get("delta")
        return bool(d.get(text_key) if text_key else d)

    return is_token


TOKEN = {"chat": chat_token, "messages": event_token("content_block_delta", "text"),
         "responses": event_token("response.output_text.delta", "")}


async def worker_json(session: aiohttp.ClientSession, url: str, body: bytes, n: int, errors_ns: list[int],
                      totals: list[int], is_token: Callable[[dict], bool] = chat_token) -> None:
    """The baseline: events split and every `data:` line parsed (chat's chunks, or the named
    events of Messages and Responses: `is_token` tells the first token)."""
    loads = orjson.loads
    for _ in range(n):
        async with session.post(url, data=body) as resp:
            content = resp.content
            chunks = 0
            first = 0
            stamp = 0
            rest = b""
            while True:
                data = await content.readany()
                if not data:
                    break
                now = _now()
                events = (rest + data).split(b"\n\n") if rest else data.split(b"\n\n")
                rest = events.pop()
                for ev in events:
                    i = ev.find(b"data: ")  # chat: at 0; a named event: after its `event:` line
                    if i < 0:
                        continue
                    chunks += 1
                    payload = ev[i + 6:]
                    if payload == b"[DONE]":
                        continue
                    obj = loads(payload)
                    if not first and is_token(obj):
                        first = now
                        stamp = obj.get("mock_sent_ns") or 0
        totals[0] += 1
        totals[1] += chunks
        if first and stamp:
            errors_ns.append(first - stamp)


async def worker(session: aiohttp.ClientSession, url: str, body: bytes, n: int, errors_ns: list[int],
                 totals: list[int]) -> None:
    for _ in range(n):
        async with session.post(url, data=body) as resp:
            content = resp.content
            chunks = 0
            first = 0
            stamp = 0
            while True:
                data = await content.readany()
                if not data:
                    break
                if not first:
                    i = data.find(_STAMP)
                    if i >= 0:
                        first = _now()
                        j = i + len(_STAMP)
                        k = data.find(b",", j)
                        stamp = int(data[j:k])
                chunks += data.count(b"\n\n")
        totals[0] += 1
        totals[1] += chunks
        if first and stamp:
            errors_ns.append(first - stamp)


async def main_async(url: str, concurrency: int, requests: int, body_bytes: int, parse: str = "json",
                     api: str = "chat") -> dict:
    body = body_of(body_bytes, api)
    conn = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=300, sock_read=60)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout,
                                     headers={"Content-Type": "application/json"}) as session:
        errors_ns: list[int] = []
        totals = [0, 0]
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        path = {"chat": "/chat/completions", "messages": "/messages", "responses": "/responses"}[api]
        await asyncio.gather(*(worker_json(session, url.rstrip("/") + path, body, requests, errors_ns, totals,
                                           TOKEN[api]) if parse == "json"
                               else worker(session, url.rstrip("/") + path, body, requests, errors_ns, totals)
                               for _ in range(concurrency)))
        wall = time.perf_counter() - t0
        r1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return {"client": ("baseline" if parse == "json" else "floor") + ("" if api == "chat" else f" {api}"),
            "requests": totals[0], "chunks": totals[1], "wall_s": wall, "cpu_s": cpu,
            "sys_s": r1.ru_stime - r0.ru_stime, "minflt": r1.ru_minflt - r0.ru_minflt,
            "rss_kb": r1.ru_maxrss, "errors_ns": errors_ns, "failed": concurrency * requests - totals[0]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.baseline")
    ap.add_argument("--url", required=True, help="base URL, e.g. http://127.0.0.1:8000/v1")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--requests", type=int, default=20, help="per worker")
    ap.add_argument("--body-bytes", type=int, default=2000)
    ap.add_argument("--parse", choices=("json", "none"), default="json",
                    help="json: parse every chunk (the baseline); none: count bytes only (the floor)")
    ap.add_argument("--api", choices=("chat", "messages", "responses"), default="chat",
                    help="the API spoken (its path, its request body, its stream)")
    ap.add_argument("--no-uvloop", action="store_true")
    ap.add_argument("--result", type=Path, default=None, help="write the result (JSON) to this file, not to stdout")
    a = ap.parse_args(argv)
    coro = main_async(a.url, a.concurrency, a.requests, a.body_bytes, a.parse, a.api)
    if a.no_uvloop:
        out = asyncio.run(coro)
    else:
        import uvloop

        out = uvloop.run(coro)
    write_result(out, a.result)
    return 0


def write_result(out: dict, path: Path | None) -> None:
    """The result as JSON, whole: into `path` (atomically: the reader sees all of it or no file),
    or as one line on stdout."""
    data = orjson.dumps(out)
    if path is None:
        sys.stdout.buffer.write(data + b"\n")
        sys.stdout.flush()
    else:
        write_atomic(path, data)


if __name__ == "__main__":
    sys.exit(main())
