"""Reads RUN_DIR/target_metrics.jsonl back into time series (pure; no network).

For report authors:

    tm = load_target_metrics(run_dir)            # or RunData.target_metrics (read once per run folder)
    tm.urls                                      # the endpoints scraped, in scenario order
    tm.scrapes[url]                              # {"ok": n, "failed": n, "errors": [first few messages]}
    for s in chosen_series(tm):                  # the series worth charting (see CHOSEN)
        s.url, s.name, s.labels, s.t_s, s.values # step series: value holds from t_s[i] to t_s[i+1]
    tm.series[(url, key)].at(t_ns)               # last scraped value at or before t_ns

The chart of these series is agentload.report.target_chart.fig_target_metrics.

Times `t_s` are seconds since the run's `t0_ns` (the records' clock), so they line up with
the timeline of requests. Values are step series: a point where a value changed (plus one at the
last scrape), so hours of scrapes of a mostly idle page stay small.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

FILE = "target_metrics.jsonl"

# Series charted by default (names or name prefixes); `[target] metrics_series` replaces them.
CHOSEN = (
    "smg_worker_requests_active",  # smg: requests in flight per worker URL (real-time gauge)
    "smg_admission_inflight",  # smg: requests holding an admission permit
    "smg_http_connections_active",  # smg: client connections open to the router
    "smg_http_inflight_request_age_count",  # smg: in-flight requests by age bucket (refreshed ~1/min)
    "vllm:num_requests_running", "vllm:num_requests_waiting",  # vLLM engine
    "sglang:num_running_reqs", "sglang:num_queue_reqs",  # SGLang engine
    "llamacpp:requests_processing", "llamacpp:requests_deferred",  # llama.cpp's llama-server (--metrics)
)
# Shown even when they stay 0 the whole run: a zero here is evidence ("router saw nothing").
ALWAYS = ("smg_worker_requests_active", "smg_admission_inflight", "vllm:num_requests_running",
          "sglang:num_running_reqs", "llamacpp:requests_processing")


def parse_key(key: str) -> tuple[str, dict[str, str]]:
    """Inverse of agentload.run.scraper.series_key: `name{a="x"}` -> ("name", {"a": "x"})."""
    brace = key.find("{")
    if brace < 0:
        return key, {}
    name, rest = key[:brace], key[brace + 1:-1]
    labels: dict[str, str] = {}
    i, n = 0, len(rest)
    while i < n:
        eq = rest.index("=", i)
        k = rest[i:eq]
        j = eq + 2  # skip ="
        buf = []
        while j < n and rest[j] != '"':
            if rest[j] == "\\" and j + 1 < n:
                nxt = rest[j + 1]
                buf.append("\n" if nxt == "n" else nxt)
                j += 2
            else:
                buf.append(rest[j])
                j += 1
        labels[k] = "".join(buf)
        i = j + 2  # skip the closing quote and the comma
    return name, labels


@dataclass
class Series:
    url: str
    key: str
    name: str
    labels: dict[str, str]
    t_ns: list[int] = field(default_factory=list)
    values: list[float | None] = field(default_factory=list)
    t0_ns: int = 0

    @property
    def t_s(self) -> list[float]:
        return [(t - self.t0_ns) / 1e9 for t in self.t_ns]

    def at(self, t_ns: int) -> float | None:
        i = bisect.bisect_right(self.t_ns, t_ns) - 1
        return self.values[i] if i >= 0 else None

    def max(self) -> float:
        return max((v for v in self.values if v is not None), default=0.0)


@dataclass
class TargetMetrics:
    t0_ns: int
    urls: list[str]
    series: dict[tuple[str, str], Series]
    scrape_times: dict[str, list[int]]  # successful scrapes per URL (ns)
    scrapes: dict[str, dict[str, Any]]

    def __bool__(self) -> bool:
        return bool(self.urls)

    def family(self, url: str, name: str) -> list[Series]:
        return [s for (u, _), s in self.series.items() if u == url and s.name == name]


def load_target_metrics(run_dir: Path, t0_ns: int | None = None, meta: dict[str, Any] | None = None) -> TargetMetrics:
    """All series of every scraped URL; an empty TargetMetrics when the run scraped nothing.

    `meta` is run.json's content when the caller has read it already (RunData does)."""
    run_dir = Path(run_dir)
    if meta is None:
        try:
            meta = orjson.loads((run_dir / "run.json").read_bytes())
        except (OSError, orjson.JSONDecodeError):
            meta = {}
        if not isinstance(meta, dict):
            meta = {}
    if t0_ns is None:
        t0_ns = int(meta.get("t0_ns") or 0)
    order = list(((meta.get("scenario") or {}).get("target") or {}).get("metrics_urls") or [])
    tm = TargetMetrics(t0_ns, [], {}, {}, {})
    path = run_dir / FILE
    if not path.exists():
        return tm
    state: dict[str, dict[str, float | None]] = {}
    last_t: dict[str, int] = {}
    with open(path, "rb") as f:
        for raw in f:
            try:
                line = orjson.loads(raw)
            except orjson.JSONDecodeError:
                continue  # a torn last line of a killed run
            if not isinstance(line, dict) or "url" not in line or "t" not in line:
                continue
            url, t = line["url"], int(line["t"])
            if url not in tm.scrapes:
                tm.urls.append(url)
                tm.scrapes[url] = {"ok": 0, "failed": 0, "errors": []}
                tm.scrape_times[url] = []
                state[url] = {}
            sc = tm.scrapes[url]
            if "error" in line:
                sc["failed"] += 1
                if len(sc["errors"]) < 3:
                    sc["errors"].append(line["error"])
                continue
            sc["ok"] += 1
            tm.scrape_times[url].append(t)
            last_t[url] = t
            cur = state[url]
            vals = line.get("v") or {}
            if line.get("full"):
                for k in [k for k in cur if k not in vals]:
                    _point(tm, url, k, t, None)
                    del cur[k]
            for k in line.get("gone") or ():
                if k in cur:
                    _point(tm, url, k, t, None)
                    del cur[k]
            for k, v in vals.items():
                if k not in cur or cur[k] != v:
                    _point(tm, url, k, t, v)
                    cur[k] = v
    # the scenario's order, not the order the first scrapes happened to finish in
    tm.urls.sort(key=lambda u: order.index(u) if u in order else len(order))
    # close every step series at the last scrape, so a chart runs to the end
    for (url, k), s in tm.series.items():
        lt = last_t.get(url)
        if lt is not None and s.t_ns and s.t_ns[-1] < lt and k in state.get(url, {}):
            s.t_ns.append(lt)
            s.values.append(s.values[-1])
    return tm


def _point(tm: TargetMetrics, url: str, key: str, t: int, v: float | None) -> None:
    s = tm.series.get((url, key))
    if s is None:
        name, labels = parse_key(key)
        s = tm.series[(url, key)] = Series(url, key, name, labels, t0_ns=tm.t0_ns)
    s.t_ns.append(t)
    s.values.append(v)


def _matches(name: str, chosen: tuple[str, ...] | list[str]) -> bool:
    return any(name == c or name.startswith(c) for c in chosen)


def chosen_series(tm: TargetMetrics, names: tuple[str, ...] | list[str] | None = None) -> list[Series]:
    """The series worth charting: matching `names` (default CHOSEN), skipping ones that stayed 0
    unless they are in ALWAYS (where a 0 is the evidence)."""
    chosen = tuple(names) if names else CHOSEN
    out = []
    for s in tm.series.values():
        if not _matches(s.name, chosen):
            continue
        if s.max() == 0 and not (names or _matches(s.name, ALWAYS)):
            continue
        out.append(s)
    out.sort(key=lambda s: (tm.urls.index(s.url), s.key))
    return out


def series_label(s: Series) -> str:
    lab = ",".join(f"{k}={v}" for k, v in s.labels.items())
    return f"{s.name}{{{lab}}}" if lab else s.name
