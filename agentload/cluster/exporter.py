"""One `--metrics-port` for a run in shards (`--workers N`, `--ray`): the latest sample of every
shard in Prometheus format, each series with a `shard` label.

Served by the supervising process (the `--workers` parent, the Ray driver) on 127.0.0.1 from its
own thread; a scrape reads only the latest sample each shard wrote (one a second), so it costs the
same whatever the load. Families (prefixed `agentload_`, as the one-process exporter's):

    shard_up{shard}                         1 while the shard runs (0: lost, or not heard from)
    requests_total{shard, outcome}          finished requests: ok, error, stalled, cut_short
    output_tokens_total{shard}              tokens received
    requests_in_flight{shard, phase}        agent requests in flight by phase
    requests_stalled{shard}                 in-flight requests with no progress for stall.after_s
    pool_connections{shard, state}          the shard's client pool: in_use, idle, waiters, limit, opened
    event_loop_lag_seconds{shard}           the shard's largest loop lag in its last sample
    process_resident_memory_bytes{shard}    the shard's RSS
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from agentload.errors import UserError

# (shard, its latest sample or None, up)
Latest = Callable[[], list[tuple[int, dict[str, Any] | None, bool]]]


class ShardsCollector:
    def __init__(self, latest: Latest):
        self.latest = latest

    def collect(self) -> Iterator[Any]:
        rows = self.latest()
        up = GaugeMetricFamily("agentload_shard_up", "1 while the shard runs", labels=["shard"])
        req = CounterMetricFamily("agentload_requests", "Finished requests by outcome", labels=["shard", "outcome"])
        tok = CounterMetricFamily("agentload_output_tokens", "Tokens received", labels=["shard"])
        fly = GaugeMetricFamily("agentload_requests_in_flight", "Agent requests in flight by phase",
                                labels=["shard", "phase"])
        stl = GaugeMetricFamily("agentload_requests_stalled", "In-flight requests with no progress for stall.after_s",
                                labels=["shard"])
        pool = GaugeMetricFamily("agentload_pool_connections", "Client pool connections", labels=["shard", "state"])
        lag = GaugeMetricFamily("agentload_event_loop_lag_seconds", "Largest loop lag in the last sample",
                                labels=["shard"])
        rss = GaugeMetricFamily("agentload_process_resident_memory_bytes", "The shard's RSS", labels=["shard"])
        for shard, s, alive in rows:
            k = str(shard)
            up.add_metric([k], 1.0 if alive and s is not None else 0.0)
            if s is None:
                continue
            counts = s.get("counts") or {}
            for outcome in ("ok", "error", "stalled", "cut_short"):
                req.add_metric([k, outcome], float(counts.get(outcome) or 0))
            tok.add_metric([k], float(counts.get("output_tokens") or 0))
            for phase, n in (s.get("inflight") or {}).items():
                fly.add_metric([k, phase], float(n))
            stl.add_metric([k], float(s.get("stalled") or 0))
            for state in ("in_use", "idle", "waiters", "limit", "opened"):
                v = (s.get("pool") or {}).get(state)
                if v is not None:
                    pool.add_metric([k, state], float(v))
            lag.add_metric([k], float(s.get("loop_lag_ms") or 0.0) / 1000.0)
            mb = (s.get("proc") or {}).get("rss_mb")
            if mb is not None:
                rss.add_metric([k], float(mb) * 1024 * 1024)
        yield from (up, req, tok, fly, stl, pool, lag, rss)


class ShardsExporter:
    """`start()` serves 127.0.0.1:port/metrics (0: a free port) from a thread; `stop()`."""

    def __init__(self, port: int, latest: Latest):
        self.port = port
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(ShardsCollector(latest))
        self.server: Any = None

    def start(self) -> int:
        try:
            self.server, _thread = start_http_server(self.port, addr="127.0.0.1", registry=self.registry)
        except OSError as e:
            raise UserError(f"--metrics-port {self.port}: cannot listen on 127.0.0.1:{self.port} "
                            f"({e.strerror or e})") from None
        self.port = self.server.server_port
        return self.port

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
