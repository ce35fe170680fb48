"""One path from a run folder to every report: used at the end of `run` and by `report`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from agentload.report.rundir import load_run
from agentload.report.summary import build_summary
from agentload.report.text import render


def write_reports(run_dir: Path, width: int = 120) -> tuple[dict[str, Any], str]:
    data = load_run(run_dir)
    summary = build_summary(data)
    (run_dir / "summary.json").write_bytes(orjson.dumps(summary, option=orjson.OPT_INDENT_2))
    text = render(summary, width=width)
    (run_dir / "report.txt").write_text(text, encoding="utf-8")
    from agentload.report.html import write_html  # plotly import is slow-ish: only when writing

    write_html(run_dir, data, summary)
    return summary, text
