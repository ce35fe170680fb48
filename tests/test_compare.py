"""`agentload compare`: variants of one seeded workload over real HTTP against the real mock process,
the side-by-side numbers rebuilt from records, and refusing runs whose workloads differ."""

from __future__ import annotations

import asyncio
import time

import orjson
import pytest

from agentload import compare as cmp
from agentload.analysis import compare as cmp_math
from agentload.errors import UserError
from agentload.mock.config import MockConfig
from agentload.mock.process import MockProcess
from agentload.records import Record, Trace
from agentload.records.rundir import load_run
from agentload.report import compare_text
from agentload.run.request import classify_exception, send
from agentload.run.scenario import ClientConfig, TargetConfig
from agentload.run.transport import Transport
from helpers import cli

pytestmark = pytest.mark.slow  # real runs of several seconds each: not in the fast tier

QUIET = dict(live=False, install_signals=False, log=lambda m: None)


def _compare(scenario: str, vary: list[str], sets: list[str], out):
    variants = cmp.plan_variants(scenario, cmp.parse_vary(vary), sets)
    res = cmp.run_variants(variants, out, **QUIET)
    assert [v.name for v in res.done] == [v.name for v in variants] and not res.interrupted
    doc = cmp_math.compare_dirs([out / v.folder for v in res.done], names=[v.name for v in res.done], base=out)
    compare_text.write_outputs(doc, out)
    return doc


def _by_name(doc):
    return {v["name"]: v for v in doc["variants"]}


@pytest.fixture(scope="module")
def starvation(tmp_path_factory):
    # pool-starvation: 40 agents, slow steady streams; a pool of 4 against an unlimited one.
    out = tmp_path_factory.mktemp("compare") / "starvation"
    doc = _compare("pool-starvation", ["client.limit=4,0"], ["agents.rounds=2", "canary.every_s=0"], out)
    return out, doc


@pytest.fixture(scope="module")
def stale(tmp_path_factory):
    # stale-keepalive: the mock closes idle connections after 0.1 s, tool time 90-110 ms between rounds.
    out = tmp_path_factory.mktemp("compare") / "stale"
    doc = _compare("stale-keepalive", ["client.keepalive_timeout=15,0.05"], ["canary.every_s=0"], out)
    return out, doc


def test_larger_pool_waits_less_than_the_starved_one(starvation):
    out, doc = starvation
    v = _by_name(doc)
    starved, large = v["limit=4"]["metrics"], v["limit=0"]["metrics"]
    assert starved["requests"] == large["requests"] == 80
    assert starved["pool_wait_p50_ms"] > large["pool_wait_p50_ms"]
    assert starved["pool_wait_p99_ms"] > large["pool_wait_p99_ms"]
    row = next(r for r in doc["rows"] if r["keys"][0] == "pool_wait_p50_ms")
    assert row["best"] == {"pool_wait_p50_ms": ["limit=0"], "pool_wait_p99_ms": ["limit=0"]}
    # the starved pool really queued: requests waited for a slot, never more than 4 connections
    recs = [r for r in load_run(out / "limit=4").records if r.kind == "agent"]
    assert sum(1 for r in recs if "queued_start" in r.t) > 0
    assert starved["connections_opened"] <= 4 < large["connections_opened"]
    assert doc["varied"] == ["client.limit"] and doc["fingerprint"] and not doc["forced"]
    # the same seed: every variant sent the same conversations
    sizes = [sorted((r.agent, r.round, r.prompt_bytes) for r in load_run(out / n).records if r.kind == "agent")
             for n in ("limit=4", "limit=0")]
    assert sizes[0] == sizes[1]


def test_stale_keepalive_variant_shows_stale_connection_errors_and_the_other_does_not(stale):
    out, doc = stale
    v = _by_name(doc)
    long_ka, short_ka = v["keepalive_timeout=15"]["metrics"], v["keepalive_timeout=0.05"]["metrics"]
    assert long_ka["stale_errors"] > 0
    assert short_ka["stale_errors"] == 0
    # each counted one is what the row says: a disconnect on a reused connection before any header
    recs = [r for r in load_run(out / "keepalive_timeout=15").records if cmp_math.is_stale_error(r)]
    assert len(recs) == long_ka["stale_errors"]
    assert all(r.reused is True and "headers" not in r.t for r in recs)
    assert {r.error for r in recs} <= {"ServerDisconnectedError", "ClientOSError", "ClientConnectionResetError",
                                       "ConnectionResetError"}
    # the price of the fix: a client keep-alive shorter than the server's reuses less
    assert short_ka["connections_opened"] > long_ka["connections_opened"]
    row = next(r for r in doc["rows"] if r["keys"] == ["stale_errors"])
    assert row["best"]["stale_errors"] == ["keepalive_timeout=0.05"]
    text = (out / "compare.txt").read_text()
    assert "stale-conn errors" in text and "aiohttp does not retry these POSTs" in text


def test_aiohttp_fails_a_post_on_a_connection_the_server_closed_while_idle():
    """What the stale row counts, made deterministic: the mock closes an idle keep-alive connection
    after 0.1 s. When the client's event loop is idle it reads the FIN and aiohttp drops that
    connection before reuse (a new connection, no error). When the loop is busy past the close
    (blocked here), aiohttp still thinks the connection is alive and hands it out for the POST,
    and the request fails before any header: written on the closed connection, or (its write made
    at the end of the step, after the loop has read the FIN) found closed at the write. aiohttp
    does not retry it."""
    mock = MockProcess.start(MockConfig(keepalive_timeout_s=0.1, decode_tokens_per_s=0, output_tokens=4))

    async def go():
        tr = Transport(ClientConfig(keepalive_timeout=15.0), TargetConfig(), mock.url)
        session = tr.session_for(0)
        body = orjson.dumps({"model": "mock-model", "messages": [{"role": "user", "content": "hi"}],
                             "max_tokens": 4, "stream": True})
        out = []

        async def one(i):
            t = Trace("agent", 0, i, 0, f"r{i}", 1, len(body), 4)
            try:
                res = await send(session, tr.url, body, t)
                err, msg = res.error, res.error_msg
            except Exception as e:
                err, msg = classify_exception(e)
            t.t.setdefault("end", time.perf_counter_ns())
            return Record.from_trace("test", t, outcome="error" if err else "ok", error=err, error_msg=msg)

        try:
            out.append(await one(1))
            await asyncio.sleep(0.4)  # idle loop: the FIN is read while the connection sits in the pool
            out.append(await one(2))
            time.sleep(0.4)  # busy loop: the server closes, the client has not read the FIN yet
            out.append(await one(3))
        finally:
            await tr.close()
        return out

    try:
        first, after_idle, after_busy = asyncio.run(go())
    finally:
        mock.stop()
    assert first.outcome == "ok" and first.reused is False
    assert after_idle.outcome == "ok" and after_idle.reused is False  # dropped, reconnected: no error
    assert after_busy.outcome == "error" and after_busy.reused is True
    assert after_busy.error in ("ServerDisconnectedError", "ClientOSError", "ClientConnectionResetError"), after_busy
    assert after_busy.stalled_phase is None and after_busy.t.get("headers") is None
    assert cmp_math.is_stale_error(after_busy) and not cmp_math.is_stale_error(after_idle)


def test_refuses_runs_with_different_workloads_unless_forced(starvation, stale):
    a = starvation[0] / "limit=4"
    b = stale[0] / "keepalive_timeout=15"
    with pytest.raises(UserError) as e:
        cmp_math.compare_dirs([a, b])
    msg = str(e.value)
    assert "\n" not in msg and "different workloads" in msg and "--force" in msg and "agents.count" in msg
    doc = cmp_math.compare_dirs([a, b], force=True)
    assert doc["forced"] and doc["fingerprint"] is None and "compared anyway" in doc["notes"][0]
    # the CLI says the same in one line, exit status 2
    r = cli("compare", str(a), str(b))
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("agentload: error: runs have different workloads")
    r = cli("compare", str(a), str(b), "--force")
    assert r.returncode == 0, r.stderr
    assert "DIFFERENT (forced)" in r.stdout


def test_existing_runs_compare_as_the_run_did(starvation, tmp_path):
    out, doc = starvation
    again = cmp_math.compare_dirs([out / "limit=4", out / "limit=0"], names=["limit=4", "limit=0"], base=out)
    assert again == doc  # a pure function of the folders
    # rebuilding a comparison folder in place writes the same bytes
    before = {n: (out / n).read_bytes() for n in ("compare.json", "compare.txt", "compare.html")}
    r = cli("compare", str(out))
    assert r.returncode == 0, r.stderr
    assert {n: (out / n).read_bytes() for n in before} == before
    # two run folders given by hand: the columns are named by the settings that differ
    r = cli("compare", str(out / "limit=4"), str(out / "limit=0"), "--out", str(tmp_path / "c"))
    assert r.returncode == 0, r.stderr
    assert [v["name"] for v in orjson.loads((tmp_path / "c" / "compare.json").read_bytes())["variants"]] == \
        ["limit=4", "limit=0"]


def test_cli_compare_runs_every_combination(tmp_path):
    out = tmp_path / "cmp"
    r = cli("compare", "demo", "--vary", "client.limit=2,0", "--vary", "client.force_close=false,true",
            "--set", "agents.count=6", "--set", "agents.rounds=2", "--set", "canary.every_s=0",
            "--out", str(out), "--no-live")
    assert r.returncode == 0, r.stderr
    names = ["limit=2,force_close=false", "limit=2,force_close=true", "limit=0,force_close=false",
             "limit=0,force_close=true"]
    assert all((out / n / "records.jsonl").exists() for n in names)
    doc = orjson.loads((out / "compare.json").read_bytes())
    assert [v["name"] for v in doc["variants"]] == names
    for label in ("verdict", "completed rounds", "stalls", "errors", "stale-conn errors", "pool_wait p50 / p99 ms",
                  "connect p50 / p99 ms", "ttfb p50 / p99 ms", "ttft p50 / p99 ms", "e2e p50 / p99 ms",
                  "connections opened", "keep-alive reuse"):
        assert label in r.stdout, label
    assert "force_close=true: HTTP/1.1 with a fresh connection per request" in r.stdout
    m = _by_name(doc)
    # force_close: one new connection per request, nothing reused
    fc = m["limit=0,force_close=true"]["metrics"]
    assert fc["reuse_rate"] == 0 and fc["connections_opened"] == fc["requests"] == 12
    assert m["limit=0,force_close=false"]["metrics"]["reuse_rate"] > 0
    html = (out / "compare.html").read_text()
    assert "<script src=" not in html and "Plotly" in html and html.count("class=\"plotly-graph-div\"") == 3
    # an existing comparison is never overwritten
    r = cli("compare", "demo", "--vary", "client.limit=2,0", "--vary", "client.force_close=false,true",
            "--out", str(out), "--no-live")
    assert r.returncode == 2 and "already holds a run" in r.stderr


@pytest.mark.parametrize("args, expect", [
    (["--vary", "client.limit=20"], "single variant"),
    (["--vary", "client.nope=1,2"], "client.nope: unknown key"),
    (["--vary", "client.limit=1,-1"], "client.limit: expected a whole number >= 0"),
    (["--vary", "mock.keepalive_timeout_s=0.1,1"], "--force"),
    (["--vary", "agents.seed=1,2"], "changes the workload"),
    (["--vary", "client.limit=1,2", "--set", "client.limit=3"], "choose one"),
    (["--vary", "limit=1,2"], "expected section.key=value1,value2"),
    ([], "demo: not a run folder; to run a scenario, give --vary"),
])
def test_bad_vary_fails_before_any_traffic(args, expect, tmp_path):
    r = cli("compare", "demo", *args, "--out", str(tmp_path / "x"), "--no-live", timeout=30)
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and expect in lines[0], lines
    assert not (tmp_path / "x").exists()


def test_vary_values_split_outside_tables_and_best_marks():
    assert cmp.split_values('1,{dist = "uniform", min = 1, max = 2},"a,b"') == \
        ["1", '{dist = "uniform", min = 1, max = 2}', '"a,b"']
    assert cmp_math.best_indices("errors", "lower", [0, 0]) == []  # all equal: nothing marked
    assert cmp_math.best_indices("errors", "lower", [3, 0, 0]) == [1, 2]
    assert cmp_math.best_indices("reuse_rate", "higher", [0.5, None, 0.9]) == [2]
    assert cmp_math.best_indices("pool_wait_p50_ms", "lower", [0.001, 0.004, 12.0]) == [0, 1]  # same as shown: 0.00
    assert cmp_math.best_indices("verdict", "healthy", ["healthy", "client_pool"]) == [0]
    variants = cmp.plan_variants("demo", cmp.parse_vary(["client.limit=20,100", "stall.after_s=1,2"]))
    assert [v.name for v in variants] == ["limit=20,after_s=1", "limit=20,after_s=2", "limit=100,after_s=1",
                                          "limit=100,after_s=2"]
    assert variants[3].scenario.client.limit == 100 and variants[3].scenario.stall.after_s == 2.0
    assert len({v.scenario.workload_fingerprint() for v in variants}) == 1


def test_routing_conclusions_name_the_run_that_kept_prefixes_together_and_the_one_that_balanced():
    from agentload.analysis.compare import group_rows, routing_conclusions

    def variant(name, hit, conv, imb, groups):
        m = {"cache_hit_rate": hit, "conversation_stickiness": conv, "imbalance": imb}
        for g, (gh, p50) in groups.items():
            m.update({f"group{g}_cache_hit_rate": gh, f"group{g}_ttft_p50_ms": p50, f"group{g}_ttft_p99_ms": p50 * 2})
        return {"name": name, "metrics": m}

    vs = [variant("policy=round_robin", 0.36, 0.0, 1.02, {0: (0.38, 111.0), 10: (0.3, 90.0)}),
          variant("policy=cache_aware", 0.76, 1.0, 1.62, {0: (0.76, 73.5)})]
    lines = routing_conclusions(vs)
    assert lines[0].startswith("kept prefixes together: policy=cache_aware (conversations on one backend 100%, "
                               "cache hit rate 76%; policy=round_robin 36% hit rate)"), lines
    assert lines[1].startswith("balanced load: policy=round_robin (imbalance 1.02"), lines
    assert "policy=cache_aware 1.62" in lines[1]
    # groups in numeric order, each with its hit rate and ttft rows, any run's groups
    labels = [label for _, label, _ in group_rows(vs)]
    assert labels == ["prefix group 0: cache hit rate", "prefix group 0: ttft p50 / p99 ms",
                      "prefix group 10: cache hit rate", "prefix group 10: ttft p50 / p99 ms"]
    # one run with router rows, or none: nothing to conclude
    assert routing_conclusions(vs[:1]) == [] and routing_conclusions([{"name": "x", "metrics": {}}] * 2) == []
