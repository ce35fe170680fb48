"""How the evidence says things: counts, shares, rounds (or their bands in a long run), spans of
sizes, and a fleet's backends by name where a router's metrics give only their URLs."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any, Callable, Iterable

from agentload.analysis.stats import band_ranges


def fmt_counts(c: Counter[Any]) -> str:
    """`ServerDisconnectedError x3, http_500 x1`: most common first."""
    return ", ".join(f"{k} x{n}" for k, n in c.most_common())


def share(part: float | None, whole: float | None) -> str:
    """`part` as a whole percentage of `whole` ("0%" when either is missing or zero)."""
    if not part or not whole:
        return "0%"
    return f"{100.0 * part / whole:.0f}%"


def _round_rows(rounds: Iterable[int]) -> Callable[[int], str]:
    """How evidence names a round: itself, or in a run with more than MAX_ROUND_ROWS rounds that
    have something to say, its band as the tables have it ("rounds 41-80")."""
    ranges = band_ranges(rounds)
    if ranges is None:
        return lambda r: f"round {r}"
    labels = [(lo, hi, f"round {lo}" if lo == hi else f"rounds {lo}-{hi}") for lo, hi in ranges]
    return lambda r: next(x for lo, hi, x in labels if lo <= r <= hi)


def fmt_round_counts(c: Counter[int]) -> str:
    """"round 3: 2, round 4: 1", or by band past MAX_ROUND_ROWS rounds (a day-long run)."""
    label = _round_rows(c)
    out: Counter[str] = Counter()
    for rnd in sorted(c):
        out[label(rnd)] += c[rnd]
    return ", ".join(f"{k}: {n}" for k, n in out.items())


def fmt_phase_counts(c: Counter[tuple[int, str | None]]) -> str:
    """"round 3 ttfb: 2, round 4 stream: 1" from counts by (round, phase), by band as fmt_round_counts."""
    label = _round_rows(rnd for rnd, _ in c)
    out: Counter[tuple[str, str | None]] = Counter()
    for (rnd, ph), n in sorted(c.items()):
        out[(label(rnd), ph)] += n
    return ", ".join(f"{k} {ph}: {n}" for (k, ph), n in out.items())


def fmt_span(values: list[int]) -> str:
    """"1,024" or "1,024-4,096": the smallest and largest of `values`."""
    lo, hi = min(values), max(values)
    return f"{lo:,}" if lo == hi else f"{lo:,}-{hi:,}"


def backend_names(meta: dict[str, Any]) -> list[tuple[str, str]]:
    """(url, "url (name)") of each fleet backend: a router's metrics name workers by URL only."""
    fleet = meta.get("fleet") or {}
    out: list[tuple[str, str]] = []
    for b in fleet.get("backends") or []:
        if isinstance(b, dict) and b.get("url") and b.get("name"):
            role = "" if b.get("role") in (None, "worker") else f" {b['role']}"
            out.append((b["url"], f"{b['url']} ({b['name']}{role})"))
    return out


def with_backend_names(v: dict[str, Any], names: list[tuple[str, str]]) -> dict[str, Any]:
    """A finding's dict whose evidence names each backend URL it quotes (`backend_names`)."""
    if names:
        def sub(text: str) -> str:
            for url, named in names:
                text = re.sub(re.escape(url) + r"(?![\d/])", named, text)
            return text

        v["evidence"] = [sub(e) for e in v.get("evidence") or []]
    return v
