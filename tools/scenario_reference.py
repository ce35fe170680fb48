"""The scenario reference: every key a scenario takes, generated from the validation model.

The keys, their defaults and what each accepts come from the dataclasses agentload validates a
scenario with (`agentload.run.scenario.Scenario` and the sections it embeds, through
`agentload.validate.checks_of`); what a key does comes from the comments written beside its field
in the source. Nothing here is typed by hand, so the page cannot drift from the code: the docs site
builds it each time (`tools/mkdocs_hooks.py`), and `python tools/scenario_reference.py` prints it.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import re
import sys
import textwrap
import tokenize
from pathlib import Path
from typing import Any, Iterator

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script from anywhere: this repository's agentload
    sys.path.insert(0, str(REPO))

from agentload.run.dist import Dist  # noqa: E402
from agentload.run.scenario import Scenario  # noqa: E402
from agentload.validate import Check, Items, Model, Opt, checks_of  # noqa: E402

PAGE = "scenario-reference.md"


@dataclasses.dataclass
class Key:
    key: str  # dotted, as `--set` writes it (a list of tables: `fleet.backends[].name`)
    default: str
    accepts: str
    what: str


def field_comments(cls: type) -> dict[str, str]:
    """Field name -> the comments written with it: the lines right above it and those on its own lines."""
    try:
        src = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    comments: dict[int, tuple[str, bool]] = {}  # line -> (text, alone on its line)
    lines = src.splitlines()
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.COMMENT:
            alone = not lines[tok.start[0] - 1][: tok.start[1]].strip()
            comments[tok.start[0]] = (tok.string.lstrip("#").strip(), alone)
    body = ast.parse(src).body[0]
    assert isinstance(body, ast.ClassDef)
    out: dict[str, str] = {}
    for node in body.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        above = []
        line = node.lineno - 1
        while line in comments and comments[line][1]:
            above.insert(0, comments[line][0])
            line -= 1
        if len(above) == 1 and len(above[0].split()) <= 3:  # a group label ("faults"), not this field's text
            above = []
        inline = [comments[n][0] for n in range(node.lineno, (node.end_lineno or node.lineno) + 1)
                  if n in comments and not comments[n][1]]
        text = " ".join(above + inline).strip()
        if text:
            out[node.target.id] = text
    return out


def show_default(value: Any) -> str:
    if value is dataclasses.MISSING:
        return "required"
    if value is None:
        return "left out"
    if isinstance(value, Dist):
        value = value.to_json()
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, str):
        return '""' if not value else f'"{value}"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(show_default(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {show_default(v)}" for k, v in value.items()) + "}"
    return str(value)


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def doc_of(cls: type) -> str:
    """The first paragraph of a class's own docstring ("" for the signature dataclasses make up)."""
    doc = inspect.getdoc(cls) or ""
    if not doc or doc.startswith(cls.__name__ + "("):
        return ""
    return doc.split("\n\n")[0].replace("\n", " ")


def plain(comment: str) -> str:
    """A field's comment as the page says it: a value left out is not Python's None to a reader."""
    return re.sub(r"\bNone\b", "left out", comment)


def _nested(check: Check) -> tuple[type | None, bool]:
    """The dataclass a check builds (a table, or a list of tables: the bool), if any."""
    if isinstance(check, Opt):
        return _nested(check.check)
    if isinstance(check, Model):
        return check.cls, False
    if isinstance(check, Items) and isinstance(check.item, Model):
        return check.item.cls, True
    return None, False


def keys_of(cls: type, prefix: str) -> Iterator[Key]:
    """Every key of the table `cls`, depth first: a nested table's keys follow the key that holds it."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    notes = field_comments(cls)
    for name, (check, _required) in checks_of(cls).items():
        key = f"{prefix}.{name}" if prefix else name
        nested, many = _nested(check)
        what = plain(notes.get(name, ""))
        if nested is not None and not what:
            what = doc_of(nested)
        yield Key(key, show_default(_default(fields[name])), check.expected, what)
        if nested is not None:
            yield from keys_of(nested, f"{key}[]" if many else key)


def sections() -> Iterator[tuple[str, str, list[Key]]]:
    """(title, intro, keys) per section of a scenario, in the order of the model."""
    top = []
    for name, (check, _required) in checks_of(Scenario).items():
        nested, many = _nested(check)
        if nested is None:
            top.append(name)
            continue
        title = f"[[{name}]]" if many else f"[{name}]"
        intro = doc_of(nested) or plain(field_comments(Scenario).get(name, ""))
        yield title, intro, list(keys_of(nested, name))
    fields = {f.name: f for f in dataclasses.fields(Scenario)}
    notes = field_comments(Scenario)
    yield "top level", "Keys outside any table.", [
        Key(n, show_default(_default(fields[n])), checks_of(Scenario)[n][0].expected, plain(notes.get(n, "")))
        for n in top]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ") or " "


def render() -> str:
    out = [
        "# Scenario reference",
        "",
        "Every key a scenario takes, generated from the validation model (`agentload/run/scenario.py` and the",
        "sections it embeds: `agentload/mock/config.py`, `agentload/fleet/config.py`) each time this site is",
        "built; in the repository, `python tools/scenario_reference.py` prints this page. A key is written in",
        "its table (`[client]` `limit = 20`) or set on the command line as `--set client.limit=20`; a",
        "distribution is a constant or a table such as `{ dist = \"lognormal\", mean = 300, sigma = 0.5 }`",
        "(`dist` one of constant, uniform, normal, lognormal, exponential; `min` and `max` clamp it).",
        "A value that is refused stops the run before any traffic, on one line naming the key and what it",
        "expected. What the sections are for: [Scenarios](scenarios.md).",
        "",
    ]
    for title, intro, keys in sections():
        out += [f"## `{title}`" if title.startswith("[") else f"## {title.capitalize()}", ""]
        if intro:
            out += [intro, ""]
        out += ["| key | default | accepts | what it does |", "|---|---|---|---|"]
        for k in keys:
            out.append(f"| `{k.key}` | `{_cell(k.default)}` | {_cell(k.accepts)} | {_cell(k.what)} |")
        out.append("")
    return "\n".join(out)


def every_key() -> list[str]:
    """The dotted keys the page documents."""
    return [k.key for _, _, keys in sections() for k in keys]


if __name__ == "__main__":
    sys.stdout.write(render())
