"""MkDocs hooks (mkdocs.yml `hooks:`): pages generated from the code when the site is built.

`scenario-reference.md` is rendered by tools/scenario_reference.py from the scenario's validation
model, so the documented keys are the ones the code accepts, whoever added one last.
"""

from __future__ import annotations

import sys
from pathlib import Path

from mkdocs.structure.files import File, Files

sys.path.insert(0, str(Path(__file__).resolve().parent))
import scenario_reference  # noqa: E402


def on_files(files: Files, config) -> Files:
    files.append(File.generated(config, scenario_reference.PAGE, content=scenario_reference.render()))
    return files
