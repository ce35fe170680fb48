"""`agentload compare` as text (the terminal table, compare.txt) and the files it writes
(compare.json, compare.txt, compare.html)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console
from rich.table import Table
from rich.text import Text

from agentload.analysis.compare import _show, fmt_value
from agentload.atomic import write_atomic


def _cell(doc: dict[str, Any], row: dict[str, Any], var: dict[str, Any]) -> tuple[str, bool]:
    parts = []
    any_best = False
    for k in row["keys"]:
        s = fmt_value(k, var["metrics"].get(k), var["metrics"])
        if var["name"] in row["best"][k]:
            s += "*"
            any_best = True
        parts.append(s)
    return " / ".join(parts), any_best


def _common_line(common: dict[str, Any], section: str) -> str:
    items = [(k.split(".", 1)[1], v) for k, v in common.items() if k.startswith(section + ".")]
    return " ".join(f"{k}={_show(v)}" for k, v in items)


def render_text(doc: dict[str, Any], width: int = 120, color: bool = False) -> str:
    cells = [[_cell(doc, row, var)[0] for var in doc["variants"]] for row in doc["rows"]]
    heads = [var["name"].split(",") for var in doc["variants"]]
    cols = [max([len(h) for h in heads[i]] + [len(r[i]) for r in cells]) for i in range(len(heads))]
    needed = max(len(row["label"]) for row in doc["rows"]) + sum(cols) + 3 * len(cols)
    width = min(max(width, needed), 400)  # the table is never cut: wider than asked if it must be
    buf = io.StringIO()
    con = Console(file=buf, width=width, force_terminal=color, color_system="standard" if color else None,
                  no_color=not color, highlight=False, emoji=False, soft_wrap=False, markup=False)
    w = doc["workload"]
    fp = doc["fingerprint"] or "DIFFERENT (forced)"
    con.print(f"compare: {doc['scenario']}  workload {fp}  "
              f"{w.get('agents')} agents x {w.get('rounds')} rounds, seed {w.get('seed')}  "
              f"({len(doc['variants'])} runs)")
    con.print("same in every run: client: " + (_common_line(doc["common"], "client") or "-"), soft_wrap=True)
    con.print("                   stall: " + (_common_line(doc["common"], "stall") or "-") +
              f"   target: {doc['common'].get('target.endpoint', 'varied')}"
              f"   api: {doc['common'].get('target.api', 'varied')}", soft_wrap=True)
    table = Table(show_edge=False, pad_edge=False, header_style="bold")
    table.add_column("", justify="left", no_wrap=True)
    for var in doc["variants"]:
        table.add_column("\n".join(var["name"].split(",")), justify="right", no_wrap=True)
    for row in doc["rows"]:
        row_cells: list[Text] = []
        for var in doc["variants"]:
            text, best = _cell(doc, row, var)
            row_cells.append(Text(text, style="bold green" if (best and color) else ""))
        table.add_row(row["label"], *row_cells)
    con.print(table)
    for line in doc["legend"]:
        con.print(line, soft_wrap=True)
    for n in doc["notes"]:
        con.print(f"note: {n}", soft_wrap=True)
    for line in doc.get("routing") or ():
        con.print(f"routing: {line}", soft_wrap=True)
    con.print("verdicts:")
    for var in doc["variants"]:
        v = var["verdict"]
        con.print(f"  {var['name']}: [{v.get('kind')}] {v.get('summary')}", soft_wrap=True)
        for sec in v.get("secondary") or []:
            con.print(f"      also [{sec.get('kind')}] {sec.get('summary')}", soft_wrap=True)
        errs = var["metrics"].get("error_classes") or {}
        if errs:
            con.print("      errors: " + ", ".join(f"{k} x{n}" for k, n in errs.items()), soft_wrap=True)
    return buf.getvalue()


def write_outputs(doc: dict[str, Any], out_dir: Path, width: int = 120) -> str:
    """compare.json, compare.txt and compare.html into out_dir; returns the text table."""
    from agentload.report.compare_html import build_compare_html

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(out_dir / "compare.json", orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    text = render_text(doc, width=width)
    write_atomic(out_dir / "compare.txt", text.encode())
    write_atomic(out_dir / "compare.html", build_compare_html(doc).encode())
    return text
