"""Send one chat completion and read it to the end, stamping first byte, tokens and completion.

aiohttp fires no signal while a body is read, so the read loop stamps these itself. Each block
of bytes is handed to `SSEBody.feed` as aiohttp's parser delivers it (`body_sink`: no task
wake-up per read; `readany()` where that path is not available), which splits SSE events from
the block and parses each data payload once. An SSE comment (`: ping`) is counted, never taken
as progress.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import aiohttp

from agentload.body_sink import read_body
from agentload.chat_stream import TOKEN, ChatStream
from agentload.records import Trace
from agentload.sse import COMMENT, DATA, SSEDecoder

_now = time.perf_counter_ns
_ERROR_BODY_LIMIT = 300
_SERVER_STAMP = b'"mock_sent_ns":'


def server_stamp(payload: bytes) -> int | None:
    """The server's send stamp (`"mock_sent_ns": <int>`) in a chunk, if it carries one.

    Looked for only in the chunk that produced the first token, so ordinary chunks cost nothing.
    """
    i = payload.find(_SERVER_STAMP)
    if i < 0:
        return None
    i += len(_SERVER_STAMP)
    j = i
    n = len(payload)
    while j < n and payload[j] in b" 0123456789":
        j += 1
    try:
        return int(payload[i:j])
    except ValueError:
        return None


@dataclass(slots=True)
class Result:
    status: int | None
    stream: ChatStream | None
    error: str | None  # error class; None when the request completed
    error_msg: str | None
    retry_after_s: float | None = None


def _retry_after(resp: aiohttp.ClientResponse) -> float | None:
    v = resp.headers.get("Retry-After")
    try:
        return float(v) if v is not None else None
    except ValueError:
        return None


class SSEBody:
    """The read loop's per-read work: stamps, SSE events, chunk accumulation.

    `feed(data)` is called once per network read, either from aiohttp's protocol callback
    (`body_sink.read_body`, the fast path) or after `await content.readany()`.
    """

    __slots__ = ("trace", "t", "cs", "dec", "last_byte")

    def __init__(self, trace: Trace):
        self.trace = trace
        self.t = trace.t
        self.cs = ChatStream()
        self.dec = SSEDecoder()
        self.last_byte = _now()  # (headers) for the idle read timeout

    def last_byte_ns(self) -> int:
        return self.last_byte

    def feed(self, data: bytes) -> None:
        self.last_byte = now = _now()
        trace = self.trace
        t = self.t
        if trace.bytes_in == 0:
            t.setdefault("first_byte", now)
        trace.bytes_in += len(data)
        add = self.cs.add
        for kind, payload in self.dec.feed(data):
            if kind == COMMENT:
                trace.comments += 1
                continue
            flags = add(payload)
            trace.chunks += 1
            if flags & TOKEN:
                if trace.token_chunks == 0:
                    t["first_token"] = now
                    trace.server_first_token_ns = server_stamp(payload)
                else:
                    gap = now - trace.last_token
                    if gap > trace.max_gap:
                        trace.max_gap = gap
                        trace.max_gap_at = now
                trace.last_token = now
                trace.token_chunks += 1
            # ERROR | DONE: keep reading to EOF so the connection goes back to the pool cleanly

    def finish(self) -> ChatStream:
        for kind, payload in self.dec.flush():
            if kind == DATA:
                self.cs.add(payload)
                self.trace.chunks += 1
        return self.cs


async def send(session: aiohttp.ClientSession, url: str, body: bytes, trace: Trace,
               extra_headers: dict[str, str] | None = None) -> Result:
    """One request; the caller wraps it in the give-up timeout the watchdog can fire."""
    t = trace.t
    headers = {"X-Request-ID": trace.request_id}
    if extra_headers:
        headers.update(extra_headers)
    t["start"] = _now()
    async with session.post(url, data=body, headers=headers, trace_request_ctx=trace) as resp:
        status = resp.status
        if "headers" not in t:  # stamped by the on_request_end hook; defensive for other seams
            t["headers"] = _now()
        if status >= 400:
            raw = await resp.read()
            t["end"] = _now()
            msg = raw[:_ERROR_BODY_LIMIT].decode("utf-8", "replace").replace("\n", " ")
            return Result(status, None, f"http_{status}", msg, _retry_after(resp))
        ctype = resp.headers.get("Content-Type", "")
        if "text/event-stream" not in ctype:
            raw = await resp.read()
            now = _now()
            t["first_byte"] = t.get("first_byte", now)
            cs = ChatStream.from_response(raw)
            if cs.error is None and (cs.content or cs.tool_calls):
                t["first_token"] = now
                trace.last_token = now
                trace.server_first_token_ns = server_stamp(raw)
            t["end"] = now
            trace.chunks = 1
            if cs.error is not None:
                return Result(status, cs, "inband_error", cs.error)
            return Result(status, cs, None, None)

        reader = SSEBody(trace)
        content = resp.content
        conn = resp.connection
        if not await read_body(content, reader.feed, conn.protocol if conn is not None else None,
                               reader.last_byte_ns):
            while True:  # the general path: any StreamReader, one task wake-up per read
                data = await content.readany()
                if not data:
                    break
                reader.feed(data)
        cs = reader.finish()
        t["end"] = _now()
        if cs.error is not None:
            return Result(status, cs, "inband_error", cs.error)
        if not cs.done and cs.finish_reason is None:
            return Result(status, cs, "incomplete_stream", "stream ended without finish_reason or [DONE]")
        return Result(status, cs, None, None)


def classify_exception(e: BaseException) -> tuple[str, str]:
    """Error class and a one-line message for a failed request."""
    name = type(e).__name__
    if isinstance(e, aiohttp.ServerTimeoutError):
        name = "read_timeout" if "read" in str(e).lower() else "ServerTimeoutError"
    elif isinstance(e, aiohttp.ConnectionTimeoutError):
        name = "connect_timeout"
    elif isinstance(e, asyncio.TimeoutError) and not isinstance(e, aiohttp.ClientError):
        name = "total_timeout"
    msg = str(e).replace("\n", " ")[:_ERROR_BODY_LIMIT] or name
    return name, msg
