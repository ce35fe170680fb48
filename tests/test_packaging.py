"""Packaging: the version is written once and `agentload --version` prints it; the wheel carries the
licence, the type marker and the packaged scenarios."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
import zipfile

import pytest

from helpers import REPO, cli

import agentload


def test_version_prints_the_packages_version():
    p = cli("--version")
    assert p.returncode == 0, p.stderr
    assert p.stdout == f"agentload {agentload.__version__}\n"
    assert re.fullmatch(r"\d+\.\d+\.\d+((a|b|rc)\d+)?(\.dev\d+)?", agentload.__version__)


def test_the_version_is_written_in_one_place():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "agentload.__version__"}
    changelog = (REPO / "CHANGELOG.md").read_text()
    assert changelog.index("## Unreleased") < changelog.index("## 0.2.0")


@pytest.mark.slow
def test_the_wheel_carries_the_licence_the_type_marker_and_the_scenarios(tmp_path):
    # built with the installed setuptools (no index needed) from a copy of what the sdist holds, so
    # setuptools' build/ folder neither lands in the repository nor feeds the wheel stale files
    src = tmp_path / "src"
    shutil.copytree(REPO / "agentload", src / "agentload", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, src / name)
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                        "-w", str(tmp_path), str(src)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    (wheel,) = tmp_path.glob("agentload-*.whl")
    assert wheel.name.startswith(f"agentload-{agentload.__version__}-")
    names = zipfile.ZipFile(wheel).namelist()
    assert "agentload/py.typed" in names
    assert "agentload/scenarios/demo.toml" in names and "agentload/scenarios/long-context-hang.toml" in names
    meta_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
    meta = zipfile.ZipFile(wheel).read(meta_name).decode()
    assert "License-Expression: Apache-2.0" in meta and f"Version: {agentload.__version__}" in meta
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert not any(n.startswith(("tests/", "tools/", "bench/", "docs/")) for n in names)
