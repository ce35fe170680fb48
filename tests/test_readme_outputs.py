"""tools/readme_outputs.py: the outputs README.md and the docs pages quote come from the commands their
markers name, and every marker names a command the script can run."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from helpers import REPO

sys.path.insert(0, str(REPO / "tools"))
import readme_outputs  # noqa: E402

# one width for rich's tables, whatever the terminal the tests run in
ENV = dict(os.environ, COLUMNS="100", PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))


def _script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "tools" / "readme_outputs.py"), *args], capture_output=True,
                          text=True, timeout=120, env=ENV)


def test_every_marker_in_the_readme_and_the_docs_names_a_command_the_script_runs():
    pages = readme_outputs.pages()
    assert REPO / "README.md" in pages and REPO / "docs" / "compare.md" in pages
    found = {}
    for page in pages:
        for m in readme_outputs.MARKER.finditer(page.read_text(encoding="utf-8")):
            argv, _ = readme_outputs.parse(m["cmd"], page.name)
            found.setdefault(page.name, []).append(argv[1])
    # the verdict sample on the README's first screen, and the comparisons moved to the docs
    assert found["README.md"] == ["run"]
    assert found["compare.md"] == ["compare", "compare"]


def test_a_marker_that_is_not_agentloads_own_command_is_refused():
    with pytest.raises(SystemExit, match="only agentload commands"):
        readme_outputs.parse("ls -l | head -3")
    with pytest.raises(SystemExit, match="head -N"):
        readme_outputs.parse("agentload scenarios | sort")


def test_a_stale_block_is_found_and_replaced_by_what_the_command_prints(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("Packaged scenarios:\n\n<!-- output: agentload scenarios | head -2 -->\n```\nstale\n```\n\nAfter.\n")
    assert _script("--check", str(page)).returncode == 1
    assert "stale" in page.read_text()  # --check writes nothing
    p = _script(str(page))
    assert p.returncode == 0, p.stderr
    now = subprocess.run([sys.executable, "-m", "agentload.cli", "scenarios"], capture_output=True, text=True,
                         cwd=REPO, timeout=60, env=ENV).stdout.splitlines()[:2]
    text = page.read_text()
    assert text == ("Packaged scenarios:\n\n<!-- output: agentload scenarios | head -2 -->\n```\n"
                    + "".join(line.rstrip() + "\n" for line in now) + "```\n\nAfter.\n")
    assert _script("--check", str(page)).returncode == 0
