"""Scenario loading and validation: bad input fails before traffic, with one line naming file and key."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentload.errors import ScenarioError
from agentload.run.scenario import Dist, load_scenario, packaged_scenarios

from helpers import cli


def write(tmp_path, text: str):
    p = tmp_path / "s.toml"
    p.write_text(text)
    return str(p)


@pytest.mark.parametrize(
    "text,key,expect",
    [
        ("[agents]\ncount = -3\n", "agents.count", "whole number >= 1, got -3"),
        ("[agents]\ncount = 0\n", "agents.count", "whole number >= 1, got 0"),
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
        # issue 10: zero, negative, infinite and NaN values that would silently mean something else
        ("[canary]\ntimeout_s = 0\n", "canary.timeout_s", "number > 0"),
        ("[stall]\nafter_s = 0\n", "stall.after_s", "number > 0"),
        ("[stall]\ngive_up_s = 0\n", "stall.give_up_s", "number > 0"),
        ("[agents]\nrounds = -1\n", "agents.rounds", "whole number >= 1, got -1"),
        ("[agents]\nduration_s = 0\n", "agents.duration_s", "number > 0"),
        ("[agents]\narrival = \"open\"\nrate_per_s = 0\n", "agents.rate_per_s", "number > 0"),
        ("[client]\ntotal_timeout_s = inf\n", "client.total_timeout_s", "number > 0"),
        ("[client]\nconnect_timeout_s = nan\n", "client.connect_timeout_s", "number > 0"),
        ("[conversation]\nmax_tokens = 0\n", "conversation.max_tokens", "whole number >= 1"),
        ("[canary]\nmax_tokens = 0\n", "canary.max_tokens", "whole number >= 1"),
        ("[canary]\nprompt_tokens = 0\n", "canary.prompt_tokens", "whole number >= 1"),
        ("[target]\nmetrics_every_s = 0\n", "target.metrics_every_s", ">= 0.2"),
        ("[conversation]\nuser_tokens = inf\n", "conversation.user_tokens", ">= 0"),
        ("[conversation]\ntool_latency_ms = { dist = \"lognormal\", mean = 0, sigma = 1 }\n",
         "conversation.tool_latency_ms.mean", "number > 0"),
        ("[conversation]\nuser_tokens = { dist = \"normal\", mean = 5, sigma = 1, min = 10, max = 3 }\n",
         "conversation.user_tokens.max", ">= conversation.user_tokens.min"),
        ("[conversation]\nuser_tokens = { dist = \"exponential\", mean = nan }\n", "conversation.user_tokens.mean", ">= 0"),
        # the target: no credential in the scenario, URLs that can be used
        ("[target]\nheaders = { Authorization = \"Bearer sk-x\" }\n", "target.headers.Authorization", "headers_env"),
        ("[target]\nheaders = { \"x-api-key\" = \"k\" }\n", "target.headers.x-api-key", "headers_env"),
        ("[target]\nheaders = { \"bad name\" = \"v\" }\n", "target.headers.bad name", "header name"),
        ("[target]\nheaders_env = { \"api-key\" = \"\" }\n", "target.headers_env.api-key", "environment variable"),
        ("[target]\napi_key_env = \"K\"\nheaders_env = { authorization = \"K2\" }\n",
         "target.headers_env.authorization", "also set by target.api_key_env"),
        ("[target]\nendpoint = \"http://u:p@127.0.0.1:8000/v1\"\n", "target.endpoint", "without credentials"),
        ("[target]\nendpoint = \"http://127.0.0.1:99999/v1\"\n", "target.endpoint", "valid"),
        ("[target]\nmodel = \"\"\n", "target.model", "model name"),
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
    from agentload.run.scenario import parse_scenario

    again = parse_scenario({k: v for k, v in d.items() if k != "source"}, sc.source)
    assert again == sc


def test_headers_env_names_variables_and_round_trips():
    sc = load_scenario("demo", ['target.headers_env={"api-key" = "AZURE_KEY"}', 'target.headers={"X-Team" = "a"}'])
    assert sc.target.headers_env == {"api-key": "AZURE_KEY"}
    d = sc.to_dict()
    assert d["target"]["headers_env"] == {"api-key": "AZURE_KEY"}
    from agentload.run.scenario import parse_scenario

    assert parse_scenario({k: v for k, v in d.items() if k != "source"}, sc.source) == sc


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
