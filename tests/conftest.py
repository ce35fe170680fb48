"""Shared pytest options and fixtures (add to this file with small edits; several suites use it)."""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--regen-golden", action="store_true", default=False,
                     help="rewrite the golden files under tests/golden/ from the fixtures instead of comparing")
    parser.addoption("--run-soak", action="store_true", default=False,
                     help="run the minutes-long soak tests (marked soak); .ci/run runs them in a second pytest call")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--run-soak"):
        return
    skip = pytest.mark.skip(reason="soak test: minutes long, run with --run-soak (as .ci/run does)")
    for item in items:
        if "soak" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def regen_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--regen-golden"))
