"""A minimal, fast OpenAI-style streaming server for the benchmark (not a general mock).

It answers every POST with a vLLM-shaped SSE stream over HTTP/1.1 keep-alive, chunked encoding:

    headers + role-only chunk           at once
    first token chunk                   --ttft-ms after the request arrived; carries "mock_sent_ns",
                                        time.perf_counter_ns() taken just before the write
    --chunks - 1 more token chunks      one write each, --interval-ms apart (0: all in one write)
    finish chunk, usage chunk, [DONE]   right after the last token

The request body is read (by Content-Length) but not parsed: the server must cost as little
CPU as possible, so that the client, pinned to its own core, is what the benchmark measures.
The clock is CLOCK_MONOTONIC (Linux), the one agentload's records use, so the client's
first-token stamp minus "mock_sent_ns" is the timing error of the client.

    python -m bench.server --port 0 --ttft-ms 50 --chunks 32 --interval-ms 5
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import stat
import sys
import time

_now = time.perf_counter_ns
READY = "BENCH_SERVER_LISTENING"

_HEAD = b'{"id":"chatcmpl-bench","object":"chat.completion.chunk","created":0,"model":"bench","choices":[{"index":0,"delta":'
_ROLE = b"data: " + _HEAD + b'{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}\n\n'
_TOKEN = b"data: " + _HEAD + b'{"content":" tok"},"logprobs":null,"finish_reason":null}]}\n\n'
_FINISH = b"data: " + _HEAD + b'{},"logprobs":null,"finish_reason":"stop"}]}\n\n'
_DONE = b"data: [DONE]\n\n"


def _frame(data: bytes) -> bytes:
    """One HTTP/1.1 chunk (Transfer-Encoding: chunked)."""
    return b"%x\r\n%b\r\n" % (len(data), data)


class Settings:
    def __init__(self, ttft_ms: float, chunks: int, interval_ms: float):
        self.ttft_s = ttft_ms / 1000.0
        self.chunks = max(1, chunks)
        self.interval_s = interval_ms / 1000.0
        usage = (b'data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":0,"model":"bench",'
                 b'"choices":[],"usage":{"prompt_tokens":0,"completion_tokens":%d,"total_tokens":%d}}\n\n'
                 % (self.chunks, self.chunks))
        self.token_frame = _frame(_TOKEN)
        self.tail_frames = _frame(_FINISH + usage + _DONE) + b"0\r\n\r\n"
        # the chunks after the first, for --interval-ms 0 (all in one write)
        self.burst_rest = self.token_frame * (self.chunks - 1) + self.tail_frames


class Stream:
    """One response in progress on a connection."""

    __slots__ = ("proto", "left", "handle")

    def __init__(self, proto: "BenchProtocol", left: int):
        self.proto = proto
        self.left = left
        self.handle: asyncio.TimerHandle | None = None


class BenchProtocol(asyncio.Protocol):
    def __init__(self, cfg: Settings, loop: asyncio.AbstractEventLoop, stats: dict[str, int]):
        self.cfg = cfg
        self.loop = loop
        self.stats = stats
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.need = -1  # body bytes still expected for the request being read
        self.stream: Stream | None = None
        self.queued = 0  # requests received while a response is still being sent (pipelining)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        s = self.stream
        if s is not None and s.handle is not None:
            s.handle.cancel()
        self.stream = None
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            if self.need < 0:
                end = self.buf.find(b"\r\n\r\n")
                if end < 0:
                    return
                head = self.buf[:end].lower()
                self.buf = self.buf[end + 4:]
                i = head.find(b"content-length:")
                if i < 0:
                    self.need = 0
                else:
                    j = head.find(b"\r\n", i)
                    self.need = int(head[i + 15:j if j >= 0 else len(head)].strip())
            if len(self.buf) < self.need:
                return
            self.buf = self.buf[self.need:]
            self.need = -1
            self._request()

    def _request(self) -> None:
        recv = _now()
        self.stats["requests"] += 1
        if self.stream is not None:  # pipelined: answer after the current response
            self.queued += 1
            return
        self._start(recv)

    def _start(self, recv: int) -> None:
        cfg = self.cfg
        t = self.transport
        if t is None:
            return
        t.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                b"Transfer-Encoding: chunked\r\nx-mock-recv-ns: %d\r\n\r\n%b" % (recv, _frame(_ROLE)))
        s = self.stream = Stream(self, cfg.chunks)
        s.handle = self.loop.call_later(cfg.ttft_s, self._first, s)

    def _first(self, s: Stream) -> None:
        t = self.transport
        if t is None or self.stream is not s:
            return
        cfg = self.cfg
        first = b'data: {"mock_sent_ns":%d,' % _now() + _TOKEN[7:]
        if cfg.interval_s <= 0:
            t.write(_frame(first) + cfg.burst_rest)
            self._done()
            return
        t.write(_frame(first))
        s.left -= 1
        self._schedule(s)

    def _schedule(self, s: Stream) -> None:
        if s.left <= 0:
            self.transport.write(self.cfg.tail_frames)  # type: ignore[union-attr]
            self._done()
        else:
            s.handle = self.loop.call_later(self.cfg.interval_s, self._next, s)

    def _next(self, s: Stream) -> None:
        t = self.transport
        if t is None or self.stream is not s:
            return
        t.write(self.cfg.token_frame)
        s.left -= 1
        self._schedule(s)

    def _done(self) -> None:
        self.stream = None
        self.stats["completed"] += 1
        if self.queued:
            self.queued -= 1
            self._start(_now())


async def serve(host: str, port: int, cfg: Settings) -> None:
    loop = asyncio.get_running_loop()
    stats = {"requests": 0, "completed": 0}
    server = await loop.create_server(lambda: BenchProtocol(cfg, loop, stats), host, port, backlog=4096,
                                      reuse_address=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    class _EOF(asyncio.Protocol):  # stdin closed: the benchmark that started us is gone
        def connection_lost(self, exc: BaseException | None) -> None:
            stop.set()

    if stat.S_ISFIFO(os.fstat(0).st_mode):  # started by bench/run.py with a pipe as a lifeline
        await loop.connect_read_pipe(_EOF, sys.stdin)
    bound = server.sockets[0].getsockname()[1]
    print(f"{READY} port={bound}", flush=True)
    await stop.wait()
    server.close()
    print(f"BENCH_SERVER_STATS requests={stats['requests']} completed={stats['completed']}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.server", description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--ttft-ms", type=float, default=50.0)
    ap.add_argument("--chunks", type=int, default=32, help="token chunks per response")
    ap.add_argument("--interval-ms", type=float, default=5.0, help="between token chunks; 0 = all in one write")
    a = ap.parse_args(argv)
    cfg = Settings(a.ttft_ms, a.chunks, a.interval_ms)
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(a.host, a.port, cfg))
    else:
        uvloop.run(serve(a.host, a.port, cfg))
    return 0


if __name__ == "__main__":
    sys.exit(main())
