"""Issue 10, cases 1 and 12, over real HTTP against the mock: verdicts that once failed open."""

from __future__ import annotations

import pytest

from helpers import cli, run_scenario

pytestmark = pytest.mark.slow  # real runs of several seconds each: not in the fast tier


def test_readme_set_example_names_the_pool_from_the_records(tmp_path):
    # `agentload run demo --set client.limit=20 --set agents.count=64` said healthy: the pool rule
    # needed the once-a-second sampler to catch a waiter, which a one-second run never does.
    p = cli("run", "demo", "--set", "client.limit=20", "--set", "agents.count=64", "--no-live",
            "--out", str(tmp_path / "run"))
    assert p.returncode == 1, p.stdout + p.stderr
    first = p.stdout.splitlines()[0]
    assert first.startswith("VERDICT [client_pool]"), first
    assert "requests waited" in first and "of e2e p50" in first
    assert "rule: pool_wait at least 20% of e2e" in p.stdout


def test_errors_that_stopped_every_agent_lead_over_a_slow_server(tmp_path):
    # The stall rules used to run first: a few slow requests that finished won over 48 failures.
    res = run_scenario("server-queue", tmp_path, ["mock.error_at_round=2", "mock.error_status=500",
                                                  "agents.rounds=3"])
    v = res.summary["verdict"]
    assert v["kind"] == "server_errors" and v["first_round"] == 2, v
    assert v["agents_stopped"] == res.summary["totals"]["agents"] == 12
    assert "server_queue" in [s["kind"] for s in v["secondary"]]  # (the mock serves 2 at once)
    # the totals count every request that stalled, not only those agentload gave up on
    assert res.summary["totals"]["stalled"] > 0
    assert "ALSO [server_queue]" in res.text
