"""Reports rebuilt from disk: golden files, killed runs, the HTML in headless Chromium, Perfetto.

The fixture run folder tests/data/report-fixture/ (records.jsonl, run.json, samples.jsonl) is
the output of a real run against the real mock:

    agentload run scenarios/long-context-hang.toml --set agents.count=6 --set stall.after_s=1.0 \
        --set stall.give_up_s=2.0 --set canary.every_s=0.5 --out /tmp/fx --no-live

The golden summary.json and report.txt under tests/golden/report-fixture/ are what
`write_reports` makes of it; `pytest --regen-golden` rewrites them after an intended change.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from agentload.analysis.summary import build_summary
from agentload.records.rundir import RunData, load_run
from agentload.report.build import write_reports
from agentload.report.html import MAX_LANES, write_html
from devtools import check_page_sync, find_chromium
from helpers import REPO, cli, run_scenario
from records_factory import RunBuilder

FIXTURE = REPO / "tests" / "data" / "report-fixture"
GOLDEN = REPO / "tests" / "golden" / "report-fixture"
GOLDEN_FILES = ("summary.json", "report.txt")


def _copy_fixture(tmp_path: Path) -> Path:
    d = tmp_path / FIXTURE.name
    shutil.copytree(FIXTURE, d)
    return d


# ---------------------------------------------------------------- golden files


def test_report_from_stored_records_matches_golden(tmp_path, regen_golden):
    run_dir = _copy_fixture(tmp_path)
    write_reports(run_dir)
    if regen_golden:
        GOLDEN.mkdir(parents=True, exist_ok=True)
        for name in GOLDEN_FILES:
            shutil.copyfile(run_dir / name, GOLDEN / name)
        pytest.skip("golden files regenerated")
    for name in GOLDEN_FILES:
        assert (GOLDEN / name).exists(), f"missing golden {name}: run pytest --regen-golden"
        got = (run_dir / name).read_text()
        want = (GOLDEN / name).read_text()
        assert got == want, f"{name} differs from tests/golden (intended? rerun with --regen-golden)"
    # The fixture is a long-context hang: the report must say so, not just match bytes.
    summary = orjson.loads((run_dir / "summary.json").read_bytes())
    assert summary["verdict"]["kind"] == "server_stall"
    html = (run_dir / "report.html").read_text()
    assert "server_stall" in html and "fig-timeline" in html


def test_report_rebuilt_from_disk_equals_the_one_written_at_the_end_of_the_run(tmp_path):
    run_dir = tmp_path / "run"
    run_scenario("demo", run_dir, ["agents.count=4", "agents.rounds=3", "canary.every_s=0.2"])
    names = ("summary.json", "report.txt", "report.html")
    at_end = {n: (run_dir / n).read_bytes() for n in names}
    assert at_end["report.html"].startswith(b"<!DOCTYPE html>")
    for n in names:
        (run_dir / n).unlink()
    res = cli("report", str(run_dir), timeout=60)
    assert res.returncode == 0, res.stderr
    for n in names:
        assert (run_dir / n).read_bytes() == at_end[n], f"{n} rebuilt from disk differs"
    assert res.stdout.strip() == at_end["report.txt"].decode().strip()


def test_truncated_records_file_gives_a_report_that_says_so(tmp_path):
    run_dir = _copy_fixture(tmp_path)
    meta = orjson.loads((run_dir / "run.json").read_bytes())
    for k in ("t_end_ns", "t_end_unix", "stop_reason", "records", "max_loop_lag_ms"):
        meta.pop(k, None)
    meta.update(ended=False, ended_normally=False, cut_short=False)
    (run_dir / "run.json").write_bytes(orjson.dumps(meta))
    data = (run_dir / "records.jsonl").read_bytes()
    last = data.rstrip(b"\n").rfind(b"\n")
    (run_dir / "records.jsonl").write_bytes(data[: last + 1 + (len(data) - last) // 2])  # a torn last line
    summary, text = write_reports(run_dir)
    assert summary["run"]["cut_short"] is True
    assert summary["totals"]["torn_lines"] == 1
    assert "cut short" in text and "never ended" in text and "torn line" in text
    html = (run_dir / "report.html").read_text()
    assert "This run was killed" in html and "1 torn line" in html


def _agent_lines(path: Path) -> int:
    if not path.exists():
        return 0
    return sum(1 for line in path.read_bytes().splitlines() if b'"kind":"agent"' in line)


def _wait_for(pred, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.05)


@pytest.mark.slow
def test_killed_run_sigusr1_dump_stall_wave_dump_and_report(tmp_path):
    """A hanging run: a stall wave writes a dump, SIGUSR1 writes another, then SIGKILL; the
    report rebuilt from what is on disk says the run was cut short."""
    run_dir = tmp_path / "killed"
    args = [sys.executable, "-m", "agentload.cli", "run", "scenarios/long-context-hang.toml", "--out", str(run_dir),
            "--no-live", "--set", "agents.count=4", "--set", "agents.start=0", "--set", "stall.after_s=0.5",
            "--set", "stall.give_up_s=120", "--set", "canary.every_s=0.5"]
    err_path = tmp_path / "stderr.txt"
    with open(err_path, "wb") as err:
        proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL)
    try:
        # 4 agents x 3 rounds complete, then every agent hangs in round 4.
        _wait_for(lambda: _agent_lines(run_dir / "records.jsonl") >= 12, 60, "three rounds of records")
        _wait_for(lambda: list(run_dir.glob("dump-*.txt")), 30, "the stall-wave dump")
        os.kill(proc.pid, signal.SIGUSR1)
        _wait_for(lambda: any("reason: SIGUSR1" in p.read_text() for p in run_dir.glob("dump-*.txt")), 30,
                  "the SIGUSR1 dump")
        _wait_for(lambda: b"(SIGUSR1) written to" in err_path.read_bytes(), 10, "the dump's path on stderr")
    finally:
        proc.kill()
        proc.wait(timeout=30)
    dumps = {p: p.read_text() for p in run_dir.glob("dump-*.txt")}
    waves = [t for t in dumps.values() if "reason: stall wave 1" in t]
    usr1 = [t for t in dumps.values() if "reason: SIGUSR1" in t]
    assert len(waves) == 1 and len(usr1) == 1, list(dumps)
    assert not any("stall wave 2" in t for t in dumps.values())  # one wave: stalls never cleared
    rows = [ln.split() for ln in usr1[0].splitlines() if ln.strip() and ln.split()[0].isdigit()]
    assert sorted(int(r[0]) for r in rows) == [0, 1, 2, 3]
    for r in rows:  # agent round state phase in_phase idle stalled conn rounds_ok request_id
        assert r[1] == "4" and r[2] == "request" and r[3] == "ttfb" and r[6] == "ttfb", r
        assert r[7] in ("reused", "new") and r[9].endswith(f"-a{r[0]}-r4-c0"), r
    assert float(rows[0][4]) > 0.5
    # Killed: run.json never ended; add a torn line as a kill mid-write would leave.
    with open(run_dir / "records.jsonl", "ab") as f:
        f.write(b'{"v":1,"run":"x","kind":"agent","agent":3,"rou')
    res = cli("report", str(run_dir), timeout=60)
    assert res.returncode == 0, res.stderr
    assert "cut short" in res.stdout and "never ended" in res.stdout and "1 torn line" in res.stdout
    summary = orjson.loads((run_dir / "summary.json").read_bytes())
    assert summary["run"]["cut_short"] and summary["totals"]["torn_lines"] == 1
    html = (run_dir / "report.html").read_text()
    assert "This run was killed" in html and "4 agent(s) had a request in flight" in html


# ---------------------------------------------------------------- Perfetto


def _check_trace(trace: dict) -> list[dict]:
    assert isinstance(trace.get("traceEvents"), list)
    named: set[tuple[int, int]] = set()
    slices = []
    for ev in trace["traceEvents"]:
        assert isinstance(ev.get("name"), str) and ev.get("ph") in ("X", "M", "C"), ev
        assert isinstance(ev.get("pid"), int) and isinstance(ev.get("tid"), int), ev
        if ev["ph"] == "M" and ev["name"] == "thread_name":
            named.add((ev["pid"], ev["tid"]))
        if ev["ph"] == "X":
            assert isinstance(ev["ts"], (int, float)) and isinstance(ev["dur"], (int, float)), ev
            assert ev["ts"] >= 0 and ev["dur"] >= 0, ev
            assert ev["args"].get("request_id") or ev["cat"] == "gap", ev
            slices.append(ev)
        if ev["ph"] == "C":
            assert isinstance(ev["ts"], (int, float)) and isinstance(ev["args"], dict), ev
    assert slices
    assert {(s["pid"], s["tid"]) for s in slices} <= named, "a track without a thread_name"
    # Slices on one track nest properly (integer nanoseconds, so rounding cannot fake it).
    tracks: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for s in slices:
        b = round(s["ts"] * 1000)
        tracks.setdefault((s["pid"], s["tid"]), []).append((b, b + round(s["dur"] * 1000)))
    for key, spans in tracks.items():
        spans.sort(key=lambda x: (x[0], -x[1]))
        stack: list[int] = []
        for b, e in spans:
            while stack and stack[-1] <= b:
                stack.pop()
            assert not stack or e <= stack[-1], f"slices overlap without nesting on track {key}"
            stack.append(e)
    return slices


def test_perfetto_export_is_well_formed_trace_event_json(tmp_path):
    run_dir = _copy_fixture(tmp_path)
    out = tmp_path / "trace.json"
    res = cli("export", str(run_dir), "--format", "perfetto", "--out", str(out), timeout=60)
    assert res.returncode == 0, res.stderr
    trace = orjson.loads(out.read_bytes())
    slices = _check_trace(trace)
    data = load_run(run_dir)
    agent_ids = {r.agent for r in data.records if r.kind == "agent"}
    assert {s["tid"] for s in slices if s["pid"] == 1} == agent_ids  # a track per agent, tid = agent
    assert any(s["pid"] == 2 for s in slices)  # canaries on their own track
    requests = [s for s in slices if s["cat"] == "request"]
    assert len(requests) == len(data.records)
    assert {s["args"]["request_id"] for s in requests} == {r.request_id for r in data.records}
    stalled = [s for s in slices if s["cat"] == "phase" and s["args"].get("stalled")]
    assert stalled and all(s["name"] == "ttfb (stalled)" for s in stalled)
    assert all({"round", "outcome", "request_id"} <= set(s["args"]) for s in slices if s["cat"] != "gap")
    assert any(s["name"] == "tool" for s in slices)
    assert cli("export", str(run_dir), "--format", "svg").returncode == 2


# ---------------------------------------------------------------- HTML in Chromium


def _many_agents(run_dir: Path, copies: int) -> Path:
    """The fixture's agents cloned into `copies` x as many agents (for the sampled-lanes view)."""
    data = load_run(run_dir)
    n = 1 + max(r.agent for r in data.iter_records() if r.kind == "agent")
    recs = list(data.iter_records())
    for k in range(1, copies):
        recs += [dataclasses.replace(r, agent=r.agent + k * n, request_id=f"{r.request_id}-x{k}")
                 for r in data.iter_records() if r.kind == "agent"]
    data.meta["scenario"]["agents"]["count"] = n * copies
    data = RunData.from_records(data.path, data.meta, recs, data.samples)
    write_html(run_dir, data, build_summary(data))
    return run_dir / "report.html"


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["fixture", "many-agents"])
def test_html_report_renders_in_headless_chromium_without_console_errors(tmp_path, variant):
    chromium = find_chromium()
    if chromium is None:
        pytest.skip("chromium is not installed (apt-get install chromium; .ci/run installs it)")
    run_dir = _copy_fixture(tmp_path)
    write_reports(run_dir)
    page = run_dir / "report.html"
    if variant == "many-agents":
        page = _many_agents(run_dir, copies=70)  # 420 agents > MAX_LANES
        assert f"showing {MAX_LANES} of 420 agents" in page.read_text()
    assert "<script src=" not in page.read_text()  # plotly.js is inlined; the browser checks for requests
    res = check_page_sync(page, chromium=chromium, timeout=60)
    assert res.ok, res.problems()  # drawn, no console errors or exceptions, no network request
    assert res.drawn == res.expected == 4
    assert res.ids == ["fig-timeline", "fig-rounds", "fig-prompt", "fig-over-time"]
    assert res.traces[0] >= 5  # phases, round ticks, stall marks
    assert res.plotly_version


def test_every_report_shows_each_finding_not_only_the_lead(tmp_path):
    # report.txt has its ALSO lines; report.html and `agentload compare` once showed the lead alone
    from agentload.analysis.compare import compare_dirs
    from agentload.report import compare_text

    def hang_beside_a_small_pool(path):
        run = RunBuilder(agents=20, rounds=6, limit=8)  # every request waits 80 ms of ~135 for a connection
        for rnd in range(1, 6):
            for a in range(20):
                run.ok(a, rnd, pool_wait_ms=80, ttfb_ms=5, ttft_ms=30, stream_ms=20, at_ms=rnd * 1000 + a)
        run.stalled(0, 6, "ttfb", at_ms=6000, held_ms=15_000)
        run.write(path)
        write_reports(path)

    for name in ("a", "b"):
        hang_beside_a_small_pool(tmp_path / name)
    text = (tmp_path / "a" / "report.txt").read_text()
    assert text.startswith("VERDICT [server_stall]") and "\nALSO [client_pool] client pool exhausted apart" in text
    html = (tmp_path / "a" / "report.html").read_text()
    assert "<span class='kind'>ALSO client_pool</span> client pool exhausted apart from the server stall" in html
    assert html.index("ALSO client_pool") > html.index("the client pool is not the cause of the stall")
    doc = compare_dirs([tmp_path / "a", tmp_path / "b"], names=["a", "b"], base=tmp_path)
    assert [x["kind"] for x in doc["variants"][0]["verdict"]["secondary"]] == ["client_pool"]
    compare_text.write_outputs(doc, tmp_path)
    assert "      also [client_pool] client pool exhausted apart" in (tmp_path / "compare.txt").read_text()
    assert "also <span class='kind'>[client_pool]</span>" in (tmp_path / "compare.html").read_text()


@pytest.mark.parametrize("proxy", [False, True])
def test_a_canary_in_flight_at_the_end_is_no_request_of_the_harness_nor_a_failed_canary(tmp_path, proxy):
    """Stopping a run (a proxy's usual end) cuts off whatever canary is in flight: the report counts
    it apart from the agents' (the harness's) requests and from the canaries that failed."""
    run_dir = _copy_fixture(tmp_path)
    meta = orjson.loads((run_dir / "run.json").read_bytes())
    meta.update(cut_short=True, stop_reason="interrupted (SIGINT)")
    if proxy:
        meta["proxy"] = {"upstream": "http://127.0.0.1:9/v1", "listen": "127.0.0.1:8"}
    (run_dir / "run.json").write_bytes(orjson.dumps(meta))
    lines = (run_dir / "records.jsonl").read_bytes().splitlines()
    canary = orjson.loads(next(ln for ln in lines if b'"kind":"canary"' in ln))
    canary.update(outcome="cut_short", error="cut_short", request_id=canary["request_id"] + "-last")
    with open(run_dir / "records.jsonl", "ab") as f:
        f.write(orjson.dumps(canary) + b"\n")
    summary, text = write_reports(run_dir)
    tot = summary["totals"]
    assert (tot["canaries"], tot["canaries_ok"], tot["canaries_cut_short"]) == (7, 6, 1)
    assert "canaries 6/6 ok (1 cut short at the end)" in " ".join(text.split())
    assert "canaries 6/6 ok (1 cut short at the end)" in (run_dir / "report.html").read_text()
    cut_agents = tot["cut_short"]
    if proxy:  # only requests of the harness's that the proxy cut off are worth a word
        assert ("request(s) still in flight" in text) == (cut_agents > 0)
    else:
        assert f"{cut_agents} request(s) (and 1 canary request(s)) still in flight" in " ".join(text.split())
