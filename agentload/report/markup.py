"""What report.html's tables and its figures' hover texts share: escaping and milliseconds."""

from __future__ import annotations

import html
from typing import Any

from agentload.analysis.stats import fmt_ms


def esc(v: Any) -> str:
    """`v` as HTML text (None as nothing)."""
    return html.escape("" if v is None else str(v))


def ms(v: float | None) -> str:
    return fmt_ms(v, sep=" ")
