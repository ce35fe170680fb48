"""OTLP export: a run's requests as OpenTelemetry spans, sent to a collector over OTLP/HTTP.

`agentload run ... --otlp-endpoint URL` (or `[export] otlp_endpoint`) sends them once the run's
reports are written; `agentload report RUN_DIR --otlp-endpoint URL` sends an existing run folder.
Like every report it is a function of the records: the same folder sends the same spans.

What is sent (protobuf, `POST <URL>/v1/traces`, content-type application/x-protobuf, the official
`opentelemetry-proto` messages; the `otlp` extra):

- a span per request (kind CLIENT, named `chat <model>`): its trace id and span id are the ones
  of the `traceparent` the request carried, so the spans of routers and engines that honour it are
  its children in the same trace. Its parent is a root span per conversation (the trace), named
  `invoke_agent agent N`, from its first request's start to its last one's end. Records without a
  traceparent (`[target] traceparent = false`) get ids of the export's own, from the same keys.
  A run of `agentload proxy`: the traceparent may be the harness's own, so each request span gets an
  id of its own and that span as its parent (no root span).
- on each request span, an event per phase it entered (the phase table's, `request_segments`) at
  the phase's start, with its duration; the phase it stalled in says so.
- the GenAI semantic-convention attributes (`gen_ai.operation.name`, `gen_ai.provider.name` and the
  older `gen_ai.system`, `gen_ai.request.model`, `gen_ai.usage.*`, `gen_ai.response.finish_reasons`,
  `gen_ai.conversation.id`), `server.address` / `server.port`, `http.response.status_code`,
  `error.type` and an error status for a failed or stalled request, and agentload's own
  (`agentload.agent`, `.round`, `.outcome`, `.stalled_phase`, `.error`, ...). Header values are never
  in a record; error texts are redacted again before they leave.

Timestamps: records hold perf_counter_ns on the run's clock; run.json's anchor (`t0_ns` taken
with `t0_unix`) turns them into Unix nanoseconds, as the Perfetto export places them from `t0_ns`.

Sending: batches of at most MAX_BATCH_SPANS spans and about MAX_BATCH_BYTES, one POST each,
every one bounded by the timeout; a collector that answers 429 or 502-504 gets RETRIES more
tries per batch. The first batch that fails ends the export (a collector that is down is one
connection refused, not one per batch), and the result is one line. Nothing here raises past
`export_run`: the run and its reports are written before the export starts.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator
from urllib.parse import urlsplit

from agentload import __version__
from agentload.errors import UserError
from agentload.records import Record
from agentload.records.phases import request_segments
from agentload.records.rundir import RunData, load_run
from agentload.redact import redact

if TYPE_CHECKING:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

MISSING_EXTRA = ("OTLP export skipped: the otlp extra is not installed (pip install 'agentload[otlp]'; "
                 "then `agentload report RUN_DIR --otlp-endpoint URL` sends this run)")
MAX_BATCH_SPANS = 1000
MAX_BATCH_BYTES = 2 * 1024 * 1024  # well under collectors' usual 4 MiB request limit
RETRIES = 2  # more tries of a batch the collector answered 429 or 502-504 to
RETRY_STATUSES = (429, 502, 503, 504)
TRACES_PATH = "/v1/traces"
_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}$")
_ERROR_TEXT_MAX = 500


def otlp_available() -> bool:
    """Is the `otlp` extra (opentelemetry-proto and protobuf) importable?"""
    try:
        _pb()
    except ImportError:
        return False
    return True


def _pb():
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
    from opentelemetry.proto.common.v1 import common_pb2
    from opentelemetry.proto.resource.v1 import resource_pb2
    from opentelemetry.proto.trace.v1 import trace_pb2

    return trace_service_pb2, common_pb2, resource_pb2, trace_pb2


def traces_url(endpoint: str) -> str:
    """Where the spans go: the URL as given when it ends in /v1/traces, else that path appended (as
    OTEL_EXPORTER_OTLP_ENDPOINT is read: a collector's base URL, e.g. http://127.0.0.1:4318)."""
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UserError(f"OTLP endpoint {endpoint!r}: expected an http:// or https:// URL of an OTLP/HTTP collector")
    if parts.path.rstrip("/").endswith(TRACES_PATH):
        return endpoint
    return parts._replace(path=parts.path.rstrip("/") + TRACES_PATH).geturl()


# ---------------------------------------------------------------- records -> spans (pure)


def _id(text: str, size: int) -> bytes:
    return hashlib.blake2b(text.encode(), digest_size=size).digest()


def _tp_ids(tp: str | None) -> tuple[bytes, bytes] | None:
    """(trace id, span id) of a W3C traceparent; None for none or a malformed or all-zero one."""
    m = _TRACEPARENT.match(tp or "")
    if not m or not int(m.group(1), 16) or not int(m.group(2), 16):
        return None
    return bytes.fromhex(m.group(1)), bytes.fromhex(m.group(2))


def _conversation_id(meta: dict[str, Any], rec: Record) -> str:
    return f"{meta.get('run')}-a{rec.agent}-k{rec.conversation}"


@dataclass
class _Root:
    """What a conversation's root span needs, kept while the records stream past (not the records)."""

    trace_id: bytes
    span_id: bytes
    conversation: str
    agent: int
    kind: str
    start: int
    end: int
    requests: int = 0
    failed: int = 0


class SpanBuilder:
    """Turns the records of one run into protobuf spans, one record at a time."""

    def __init__(self, meta: dict[str, Any]):
        _, self.common, self.resource_pb, self.trace = _pb()
        self.meta = meta
        sc = meta.get("scenario") or {}
        target = sc.get("target") or {}
        self.model = str(target.get("model") or "")
        self.api = str(meta.get("api") or target.get("api") or "chat")
        self.provider = "anthropic" if self.api == "messages" else "openai"  # whose API shape was spoken
        self.max_tokens = (sc.get("conversation") or {}).get("max_tokens")
        self.proxy = bool(meta.get("proxy"))
        t0_ns, t0_unix = meta.get("t0_ns"), meta.get("t0_unix")
        if not isinstance(t0_ns, int) or not isinstance(t0_unix, (int, float)):
            raise UserError("run.json: expected t0_ns and t0_unix (the anchor that turns the records' clock into "
                            "wall-clock time)")
        self.offset = int(round(t0_unix * 1e9)) - t0_ns  # perf_counter_ns + offset = Unix ns
        ep = urlsplit(str(meta.get("endpoint") or ""))
        self.server_address = ep.hostname
        try:
            self.server_port = ep.port or {"http": 80, "https": 443}.get(ep.scheme)
        except ValueError:
            self.server_port = None
        self.roots: dict[bytes, _Root] = {}
        self.skipped = 0  # records without a start stamp (nothing to place)

    def _attrs(self, items: dict[str, Any]) -> list[Any]:
        kv, av = self.common.KeyValue, self.common.AnyValue
        out = []
        for k, v in items.items():
            if v is None:
                continue
            if isinstance(v, bool):
                val = av(bool_value=v)
            elif isinstance(v, int):
                val = av(int_value=v)
            elif isinstance(v, float):
                val = av(double_value=v)
            elif isinstance(v, (list, tuple)):
                val = av(array_value=self.common.ArrayValue(values=[av(string_value=str(x)) for x in v]))
            else:
                val = av(string_value=str(v))
            out.append(kv(key=k, value=val))
        return out

    def resource(self) -> Any:
        sc = self.meta.get("scenario") or {}
        return self.resource_pb.Resource(attributes=self._attrs({
            "service.name": "agentload", "service.version": __version__,
            "agentload.run": self.meta.get("run"), "agentload.scenario": sc.get("source"),
        }))

    def scope(self) -> Any:
        return self.common.InstrumentationScope(name="agentload", version=__version__)

    def span(self, rec: Record) -> Any | None:
        """The request's span (None: the record has no start stamp)."""
        t = rec.t
        start = t.get("start")
        if start is None:
            self.skipped += 1
            return None
        end = max(t.values())
        if t.get("end") is not None:
            end = max(end, t["end"])
        conv = _conversation_id(self.meta, rec)
        ids = _tp_ids(rec.traceparent)
        failed = rec.outcome in ("error", "stalled")
        parent = b""
        if ids is None:  # no trace context was sent: ids of the export's own
            trace_id, span_id = _id(conv, 16), _id(rec.request_id, 8)
        elif self.proxy:  # maybe the harness's own span: ours is its child
            trace_id, parent = ids
            span_id = _id(rec.request_id, 8)
        else:
            trace_id, span_id = ids
        if not self.proxy:
            root = self.roots.get(trace_id)
            if root is None:
                root = self.roots[trace_id] = _Root(trace_id, _id("root-" + trace_id.hex(), 8), conv, rec.agent,
                                                    rec.kind, start, end)
            root.start, root.end = min(root.start, start), max(root.end, end)
            root.requests += 1
            root.failed += failed
            parent = root.span_id
        tr = self.trace
        attrs = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": self.provider,
            "gen_ai.system": self.provider,
            "gen_ai.request.model": self.model,
            "gen_ai.request.max_tokens": self.max_tokens if rec.kind == "agent" else None,
            "gen_ai.conversation.id": conv,
            "gen_ai.usage.input_tokens": rec.server_prompt_tokens,
            "gen_ai.usage.output_tokens": rec.output_tokens,
            "gen_ai.usage.cache_read.input_tokens": rec.cached_tokens,
            "gen_ai.response.finish_reasons": [redact(rec.finish_reason)] if rec.finish_reason else None,
            "server.address": self.server_address,
            "server.port": self.server_port,
            "http.response.status_code": rec.status,
            "error.type": (rec.error or rec.outcome) if failed else None,
            "agentload.request_id": rec.request_id,
            "agentload.request_id_sent": rec.id_sent,
            "agentload.kind": rec.kind,
            "agentload.agent": rec.agent,
            "agentload.conversation": rec.conversation,
            "agentload.round": rec.round,
            "agentload.call": rec.call,
            "agentload.outcome": rec.outcome,
            "agentload.error": rec.error,
            "agentload.stalled_phase": rec.stalled_phase,
            "agentload.prompt_tokens_estimate": rec.prompt_tokens,
            "agentload.messages": rec.messages,
            "agentload.tool_calls": rec.tool_calls,
            "agentload.reused_connection": rec.reused,
            "agentload.backend": rec.backend,
            "agentload.prefix_group": rec.group,
            "agentload.schedule_lag_ms": (start - t["intended"]) / 1e6 if "intended" in t else None,
        }
        events = []
        for phase, b, e in request_segments(t):
            ev = {"agentload.phase": phase, "agentload.phase.duration_ms": (e - b) / 1e6}
            if rec.stalled_phase == phase:
                ev["agentload.phase.stalled"] = True
            events.append(tr.Span.Event(time_unix_nano=b + self.offset, name=phase, attributes=self._attrs(ev)))
        if failed:
            msg = redact(rec.error_msg or rec.error or rec.outcome)[:_ERROR_TEXT_MAX]
            status = tr.Status(code=tr.Status.STATUS_CODE_ERROR, message=msg)
        else:
            status = tr.Status(code=tr.Status.STATUS_CODE_UNSET)
        return tr.Span(trace_id=trace_id, span_id=span_id, parent_span_id=parent,
                       name=f"chat {self.model}".strip(), kind=tr.Span.SpanKind.SPAN_KIND_CLIENT,
                       start_time_unix_nano=start + self.offset, end_time_unix_nano=end + self.offset,
                       attributes=self._attrs(attrs), events=events, status=status)

    def root_spans(self) -> Iterator[Any]:
        tr = self.trace
        for r in self.roots.values():
            who = "canaries" if r.kind == "canary" else f"agent {r.agent}"
            yield tr.Span(trace_id=r.trace_id, span_id=r.span_id, name=f"invoke_agent {who}",
                          kind=tr.Span.SpanKind.SPAN_KIND_INTERNAL,
                          start_time_unix_nano=r.start + self.offset, end_time_unix_nano=r.end + self.offset,
                          attributes=self._attrs({
                              "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": who,
                              "gen_ai.conversation.id": r.conversation, "gen_ai.provider.name": self.provider,
                              "gen_ai.request.model": self.model, "agentload.agent": r.agent,
                              "agentload.requests": r.requests, "agentload.failed_requests": r.failed}),
                          status=tr.Status(code=tr.Status.STATUS_CODE_ERROR if r.failed else tr.Status.STATUS_CODE_UNSET))


def iter_batches(data: RunData, max_spans: int = MAX_BATCH_SPANS,
                 max_bytes: int = MAX_BATCH_BYTES) -> Iterator[tuple["ExportTraceServiceRequest", int]]:
    """The run's spans as export requests of bounded size, with the number of request spans in each
    (one pass over the records; the conversations' root spans come last)."""
    ts = _pb()[0]
    b = SpanBuilder(data.meta)
    resource, scope = b.resource(), b.scope()
    spans: list[Any] = []
    size = requests = 0

    def batch():
        req = ts.ExportTraceServiceRequest()
        rs = req.resource_spans.add()
        rs.resource.CopyFrom(resource)
        ss = rs.scope_spans.add()
        ss.scope.CopyFrom(scope)
        ss.spans.extend(spans)
        return req

    def spans_then_roots():
        for rec in data.iter_records():
            sp = b.span(rec)
            if sp is not None:
                yield sp, 1
        for sp in b.root_spans():
            yield sp, 0

    for sp, is_request in spans_then_roots():
        n = sp.ByteSize()
        if spans and (len(spans) >= max_spans or size + n > max_bytes):
            yield batch(), requests
            spans, size, requests = [], 0, 0
        spans.append(sp)
        size += n
        requests += is_request
    if spans:
        yield batch(), requests


# ---------------------------------------------------------------- sending


@dataclass
class ExportResult:
    ok: bool
    line: str  # one line for the person running it
    spans: int = 0
    requests: int = 0
    missing_extra: bool = False


class _SendFailed(Exception):
    pass


def _hint(url: str) -> str:
    try:
        port = urlsplit(url).port
    except ValueError:
        port = None
    return " (4317 is OTLP/gRPC's port; OTLP/HTTP listens on 4318)" if port == 4317 else ""


async def _post(session: Any, url: str, body: bytes, timeout_s: float) -> int:
    """POST one batch; returns the spans the collector said it rejected (partial success)."""
    import aiohttp

    ts = _pb()[0]
    for attempt in range(RETRIES + 1):
        try:
            async with session.post(url, data=body, timeout=aiohttp.ClientTimeout(total=timeout_s),
                                    headers={"Content-Type": "application/x-protobuf"}) as resp:
                payload = await resp.read()
                if resp.status in RETRY_STATUSES and attempt < RETRIES:
                    await asyncio.sleep(min(timeout_s, 0.5 * 2 ** attempt))
                    continue
                if resp.status // 100 != 2:
                    text = " ".join(payload[:200].decode("utf-8", "replace").split()) \
                        if "protobuf" not in (resp.content_type or "") else ""
                    raise _SendFailed(f"the collector answered HTTP {resp.status} {resp.reason or ''}".rstrip()
                                      + (f": {text}" if text else ""))
                if payload and "protobuf" in (resp.content_type or ""):
                    answer = ts.ExportTraceServiceResponse()
                    try:
                        answer.ParseFromString(payload)
                    except Exception:  # (a body that is not the response message: the spans were taken)
                        return 0
                    return int(answer.partial_success.rejected_spans)
                return 0
        except asyncio.TimeoutError:
            raise _SendFailed(f"no answer within [export] otlp_timeout_s = {timeout_s:g} s{_hint(url)}") from None
        except aiohttp.ClientConnectorError as e:
            err = e.os_error
            why = os.strerror(err.errno) if err.errno else (err.strerror or err.__class__.__name__)
            raise _SendFailed(f"cannot connect ({why}; is the collector running?){_hint(url)}") from None
        except aiohttp.ClientError as e:
            raise _SendFailed(f"{e.__class__.__name__}: {e}{_hint(url)}") from None
    raise AssertionError("unreachable")


async def _send_all(data: RunData, url: str, timeout_s: float) -> tuple[int, int, int, int]:
    import aiohttp

    spans = requests = rejected = batches = 0
    async with aiohttp.ClientSession() as session:
        for req, n_requests in iter_batches(data):
            body = req.SerializeToString()
            try:
                rejected += await _post(session, url, body, timeout_s)
            except _SendFailed as e:
                raise _SendFailed(f"{e} (after {spans} spans sent)" if spans else str(e)) from None
            batches += 1
            spans += len(req.resource_spans[0].scope_spans[0].spans)
            requests += n_requests
    return spans, requests, rejected, batches


def export_run(run_dir: Path, endpoint: str, timeout_s: float) -> ExportResult:
    """Send a run folder's spans to an OTLP/HTTP collector; never raises (the result says what happened)."""
    try:
        _pb()
    except ImportError:
        return ExportResult(False, MISSING_EXTRA, missing_extra=True)
    try:
        url = traces_url(endpoint)
        data = load_run(Path(run_dir))
        spans, requests, rejected, batches = asyncio.run(_send_all(data, url, timeout_s))
    except (UserError, _SendFailed) as e:
        return ExportResult(False, redact(f"OTLP export to {endpoint} failed: {e}; the run folder is complete "
                                          f"(`agentload report {run_dir} --otlp-endpoint URL` sends it again)"))
    except KeyboardInterrupt:
        return ExportResult(False, f"OTLP export to {endpoint} interrupted; the run folder is complete")
    line = f"OTLP: sent {spans} spans ({requests} requests) to {url} in {batches} batch{'es' if batches != 1 else ''}"
    if rejected:
        return ExportResult(False, redact(f"{line}; the collector rejected {rejected} of them"), spans, requests)
    return ExportResult(True, redact(line), spans, requests)
