"""The target's endpoint: what is refused, and the one URL each API's requests go to.

`[target] endpoint` is either a base URL (`http://127.0.0.1:8000/v1`, Azure's
`https://x.openai.azure.com/openai/deployments/gpt4?api-version=2024-06-01`) or the full URL of
the API's path (`http://127.0.0.1:8000/v1/chat/completions`). `api_url` is the one place a
request URL is made from it: the API's path (`API_PATHS`) is joined onto the URL's path, before
its query string, unless the path already ends in it. `endpoint_problem` names, in one line, what
cannot work (checked before any traffic, by the scenario's validation): another scheme than
http(s), credentials in the URL (they would be copied into run.json), a fragment (never sent), a
path that ends in another API's path (`/v1/embeddings`), a query parameter that looks like a key.

A leaf module: it imports nothing of agentload.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlsplit, urlunsplit

# the path each API's requests go to, after the endpoint's own path (`api` is the scenario's choice)
API_PATHS = {"chat": "/chat/completions", "messages": "/messages", "responses": "/responses"}
API_NAMES = {"chat": "OpenAI's Chat Completions API", "messages": "Anthropic's Messages API",
             "responses": "OpenAI's Responses API"}
# paths of other APIs: an endpoint that ends in one of these was meant for something else
OTHER_PATHS = {"/completions": "legacy text completions", "/embeddings": "embeddings", "/models": "the model list",
               "/moderations": "moderations", "/audio/transcriptions": "audio", "/images/generations": "images",
               "/api/chat": "Ollama's native chat API", "/api/generate": "Ollama's native generate API",
               "/generate": "a native generate API", "/metrics": "Prometheus metrics", "/health": "a health check"}
_SECRET_WORDS = ("key", "token", "secret", "password", "auth", "sig")
_VERSION_PART = re.compile(r"^v\d+(?:beta\d*|alpha\d*)?$", re.I)


def endpoint_problem(endpoint: str, api: str = "chat") -> str | None:
    """What makes `endpoint` unusable, as "expected ..." text (None: usable). Never repeats a credential."""
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in endpoint):
        return "expected a URL without spaces or control characters (percent-encode them)"
    scheme = endpoint.split("://", 1)[0].lower() if "://" in endpoint else ""
    if "@" in re.split(r"[/?#]", endpoint.split("://", 1)[-1], maxsplit=1)[0]:  # first: the message must not repeat them
        return ("expected a URL without credentials (user:password@ would be copied into run.json and reports): "
                "give them with [target] api_key_env or headers_env")
    if scheme not in ("http", "https"):
        return f"expected an http:// or https:// URL, got {'scheme ' + scheme + '://' if scheme else 'no scheme'}"
    try:
        parts = urlsplit(endpoint)
        parts.port  # noqa: B018 (raises on a port out of range)
    except ValueError as e:
        return f"expected a valid http:// or https:// URL ({e})"
    if not parts.hostname:
        return "expected a URL with a host"
    if "#" in endpoint:
        return (f"expected a URL without a fragment (#{parts.fragment}: a client never sends it, so the server "
                f"would not see it)")
    for name, _ in parse_qsl(parts.query, keep_blank_values=True):
        if any(w in name.lower() for w in _SECRET_WORDS) and name.lower() != "api-version":
            return (f"expected no credential in the query string (parameter {name!r} would be copied into run.json "
                    f"and reports): give it with [target] api_key_env or headers_env")
    path = parts.path.rstrip("/")
    own = API_PATHS[api]
    if path.endswith(own):
        return None
    others = {**OTHER_PATHS, **{p: API_NAMES[a] for a, p in API_PATHS.items() if a != api}}
    for p, what in sorted(others.items(), key=lambda x: -len(x[0])):
        if path.endswith(p):
            return (f"expected a base URL (such as http://host:port/v1) or one ending in {own}, got a path ending "
                    f"in {p} ({what}); requests would go to {api_url(endpoint, api)}")
    return None


def api_url(endpoint: str, api: str = "chat") -> str:
    """The URL the API's requests go to: its path joined onto the endpoint's path, before the query
    string (kept); an endpoint whose path already ends in it is used as it is (less a trailing /)."""
    parts = urlsplit(endpoint)
    path = parts.path.rstrip("/")
    own = API_PATHS[api]
    if not path.endswith(own):
        path += own
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def base_path(endpoint: str, api: str = "chat") -> str:
    """The endpoint's path without the API's own path and trailing slashes ("" for a bare host)."""
    path = urlsplit(endpoint).path.rstrip("/")
    own = API_PATHS[api]
    return path[: -len(own)].rstrip("/") if path.endswith(own) else path


def without_version_hint(endpoint: str, api: str = "chat") -> str | None:
    """A warning for an endpoint that is a bare host (`http://127.0.0.1:8000`, or that host with the
    API's path): requests go to `/chat/completions`, where OpenAI-compatible servers serve
    `/v1/chat/completions`, so a 404 means this. None for any endpoint with a path of its own (an
    Azure deployment, a proxy's prefix: the user chose it)."""
    try:
        base = base_path(endpoint, api)
    except ValueError:
        return None
    if base:
        return None
    return (f"endpoint {endpoint} has no path such as /v1, so requests go to {api_url(endpoint, api)}; "
            f"OpenAI-compatible servers usually serve {with_version(endpoint, api)} (a 404 means this)")


def with_version(endpoint: str, api: str = "chat", version: str = "v1", full: bool = True) -> str:
    """The API URL (`full`; else the base URL to give as the endpoint) with `/v1` inserted after the
    endpoint's base path, its query kept."""
    parts = urlsplit(endpoint)
    path = f"{base_path(endpoint, api)}/{version}{API_PATHS[api] if full else ''}"
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def has_version(endpoint: str, api: str = "chat") -> bool:
    """Does the endpoint's path carry a version part (`/v1`, `/v1beta`)?"""
    try:
        return any(_VERSION_PART.match(p) for p in base_path(endpoint, api).split("/") if p)
    except ValueError:
        return False
