"""The verdict as a pure function: records and samples of a real run, with the samples altered."""

from __future__ import annotations

import copy

import pytest

from agentload.diagnose import diagnose
from agentload.report.rundir import load_run

from helpers import run_scenario


@pytest.fixture(scope="module")
def healthy_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("healthy")
    run_scenario("demo", out, ["agents.count=4", "agents.rounds=3"])
    return load_run(out)


def test_sustained_loop_lag_is_client_saturated_but_a_spike_is_not(healthy_run):
    assert diagnose(healthy_run)["kind"] == "healthy"
    data = copy.copy(healthy_run)
    base = healthy_run.samples[0]
    data.samples = [dict(base, loop_lag_ms=5.0) for _ in range(9)] + [dict(base, loop_lag_ms=400.0)]
    assert diagnose(data)["kind"] == "healthy"  # one spike: a warning, not a verdict
    data.samples = [dict(base, loop_lag_ms=350.0) for _ in range(6)] + [dict(base, loop_lag_ms=5.0)] * 4
    v = diagnose(data)
    assert v["kind"] == "client_saturated" and "350 ms" in v["evidence"][0]


def test_no_records_is_no_data(healthy_run):
    data = copy.copy(healthy_run)
    data.records = []
    assert diagnose(data)["kind"] == "no_data"
