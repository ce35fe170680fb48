"""One path from a run folder to every report: used at the end of `run` and by `report`.

Every file written here goes through `agentload.redact` (a secret the environment holds never
reaches summary.json, report.txt or report.html, nor the text returned for printing)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from agentload.analysis.passes import one_pass
from agentload.analysis.summary import SummaryPass, build_summary
from agentload.atomic import write_atomic
from agentload.errors import UserError
from agentload.records.rundir import load_run
from agentload.redact import redact, redact_bytes
from agentload.report.html_view import HtmlView
from agentload.report.text import render


def write_reports(run_dir: Path, width: int = 120) -> tuple[dict[str, Any], str]:
    run_dir = Path(run_dir)
    data = load_run(run_dir)  # also remembers the secrets run.json's target names, from this environment
    from agentload.report.html import (
        build_html_bytes,  # plotly import is slow-ish: only when writing
    )

    # one pass over the records feeds the summary (and the verdict) and the HTML report
    sp, view = SummaryPass(data), HtmlView(data)
    one_pass(data, [sp, view])
    summary = build_summary(data, sp)
    # the summary's pass state (histograms, per-agent tallies, the troubled records) is done with:
    # let it go before the HTML is built, whose figures reuse that memory (a day-long run: -11 MB peak)
    del sp
    text = redact(render(summary, width=width))

    try:
        write_atomic(run_dir / "summary.json", redact_bytes(orjson.dumps(summary, option=orjson.OPT_INDENT_2)))
        write_atomic(run_dir / "report.txt", text.encode("utf-8"))
        write_atomic(run_dir / "report.html", build_html_bytes(data, summary, view))
    except OSError as e:  # a read-only copy of a run folder, a full disk
        raise UserError(f"{run_dir}: cannot write the reports into the run folder "
                        f"({e.strerror or e.__class__.__name__}); expected a writable folder") from None
    return summary, text
