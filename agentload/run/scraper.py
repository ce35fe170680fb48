"""Scrape the target's Prometheus endpoints during a run -> RUN_DIR/target_metrics.jsonl.

`[target] metrics_urls = [...]` (a router such as smg, vLLM or SGLang engines) are scraped every
`[target] metrics_every_s`, each with a bounded timeout and a bounded body, on their own small
HTTP pool (never the agents'; with `[target] metrics_api_key_env`, that variable's value goes to
these URLs as `Authorization: Bearer`), and parsed with prometheus-client's text parser in a worker
thread so a big metrics page does not lag the event loop that stamps the agents' requests.

One JSON line per scrape and URL, timestamped with `time.perf_counter_ns()` like the records,
so the two line up on one time axis (`run.json` `t0_ns` is the common origin):

    {"t": <ns when the body was read>, "t_start": <ns when the GET went out>, "url": "...",
     "ms": 3.2, "full": true, "v": {"smg_worker_requests_active{worker=\"http://...\"}": 6.0, ...}}
    {"t": ..., "url": "...", "error": "ClientConnectorError: ..."}

To keep hours of scrapes small, a line holds every series only when `full` is true (the first
scrape of a URL and every FULL_EVERY-th after); the others hold the series whose value changed
(`v`) and the ones that disappeared (`gone`). `agentload.records.target_metrics.load_target_metrics`
reads it back into series. Memory is bounded by the number of series, not the run's length.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from agentload.errors import drop_tracebacks
from agentload.redact import add_secret, redact

_now = time.perf_counter_ns

FINAL_SCRAPE_SETTLE_S = 0.5  # wait after the last request before the last scrape

FULL_EVERY = 60  # a full snapshot every this many scrapes of one URL
MAX_BODY_BYTES = 16 * 1024 * 1024
MAX_TIMEOUT_S = 10.0


def series_key(name: str, labels: dict[str, str]) -> str:
    """`name{a="x",b="y"}` with sorted labels and exposition-format escaping."""
    if not labels:
        return name
    parts = []
    for k in sorted(labels):
        v = labels[k].replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        parts.append(f'{k}="{v}"')
    return name + "{" + ",".join(parts) + "}"


def parse_exposition(text: str) -> dict[str, float | None]:
    """Every sample of a Prometheus text page as {series_key: value} (NaN/Inf -> None)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float | None] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            v = float(s.value)
            out[series_key(s.name, s.labels)] = v if math.isfinite(v) else None
    return out


class TargetScraper:
    """Scrapes `urls` every `every_s` until cancelled; one JSONL line per scrape per URL."""

    def __init__(self, urls: list[str], every_s: float, path: Path, timeout_s: float | None = None,
                 api_key: str | None = None):
        self.urls = list(urls)
        # `[target] metrics_api_key_env`'s value, sent as a bearer token to these URLs only (LiteLLM's
        # proxy serves /metrics behind its master key); held in memory, never written
        self._headers = {"Accept": "text/plain"}
        if api_key:
            add_secret(api_key)
            self._headers["Authorization"] = f"Bearer {api_key}"
        self.every_s = max(0.2, float(every_s))
        self.timeout_s = min(timeout_s or self.every_s, MAX_TIMEOUT_S)
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.last: dict[str, dict[str, float | None]] = {u: {} for u in self.urls}
        self.n: dict[str, int] = {u: 0 for u in self.urls}
        self.ok: dict[str, int] = {u: 0 for u in self.urls}
        self.failed: dict[str, int] = {u: 0 for u in self.urls}
        self._session: aiohttp.ClientSession | None = None

    def _write(self, line: dict[str, Any]) -> None:
        os.write(self.fd, orjson.dumps(line, option=orjson.OPT_APPEND_NEWLINE))

    async def _fetch(self, url: str) -> str:
        assert self._session is not None
        async with self._session.get(url, headers=self._headers) as resp:
            if resp.status != 200:
                raise RuntimeError(f"HTTP {resp.status}")
            body = await resp.content.read(MAX_BODY_BYTES + 1)
            if len(body) > MAX_BODY_BYTES:
                raise RuntimeError(f"metrics page larger than {MAX_BODY_BYTES} bytes")
            return body.decode("utf-8", "replace")

    async def scrape(self, url: str) -> None:
        t_start = _now()
        try:
            text = await asyncio.wait_for(self._fetch(url), self.timeout_s)
            t = _now()
            values = await asyncio.to_thread(parse_exposition, text)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a target that cannot be scraped is a fact, never a crash
            self.failed[url] += 1
            msg = redact(f"{type(e).__name__}: {e}".replace("\n", " ")[:300])
            if isinstance(e, (TimeoutError, asyncio.TimeoutError)):
                msg = f"timeout after {self.timeout_s:g} s"
            self._write({"t": _now(), "t_start": t_start, "url": url, "error": msg})
            drop_tracebacks(e)
            return
        self.ok[url] += 1
        prev = self.last[url]
        full = self.n[url] % FULL_EVERY == 0
        self.n[url] += 1
        line: dict[str, Any] = {"t": t, "t_start": t_start, "url": url, "ms": round((t - t_start) / 1e6, 3),
                                "full": full}
        if full:
            line["v"] = values
        else:
            line["v"] = {k: v for k, v in values.items() if k not in prev or prev[k] != v}
            gone = [k for k in prev if k not in values]
            if gone:
                line["gone"] = gone
        self.last[url] = values
        self._write(line)

    def _open(self) -> None:
        if self._session is None:
            timeout = aiohttp.ClientTimeout(total=self.timeout_s, connect=self.timeout_s, sock_read=self.timeout_s)
            connector = aiohttp.TCPConnector(limit=max(2, len(self.urls)),
                                             keepalive_timeout=max(30.0, 2 * self.every_s))
            self._session = aiohttp.ClientSession(timeout=timeout, connector=connector, trust_env=False)

    async def baseline(self) -> None:
        """One scrape of every URL before any agent request (bounded by the scrape timeout): the
        counters' values before the load, so differences over the run count only the run's own
        requests (a router's routed-minus-ended attempts, for one)."""
        self._open()
        await asyncio.gather(*(self.scrape(u) for u in self.urls))
        self.baseline_done = True

    async def run(self) -> None:
        self._open()
        try:
            start = time.monotonic()
            tick = 0
            if getattr(self, "baseline_done", False):  # the first scrape was the baseline
                tick = 1
                await asyncio.sleep(self.every_s)
            while True:
                await asyncio.gather(*(self.scrape(u) for u in self.urls))
                tick += 1
                # on a fixed schedule: a slow scrape does not push every later one back
                delay = start + tick * self.every_s - time.monotonic()
                if delay < 0:
                    tick += int(-delay // self.every_s) + 1
                    delay = start + tick * self.every_s - time.monotonic()
                await asyncio.sleep(max(0.0, delay))
        finally:
            if self._session is not None:
                await self._session.close()
                self._session = None

    async def aclose(self) -> None:
        """One last scrape after the last request (a router counts an outcome when a stream ends:
        the final failures would be missed otherwise), bounded by the scrape timeout; then close."""
        try:
            if self.fd >= 0:
                self._open()
                # a router lowers its in-flight gauges when it sees the stream's end, a moment after
                # agentload does: scraped at once, a healthy router could read as leaking (router_leak)
                await asyncio.sleep(FINAL_SCRAPE_SETTLE_S)
                await asyncio.gather(*(self.scrape(u) for u in self.urls))
        finally:
            if self._session is not None:
                await self._session.close()
                self._session = None
            self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def state(self) -> dict[str, dict[str, int]]:
        return {u: {"ok": self.ok[u], "failed": self.failed[u]} for u in self.urls}
