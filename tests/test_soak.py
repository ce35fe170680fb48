"""A soak through a real router: agentload (open loop, `scenarios/router-two-backends.toml`) ->
smg -> two mock backends, as the CLI a user runs. Shows that agentload's
resident memory and file descriptors stay flat after warm-up, and prints the numbers.

Part of the normal suite, 60 s by default (the suite's longest test at 120 s; at 60 s on
2026-12-03: 46 samples after warm-up, RSS +0.2 MB, fds flat). Knobs for a longer run, e.g. the
figures in docs/soak.md:

    AGENTLOAD_SOAK_S=600 AGENTLOAD_SOAK_OUT=reports/soak-smg python3 -m pytest -q -s tests/test_soak.py

smg runs with its defaults here (retries on, 15 s pings, 1800 s request timeout): a soak tests
the router as it would be deployed; only the ports and the startup check interval are set.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agentload.analysis.intervals import load_intervals, window
from agentload.process import free_port, http_get
from agentload.records import iter_record_dicts
from agentload.records.target_metrics import load_target_metrics
from agentload.run.health import flatness
from agentload.run.scenario import load_scenario
from helpers import REPO
from serverprocs import RouterStack
from smgproc import SmgProcess, smg_executable

pytestmark = [
    pytest.mark.soak,
    pytest.mark.skipif(smg_executable() is None,
                       reason="the `smg` executable is missing (pip install smg, or pip install -e '.[test]')"),
]

SOAK_S = float(os.environ.get("AGENTLOAD_SOAK_S", "60"))
RSS_GROWTH_MB = 8.0  # after warm-up, median of the last third vs the first third
FD_GROWTH = 8


def _proc_stats(pid: int) -> tuple[float, int]:
    p = psutil.Process(pid)
    return p.memory_info().rss / 1048576, p.num_fds()


def test_soak_through_smg_keeps_memory_and_fds_flat(tmp_path):
    out = Path(os.environ.get("AGENTLOAD_SOAK_OUT") or tmp_path / "soak")
    sc = load_scenario("router-two-backends")
    with RouterStack(lambda urls: SmgProcess.start(urls, tmp_path / "smg.log")) as stack:
        smg, mocks = stack.start([sc.mock, sc.mock])
        port = free_port()
        cmd = [sys.executable, "-m", "agentload.cli", "run", "router-two-backends", "--no-live", "--out", str(out),
               "--endpoint", smg.url, "--metrics-port", str(port),
               "--set", f'target.metrics_urls=["{smg.metrics_url}"]', "--set", f"agents.duration_s={SOAK_S:g}"]
        err_path = tmp_path / "agentload.stderr"
        with open(err_path, "wb") as err:
            p = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=err, start_new_session=True)
        others: dict[str, list[tuple[float, int]]] = {"smg": [], "mock 1": [], "mock 2": []}
        exported = None
        t0 = time.monotonic()
        try:
            while p.poll() is None and time.monotonic() - t0 < SOAK_S + 180:  # bounded: the run ends itself
                for name, pid in (("smg", smg.pid), ("mock 1", mocks[0].pid), ("mock 2", mocks[1].pid)):
                    others[name].append(_proc_stats(pid))
                if exported is None and time.monotonic() - t0 > SOAK_S / 2:
                    status, body = http_get(f"http://127.0.0.1:{port}/metrics")
                    assert status == 200
                    exported = {f.name: f for f in text_string_to_metric_families(body.decode())}
                try:
                    p.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
            stdout, _ = p.communicate(timeout=120)
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)

    text = stdout.decode()
    assert p.returncode == 0, text + err_path.read_text()[-3000:]
    summary = orjson.loads((out / "summary.json").read_bytes())
    assert summary["verdict"]["kind"] == "healthy", text
    samples = [d for d in iter_record_dicts(out / "samples.jsonl") if d]
    rss = flatness(samples, "rss_mb")
    fds = flatness(samples, "fds")
    assert rss and fds
    n_req = summary["totals"]["requests"]
    intervals = load_intervals(out)
    ok = window(intervals, "e2e").get_total_count()
    tm = load_target_metrics(out)
    scrapes = tm.scrapes[smg.metrics_url]

    def first_last(xs):
        k = max(1, len(xs) // 4)
        return xs[k], xs[-1]

    lines = [
        f"soak through smg: {summary['run']['duration_s']:.0f} s, {summary['totals']['agents']} conversations, "
        f"{n_req} requests ({summary['totals']['completed']} ok), verdict {summary['verdict']['kind']}",
        f"  agentload RSS MB after warm-up: first third {rss['warm']:.1f}, last third {rss['end']:.1f}, "
        f"max {rss['max']:.1f} (growth {rss['growth']:+.1f}; {rss['n']} samples)",
        f"  agentload open fds after warm-up: first third {fds['warm']}, last third {fds['end']}, max {fds['max']}",
        f"  intervals.hlog: {len(intervals) // 2} intervals per tag, {ok} ok requests in e2e",
        f"  smg scrapes: {scrapes['ok']} ok, {scrapes['failed']} failed; exporter families: "
        f"{len(exported or {})}",
    ]
    for name, xs in others.items():
        if len(xs) >= 4:
            (r0, f0), (r1, f1) = first_last(xs)
            lines.append(f"  {name}: RSS {r0:.1f} -> {r1:.1f} MB, fds {f0} -> {f1}")
    print("\n" + "\n".join(lines))
    (out / "soak.txt").write_text("\n".join(lines) + "\n")

    assert rss["growth"] <= RSS_GROWTH_MB, lines
    assert fds["growth"] <= FD_GROWTH, lines
    assert ok == summary["totals"]["completed"]
    assert scrapes["ok"] >= 2 and scrapes["failed"] == 0
    assert exported is not None and {"agentload_agents", "agentload_requests", "agentload_pool_connections",
                                     "process_resident_memory_bytes"} <= set(exported)
