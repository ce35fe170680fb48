"""The request record: one immutable JSONL line per request, and the in-flight trace it comes from.

Timestamps are raw `time.perf_counter_ns()` values (CLOCK_MONOTONIC on Linux); `run.json`
holds the anchor (`t0_ns`, `t0_unix`) that turns them into wall-clock times. Phases are
derived from timestamps at report time, never stored.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import orjson

from agentload import redact
from agentload.records.phases import (  # one definition, re-exported for every caller ("X as X")
    PHASES as PHASES,
)
from agentload.records.phases import (
    PROGRESS_STAMPS as PROGRESS_STAMPS,
)
from agentload.records.phases import (
    REPORT_PHASES as REPORT_PHASES,
)
from agentload.records.phases import (
    STAMPS as STAMPS,
)
from agentload.records.phases import (
    phase_at as phase_at,
)
from agentload.records.phases import (
    phase_ns as phase_ns,
)

RECORD_VERSION = 1

OUTCOMES = ("ok", "error", "stalled", "cut_short")

# The kinds of record a stall wave's probes leave (agentload.run.probes), each changing one factor
# against the stalled request: what each is, as the verdict names it.
PROBE_KINDS = {
    "probe_body_fresh": "the stalled request's own body on a fresh connection",
    "probe_short_reused": "a short prompt on a reused keep-alive connection",
    "probe_short_fresh": "a short prompt on a fresh connection",
    "probe_body_reused": "the stalled request's own body on a reused keep-alive connection",
}

# The codes of a record's `tool_call_problems` (`agentload.run.apis.tool_calls.ToolCalls.problems`)
TRUNCATED = "truncated"  # finish_reason length on an answer that carried a tool call or was asked for one
BAD_ARGUMENTS = "bad_arguments"  # arguments not a JSON object: not JSON (cut mid-JSON), an array, an object not a string
NO_ID = "no_id"  # a call without an id: its tool result could not name it
NO_NAME = "no_name"  # a call without a function name
IDS_ON_ONE_INDEX = "ids_on_one_index"  # a second id on an index another call had: two calls merged into one


def tool_calls_sendable(problems: list[str] | None) -> bool:
    """Can an answer with these tool-call problems be sent back as it came? When it has none, or
    its only problem is that max_tokens cut it after whole tool calls (`truncated`): the calls are
    what the model said, nothing in them made up. Otherwise a real harness could not run them and
    agentload, which never invents or repairs a call, ends that conversation (mode model)."""
    return not problems or all(p.startswith(TRUNCATED + ":") for p in problems)


class Trace:
    """Mutable timestamps of one request in flight. Hooks only stamp; nothing else happens here."""

    __slots__ = ("kind", "agent", "round", "call", "request_id", "messages", "prompt_bytes",
                 "prompt_tokens", "t", "reused", "chunks", "token_chunks", "comments", "last_token",
                 "max_gap", "max_gap_at", "stalled_phase", "stalled_at", "gave_up", "timeout_cm",
                 "bytes_in", "server_first_token_ns", "bad_events", "id_sent", "conversation", "body", "idle_ns",
                 "first_output",
                 "token_reads", "server", "group", "traceparent")

    def __init__(self, kind: str, agent: int, round_: int, call: int, request_id: str,
                 messages: int, prompt_bytes: int, prompt_tokens: int, intended: int | None = None,
                 conversation: int = 0):
        self.kind = kind
        self.conversation = conversation
        self.agent = agent
        self.round = round_
        self.call = call
        self.request_id = request_id
        self.messages = messages
        self.prompt_bytes = prompt_bytes
        self.prompt_tokens = prompt_tokens
        self.t: dict[str, int] = {}
        if intended is not None:
            self.t["intended"] = intended
        self.reused: bool | None = None
        self.chunks = 0
        self.token_chunks = 0
        self.comments = 0
        self.bytes_in = 0
        self.last_token = 0
        self.max_gap = 0
        self.max_gap_at = 0
        self.stalled_phase: str | None = None
        self.stalled_at = 0
        self.gave_up = False
        self.timeout_cm: Any = None  # asyncio.Timeout the watchdog fires on give-up
        self.server_first_token_ns: int | None = None  # the server's own send stamp, if it sent one
        self.bad_events = 0  # malformed events in the response (set by the read path)
        self.id_sent: str | None = None  # the request id header's value, if one was sent
        self.body: Any = None  # the request's body while it connects (the transport may park it)
        self.idle_ns: int | None = None  # a reused connection: how long it sat idle in the pool before this request
        self.first_output: str | None = None  # what the first token was: text, tool or reasoning
        self.token_reads = 0  # network reads that carried at least one token (set by the read path)
        self.server: str | None = None  # the response's Server header
        self.group: int | None = None  # the agent's prefix group ([conversation] prefix_groups)
        self.traceparent: str | None = None  # the W3C traceparent header sent

    def phase(self) -> str:
        """The phase the request is in now."""
        return phase_at(self.t, self.reused)

    def progress_ns(self) -> int:
        """When the request last made progress: entering its phase, or its last token."""
        t = self.t
        for k in PROGRESS_STAMPS:  # the phase table's opening stamps, latest first
            if k in t:
                return self.last_token if k == "first_token" else t[k]
        return 0


@dataclass(frozen=True, slots=True)
class Record:
    v: int
    run: str
    kind: str  # "agent", "canary", or one of PROBE_KINDS
    agent: int
    round: int
    call: int  # attempt within the round (retries after a give-up count up)
    request_id: str
    messages: int
    prompt_bytes: int
    prompt_tokens: int  # agentload's estimate (the mock counts the same way)
    server_prompt_tokens: int | None
    output_tokens: int | None
    status: int | None
    outcome: str  # ok | error | stalled | cut_short
    error: str | None  # error class, e.g. ServerDisconnectedError, http_500, stall_give_up
    error_msg: str | None
    stalled_phase: str | None  # set when no progress for stall.after_s, even if it finished later
    reused: bool | None  # keep-alive connection reused (True) or new (False)
    finish_reason: str | None
    tool_calls: int
    chunks: int
    token_chunks: int
    comments: int  # SSE comment lines such as ": ping" (bytes, not progress)
    max_gap_ns: int  # largest gap between two token chunks (a cut body: also its silence before the cut)
    max_gap_at: int  # stamp of the chunk that ended that gap
    t: dict[str, int] = field(default_factory=dict)
    # The server's perf_counter_ns when it sent the first token, where the server stamps it
    # (agentload's mock and bench/server.py put "mock_sent_ns" in that chunk). Same host, same
    # CLOCK_MONOTONIC: t["first_token"] - server_first_token_ns is agentload's timing error.
    server_first_token_ns: int | None = None
    # Malformed events in the response (not JSON, not a JSON object, a wrong-shaped field such as
    # a "usage" that is not an object), counted even when the request is otherwise ok.
    bad_events: int = 0
    # The value of the request id header as sent (`[target] request_id_header`; by default a UUID
    # derived from request_id, see agentload.run.request.sent_request_id): what a server's or
    # router's log shows, so its lines join to this record. None: no id header was sent.
    id_sent: str | None = None
    # The backend that answered, as it names itself in `system_fingerprint` (agentload's mock puts
    # its name there; routers pass the field through), so records attribute requests to backends.
    backend: str | None = None
    # usage.prompt_tokens_details.cached_tokens, where the server reports it (vLLM, SGLang, the mock
    # with its prefix cache): the prompt tokens the server did not have to compute again.
    cached_tokens: int | None = None
    # Which conversation of this agent (0, 1, ...): a closed-loop agent with `agents.restart`
    # starts a new conversation, round 1 again, when it finished one.
    conversation: int = 0
    # The shard that ran this request (`--ray`, `merge`): its stamps were moved onto the driver's
    # clock by the shard's estimated offset (run.json `shards` gives each offset's uncertainty).
    shard: int | None = None
    # On a reused keep-alive connection: how long it sat idle in the client's pool between the end of
    # the previous answer on it and this request taking it (None: a new connection, or not known).
    # A reuse that failed before any answer is judged by it: a few milliseconds is a server that
    # closes after each answer, seconds past what worked is a keep-alive timeout.
    idle_ns: int | None = None
    # What the first output was (the one that stamped first_token): "text", "tool" (a tool call's name
    # or arguments) or "reasoning" (thinking); None: no output came.
    first_output: str | None = None
    # Network reads that carried at least one token: token_chunks / token_reads is how many token
    # chunks came in one read (a buffering proxy delivers a whole answer, or ~4 KB, at once).
    # 0: not known (a record written before it was counted) or no token.
    token_reads: int = 0
    # The response's `Server` header (its first 100 characters): which layer answered (a proxy's
    # 504 or 503 says `nginx/1.22.1`, the mock `Python/3.x aiohttp/3.x`). None: none sent, no response.
    server: str | None = None
    # [conversation] prefix_groups: the group whose system prompt and tools the agent shares (None: none)
    group: int | None = None
    # The W3C `traceparent` sent (`[target] traceparent`): trace id per conversation, span id per request
    traceparent: str | None = None
    # What a stream did against the protocol without keeping its answer from being read, one
    # `code: detail` line each (`agentload.run.answer.protocol_notes`): `events_after_done` (data
    # events after [DONE], never part of the answer), `held_open_after_done` (the body was still open
    # past [DONE]; agentload ended the read and closed the connection). None: nothing.
    protocol: list[str] | None = None
    # Why the answer's tool calls could not be sent back as they came, one `code: detail` line each
    # (`agentload.run.apis.tool_calls.ToolCalls.problems`): `truncated` (finish_reason length
    # where a tool call was expected), `bad_arguments`, `no_id`, `no_name`, `ids_on_one_index`. In
    # mode model the agent's conversation ends on any but a lone `truncated` (agent.py). None: none.
    tool_call_problems: list[str] | None = None
    # The wait an HTTP error's `Retry-After` asked for, in seconds (an HTTP date counted from the
    # response's `Date`); None: the answer had none.
    retry_after_s: float | None = None

    @classmethod
    def from_trace(cls, run: str, tr: Trace, *, outcome: str, status: int | None = None,
                   error: str | None = None, error_msg: str | None = None,
                   server_prompt_tokens: int | None = None, output_tokens: int | None = None,
                   finish_reason: str | None = None, tool_calls: int = 0, backend: str | None = None,
                   cached_tokens: int | None = None, protocol: list[str] | None = None,
                   tool_call_problems: list[str] | None = None,
                   retry_after_s: float | None = None) -> "Record":
        build = _build if cls is Record else cls  # (a subclass: its own __init__)
        return build(RECORD_VERSION, run, tr.kind, tr.agent, tr.round, tr.call, tr.request_id,
                     tr.messages, tr.prompt_bytes, tr.prompt_tokens, server_prompt_tokens,
                     output_tokens, status, outcome, error, error_msg, tr.stalled_phase, tr.reused,
                     finish_reason, tool_calls, tr.chunks, tr.token_chunks, tr.comments,
                     tr.max_gap, tr.max_gap_at, dict(tr.t), tr.server_first_token_ns, tr.bad_events,
                     tr.id_sent, backend, cached_tokens, tr.conversation, None, tr.idle_ns, tr.first_output,
                     tr.token_reads, tr.server, tr.group, tr.traceparent, protocol, tool_call_problems,
                     retry_after_s)

    def to_json(self) -> bytes:
        return orjson.dumps(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Record":
        # Fields added after version 1 have defaults: older records load without them.
        if tuple(d) == _FIELDS:  # every field in order (as written): the usual case, positional
            return _build(*d.values()) if cls is Record else cls(*d.values())
        return cls(**{k: d[k] for k in _FIELDS if k in d or k not in _OPTIONAL})

    # ---- derived values (never stored)

    def phase_ns(self, phase: str) -> int | None:
        return phase_ns(self.t, phase, self.reused)


_FIELDS = tuple(Record.__dataclass_fields__)


def _builder() -> Any:
    """`Record(*values)` (every field, in order) without the frozen dataclass's `__init__`, which
    goes through `object.__setattr__` once per field: each slot set by its own descriptor (a third
    of the cost; one record per request). The record is as frozen as any other."""
    names = [f"_set_{f}" for f in _FIELDS]
    ns: dict[str, Any] = {"_new": object.__new__, "_Record": Record}
    ns.update({n: Record.__dict__[f].__set__ for n, f in zip(names, _FIELDS)})
    args = ", ".join(_FIELDS)
    body = "".join(f"    {n}(self, {f})\n" for n, f in zip(names, _FIELDS))
    exec(f"def build({args}):\n    self = _new(_Record)\n{body}    return self\n", ns)
    return ns["build"]


_build = _builder()
_OPTIONAL = frozenset({"server_first_token_ns", "bad_events", "id_sent", "backend", "cached_tokens",
                       "conversation", "shard", "idle_ns", "first_output", "token_reads", "server",
                       "group", "traceparent", "protocol",
                       "tool_call_problems", "retry_after_s"})


class RecordWriter:
    """Appends one line per record to an O_APPEND descriptor, whole lines per write(2).

    Without a loop each record is one write(2). With the run's event loop (`loop`), the records
    finished in one loop step are written together, in one write(2) at the end of that step
    (`call_soon`): a burst of answers that arrive in one read costs one syscall, not one each
    (~7 us a record in a run). A run killed with SIGKILL loses at most the records of the step it
    was killed in; a stop by signal, a crash or the run's end flushes them (`close`). Lines are
    never split across writes, so readers that tail the file (`--ray`, `--workers`) see whole lines.
    """

    def __init__(self, path: Path, loop: asyncio.AbstractEventLoop | None = None):
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.count = 0
        self._loop = loop
        self._pending: list[bytes] = []
        self._failed: OSError | None = None  # a batched write that failed: raised by the next write

    def write(self, rec: Record) -> None:
        if self._failed is not None:
            e, self._failed = self._failed, None
            raise e
        line = orjson.dumps(rec, option=orjson.OPT_APPEND_NEWLINE)
        if redact.has_secrets():  # a server may echo the API key in its error body
            line = _redacted_line(rec, line)
        self.count += 1
        if self._loop is None or self.fd < 0:
            _write_all(self.fd, line)
            return
        pending = self._pending
        pending.append(line)
        if len(pending) == 1:
            self._loop.call_soon(self.flush)

    def flush(self) -> None:
        """Write the lines still held (the records of the current loop step)."""
        pending = self._pending
        if pending and self.fd >= 0:
            n = len(pending)
            data = pending[0] if n == 1 else b"".join(pending)
            pending.clear()
            try:
                _write_all(self.fd, data)
            except OSError as e:  # (in a loop callback: raised to the next writer, who records it)
                self._failed = e
                self.count -= n  # run.json's count is of the lines on disk

    def close(self) -> None:
        if self.fd >= 0:
            try:
                self.flush()
            finally:
                os.close(self.fd)
                self.fd = -1
            if self._failed is not None:
                raise self._failed


def _write_all(fd: int, data: bytes) -> None:
    # a regular file takes the whole buffer but for a full disk or a signal in the middle; then the rest
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def redact_record(rec: Record) -> Record:
    """`rec` with every known secret hidden in the text a server can put there."""
    msg, fin = redact.redact(rec.error_msg or ""), redact.redact(rec.finish_reason or "")
    if msg == (rec.error_msg or "") and fin == (rec.finish_reason or ""):
        return rec
    return dataclasses.replace(rec, error_msg=msg if rec.error_msg is not None else None,
                               finish_reason=fin if rec.finish_reason is not None else None)


def _redacted_line(rec: Record, line: bytes) -> bytes:
    # field by field (that also hides a key cut off at the end of a truncated error body), then the
    # whole line, so no other field can carry one either
    red = redact_record(rec)
    if red is not rec:
        line = orjson.dumps(red, option=orjson.OPT_APPEND_NEWLINE)
    return redact.redact_bytes(line)


@dataclass
class LoadedRecords:
    records: list[Record]
    torn_lines: int  # lines that did not parse (a run killed mid-write)


def iter_record_dicts(path: Path) -> Iterator[dict[str, Any] | None]:
    with open(path, "rb") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                d = orjson.loads(line)
            except orjson.JSONDecodeError:
                yield None
                continue
            yield d if isinstance(d, dict) else None


def load_records(path: Path) -> LoadedRecords:
    recs: list[Record] = []
    torn = 0
    for d in iter_record_dicts(path):
        if d is None:
            torn += 1
            continue
        try:
            recs.append(Record.from_dict(d))
        except (TypeError, KeyError):
            torn += 1
    return LoadedRecords(recs, torn)
