"""Shared pytest options and fixtures (add to this file with small edits; several suites use it)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# development tooling (the DevTools client for the HTML render tests) lives in tools/, not in the package
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--regen-golden", action="store_true", default=False,
                     help="rewrite the golden files under tests/golden/ from the fixtures instead of comparing")


@pytest.fixture
def regen_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--regen-golden"))
