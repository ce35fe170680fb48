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

Every POST is a chat completion, whatever its path, except a POST to .../v1/completions, answered
in the legacy completions shape (`choices[0].text`, no role chunk), one to .../messages, answered
as Anthropic's Messages API streams (`message_start` and the text block's start first, one
`content_block_delta` per token, then the block's stop, `message_delta` with the usage and
`message_stop`), and one to .../responses, as OpenAI's Responses API streams (`response.created`,
`response.in_progress`, the message item and its part first, one `response.output_text.delta`
per token, then the `.done` events and `response.completed` with the usage), with the same timing. A GET is
not a completion and is not counted:
    GET /bench/stats    the counters, JSON: requests and completed (streams), active (streams in
                        progress now), max_active (the most at once), busy_ns (the integral of
                        active over time: its increase over a window / the window = the mean
                        number of streams in progress), body_bytes (of the POSTs' bodies, added up),
                        now_ns (the server's perf_counter_ns)
    GET /bench/reset    the counters back to zero (between two clients on one server)
    GET /v1/models      one model, "bench"; GET /health: 200; any other GET: 404
The benchmark of peer tools (bench/peers.py) reads /bench/stats to count completions in each
client's active window.

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

TOKEN_TEXT = " tok"  # the text of every token chunk (bench/tokenizer.py builds its vocabulary from it)
MODEL = "bench"

_HEAD = b'{"id":"chatcmpl-bench","object":"chat.completion.chunk","created":0,"model":"bench","choices":[{"index":0,"delta":'
_ROLE = b"data: " + _HEAD + b'{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}\n\n'
_TOKEN = b"data: " + _HEAD + b'{"content":"%b"},' % TOKEN_TEXT.encode() + b'"logprobs":null,"finish_reason":null}]}\n\n'
_FINISH = b"data: " + _HEAD + b'{},"logprobs":null,"finish_reason":"stop"}]}\n\n'
_DONE = b"data: [DONE]\n\n"
# POST .../v1/completions (not chat): the legacy completions shape, `choices[0].text` (inference-perf's
# synthetic prompts go there); no role chunk
_THEAD = b'{"id":"cmpl-bench","object":"text_completion","created":0,"model":"bench","choices":[{"index":0,'
_TTOKEN = b"data: " + _THEAD + b'"text":"%b","logprobs":null,"finish_reason":null}]}\n\n' % TOKEN_TEXT.encode()
_TFINISH = b"data: " + _THEAD + b'"text":"","logprobs":null,"finish_reason":"stop"}]}\n\n'


def _ev(name: str, data: bytes) -> bytes:
    """One named SSE event (Messages and Responses name theirs)."""
    return b"event: %b\ndata: %b\n\n" % (name.encode(), data)


# POST .../messages: Anthropic's Messages stream
_M_ROLE = (_ev("message_start", b'{"type":"message_start","message":{"id":"msg_bench","type":"message","role":'
                                b'"assistant","content":[],"model":"bench","stop_reason":null,"stop_sequence":null,'
                                b'"usage":{"input_tokens":0,"output_tokens":1}}}')
           + _ev("content_block_start", b'{"type":"content_block_start","index":0,"content_block":{"type":"text",'
                                        b'"text":""}}'))
_M_TOKEN = _ev("content_block_delta", b'{"type":"content_block_delta","index":0,"delta":{"type":"text_delta",'
                                      b'"text":"%b"}}' % TOKEN_TEXT.encode())
_M_FINISH = _ev("content_block_stop", b'{"type":"content_block_stop","index":0}')
# POST .../responses: OpenAI's Responses stream
_R_RESP = b'{"id":"resp_bench","object":"response","created_at":0,"status":"%b","model":"bench","output":[]}'
_R_ROLE = (_ev("response.created", b'{"type":"response.created","response":%b}' % (_R_RESP % b"in_progress"))
           + _ev("response.in_progress", b'{"type":"response.in_progress","response":%b}' % (_R_RESP % b"in_progress"))
           + _ev("response.output_item.added", b'{"type":"response.output_item.added","output_index":0,"item":'
                                               b'{"id":"msg_bench","type":"message","status":"in_progress",'
                                               b'"role":"assistant","content":[]}}')
           + _ev("response.content_part.added", b'{"type":"response.content_part.added","item_id":"msg_bench",'
                                                b'"output_index":0,"content_index":0,"part":{"type":"output_text",'
                                                b'"text":"","annotations":[]}}'))
_R_TOKEN = _ev("response.output_text.delta", b'{"type":"response.output_text.delta","item_id":"msg_bench",'
                                             b'"output_index":0,"content_index":0,"delta":"%b"}' % TOKEN_TEXT.encode())


def _frame(data: bytes) -> bytes:
    """One HTTP/1.1 chunk (Transfer-Encoding: chunked)."""
    return b"%x\r\n%b\r\n" % (len(data), data)


class Shape:
    """The bytes of one kind of answer (chat or legacy completions), framed once."""

    def __init__(self, chunks: int, obj: bytes, role: bytes, token: bytes, finish: bytes, end: bytes | None = None):
        if end is None:  # chat and completions: the usage chunk, then [DONE]
            end = (b'data: {"id":"%b","object":"%b","created":0,"model":"bench",'
                   b'"choices":[],"usage":{"prompt_tokens":0,"completion_tokens":%d,"total_tokens":%d}}\n\n'
                   % (b"chatcmpl-bench" if role else b"cmpl-bench", obj, chunks, chunks)) + _DONE
        self.role_frame = _frame(role) if role else b""
        self.token = token  # (the first token gets the send stamp after its b'data: {')
        self.stamp_at = token.find(b"data: {") + 7
        self.token_frame = _frame(token)
        self.tail_frames = _frame(finish + end) + b"0\r\n\r\n"
        # the chunks after the first, for --interval-ms 0 (all in one write)
        self.burst_rest = self.token_frame * (chunks - 1) + self.tail_frames


class Settings:
    def __init__(self, ttft_ms: float, chunks: int, interval_ms: float):
        self.ttft_s = ttft_ms / 1000.0
        self.chunks = max(1, chunks)
        self.interval_s = interval_ms / 1000.0
        self.chat = Shape(self.chunks, b"chat.completion.chunk", _ROLE, _TOKEN, _FINISH)
        self.text = Shape(self.chunks, b"text_completion", b"", _TTOKEN, _TFINISH)
        n = self.chunks
        self.messages = Shape(n, b"", _M_ROLE, _M_TOKEN, _M_FINISH, _ev(
            "message_delta", b'{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},'
                             b'"usage":{"output_tokens":%d}}' % n) + _ev("message_stop", b'{"type":"message_stop"}'))
        text = TOKEN_TEXT.encode() * n
        item = b'{"id":"msg_bench","type":"message","status":"completed","role":"assistant","content":[%b]}'
        part = b'{"type":"output_text","text":"%b","annotations":[]}' % text
        done = (b'{"id":"resp_bench","object":"response","created_at":0,"status":"completed","model":"bench",'
                b'"output":[%b],"usage":{"input_tokens":0,"input_tokens_details":{"cached_tokens":0},'
                b'"output_tokens":%d,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":%d}}'
                % (item % part, n, n))
        self.responses = Shape(n, b"", _R_ROLE, _R_TOKEN, _ev(
            "response.output_text.done", b'{"type":"response.output_text.done","item_id":"msg_bench",'
                                         b'"output_index":0,"content_index":0,"text":"%b"}' % text)
            + _ev("response.content_part.done", b'{"type":"response.content_part.done","item_id":"msg_bench",'
                                                b'"output_index":0,"content_index":0,"part":%b}' % part)
            + _ev("response.output_item.done", b'{"type":"response.output_item.done","output_index":0,"item":%b}'
                  % (item % part)),
            _ev("response.completed", b'{"type":"response.completed","response":%b}' % done))


class Stats:
    """The server's counters (GET /bench/stats). `active` counts the streams received and not yet
    finished (pipelined ones waiting on their connection included); `busy_ns` is the integral of
    `active` over time, so over a window its increase / the window's length is the mean number of
    streams in progress."""

    __slots__ = ("aborted", "active", "body_bytes", "busy_ns", "completed", "last_ns", "max_active", "requests")

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.requests = self.completed = self.aborted = self.active = self.max_active = self.busy_ns = 0
        self.body_bytes = 0
        self.last_ns = _now()

    def _tick(self, now: int) -> None:
        self.busy_ns += self.active * (now - self.last_ns)
        self.last_ns = now

    def arrived(self, now: int, body: int) -> None:
        self._tick(now)
        self.requests += 1
        self.body_bytes += body
        self.active += 1
        self.max_active = max(self.max_active, self.active)

    def finished(self, now: int, ok: bool = True) -> None:
        self._tick(now)
        self.active -= 1
        if ok:
            self.completed += 1
        else:
            self.aborted += 1

    def as_json(self) -> bytes:
        now = _now()
        self._tick(now)
        return (b'{"requests":%d,"completed":%d,"aborted":%d,"active":%d,"max_active":%d,"busy_ns":%d,'
                b'"body_bytes":%d,"now_ns":%d}' % (self.requests, self.completed, self.aborted, self.active,
                                                   self.max_active, self.busy_ns, self.body_bytes, now))


def _plain(status: bytes, body: bytes, ctype: bytes = b"application/json") -> bytes:
    return (b"HTTP/1.1 %b\r\nContent-Type: %b\r\nContent-Length: %d\r\n\r\n%b"
            % (status, ctype, len(body), body))


_MODELS = b'{"object":"list","data":[{"id":"%b","object":"model","created":0,"owned_by":"bench"}]}' % MODEL.encode()


class Stream:
    """One response in progress on a connection."""

    __slots__ = ("handle", "left", "proto", "shape")

    def __init__(self, proto: "BenchProtocol", left: int, shape: Shape):
        self.proto = proto
        self.left = left
        self.shape = shape
        self.handle: asyncio.TimerHandle | None = None


class BenchProtocol(asyncio.Protocol):
    def __init__(self, cfg: Settings, loop: asyncio.AbstractEventLoop, stats: Stats):
        self.cfg = cfg
        self.loop = loop
        self.stats = stats
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.need = -1  # body bytes still expected for the request being read
        self.req: bytes | Shape = cfg.chat  # the request being read: a POST's answer Shape, or a GET's path
        self.stream: Stream | None = None
        self.queued: list[bytes | Shape] = []  # requests received while a response is being sent (pipelining)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        s = self.stream
        now = _now()
        if s is not None:
            if s.handle is not None:
                s.handle.cancel()
            self.stats.finished(now, ok=False)
        for q in self.queued:
            if isinstance(q, Shape):
                self.stats.finished(now, ok=False)
        self.queued.clear()
        self.stream = None
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            if self.need < 0:
                end = self.buf.find(b"\r\n\r\n")
                if end < 0:
                    return
                head = self.buf[:end]
                self.buf = self.buf[end + 4:]
                if head[:4] == b"GET ":
                    self.req = head[4:head.find(b" ", 4)]
                    self.need = 0
                else:
                    path = head[head.find(b" ") + 1:head.find(b" HTTP/")]
                    if path.endswith(b"/chat/completions"):
                        self.req = self.cfg.chat
                    elif path.endswith(b"/messages"):
                        self.req = self.cfg.messages
                    elif path.endswith(b"/responses"):
                        self.req = self.cfg.responses
                    else:
                        self.req = self.cfg.text if path.endswith(b"/completions") else self.cfg.chat
                    head = head.lower()
                    i = head.find(b"content-length:")
                    if i < 0:
                        self.need = 0
                    else:
                        j = head.find(b"\r\n", i)
                        self.need = int(head[i + 15:j if j >= 0 else len(head)].strip())
            if len(self.buf) < self.need:
                return
            self.buf = self.buf[self.need:]
            body, self.need = self.need, -1
            self._request(self.req, body)

    def _request(self, req: bytes | Shape, body: int) -> None:
        recv = _now()
        post = isinstance(req, Shape)
        if post:
            self.stats.arrived(recv, body)
        if self.stream is not None:  # pipelined: answer after the current response
            self.queued.append(req)
            return
        if post:
            self._start(recv, req)  # type: ignore[arg-type]
        else:
            self._answer_get(req)  # type: ignore[arg-type]

    def _answer_get(self, path: bytes) -> None:
        t = self.transport
        if t is None:
            return
        if path.startswith(b"/bench/stats"):
            t.write(_plain(b"200 OK", self.stats.as_json()))
        elif path.startswith(b"/bench/reset"):
            self.stats.reset()
            t.write(_plain(b"200 OK", self.stats.as_json()))
        elif path.startswith(b"/v1/models"):
            t.write(_plain(b"200 OK", _MODELS))
        elif path.startswith(b"/health"):
            t.write(_plain(b"200 OK", b"{}"))
        else:
            t.write(_plain(b"404 Not Found", b'{"error":"not found"}'))

    def _start(self, recv: int, shape: Shape) -> None:
        cfg = self.cfg
        t = self.transport
        if t is None:
            return
        t.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                b"Transfer-Encoding: chunked\r\nx-mock-recv-ns: %d\r\n\r\n%b" % (recv, shape.role_frame))
        s = self.stream = Stream(self, cfg.chunks, shape)
        s.handle = self.loop.call_later(cfg.ttft_s, self._first, s)

    def _first(self, s: Stream) -> None:
        t = self.transport
        if t is None or self.stream is not s:
            return
        cfg = self.cfg
        shape = s.shape
        at = shape.stamp_at
        first = shape.token[:at] + b'"mock_sent_ns":%d,' % _now() + shape.token[at:]
        if cfg.interval_s <= 0:
            t.write(_frame(first) + shape.burst_rest)
            self._done()
            return
        t.write(_frame(first))
        s.left -= 1
        self._schedule(s)

    def _schedule(self, s: Stream) -> None:
        if s.left <= 0:
            self.transport.write(s.shape.tail_frames)  # type: ignore[union-attr]
            self._done()
        else:
            s.handle = self.loop.call_later(self.cfg.interval_s, self._next, s)

    def _next(self, s: Stream) -> None:
        t = self.transport
        if t is None or self.stream is not s:
            return
        t.write(s.shape.token_frame)
        s.left -= 1
        self._schedule(s)

    def _done(self) -> None:
        self.stream = None
        self.stats.finished(_now())
        while self.queued:
            req = self.queued.pop(0)
            if isinstance(req, Shape):
                self._start(_now(), req)
                return
            self._answer_get(req)


async def serve(host: str, port: int, cfg: Settings) -> None:
    loop = asyncio.get_running_loop()
    stats = Stats()
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
    print(f"BENCH_SERVER_STATS requests={stats.requests} completed={stats.completed} aborted={stats.aborted} "
          f"max_active={stats.max_active}", file=sys.stderr, flush=True)


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
