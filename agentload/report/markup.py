"""What agentload's HTML pages (report.html, compare.html) share: escaping, milliseconds, the
plotly template and the charts' toolbar."""

from __future__ import annotations

import html
from typing import Any

from agentload.analysis.stats import fmt_ms

TEMPLATE = "plotly_white"
PLOT_CONFIG = {"displaylogo": False, "responsive": True, "modeBarButtonsToRemove": ["select2d", "lasso2d"]}


def esc(v: Any) -> str:
    """`v` as HTML text (None as nothing)."""
    return html.escape("" if v is None else str(v))


def ms(v: float | None) -> str:
    return fmt_ms(v, sep=" ")
