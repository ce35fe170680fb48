"""Secret values agentload must never print or write, and `redact(text)` that hides them.

Secrets reach agentload only through the environment: `[target] api_key_env` (sent as a bearer
token), `[target] headers_env` (header name -> variable, e.g. `{"api-key" = "AZURE_KEY"}`) and
`[target] metrics_api_key_env` (the scraper's bearer token for `metrics_urls`).
`register_target(target)` reads those variables (where the transport builds its headers, where a
run starts, where reports are rebuilt from run.json) and remembers each value in this process.

`redact(text)` replaces every remembered value (of 8 characters or more: shorter ones are
placeholders such as "EMPTY", not credentials) with `***`, in the forms it takes in agentload's
outputs: as is, JSON-escaped (records.jsonl, summary.json) and HTML-escaped (report.html); and a
value cut off at the end of the text (an error body truncated mid-key) loses that tail too. It is
applied where text leaves agentload: each record as it is written (`RecordWriter.write`), the
records as reports load them, summary.json / report.txt / report.html, and what the CLI prints.
A server that echoes the Authorization header in its error body therefore leaves `***` on disk.

`agentload report RUN_DIR` runs in a process of its own: it can only hide what its environment
holds then, so the records on disk are redacted when written, not when read.
"""

from __future__ import annotations

import html
import os
from typing import Any, Mapping

import orjson

# Shorter values are placeholders ("EMPTY", "dummy", "sk-1234": what local servers accept), not
# credentials; hiding such a word everywhere would garble the reports.
MIN_LEN = 8
MIN_TAIL = 6  # a value cut off at the end of a text: hidden when at least this much of it is there
MASK = "***"

_values: set[str] = set()
_forms: list[str] = []  # every value in every escaped form, longest first
_bforms: list[bytes] = []


def add_secret(value: str | None) -> None:
    """Remember a secret value for the rest of this process."""
    if not value or len(value) < MIN_LEN or value in _values:
        return
    _values.add(value)
    js = orjson.dumps(value).decode()[1:-1]
    # plotly's figure JSON in report.html escapes / < > (and some versions &) as \uXXXX
    plotly = js.replace("/", "\\u002f").replace("<", "\\u003c").replace(">", "\\u003e")
    forms = {value, js, html.escape(value), html.escape(value, quote=False), plotly, plotly.replace("&", "\\u0026")}
    _forms.extend(f for f in forms if f not in _forms)
    _forms.sort(key=len, reverse=True)
    _bforms[:] = [f.encode() for f in _forms]


def has_secrets() -> bool:
    return bool(_values)


def clear() -> None:
    """Forget every secret (tests)."""
    _values.clear()
    _forms.clear()
    _bforms.clear()


def env_secrets(target: Any) -> dict[str, str | None]:
    """The environment variables a target names for its secrets -> their values (None: unset).

    `target` is a TargetConfig or the `target` table of run.json."""
    get = target.get if isinstance(target, Mapping) else (lambda k, d=None: getattr(target, k, d))
    names = []
    if get("api_key_env"):
        names.append(str(get("api_key_env")))
    headers_env = get("headers_env") or {}
    if isinstance(headers_env, Mapping):
        names.extend(str(v) for v in headers_env.values() if v)
    if get("metrics_api_key_env"):  # the scraper's bearer token for metrics_urls
        names.append(str(get("metrics_api_key_env")))
    return {n: os.environ.get(n) for n in names}


def secret_field(target: Any, name: str) -> str:
    """The `[target]` setting that names environment variable `name` (for error messages)."""
    get = target.get if isinstance(target, Mapping) else (lambda k, d=None: getattr(target, k, d))
    if name == get("api_key_env"):
        return "target.api_key_env"
    for header, var in (get("headers_env") or {}).items():
        if var == name:
            return f"target.headers_env.{header}"
    if name == get("metrics_api_key_env"):
        return "target.metrics_api_key_env"
    return "target"


def register_target(target: Any) -> None:
    """Remember the values of every variable the target names (those that are set)."""
    for value in env_secrets(target).values():
        add_secret(value)


def redact(text: str) -> str:
    """`text` with every known secret replaced by `***`."""
    if not _forms or not text:
        return text
    for f in _forms:
        if f in text:
            text = text.replace(f, MASK)
    return _cut_tail(text)


def redact_bytes(data: bytes) -> bytes:
    """The same for encoded text (a JSON line, a file's bytes)."""
    if not _bforms or not data:
        return data
    for f in _bforms:
        if f in data:
            data = data.replace(f, MASK.encode())
    return data


_ELLIPSES = ("...", "\u2026", "")


def _cut_tail(text: str) -> str:
    # An error body is kept up to a length limit: a key may be cut off at the end of the message
    # (and an ellipsis put after it).
    for mark in _ELLIPSES:
        if not text.endswith(mark):
            continue
        body = text[: len(text) - len(mark)]
        for v in _values:
            for n in range(min(len(v) - 1, len(body)), MIN_TAIL - 1, -1):
                if body.endswith(v[:n]):
                    return body[: len(body) - n] + MASK + mark
    return text
