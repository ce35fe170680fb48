"""OTLP export: a real OTLP/HTTP receiver (aiohttp, loopback, in this test process) decodes what
`agentload run --otlp-endpoint` and `agentload report --otlp-endpoint` send with the official
`opentelemetry-proto` messages, and the spans are checked against the run's own records.

Also: a collector that is down or never answers is one line and leaves the reports written; a
process where opentelemetry cannot be imported says in one line how to get the extra and still
finishes the run.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import threading

import orjson
import pytest

from agentload.records import PHASES, load_records
from helpers import REPO, cli

pytest.importorskip("opentelemetry.proto.collector.trace.v1.trace_service_pb2")

from aiohttp import web  # noqa: E402
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (  # noqa: E402
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status  # noqa: E402

FIXTURE = REPO / "tests" / "data" / "report-fixture"


class Receiver:
    """An OTLP/HTTP traces endpoint on a loopback port, served from its own thread and event loop.
    `hang`: accept each request and never answer (a collector that is stuck)."""

    def __init__(self, hang: bool = False):
        self.requests: list[ExportTraceServiceRequest] = []
        self.content_types: list[str] = []
        self.hang = hang
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()
        assert self.ready.wait(10), "receiver did not start"

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.release = asyncio.Event()
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_post("/v1/traces", self._traces)
        self.runner = web.AppRunner(app)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]
        self.ready.set()
        self.loop.run_forever()

    async def _traces(self, request: web.Request) -> web.Response:
        if self.hang:
            await self.release.wait()  # (set on close, so the server can stop)
            return web.Response(status=503)
        body = await request.read()
        self.content_types.append(request.content_type)
        req = ExportTraceServiceRequest()
        req.ParseFromString(body)
        self.requests.append(req)
        return web.Response(body=ExportTraceServiceResponse().SerializeToString(),
                            content_type="application/x-protobuf")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def spans(self) -> list[Span]:
        return [s for r in self.requests for rs in r.resource_spans for ss in rs.scope_spans for s in ss.spans]

    def close(self) -> None:
        async def stop():
            self.release.set()
            await self.runner.cleanup()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def _attrs(span) -> dict:
    out = {}
    for kv in span.attributes:
        v = kv.value
        kind = v.WhichOneof("value")
        out[kv.key] = [x.string_value for x in v.array_value.values] if kind == "array_value" else getattr(v, kind)
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _check_spans_against_records(spans, records, meta) -> None:
    requests = [s for s in spans if s.kind == Span.SpanKind.SPAN_KIND_CLIENT]
    roots = {s.span_id: s for s in spans if s.kind == Span.SpanKind.SPAN_KIND_INTERNAL}
    assert len(requests) == len(records) and len(spans) == len(requests) + len(roots)
    by_id = {r.request_id: r for r in records}
    t0_unix_ns = int(meta["t0_unix"] * 1e9)
    for s in requests:
        a = _attrs(s)
        rec = by_id[a["agentload.request_id"]]
        _, trace_id, span_id, _ = rec.traceparent.split("-")
        assert (s.trace_id.hex(), s.span_id.hex()) == (trace_id, span_id)  # joins what the servers received
        root = roots[s.parent_span_id]  # a child of its conversation's root span, in the same trace
        assert root.trace_id == s.trace_id and root.start_time_unix_nano <= s.start_time_unix_nano
        assert s.start_time_unix_nano - t0_unix_ns == rec.t["start"] - meta["t0_ns"]  # on the run's wall clock
        assert s.end_time_unix_nano - s.start_time_unix_nano == max(rec.t.values()) - rec.t["start"]
        assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.request.model"] == "mock-model"
        assert a["gen_ai.provider.name"] == a["gen_ai.system"] == "openai"
        assert a["server.address"] == "127.0.0.1" and a["server.port"] > 0
        assert (a["agentload.agent"], a["agentload.round"], a["agentload.kind"]) == (rec.agent, rec.round, rec.kind)
        assert a.get("gen_ai.usage.input_tokens") == rec.server_prompt_tokens
        assert a.get("gen_ai.usage.output_tokens") == rec.output_tokens
        events = [e.name for e in s.events]
        assert events and set(events) <= set(PHASES) and events[0] in ("pool_wait", "connect", "send")
        assert all(s.start_time_unix_nano <= e.time_unix_nano <= s.end_time_unix_nano for e in s.events)
        if rec.outcome == "ok":
            assert s.status.code == Status.STATUS_CODE_UNSET and "error.type" not in a
            assert a["gen_ai.response.finish_reasons"] == [rec.finish_reason]
            assert events[-3:] == ["ttfb", "ttft", "stream"]
        if rec.outcome == "stalled":
            assert s.status.code == Status.STATUS_CODE_ERROR and a["error.type"] == rec.error == "stall_give_up"
            assert a["agentload.stalled_phase"] == rec.stalled_phase
            stalled = [e for e in s.events if any(kv.key == "agentload.phase.stalled" for kv in e.attributes)]
            assert [e.name for e in stalled] == [rec.stalled_phase]
    assert {s.trace_id.hex() for s in requests} == {r.traceparent.split("-")[1] for r in records}


@pytest.mark.slow
def test_a_run_sends_a_span_per_request_to_a_real_otlp_receiver(tmp_path, receiver):
    out = tmp_path / "run"
    res = cli("run", "stall-after-headers", "--no-live", "--fail-on", "never", "--out", str(out),
              "--otlp-endpoint", receiver.url, "--set", "agents.count=3", "--set", "stall.after_s=0.5",
              "--set", "stall.give_up_s=1.0", "--set", "canary.every_s=0.3", timeout=120)
    assert res.returncode == 0, res.stderr
    records = load_records(out / "records.jsonl").records
    meta = orjson.loads((out / "run.json").read_bytes())
    assert {r.outcome for r in records} >= {"ok", "stalled"} and any(r.kind == "canary" for r in records)
    assert all(r.traceparent for r in records)
    spans = receiver.spans()
    assert set(receiver.content_types) == {"application/x-protobuf"}
    _check_spans_against_records(spans, records, meta)
    lines = [ln for ln in res.stderr.splitlines() if "OTLP" in ln]
    assert lines == [f"agentload: OTLP: sent {len(spans)} spans ({len(records)} requests) to {receiver.url}/v1/traces "
                     f"in 1 batch"], res.stderr
    res = receiver.requests[0].resource_spans[0]
    assert _attrs(res.resource)["service.name"] == "agentload" and _attrs(res.resource)["agentload.run"] == meta["run"]


def test_report_sends_an_existing_run_folder(tmp_path, receiver):
    # The fixture was recorded before requests carried a traceparent: the spans get ids of the
    # export's own, a trace per conversation all the same.
    run_dir = tmp_path / "fx"
    shutil.copytree(FIXTURE, run_dir)
    res = cli("report", str(run_dir), "--otlp-endpoint", receiver.url + "/v1/traces", timeout=60)
    assert res.returncode == 0, res.stderr
    assert (run_dir / "report.html").exists()
    records = load_records(run_dir / "records.jsonl").records
    assert not any(r.traceparent for r in records)
    spans = receiver.spans()
    requests = [s for s in spans if s.kind == Span.SpanKind.SPAN_KIND_CLIENT]
    assert sorted(_attrs(s)["agentload.request_id"] for s in requests) == sorted(r.request_id for r in records)
    conversations = {(r.agent, r.conversation) for r in records}
    traces = {(_attrs(s)["agentload.agent"], _attrs(s)["agentload.conversation"]): s.trace_id for s in requests}
    assert len(set(traces.values())) == len(conversations)  # one trace per conversation
    roots = {s.span_id for s in spans if s.kind == Span.SpanKind.SPAN_KIND_INTERNAL}
    assert len(roots) == len(conversations) and {s.parent_span_id for s in requests} == roots
    stalled = [s for s in requests if _attrs(s)["agentload.outcome"] == "stalled"]
    assert len(stalled) == sum(r.outcome == "stalled" for r in records) > 0
    assert all(s.status.code == Status.STATUS_CODE_ERROR and _attrs(s)["error.type"] == "stall_give_up"
               for s in stalled)


def test_batches_are_bounded_and_hold_every_span(tmp_path):
    from agentload.records.rundir import load_run
    from agentload.report.otlp import iter_batches

    data = load_run(FIXTURE)
    n_records = sum(1 for _ in data.iter_records())
    batches = list(iter_batches(data, max_spans=7))
    sizes = [len(b.resource_spans[0].scope_spans[0].spans) for b, _ in batches]
    assert max(sizes) == 7 and sum(n for _, n in batches) == n_records
    ids = [s.span_id for b, _ in batches for s in b.resource_spans[0].scope_spans[0].spans]
    assert len(ids) == len(set(ids)) == sum(sizes) > n_records  # the conversations' roots come too
    one = list(iter_batches(data, max_bytes=1))  # a span alone over the byte bound still goes, one a batch
    assert [len(b.resource_spans[0].scope_spans[0].spans) for b, _ in one] == [1] * sum(sizes)


def test_a_collector_that_is_down_is_one_line_and_the_reports_are_written(tmp_path):
    run_dir = tmp_path / "fx"
    shutil.copytree(FIXTURE, run_dir)
    port = _free_port()
    res = cli("report", str(run_dir), "--otlp-endpoint", f"http://127.0.0.1:{port}", timeout=60)
    assert res.returncode == 1
    assert (run_dir / "report.html").exists() and (run_dir / "summary.json").exists()
    lines = [ln for ln in res.stderr.splitlines() if "OTLP" in ln]
    assert len(lines) == 1 and "cannot connect" in lines[0] and "Traceback" not in res.stderr, res.stderr


def test_a_collector_that_never_answers_is_cut_off_by_the_timeout(tmp_path):
    run_dir = tmp_path / "fx"
    shutil.copytree(FIXTURE, run_dir)
    meta = orjson.loads((run_dir / "run.json").read_bytes())
    meta["scenario"]["export"] = {"otlp_endpoint": None, "otlp_timeout_s": 0.5}
    (run_dir / "run.json").write_bytes(orjson.dumps(meta))
    stuck = Receiver(hang=True)
    try:
        res = cli("report", str(run_dir), "--otlp-endpoint", stuck.url, timeout=60)
    finally:
        stuck.close()
    assert res.returncode == 1
    lines = [ln for ln in res.stderr.splitlines() if "OTLP" in ln]
    assert len(lines) == 1 and "no answer within [export] otlp_timeout_s = 0.5 s" in lines[0], res.stderr


def test_bad_endpoints_are_refused_before_anything_runs(tmp_path):
    res = cli("run", "demo", "--no-live", "--out", str(tmp_path / "r"), "--otlp-endpoint", "localhost:4318")
    assert res.returncode == 2 and res.stderr.count("\n") == 1
    assert "export.otlp_endpoint" in res.stderr and "http://" in res.stderr
    assert not (tmp_path / "r").exists()
    res = cli("report", str(FIXTURE), "--otlp-endpoint", "http://user:hunter2pass@127.0.0.1:4318")
    assert res.returncode == 2 and "hunter2pass" not in res.stderr and "without credentials" in res.stderr


_WITHOUT_OTEL = """
import sys
sys.modules["opentelemetry"] = None  # `import opentelemetry...` raises ImportError: the extra is not installed
from agentload.cli import app
sys.argv = ["agentload", *sys.argv[1:]]
app()
"""


def test_without_the_extra_a_run_says_how_to_get_it_in_one_line_and_completes(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "run"
    res = subprocess.run([sys.executable, "-c", _WITHOUT_OTEL, "run", "demo", "--no-live", "--out", str(out),
                          "--set", "agents.count=2", "--set", "agents.rounds=2", "--set", "canary.every_s=0",
                          "--otlp-endpoint", f"http://127.0.0.1:{_free_port()}"],
                         capture_output=True, text=True, timeout=120, cwd=REPO)
    assert res.returncode == 0, res.stderr  # the verdict's status: healthy
    lines = [ln for ln in res.stderr.splitlines() if "otlp" in ln.lower()]
    assert len(lines) == 1 and "pip install 'agentload[otlp]'" in lines[0], res.stderr
    assert (out / "report.html").exists() and len(load_records(out / "records.jsonl").records) == 4
    res = subprocess.run([sys.executable, "-c", _WITHOUT_OTEL, "report", str(out), "--otlp-endpoint",
                          "http://127.0.0.1:4318"], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert res.returncode == 1 and "pip install 'agentload[otlp]'" in res.stderr
