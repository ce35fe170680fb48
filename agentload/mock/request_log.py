"""The request log (`request_log = path`): one JSON line per chat request when it ends, however
it ends, with one write(2) on an O_APPEND descriptor (a SIGKILL loses only the requests still in
flight). The fields are listed in mock/server.py's docstring; `Rec` gathers them as the request goes.
"""

from __future__ import annotations

import os
import time

import orjson

from agentload.errors import UserError
from agentload.mock.stats import Stats

_perf_ns = time.perf_counter_ns
_dumps = orjson.dumps


class Rec:
    """What the request log says of one chat request; filled in as the request goes."""

    __slots__ = ("recv_ns", "fault", "rid", "round", "ptoks", "cached", "status", "outcome", "stream", "api",
                 "traceparent")

    def __init__(self, recv_ns: int, fault: str | None, api: str = "chat"):
        self.api = api
        self.recv_ns = recv_ns
        self.fault = fault
        self.rid: str | None = None
        self.round: int | None = None
        self.ptoks: int | None = None
        self.cached: int | None = None
        self.status: int | None = None
        self.outcome: str | None = None
        self.stream = False
        self.traceparent: str | None = None  # the W3C trace context the request carried (a router passes it on)


class RequestLog:
    """The log file of one server (`path` None: no log, and `write` does nothing)."""

    def __init__(self, path: str | None, backend: str, stats: Stats):
        self.path = path
        self.backend = backend
        self.stats = stats
        self._fd: int | None = None

    def open(self) -> None:
        if self.path is None:
            return
        try:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            # not an OSError: serve() would take it for a port it cannot listen on
            raise UserError(f"request_log: cannot open {self.path} for appending ({e.strerror or e})") from None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def write(self, rec: Rec) -> None:
        if self._fd is None:
            return
        line = _dumps({"id": rec.rid, "backend": self.backend, "recv_ns": rec.recv_ns, "end_ns": _perf_ns(),
                       "round": rec.round, "prompt_tokens": rec.ptoks, "cached_tokens": rec.cached,
                       "status": rec.status, "outcome": rec.outcome or "error", "fault": rec.fault,
                       "stream": rec.stream, "api": rec.api, "traceparent": rec.traceparent},
                      option=orjson.OPT_APPEND_NEWLINE)
        try:
            os.write(self._fd, line)  # one write on O_APPEND: lines never interleave or tear
        except OSError:
            self.stats.request_log_errors += 1  # a full disk must not fail the request
