"""agentload's own live state in Prometheus format (`agentload run --metrics-port PORT`).

Served at http://127.0.0.1:PORT/metrics by a tiny aiohttp server on the run's own event loop.
Every scrape reads the run's latest full snapshot (`agentload.run.snapshot`: what the watchdog
counted at the first tick of the current second), never the in-flight registry or the agents: a
scrape costs the same with 10 or 100,000 agents. Bound to loopback only. A soak can then sit on
the same Grafana board as the router it tests. Families (all prefixed `agentload_`):

    agents{round, phase}              agents working, by round and what they wait for
                                      (pool_wait, connect, send, ttfb, ttft, stream, tool, waiting)
    agents_finished{outcome}          conversations ended: done, stalled, error, cut_short, crashed
    requests_in_flight{phase}         agent requests in flight by phase
    requests_stalled{round, phase}    in-flight requests with no progress for stall.after_s
    oldest_request_age_seconds        age of the oldest agent request in flight
    requests_total{outcome}           finished requests: ok, error, stalled, cut_short
    output_tokens_total               tokens received
    pool_connections{state}           client pool: in_use, idle, waiters, limit, opened (total)
    event_loop_lag_seconds            largest event-loop lag since the last sample
    target_scrapes_total{url,result}  scrapes of [target] metrics_urls, ok / failed
    crashes_total                     crashes of agentload itself (agents, background tasks; run.json `crashes`)
    run_info{run, scenario, arrival}  1
plus the standard process_* metrics (RSS, fds, CPU).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator

from aiohttp import web
from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from agentload.errors import UserError
from agentload.run.snapshot import current

if TYPE_CHECKING:
    from agentload.run.context import RunContext


class LiveCollector:
    """Every scrape reads the run's latest full snapshot (`ctx.snapshots.latest_full`: every number
    of one instant, at most a second old): a scrape costs O(rounds x phases), whatever the number
    of agents or requests."""

    def __init__(self, ctx: "RunContext", extra: dict[str, Any] | None = None):
        self.ctx = ctx
        self.extra = extra if extra is not None else {}  # scraper: attached by the runner

    def collect(self) -> Iterator[Any]:
        ctx = self.ctx
        snap = current(ctx, full=True)
        agents = GaugeMetricFamily("agentload_agents", "Agents working, by round and what they wait for",
                                   labels=["round", "phase"])
        for (rnd, ph), n in snap.agents.items():
            agents.add_metric([str(rnd), ph], n)
        yield agents
        fin = GaugeMetricFamily("agentload_agents_finished", "Conversations that ended, by outcome", labels=["outcome"])
        for k in ("done", "stalled", "error", "cut_short", "crashed"):
            fin.add_metric([k], snap.finished.get(k, 0))
        yield fin

        inflight = GaugeMetricFamily("agentload_requests_in_flight", "Agent requests in flight by phase", labels=["phase"])
        for ph, n in sorted(snap.inflight.items()):
            inflight.add_metric([ph], n)
        yield inflight
        stalled = GaugeMetricFamily("agentload_requests_stalled",
                                    "In-flight requests with no progress for stall.after_s, by round and phase",
                                    labels=["round", "phase"])
        for (rnd, ph), n in snap.stalled.items():
            stalled.add_metric([str(rnd), ph], n)
        yield stalled
        yield GaugeMetricFamily("agentload_oldest_request_age_seconds", "Age of the oldest agent request in flight",
                                value=snap.oldest.age_s if snap.oldest is not None else 0.0)

        c = snap.counts
        req = CounterMetricFamily("agentload_requests", "Finished agent requests by outcome", labels=["outcome"])
        for k in ("ok", "error", "stalled", "cut_short"):
            req.add_metric([k], c.get(k, 0))
        yield req
        yield CounterMetricFamily("agentload_output_tokens", "Output tokens received", value=c.get("output_tokens", 0))

        pool = snap.pool
        pg = GaugeMetricFamily("agentload_pool_connections", "Client pool: connections in use, idle, waiters "
                               "queued, the limit (0 = unlimited) and connections opened so far", labels=["state"])
        for k in ("in_use", "idle", "waiters", "limit", "opened"):
            if k in pool:
                pg.add_metric([k], pool[k])
        yield pg
        yield GaugeMetricFamily("agentload_event_loop_lag_seconds", "Largest event-loop lag in the current sample",
                                value=max(snap.lag_ms, 0.0) / 1000.0)
        scraper = self.extra.get("scraper")
        if scraper is not None:
            sc = CounterMetricFamily("agentload_target_scrapes", "Scrapes of [target] metrics_urls",
                                     labels=["url", "result"])
            for url, st in scraper.state().items():
                sc.add_metric([url, "ok"], st["ok"])
                sc.add_metric([url, "failed"], st["failed"])
            yield sc
        yield CounterMetricFamily("agentload_crashes", "Crashes of agentload itself: agents, background tasks, "
                                  "the run loop (run.json crashes)", value=snap.crashes)
        a = ctx.scenario.agents
        yield _info(ctx.run_id, ctx.scenario.source, a.arrival)


def _info(run: str, scenario: str, arrival: str) -> GaugeMetricFamily:
    g = GaugeMetricFamily("agentload_run_info", "The run", labels=["run", "scenario", "arrival"])
    g.add_metric([run, scenario, arrival], 1)
    return g


class Exporter:
    """Serves the registry at 127.0.0.1:port/metrics on the running loop."""

    def __init__(self, ctx: "RunContext", port: int, host: str = "127.0.0.1"):
        self.collector = LiveCollector(ctx)
        self.registry = CollectorRegistry()
        self.registry.register(self.collector)
        ProcessCollector(registry=self.registry)
        self.host = host
        self.port = port
        self._runner: web.AppRunner | None = None

    async def start(self) -> int:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/", self._metrics)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
        try:
            await site.start()
        except OSError as e:
            await self._runner.cleanup()
            self._runner = None
            raise UserError(f"--metrics-port {self.port}: cannot listen on {self.host}:{self.port} ({e.strerror or e})") from e
        self.port = self._runner.addresses[0][1]
        return self.port

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.registry), headers={"Content-Type": CONTENT_TYPE_PLAIN_0_0_4})

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
