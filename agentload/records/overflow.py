"""A context overflow as the server says it: the one reading of an error answer that means "this
prompt does not fit", for the run path (such a request is never retried: the same prompt cannot
fit the next time; the server's own prompt token count goes into the record's
`server_prompt_tokens`) and for the verdict (its evidence uses the server's numbers).

    overflow(400, '{"error":{..."type":"exceed_context_size_error","n_prompt_tokens":600,"n_ctx":512}}')
    -> Overflow(prompt_tokens=600, n_ctx=512)

What servers send (a 400, or a 413):
- llama.cpp's llama-server: `"type": "exceed_context_size_error"` with `n_prompt_tokens` and `n_ctx`
  (n_ctx per slot: `-c` split over `--parallel` slots), message "request (600 tokens) exceeds the
  available context size (512 tokens), try increasing it";
- llama-cpp-python, OpenAI, vLLM: `"code": "context_length_exceeded"` or "This model's maximum
  context length is 512 tokens. However, you requested 600 tokens (...)".
"""

from __future__ import annotations

import re
from typing import NamedTuple

import orjson

_MARKERS = ("exceed_context_size_error", "context_length_exceeded", "exceeds the available context size",
            "maximum context length")
_LLAMA = re.compile(r"request \((\d+) tokens\) exceeds the available context size \((\d+) tokens\)")
_OPENAI = re.compile(r"maximum context length is (\d+) tokens\. However, you requested (\d+) tokens")
_OPENAI_PROMPT = re.compile(r"\((\d+) in the messages")  # vLLM: "(2000 in the messages, 100 in the completion)"


class Overflow(NamedTuple):
    prompt_tokens: int | None  # the server's count of the prompt (None: it did not say)
    n_ctx: int | None  # the context it measured it against


def _int(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def overflow(status: int | None, msg: str | None) -> Overflow | None:
    """The server's numbers when this error answer is a context overflow, else None."""
    if status not in (400, 413) or not msg or not any(m in msg for m in _MARKERS):
        return None
    tokens = n_ctx = None
    try:
        body = orjson.loads(msg)
    except orjson.JSONDecodeError:  # (a body cut at the record's limit, or not JSON)
        body = None
    err = body.get("error") if isinstance(body, dict) else None
    for d in (err, body):
        if isinstance(d, dict):
            tokens = tokens if tokens is not None else _int(d.get("n_prompt_tokens"))
            n_ctx = n_ctx if n_ctx is not None else _int(d.get("n_ctx"))
    if tokens is None or n_ctx is None:
        m = _LLAMA.search(msg)
        if m:
            tokens, n_ctx = tokens if tokens is not None else int(m[1]), n_ctx if n_ctx is not None else int(m[2])
        else:
            m = _OPENAI.search(msg)
            if m:
                p = _OPENAI_PROMPT.search(msg)
                n_ctx = n_ctx if n_ctx is not None else int(m[1])
                tokens = tokens if tokens is not None else int(p[1] if p else m[2])
    return Overflow(tokens, n_ctx)
