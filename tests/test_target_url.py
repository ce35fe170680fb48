"""The endpoint URL over real HTTP: a query string is kept (Azure's `?api-version=`), a full path
ending in /chat/completions is used as it is, what cannot work is refused in one line before any
traffic, and the printed hint names the URL requests really go to."""

from __future__ import annotations

import pytest
from aiohttp import web

from agentload import endpoint
from agentload.launch import run_to_dir
from agentload.run.scenario import load_scenario
from fakeserver import DONE, FakeServer, chunk, sse_response
from helpers import cli

GOOD = [chunk({"role": "assistant", "content": ""}), chunk({"content": "hel"}), chunk({"content": "lo"}),
        chunk({}, "stop"), DONE]
SMALL = ["agents.count=2", "agents.rounds=2", "canary.every_s=0", "agents.error_retries=0"]


def _azure(request: web.Request) -> web.StreamResponse:
    """Like Azure OpenAI: 404 without `api-version` in the query."""
    async def go():
        if request.query.get("api-version") != "2024-06-01":
            return web.json_response({"error": {"code": "404", "message": "Resource not found"}}, status=404)
        return await sse_response(request, GOOD)
    return go()


def _run(tmp_path, name, ep, logs=None):
    sc = load_scenario("demo", [f'target.endpoint="{ep}"', *SMALL])
    out = run_to_dir(sc, tmp_path / name, live=False, install_signals=False,
                     log=(logs.append if logs is not None else lambda m: None))
    return out.summary


def test_a_query_string_is_kept_after_the_api_path(tmp_path):
    path = "/openai/deployments/gpt4/chat/completions"
    with FakeServer(_azure, path=path) as srv:
        base = f"http://127.0.0.1:{srv.port}/openai/deployments/gpt4"
        logs: list[str] = []
        summary = _run(tmp_path, "azure", f"{base}?api-version=2024-06-01", logs)
        assert summary["verdict"]["kind"] == "healthy", summary["verdict"]
        assert srv.paths and set(srv.paths) == {f"{path}?api-version=2024-06-01"}, srv.paths
        # a deployment path is a path of its own: no "/v1" hint (it would be wrong for Azure)
        assert not [m for m in logs if "warning" in m], logs


def test_an_endpoint_ending_in_the_api_path_is_used_as_is(tmp_path):
    with FakeServer(lambda r: sse_response(r, GOOD)) as srv:
        for i, ep in enumerate((f"{srv.url}/chat/completions", f"{srv.url}/chat/completions/")):
            logs: list[str] = []
            n = len(srv.paths)
            summary = _run(tmp_path, f"full{i}", ep, logs)
            assert summary["verdict"]["kind"] == "healthy", summary["verdict"]
            assert set(srv.paths[n:]) == {"/v1/chat/completions"}, srv.paths
            assert not [m for m in logs if "warning" in m], logs


def test_the_hint_for_a_bare_host_names_the_real_urls_and_keeps_the_query(tmp_path):
    with FakeServer(lambda r: sse_response(r, GOOD), path="/chat/completions") as srv:
        base = f"http://127.0.0.1:{srv.port}"
        logs: list[str] = []
        _run(tmp_path, "bare", f"{base}?tenant=a", logs)
        warn = [m for m in logs if "warning" in m]
        assert len(warn) == 1, logs
        assert f"requests go to {base}/chat/completions?tenant=a;" in warn[0], warn
        assert f"usually serve {base}/v1/chat/completions?tenant=a " in warn[0], warn
        assert set(srv.paths) == {"/chat/completions?tenant=a"}, srv.paths


def test_a_404_names_the_url_that_answered_it(tmp_path):
    with FakeServer(lambda r: sse_response(r, GOOD), path="/v1/chat/completions") as srv:
        base = f"http://127.0.0.1:{srv.port}"
        summary = _run(tmp_path, "bare404", f"{base}?tenant=a")
        ev = " | ".join(summary["verdict"]["evidence"])
        assert summary["verdict"]["kind"] == "server_errors"
        assert f"HTTP 404 from {base}/chat/completions?tenant=a" in ev, ev
        assert f"try --endpoint {base}/v1?tenant=a" in ev, ev
        summary = _run(tmp_path, "deep404", f"{base}/other/v1")
        ev = " | ".join(summary["verdict"]["evidence"])
        assert f"HTTP 404 from {base}/other/v1/chat/completions: the server has no such path" in ev, ev
        assert "try --endpoint" not in ev, ev


REFUSED = [
    ("ftp://127.0.0.1:{port}/v1", "http:// or https://"),
    ("127.0.0.1:{port}/v1", "http:// or https://"),
    ("http://127.0.0.1:{port}/v1#section", "fragment"),
    ("http://user:pw-secret@127.0.0.1:{port}/v1", "credentials"),
    ("http://127.0.0.1:{port}/v1?api_key=pw-secret", "credential in the query"),
    ("http://127.0.0.1:{port}/v1/embeddings", "/embeddings"),
    ("http://127.0.0.1:{port}/v1/completions", "/completions (legacy text completions)"),
    ("http://127.0.0.1:{port}/v1/messages", "/messages (Anthropic's Messages API)"),
    ("http://127.0.0.1:{port}/v1/responses/", "/responses (OpenAI's Responses API)"),
    ("http://127.0.0.1:{port}/api/chat", "Ollama"),
    ("http://127.0.0.1:{port}/v 1", "spaces"),
]


@pytest.mark.parametrize("ep,says", REFUSED, ids=[s for _, s in REFUSED])
def test_what_cannot_work_is_refused_in_one_line_before_any_traffic(tmp_path, ep, says):
    with FakeServer(lambda r: sse_response(r, GOOD)) as srv:
        r = cli("run", "demo", "--out", str(tmp_path / "r"), "--no-live", "--endpoint", ep.format(port=srv.port),
                timeout=60)
        assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("agentload: error: "), r.stderr
        assert "target.endpoint" in lines[0] and says in lines[0], lines[0]
        assert "pw-secret" not in lines[0]
        assert srv.paths == [], srv.paths
        assert not (tmp_path / "r").exists()


def test_api_url_is_the_one_join():
    assert endpoint.api_url("http://h/v1?api-version=1") == "http://h/v1/chat/completions?api-version=1"
    assert endpoint.api_url("http://h/v1/chat/completions?x=1") == "http://h/v1/chat/completions?x=1"
    assert endpoint.api_url("http://h/v1/", "messages") == "http://h/v1/messages"
    assert endpoint.api_url("http://h/v1/responses", "responses") == "http://h/v1/responses"
    assert endpoint.endpoint_problem("http://h/v1/chat/completions", "messages") is not None
    assert endpoint.endpoint_problem("http://h/v1/messages", "messages") is None
