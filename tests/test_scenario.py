"""Scenario loading and validation: bad input fails before traffic, with one line naming file and key."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentload.errors import ScenarioError
from agentload.run.conversation import agent_rng
from agentload.run.dist import Dist
from agentload.run.scenario import load_scenario, packaged_scenarios, parse_scenario
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
        # issue 12: request ids, assistant turns, tool_choice
        ("[target]\nheaders = { \"x-request-id\" = \"a\" }\n", "target.headers.x-request-id",
         "also set by target.request_id_header (each request gets its own id there; "
         "target.request_id_header = \"\" sends none"),
        ("[target]\nrequest_id_header = \"X-Trace\"\nheaders_env = { \"x-trace\" = \"V\" }\n",
         "target.headers_env.x-trace", "also set by target.request_id_header"),
        ("[target]\nrequest_id_header = true\n", "target.request_id_header", "a header name for the request id"),
        ("[target]\nrequest_id_header = \"bad name\"\n", "target.request_id_header", "a header name"),
        ("[target]\nrequest_id_format = \"ulid\"\n", "target.request_id_format", "'uuid', 'readable', got 'ulid'"),
        ("[conversation]\nassistant_content = \"nil\"\n", "conversation.assistant_content",
         "'empty', 'null', 'omit', got 'nil'"),
        ("[conversation]\ntool_choice = \"tool_9\"\n", "conversation.tool_choice",
         "'auto', 'required', 'none' or an offered tool's name (tool_0, tool_1, tool_2, tool_3), got 'tool_9'"),
        ("[conversation]\ntool_choice = \"\"\n", "conversation.tool_choice", "got ''"),
        ("[conversation]\ntools = 0\ntool_choice = \"auto\"\n", "conversation.tool_choice",
         "the conversation offers no tools (conversation.tools = 0)"),
        ("[mock]\ntool_call_rate = 2\n", "mock.tool_call_rate", "a number >= 0 and <= 1, got 2"),
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


@pytest.mark.parametrize("text,expected", [
    # one mechanism (agentload.validate) for the scenario and the mock: the same words for the same rule
    ("[agents]\nstart = -1\n", "agents.start: expected 'all' or a ramp length in seconds (a number >= 0), got -1"),
    ("[agents]\ncuont = 3\n", "agents.cuont: unknown key (did you mean count?); expected one of: count, rounds, "
                              "start, seed, duration_s, arrival, rate_per_s, rate_dist, error_retries, "
                              "rate_limit_retries, retry_after_max_s, restart"),
    ("[stall]\nafter_s = 0\n", "stall.after_s: expected a number > 0 (0 would count every request as stalled), got 0"),
    ("[stall]\nafter_s = 10\ngive_up_s = 5\n", "stall.give_up_s: expected a number >= stall.after_s (10), got 5"),
    ("[conversation]\nuser_tokens = { dist = \"uniform\", min = 3 }\n",
     "conversation.user_tokens.max: missing; expected a number >= 0 (dist = 'uniform' draws between min and max)"),
    ("[conversation]\nuser_tokens = \"many\"\n",
     "conversation.user_tokens: expected a number >= 0 or a table { dist = ..., mean = ... }, got 'many'"),
    ("[target]\nmetrics_urls = [\"http://x/metrics\", 5]\n",
     "target.metrics_urls[1]: expected an http:// or https:// URL, got 5"),
    ("[target]\nheaders = { \"X-Team\" = 5 }\n", "target.headers.X-Team: expected a header value (a string on one line), got 5"),
    ("[mock]\nstyle = \"tgi\"\n", "mock.style: expected one of 'vllm', 'sglang', got 'tgi'"),
    ("stall = 5\n", "stall: expected a table, got 5"),
    ("description = 5\n", "description: expected a string, got 5"),
])
def test_messages_name_key_expectation_and_value(tmp_path, text, expected):
    path = write(tmp_path, text)
    with pytest.raises(ScenarioError) as ei:
        load_scenario(path)
    assert str(ei.value) == f"{path}: {expected}"


def test_whole_numbers_may_be_written_as_integral_floats(tmp_path):
    sc = load_scenario(write(tmp_path, "[agents]\ncount = 5.0\n[mock]\noutput_tokens = 7.0\n"))
    assert sc.agents.count == 5 and type(sc.agents.count) is int and sc.mock.output_tokens == 7


@pytest.mark.parametrize("sets,expected", [
    # a value an override wrote: the error names --set, not the file the override was applied to
    (["client.limit=-1"], "--set: client.limit: expected a whole number >= 0, got -1"),
    (["agents.cuont=3"], "--set: agents.cuont: unknown key (did you mean count?)"),
    (["nonsense.x=1"], "--set: nonsense: unknown section; expected one of: target, agents"),
    (["mock.error_rate=abc"], "--set: mock.error_rate: expected a number >= 0 and <= 1, got 'abc'"),
    (["mock.stall_mid_stream.for_s=2"], "--set: mock.stall_mid_stream.after_tokens: missing; expected a whole number >= 0"),
    (['conversation.user_tokens={ dist = "lognormal" }'], "--set: conversation.user_tokens.mean: missing; expected a number > 0"),
    # the parser's own errors
    (["limit=3"], "--set: limit: expected section.key=value, e.g. client.limit=20"),
    (["client.limit"], "--set: client.limit: expected section.key=value"),
    (["client..limit=3"], "--set: client..limit: expected section.key=value"),
    (["client.limit.x=1"], "--set: client.limit.x: expected client.limit to be a table, got 100"),
])
def test_override_errors_name_set(sets, expected):
    with pytest.raises(ScenarioError) as ei:
        load_scenario("demo", sets)
    assert str(ei.value).startswith(expected), str(ei.value)


def test_an_override_that_breaks_a_file_value_names_the_file(tmp_path):
    path = write(tmp_path, "[stall]\ngive_up_s = 20\n")
    with pytest.raises(ScenarioError) as ei:
        load_scenario(path, ["stall.after_s=30"])
    assert str(ei.value) == f"{path}: stall.give_up_s: expected a number >= stall.after_s (30), got 20"


def test_set_values_are_toml_values_else_strings():
    sc = load_scenario("demo", ["target.model=my model", 'target.metrics_series=["a", "b"]', "agents.start=2.5",
                                "client.force_close=true", 'target.model="x = 1"'])
    assert sc.target.metrics_series == ["a", "b"] and sc.agents.start == 2.5 and sc.client.force_close is True
    assert sc.target.model == "x = 1"
    assert load_scenario("demo", ["target.model=my model"]).target.model == "my model"
    # two TOML lines are not one value: kept as the bare string
    assert load_scenario("demo", ["target.model=1\nx = 2"]).target.model == "1\nx = 2"


def test_overrides_apply_and_are_recorded():
    sc = load_scenario("demo", ["client.limit=7", "agents.count=3", "mock.hang_above_tokens=500",
                                'conversation.tool_latency_ms={ dist = "exponential", mean = 5 }'])
    assert sc.client.limit == 7 and sc.agents.count == 3 and sc.mock.hang_above_tokens == 500
    d = sc.to_dict()
    assert d["client"]["limit"] == 7
    assert d["conversation"]["tool_latency_ms"]["dist"] == "exponential"
    # The effective scenario round-trips through its own dict.
    again = parse_scenario({k: v for k, v in d.items() if k != "source"}, sc.source)
    assert again == sc


def test_headers_env_names_variables_and_round_trips():
    sc = load_scenario("demo", ['target.headers_env={"api-key" = "AZURE_KEY"}', 'target.headers={"X-Team" = "a"}'])
    assert sc.target.headers_env == {"api-key": "AZURE_KEY"}
    d = sc.to_dict()
    assert d["target"]["headers_env"] == {"api-key": "AZURE_KEY"}
    assert parse_scenario({k: v for k, v in d.items() if k != "source"}, sc.source) == sc


def test_request_id_and_tool_settings_defaults_switches_and_round_trip():
    sc = load_scenario("demo")
    assert (sc.target.request_id_header, sc.target.request_id_format) == ("X-Request-ID", "uuid")
    assert (sc.conversation.assistant_content, sc.conversation.tool_choice) == ("empty", None)
    assert sc.conversation.tool_choice_json() is None
    for off in ("false", '""'):
        sc = load_scenario("demo", [f"target.request_id_header={off}", 'target.headers={"X-Request-ID" = "mine"}'])
        assert sc.target.request_id_header == "" and sc.target.headers == {"X-Request-ID": "mine"}
    sc = load_scenario("demo", ['target.request_id_header="X-Correlation-ID"', 'target.request_id_format="readable"',
                                'target.headers={"X-Request-ID" = "mine"}', 'conversation.assistant_content="omit"',
                                "conversation.tools=8", 'conversation.tool_choice="tool_7"'])
    assert sc.conversation.tool_choice_json() == {"type": "function", "function": {"name": "tool_7"}}
    d = sc.to_dict()
    assert d["target"]["request_id_header"] == "X-Correlation-ID" and d["conversation"]["tool_choice"] == "tool_7"
    assert parse_scenario({k: v for k, v in d.items() if k != "source"}, sc.source) == sc
    assert load_scenario("demo", ['conversation.tool_choice="required"']).conversation.tool_choice_json() == "required"


def test_every_packaged_scenario_loads_and_says_what_it_shows():
    names = packaged_scenarios()
    assert {"demo", "healthy", "long-context-hang", "pool-starvation", "mid-stream-stall"} <= set(names)
    for n in names:
        sc = load_scenario(n)
        assert sc.description.strip(), f"{n} has no description"
        # shards and workers get the scenario as run.json holds it: it must come back the same
        d = sc.to_dict()
        assert parse_scenario({k: v for k, v in d.items() if k != "source"}, sc.source) == sc, n


def test_a_router_soak_describes_the_router_it_starts():
    """A scenario that starts a router names that router in its description, and no other (the
    vllm-router soak's said it ran "through smg")."""
    routers = {"smg", "vllm-router"}
    seen = 0
    for n in packaged_scenarios():
        sc = load_scenario(n)
        if not sc.router.command:
            continue
        binary = sc.router.command.split()[0]
        if binary not in routers:
            continue
        seen += 1
        words = set(re.findall(r"[\w-]+", sc.description))
        assert binary in words, (n, binary)
        assert not (routers - {binary}) & words, (n, sc.description)
    assert seen >= 2


def test_fingerprint_ignores_client_but_not_workload():
    a = load_scenario("demo")
    assert a.workload_fingerprint() == load_scenario("demo", ["client.limit=3", "client.force_close=true"]).workload_fingerprint()
    assert a.workload_fingerprint() != load_scenario("demo", ["agents.seed=99"]).workload_fingerprint()


@given(kind=st.sampled_from(["uniform", "normal", "lognormal", "exponential"]), mean=st.floats(1, 5000),
       sigma=st.floats(0, 2), seed=st.integers(0, 2**32))
@settings(max_examples=50, deadline=None)
def test_distributions_are_seeded_and_non_negative(kind, mean, sigma, seed):
    d = Dist(kind=kind, mean=mean, sigma=sigma, min=0.0 if kind == "uniform" else None,
             max=mean if kind == "uniform" else None)
    ra, rb = agent_rng(seed, 0), agent_rng(seed, 0)
    a = [d.sample(ra) for _ in range(3)]
    b = [d.sample(rb) for _ in range(3)]
    assert a == b and all(x >= 0 and type(x) is float for x in a)


def test_distribution_semantics():
    rng = np.random.default_rng(7)
    # lognormal: `mean` is the median scale exp(mu); exponential: `mean` is the mean
    logn = np.array([Dist(kind="lognormal", mean=300, sigma=0.5).sample(rng) for _ in range(20000)])
    assert abs(np.median(logn) / 300 - 1) < 0.03
    expo = np.array([Dist(kind="exponential", mean=20).sample(rng) for _ in range(20000)])
    assert abs(expo.mean() / 20 - 1) < 0.03
    unif = [Dist(kind="uniform", min=5, max=9).sample(rng) for _ in range(2000)]
    assert 5 <= min(unif) < 5.1 and 8.9 < max(unif) < 9
    clipped = [Dist(kind="normal", mean=10, sigma=50, min=2, max=30).sample(rng) for _ in range(2000)]
    assert min(clipped) == 2 and max(clipped) == 30


def test_agent_streams_depend_on_seed_and_agent_only():
    def draws(seed, agent):
        return agent_rng(seed, agent).random(4).tolist()

    assert draws(1, 3) == draws(1, 3)
    assert len({tuple(draws(s, a)) for s in (1, 2) for a in (0, 1, 2)}) == 6
    # seeds past 2**32 do not alias another (seed, agent) pair
    assert draws(5 * 2**32 + 3, 0) != draws(3, 5)


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
