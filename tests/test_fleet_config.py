"""The [fleet], [router] and [[schedule]] tables: every mistake is one line naming the key, and the
router's command line expands its placeholders (no process is started here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentload.errors import ScenarioError
from agentload.fleet.fleet import Fleet
from agentload.run.scenario import load_scenario
from helpers import cli

BASE = """
[fleet]
count = 3
[router]
command = "smg launch --port {port} --worker-urls {backend_urls} --policy {policy} --prometheus-port {metrics_port}"
policy = "cache_aware"
[agents]
duration_s = 5
"""


def _load(tmp_path: Path, text: str, sets: list[str] | None = None):
    p = tmp_path / "s.toml"
    p.write_text(text)
    return load_scenario(str(p), sets or [])


@pytest.mark.parametrize("sets, key, words", [
    (["schedule=[{at_s=1, backend=5, fault=\"hang\"}]"], "schedule[0].backend", "below 3"),
    (["schedule=[{at_s=1, backend=\"b9\", fault=\"hang\"}]"], "schedule[0].backend", "b0, b1, b2"),
    (["schedule=[{at_s=1, backend=0, fault=\"melt\"}]"], "schedule[0].fault", "hang"),
    (["schedule=[{at_s=-1, backend=0, fault=\"hang\"}]"], "schedule[0].at_s", ">= 0"),
    (["router.command=\"smg --port {prot}\""], "router.command", "placeholders"),
    (["router.command=\"smg --urls x{backend_urls}\""], "router.command", "argument of its own"),
    (["fleet.backends=[{role=\"prefill\"}, {role=\"decode\"}]", "fleet.count=2"], "fleet.mode", "pd"),
    (["fleet.mode=\"pd\""], "fleet.backends", "prefill"),
    (["fleet.backends=[{name=\"a\"}, {name=\"a\"}]", "fleet.count=2"], "fleet.backends", "once"),
    (["fleet.backends=[{mock={hang_above_tokens=\"x\"}}]", "fleet.count=1"], "fleet.backends[0].mock.hang_above_tokens", ""),
    (["router.command=false"], "router.command", "already"),
    (["agents.restart=true", "agents.duration_s=false"], "", ""),
    # --set into a list: an item replaced by a number is named, a number is not walked into as a table
    (["schedule=[{at_s=1, backend=0, fault=\"hang\"}]", "schedule.0=5"], "schedule[0]", "table"),
    (["schedule=[1]", "schedule.0.at_s=2"], "schedule.0.at_s", "expected schedule.0 to be a table, got 1"),
])
def test_mistakes_name_the_key(tmp_path, sets, key, words):
    with pytest.raises(ScenarioError) as e:
        _load(tmp_path, BASE, sets)
    text = str(e.value)
    assert "\n" not in text and key in text and words in text, text


def test_schedule_needs_a_fleet_and_restart_needs_a_duration(tmp_path):
    with pytest.raises(ScenarioError, match="schedule: expected a \\[fleet\\]"):
        _load(tmp_path, "[[schedule]]\nat_s = 1\nbackend = 0\nfault = \"hang\"\n")
    with pytest.raises(ScenarioError, match="agents.restart: expected agents.duration_s"):
        _load(tmp_path, "[agents]\nrestart = true\n")


def test_the_router_command_expands_its_placeholders(tmp_path):
    sc = _load(tmp_path, BASE)
    fleet = Fleet(sc.fleet, sc.router, sc.mock, sc.target.model, tmp_path, log=lambda m: None)
    for b, port in zip(fleet.backends, (8001, 8002, 8003)):
        b.port = port
    fleet.port, fleet.metrics_port = 30000, 29000
    assert fleet.command_argv() == ["smg", "launch", "--port", "30000", "--worker-urls", "http://127.0.0.1:8001",
                                    "http://127.0.0.1:8002", "http://127.0.0.1:8003", "--policy", "cache_aware",
                                    "--prometheus-port", "29000"]
    assert [b.mock.name for b in fleet.backends] == ["b0", "b1", "b2"]
    assert len({b.mock.seed for b in fleet.backends}) == 3  # fault draws differ per backend
    assert all(str(b.mock.request_log).endswith(f"fleet/{b.name}.requests.jsonl") for b in fleet.backends)


def test_pd_arguments_in_role_order(tmp_path):
    sc = _load(tmp_path, """
[fleet]
mode = "pd"
[[fleet.backends]]
role = "prefill"
bootstrap_port = 9000
[[fleet.backends]]
role = "decode"
[router]
command = "smg launch --pd-disaggregation {prefill_args} {decode_args}"
""")
    fleet = Fleet(sc.fleet, sc.router, sc.mock, sc.target.model, tmp_path, log=lambda m: None)
    fleet.backends[0].port, fleet.backends[1].port = 8001, 8002
    assert fleet.command_argv() == ["smg", "launch", "--pd-disaggregation", "--prefill", "http://127.0.0.1:8001",
                                    "9000", "--decode", "http://127.0.0.1:8002"]


def test_a_router_program_that_does_not_exist_is_one_line(tmp_path):
    p = tmp_path / "s.toml"
    p.write_text(BASE.replace("smg launch", "no-such-router-xyz"))
    res = cli("run", str(p), "--no-live", "--out", str(tmp_path / "run"))
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "no-such-router-xyz" in res.stderr, res.stderr
