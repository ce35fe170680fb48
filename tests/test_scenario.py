"""Scenario loading and validation: bad input fails before traffic, with one line naming file and key."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentload.errors import ScenarioError
from agentload.scenario import Dist, load_scenario, packaged_scenarios

from helpers import cli


def write(tmp_path, text: str):
    p = tmp_path / "s.toml"
    p.write_text(text)
    return str(p)


@pytest.mark.parametrize(
    "text,key,expect",
    [
        ("[agents]\ncount = -3\n", "agents.count", "whole number >= 0"),
        ("[agents]\ncount = 0\n", "agents.count", ">= 1"),
        ("[agents]\ncuont = 3\n", "agents.cuont", "unknown key"),
        ("[client]\nlimit = \"many\"\n", "client.limit", "whole number"),
        ("[client]\nforce_close = 1\n", "client.force_close", "true or false"),
        ("[client]\nsession = \"pooled\"\n", "client.session", "'shared', 'per_agent'"),
        ("[client]\nread_timeout_s = 0\n", "client.read_timeout_s", "> 0"),
        ("[conversation]\nsystem_tokens = { dist = \"zipf\", mean = 3 }\n", "conversation.system_tokens.dist", "lognormal"),
        ("[conversation]\ntool_latency_ms = { dist = \"lognormal\", sigma = 1 }\n", "conversation.tool_latency_ms.mean", "number > 0"),
        ("[stall]\nafter_s = 10\ngive_up_s = 5\n", "stall.give_up_s", ">= stall.after_s"),
        ("[target]\nendpoint = \"localhost:8000\"\n", "target.endpoint", "http://"),
        ("[mock]\nhang_above_tokens = -1\n", "mock.hang_above_tokens", ">= 0"),
        ("[mock]\nbogus = 1\n", "mock.bogus", "unknown key"),
        ("[nonsense]\nx = 1\n", "nonsense", "unknown section"),
        ("[agents\ncount = 1\n", "(syntax)", "valid TOML"),
    ],
)
def test_bad_scenarios_name_file_key_and_expectation(tmp_path, text, key, expect):
    path = write(tmp_path, text)
    with pytest.raises(ScenarioError) as ei:
        load_scenario(path)
    msg = str(ei.value)
    assert msg.startswith(path), msg
    assert key in msg and expect in msg, msg
    assert "\n" not in msg


def test_missing_file_and_bad_override(tmp_path):
    with pytest.raises(ScenarioError, match="no such scenario file"):
        load_scenario(str(tmp_path / "nope.toml"))
    with pytest.raises(ScenarioError, match="client.limit"):
        load_scenario("demo", ["client.limit=-1"])


def test_overrides_apply_and_are_recorded():
    sc = load_scenario("demo", ["client.limit=7", "agents.count=3", "mock.hang_above_tokens=500",
                                'conversation.tool_latency_ms={ dist = "exponential", mean = 5 }'])
    assert sc.client.limit == 7 and sc.agents.count == 3 and sc.mock.hang_above_tokens == 500
    d = sc.to_dict()
    assert d["client"]["limit"] == 7
    assert d["conversation"]["tool_latency_ms"]["dist"] == "exponential"
    # The effective scenario round-trips through its own dict.
    from agentload.scenario import parse_scenario

    again = parse_scenario({k: v for k, v in d.items() if k != "source"}, sc.source)
    assert again == sc


def test_every_packaged_scenario_loads_and_says_what_it_shows():
    names = packaged_scenarios()
    assert {"demo", "healthy", "long-context-hang", "pool-starvation", "mid-stream-stall"} <= set(names)
    for n in names:
        sc = load_scenario(n)
        assert sc.description.strip(), f"{n} has no description"


def test_fingerprint_ignores_client_but_not_workload():
    a = load_scenario("demo")
    assert a.workload_fingerprint() == load_scenario("demo", ["client.limit=3", "client.force_close=true"]).workload_fingerprint()
    assert a.workload_fingerprint() != load_scenario("demo", ["agents.seed=99"]).workload_fingerprint()


@given(mean=st.floats(1, 5000), sigma=st.floats(0, 2), seed=st.integers(0, 2**32))
@settings(max_examples=50, deadline=None)
def test_distributions_are_seeded_and_non_negative(mean, sigma, seed):
    d = Dist(kind="lognormal", mean=mean, sigma=sigma)
    a = [d.sample(random.Random(seed)) for _ in range(3)]
    b = [d.sample(random.Random(seed)) for _ in range(3)]
    assert a == b and all(x >= 0 for x in a)


def test_cli_bad_scenario_is_one_line_exit_2(tmp_path):
    path = write(tmp_path, "[agents]\ncount = \"lots\"\n")
    r = cli("run", path, "--no-live", timeout=60)
    assert r.returncode == 2
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert len(lines) == 1, r.stderr
    assert path in lines[0] and "agents.count" in lines[0] and "Traceback" not in r.stderr
    r = cli("run", str(tmp_path / "missing.toml"), timeout=60)
    assert r.returncode == 2 and "missing.toml" in r.stderr and "Traceback" not in r.stderr
    r = cli("report", str(tmp_path / "no-run"), timeout=60)
    assert r.returncode == 2 and "not a run folder" in r.stderr
