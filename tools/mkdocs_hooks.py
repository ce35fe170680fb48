"""MkDocs hooks (mkdocs.yml `hooks:`): pages generated from the code when the site is built.

`scenario-reference.md` is rendered by tools/scenario_reference.py from the scenario's validation
model, so the documented keys are the ones the code accepts, whoever added one last;
`changelog.md` is the repository's CHANGELOG.md as it is.
"""

from __future__ import annotations

import sys
from pathlib import Path

from mkdocs.structure.files import File, Files

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import scenario_reference  # noqa: E402

# page in the site -> what renders it
GENERATED = {
    scenario_reference.PAGE: scenario_reference.render,
    "changelog.md": lambda: (HERE.parent / "CHANGELOG.md").read_text(encoding="utf-8"),
}


def on_files(files: Files, config) -> Files:
    for page, render in GENERATED.items():
        files.append(File.generated(config, page, content=render()))
    return files
