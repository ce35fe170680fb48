"""What the target says about itself, read once before the agents start -> run.json `server_props`.

llama.cpp's llama-server serves `GET /props` beside `/v1`: its slots (`total_slots`, `--parallel`),
each slot's context (`default_generation_settings.n_ctx`: `-c` split over the slots), whether its
chat template can call tools (`chat_template_caps.supports_tool_calls`) and whether `/metrics` is
on (`endpoint_metrics`). The verdict reads these (a queue's slots, a context overflow's split
n_ctx, a model that cannot call tools); any other server answers 404, which is recorded as such.

One GET on a session of its own (the agents' pools and connection counts stay untouched), with the
target's headers (its API key), bounded by `client.connect_timeout_s` (at most MAX_TIMEOUT_S), and
only a few fields are kept: never the model's path or the template's text.
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import orjson

from agentload.errors import drop_tracebacks
from agentload.redact import redact

MAX_TIMEOUT_S = 5.0
MAX_BODY_BYTES = 4 * 1024 * 1024  # (a chat template of a few KB is inside)


def props_url(endpoint: str) -> str:
    """`http://host:port/v1` -> `http://host:port/props` (a path prefix before /v1 kept, a query dropped)."""
    u = urlsplit(endpoint)
    path = u.path.rstrip("/")
    if path.endswith("/chat/completions"):
        path = path[: -len("/chat/completions")]
    if path.endswith("/v1"):
        path = path[:-3]
    return urlunsplit((u.scheme, u.netloc, path + "/props", "", ""))


def pick(body: Any) -> dict[str, Any] | None:
    """The fields kept of a /props body (None: not llama.cpp's)."""
    if not isinstance(body, dict) or "total_slots" not in body and "default_generation_settings" not in body:
        return None
    out: dict[str, Any] = {}
    slots = body.get("total_slots")
    if isinstance(slots, int) and not isinstance(slots, bool):
        out["total_slots"] = slots
    gen = body.get("default_generation_settings")
    if isinstance(gen, dict) and isinstance(gen.get("n_ctx"), int):
        out["n_ctx_per_slot"] = gen["n_ctx"]
    caps = body.get("chat_template_caps")
    if isinstance(caps, dict) and isinstance(caps.get("supports_tool_calls"), bool):
        out["supports_tool_calls"] = caps["supports_tool_calls"]
    for key in ("endpoint_metrics", "build_info", "model_alias"):
        v = body.get(key)
        if isinstance(v, (bool, str)):
            out[key] = v if not isinstance(v, str) else v[:200]
    out["has_tool_template"] = "chat_template_tool_use" in body
    return out


async def fetch(endpoint: str, headers: dict[str, str], timeout_s: float) -> dict[str, Any]:
    """`{"url", ...fields}` from the target's /props, or `{"url", "error"}`; never raises."""
    url = props_url(endpoint)
    timeout_s = min(max(timeout_s, 0.1), MAX_TIMEOUT_S)
    try:
        async with aiohttp.ClientSession(headers=headers, timeout=aiohttp.ClientTimeout(total=timeout_s)) as s:
            async with s.get(url, allow_redirects=False) as resp:
                if resp.status != 200:
                    return {"url": url, "error": f"HTTP {resp.status}"}
                raw = await resp.content.read(MAX_BODY_BYTES + 1)
        if len(raw) > MAX_BODY_BYTES:
            return {"url": url, "error": f"a body larger than {MAX_BODY_BYTES} bytes"}
        got = pick(orjson.loads(raw))
        if got is None:
            return {"url": url, "error": "not llama.cpp's /props (no total_slots)"}
        return {"url": url, **got}
    except asyncio.CancelledError:
        raise
    except Exception as e:  # a server without /props is a fact, never a failure of the run
        msg = f"timeout after {timeout_s:g} s" if isinstance(e, (TimeoutError, asyncio.TimeoutError)) else (
            redact(f"{type(e).__name__}: {e}".replace("\n", " ")[:200]))
        drop_tracebacks(e)
        return {"url": url, "error": msg}
