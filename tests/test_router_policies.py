"""Routing policies compared on a fleet that shares prefixes, through a real smg and a real vllm-router.

`router-prefix-groups-smg` (packaged) starts 4 mock backends with prefix caches and smg in front of
them, and runs agents of 4 prefix groups. One `agentload compare` over three policies, every agent
sending its conversation's routing key (`X-SMG-Routing-Key`, which smg is told to read):
round_robin ignores it, cache_aware routes by the prompt's prefix, consistent_hashing by the key.
What a router engineer asks of the comparison: which kept prefixes together (hit rate, time to first
token by group, conversations on one backend) and what it cost in balance.
"""

from __future__ import annotations

import orjson
import pytest

from helpers import cli, run_scenario
from routerprocs import skip_reason
from smgproc import smg_executable

pytestmark = [pytest.mark.slow]
_no_vllm_router = skip_reason("vllm-router", "pip install vllm-router")


@pytest.mark.smg
@pytest.mark.skipif(smg_executable() is None, reason="the `smg` executable is missing (pip install smg)")
def test_cache_aware_keeps_each_groups_prefix_and_a_routing_key_keeps_each_conversation(tmp_path):
    out = tmp_path / "cmp"
    # a slower prefill than the packaged one: what a cache saves is then far above a loaded machine's noise
    res = cli("compare", "router-prefix-groups-smg", "--vary", "router.policy=round_robin,cache_aware,consistent_hashing",
              "--set", "target.session_header=X-SMG-Routing-Key", "--set", "agents.count=16",
              "--set", "agents.rounds=4", "--set", "mock.prefill_tokens_per_s=15000", "--no-live", "--out", str(out),
              timeout=600)
    assert res.returncode in (0, 1), res.stdout + res.stderr
    doc = orjson.loads((out / "compare.json").read_bytes())
    m = {v["name"].removeprefix("policy="): v["metrics"] for v in doc["variants"]}
    rr, ca, ch = m["round_robin"], m["cache_aware"], m["consistent_hashing"]
    for x in (rr, ca, ch):
        assert x["rounds_completed"] == 16 * 4 and x["stalls"] == 0 and x["errors"] == 0, x
    # cache_aware: a higher hit rate and a lower time to first token, overall and in every prefix group
    assert ca["cache_hit_rate"] > rr["cache_hit_rate"] + 0.15, (ca["cache_hit_rate"], rr["cache_hit_rate"])
    for g in range(4):
        assert ca[f"group{g}_cache_hit_rate"] > rr[f"group{g}_cache_hit_rate"], g
        # (ttft by group is reported, not compared: on an idle machine both policies' p50 is a cache hit)
        assert ca[f"group{g}_ttft_p50_ms"] is not None and rr[f"group{g}_ttft_p50_ms"] is not None, g
    # the routing key: every conversation on one backend; round robin, which ignores it, spreads them
    assert ch["conversation_stickiness"] >= 0.99 and ch["stickiness"] >= 0.99, ch
    assert rr["conversation_stickiness"] < 0.5, rr
    # ... and the balance it cost: round robin's spread is the even one
    assert all(x["imbalance"] is not None and x["imbalance"] >= 1.0 for x in (rr, ca, ch))
    assert rr["imbalance"] <= min(ca["imbalance"], ch["imbalance"]) + 0.05, (rr["imbalance"], ca["imbalance"],
                                                                             ch["imbalance"])
    # said in words, in the text and the HTML
    routing = doc["routing"]
    assert routing[0].startswith("kept prefixes together: policy=c"), routing
    assert any(line.startswith("balanced load: policy=") for line in routing), routing
    text = (out / "compare.txt").read_text()
    assert "prefix group 3: cache hit rate" in text and "routing: kept prefixes together" in text
    assert "kept prefixes together" in (out / "compare.html").read_text()


@pytest.mark.vllm_router
@pytest.mark.skipif(_no_vllm_router is not None, reason=_no_vllm_router or "")
def test_vllm_router_keeps_each_session_on_one_backend_and_every_request_joins_by_traceparent(tmp_path):
    """vllm-router's consistent_hash reads X-Session-ID: each conversation on one backend. It forwards
    `traceparent`, so every backend log line joins its record by trace context (not by request id), and
    the router's own time per request is reported."""
    res = run_scenario("router-prefix-groups-vllm-router", tmp_path / "run", [
        "router.policy=consistent_hash", 'target.session_header="X-Session-ID"', "agents.count=12", "agents.rounds=3"])
    s = res.summary
    assert s["verdict"]["kind"] in ("healthy", "client_saturated"), res.text  # (saturated: a loaded machine)
    router = s["router"]
    assert router["conversations"]["share"] >= 0.99, router["conversations"]
    rt = router["router_time"]
    requests = 12 * 3
    assert rt["by_traceparent"] >= 0.99 * requests and rt["by_id"] == 0, rt
    assert rt["all"]["n"] > 0 and rt["all"]["p50_ms"] is not None, rt
    assert "router's own time" in res.text and "by traceparent" in res.text


@pytest.mark.smg
@pytest.mark.skipif(smg_executable() is None, reason="the `smg` executable is missing (pip install smg)")
def test_smg_sticky_sessions_keep_each_conversation_on_one_backend_under_round_robin(tmp_path):
    """smg's --sticky-sessions (routing-key override) pins each routing key to a worker on any policy:
    round robin, which alone spreads every conversation, keeps each on one backend."""
    from agentload.run.scenario import load_scenario

    command = load_scenario("router-prefix-groups-smg", []).router.command
    res = run_scenario("router-prefix-groups-smg", tmp_path / "run", [
        f"router.command={orjson.dumps(command.replace('--disable-retries', '--disable-retries --sticky-sessions')).decode()}",
        "router.policy=round_robin", 'target.session_header="X-SMG-Routing-Key"', "agents.count=12", "agents.rounds=3"])
    s = res.summary
    assert s["verdict"]["kind"] in ("healthy", "client_saturated"), res.text  # (saturated: a loaded machine)
    assert s["router"]["conversations"]["share"] >= 0.99, s["router"]["conversations"]
    assert s["router"]["imbalance"]["overall"] >= 1.0
