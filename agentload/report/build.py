"""One path from a run folder to every report: used at the end of `run` and by `report`.

Every file written here goes through `agentload.redact` (a secret the environment holds never
reaches summary.json, report.txt or report.html, nor the text returned for printing)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from agentload.errors import UserError
from agentload.redact import redact, redact_bytes
from agentload.records.rundir import load_run
from agentload.analysis.summary import build_summary
from agentload.report.text import render


def write_reports(run_dir: Path, width: int = 120) -> tuple[dict[str, Any], str]:
    run_dir = Path(run_dir)
    data = load_run(run_dir)  # also remembers the secrets run.json's target names, from this environment
    summary = build_summary(data)
    text = redact(render(summary, width=width))
    from agentload.report.html import write_html  # plotly import is slow-ish: only when writing

    try:
        (run_dir / "summary.json").write_bytes(redact_bytes(orjson.dumps(summary, option=orjson.OPT_INDENT_2)))
        (run_dir / "report.txt").write_text(text, encoding="utf-8")
        write_html(run_dir, data, summary)
    except OSError as e:  # a read-only copy of a run folder, a full disk
        raise UserError(f"{run_dir}: cannot write the reports into the run folder "
                        f"({e.strerror or e.__class__.__name__}); expected a writable folder") from None
    return summary, text
