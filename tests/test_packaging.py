"""Packaging: the version is written once and `agentload --version` prints it; the wheel carries the
licence, the type marker and the packaged scenarios, and a run works from it installed."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile

import orjson
import pytest

import agentload
from helpers import REPO, cli


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
def test_the_wheel_carries_the_licence_and_the_scenarios_and_runs_installed(tmp_path):
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

    # Installed from the wheel into a venv (the dependencies from this interpreter's site-packages:
    # no index needed), run from a folder outside the repository: the packaged scenarios and the
    # embedded mock work from the installed package, not from a checkout.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    p = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

    def installed(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(venv / "bin" / "agentload"), *args], capture_output=True, text=True,
                              timeout=300, cwd=elsewhere, env=env)

    where = subprocess.run([str(py), "-c", "import agentload; print(agentload.__file__)"], capture_output=True,
                           text=True, timeout=60, cwd=elsewhere, env=env).stdout.strip()
    assert where.startswith(str(venv)), where
    assert installed("--version").stdout == f"agentload {agentload.__version__}\n"
    assert "long-context-hang" in installed("scenarios").stdout
    p = installed("run", "demo", "--no-live", "--set", "agents.count=2", "--set", "agents.rounds=2",
                  "--out", str(elsewhere / "run"))
    assert p.returncode == 0 and p.stdout.startswith("VERDICT [healthy]"), p.stdout + p.stderr
    # the run folder, written by the installed package from its packaged scenario and embedded mock
    run = elsewhere / "run"
    assert {"run.json", "records.jsonl", "summary.json", "report.txt", "report.html"} <= {f.name for f in run.iterdir()}
    meta = orjson.loads((run / "run.json").read_bytes())
    assert meta["version"] == agentload.__version__ and meta["embedded_mock"] is True and meta["ended_normally"]
    agents = [r for r in map(orjson.loads, (run / "records.jsonl").read_bytes().splitlines()) if r["kind"] == "agent"]
    assert len(agents) == 2 * 2 and all(r["outcome"] == "ok" for r in agents)
    assert "scenario demo.toml (packaged)" in (run / "report.txt").read_text()
