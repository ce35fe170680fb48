"""agentload through LiteLLM's proxy (`litellm[proxy]==1.108.7`, in a venv of its own that .ci/run
creates) on loopback in front of two mock backends (each a real `agentload.mock` process), like
tests/test_vllm_router.py.

What these runs rely on (checked against 1.108.7):

- Every request needs the master key (`[target] api_key_env`); /metrics too, with the
  `prometheus` callback: 401 without the key, so the scraper sends `[target] metrics_api_key_env`.
  /metrics answers 307 -> /metrics/: the tests scrape /metrics/ itself.
- It rewrites the stream: finish_reason in a chunk of its own (`delta: {}`), the usage chunk with
  `choices: [{"index": 0, "delta": {}}]`, the mock's `mock_sent_ns` stamp dropped; it drops `: ping`
  comments, and it does not forward X-Request-ID.
- A deployment's `stream_timeout` (seconds of silence from the backend) ends the stream with an
  in-band `{"error": {..., "code": "408"}}` event and no `[DONE]`: agents see a server error, not a
  stall. Pings from the backend count as bytes: they keep such a stream alive.
- Per deployment (label `api_base`) it counts attempts when they end
  (`litellm_deployment_total_requests_total`, `..._success_responses_total`,
  `..._failure_responses_total`): a failure names the backend; a hang that has not ended does not
  show (agentload.analysis.target_evidence, `LITELLM`).
- /v1/messages and /v1/responses (issue 29): with `use_chat_completions_api: true` in a deployment's
  litellm_params the proxy translates both into chat/completions for the backend and streams back
  in the API's own events; without it an openai/ deployment gets /v1/messages as /v1/responses.
"""

from __future__ import annotations

import functools
import json
import re
import time

import pytest

from agentload.mock.config import MockConfig
from agentload.records import load_records
from agentload.records.target_metrics import load_target_metrics
from helpers import run_scenario
from routerprocs import LiteLLMProcess, litellm_skip_reason
from serverprocs import RouterStack, router_stack

_skip = litellm_skip_reason()
pytestmark = [pytest.mark.slow, pytest.mark.litellm, pytest.mark.skipif(_skip is not None, reason=_skip or "")]

KEY_ENV = "AGENTLOAD_TEST_LITELLM_KEY"
MASTER_KEY = "sk-agentload-litellm-test-" + "7f3a9c51e2d84b06"  # >= 8 characters: redacted
BACKEND = dict(decode_tokens_per_s=2000, output_tokens=16)
LIGHT = ["agents.count=6", "agents.rounds=4"]  # LiteLLM costs ~0.1 s of CPU a request on 2 shared cores


def _start_proxy(tmp_path, backends: list[str], params: dict | None = None, router_settings: dict | None = None,
                 models: list[str] | None = None) -> LiteLLMProcess:
    t = time.monotonic()
    proxy = LiteLLMProcess.start(backends, tmp_path / "litellm", MASTER_KEY, params=params,
                                 router_settings=router_settings, models=models)
    print(f"LiteLLM's proxy ready in {time.monotonic() - t:.1f} s")
    return proxy


# stack(backends, params, router_settings, models) -> (proxy, mocks); everything started is stopped by PID
stack = router_stack(_start_proxy)


@pytest.fixture(autouse=True)
def _master_key_in_env(monkeypatch):
    monkeypatch.setenv(KEY_ENV, MASTER_KEY)


def _through(proxy: LiteLLMProcess, *extra: str) -> list[str]:
    return [f'target.endpoint="{proxy.url}"', f'target.api_key_env="{KEY_ENV}"',
            f'target.metrics_urls=["{proxy.metrics_url}"]', f'target.metrics_api_key_env="{KEY_ENV}"',
            "target.metrics_every_s=1.0", *extra]  # its /metrics page takes a while under load


def _no_key_on_disk(run_dir) -> None:
    for f in run_dir.rglob("*"):
        if f.is_file():
            assert MASTER_KEY.encode() not in f.read_bytes(), f"the master key is in {f}"


def _api_bases(tm, url: str, name: str) -> dict[str, float]:
    """{api_base: value at the last scrape} of a per-deployment counter (pre-routing rejects,
    api_base "", left out)."""
    last = tm.scrape_times[url][-1]
    out: dict[str, float] = {}
    for s in tm.family(url, name):
        if s.labels.get("api_base"):
            out[s.labels["api_base"]] = out.get(s.labels["api_base"], 0.0) + (s.at(last) or 0.0)
    return out


def test_healthy_run_through_litellm_with_metrics_scraped_behind_the_master_key(tmp_path, stack):
    proxy, (a, b) = stack([MockConfig(**BACKEND), MockConfig(**BACKEND)])
    assert proxy.get("/metrics/", key=False)[0] == 401  # the reason for metrics_api_key_env
    run = tmp_path / "run"
    res = run_scenario("healthy", run, _through(proxy, *LIGHT))
    assert res.summary["verdict"]["kind"] == "healthy", res.text
    recs = load_records(run / "records.jsonl").records
    # every agent request ok (a canary still in flight when the run ends is cut short: no failure)
    assert recs and all(r.outcome == "ok" for r in recs if r.kind == "agent"), res.text
    sa, sb = a.stats(), b.stats()
    assert sa["completed"] > 0 and sb["completed"] > 0  # simple-shuffle used both
    # a canary cut short at the end may not have reached a backend
    assert sum(r.outcome == "ok" for r in recs) <= sa["requests_total"] + sb["requests_total"] <= len(recs)
    # LiteLLM does not forward X-Request-ID: the mocks saw none of the ids sent
    sent = {r.id_sent for r in recs}
    assert not (set(sa["last_request_ids"]) | set(sb["last_request_ids"])) & sent
    # it rewrites the stream: every agent request still ends with finish_reason and usage
    agents = [r for r in recs if r.kind == "agent"]
    assert all(r.finish_reason in ("stop", "tool_calls", "length") and r.output_tokens for r in agents)
    # /metrics scraped with the key: none refused (one may time out while the proxy is busy)
    tm = load_target_metrics(run)
    sc = tm.scrapes[proxy.metrics_url]
    assert sc["ok"] >= 2 and sc["failed"] <= 1 and not any("401" in e for e in sc["errors"]), sc
    per = _api_bases(tm, proxy.metrics_url, "litellm_deployment_success_responses_total")
    assert set(per) == {a.url, b.url}, per
    # counted when LiteLLM logs the success, after the stream: the last scrape lags the run's end
    assert 0 < sum(per.values()) <= sa["completed"] + sb["completed"], per
    _no_key_on_disk(run)
    assert MASTER_KEY not in res.text


def test_a_stream_timeout_is_an_in_band_408_named_by_the_proxys_counters(tmp_path, stack):
    """One backend stops mid-stream (no pings) once prompts reach 2,000 tokens; the proxy's
    stream_timeout (1.5 s) is shorter than agentload's stall.after_s (3 s): the proxy ends those
    streams with an in-band 408 and no [DONE], agents see server errors, and the proxy's
    per-deployment failure counter names the stalling backend."""
    stall = dict(stall_mid_stream={"after_tokens": 4, "for_s": 30, "above_tokens": 2000})
    proxy, (good, bad) = stack([MockConfig(**BACKEND), MockConfig(**BACKEND, **stall)],
                               params={"timeout": 1.5, "stream_timeout": 1.5},
                               router_settings={"disable_cooldowns": True})
    run = tmp_path / "run"
    res = run_scenario("healthy", run, _through(proxy, *LIGHT, "agents.error_retries=1"))
    v = res.summary["verdict"]
    assert v["kind"] == "server_errors", res.text
    assert "inband_error" in v["summary"] + " ".join(v["evidence"]), v
    recs = load_records(run / "records.jsonl").records
    failed = [r for r in recs if r.kind == "agent" and r.error == "inband_error"]
    assert failed and all("408" in r.error_msg and "timed out" in r.error_msg for r in failed), \
        [r.error_msg for r in failed][:3]
    # tokens came, then silence: the proxy's 408 came before agentload's stall.after_s (tool-call
    # chunks reach the agents as 3 of the mock's 4)
    assert all(r.prompt_tokens >= 2000 and 1 <= r.token_chunks <= 4 and r.stalled_phase is None for r in failed), \
        [(r.prompt_tokens, r.token_chunks, r.stalled_phase, r.chunks, r.comments, r.error_msg) for r in failed][:5]
    assert good.stats()["errors_injected"] == 0
    # the proxy's counters name the backend: every failure on the stalling one
    ev = "\n".join(v["evidence"])
    m = re.search(r"the router counted (\d+) of its (\d+) failed attempt\(s\) on worker (\S+) while "
                  rf"{len(failed)} agent request\(s\) failed", ev)
    assert m and m.group(3) == bad.url and m.group(1) == m.group(2), ev
    _no_key_on_disk(run)


def test_raw_streams_through_litellm(tmp_path, stack):
    """The bytes of answers through the proxy, checked live: a healthy one (what
    tests/data/sse/litellm-1.108.7.sse holds), one whose backend pauses 2 s with pings (the proxy
    drops them, and they keep its stream_timeout from firing), one whose backend goes silent (408
    in-band, no [DONE])."""
    import urllib.request

    proxy, (ok_mock, pinging, _silent) = stack(
        [MockConfig(**BACKEND),
         MockConfig(**BACKEND, models=("ping-model",), stall_mid_stream={"after_tokens": 3, "for_s": 2.0},
                    ping_while_stalled_s=0.2),
         MockConfig(**BACKEND, models=("silent-model",), stall_mid_stream={"after_tokens": 3, "for_s": 30})],
        params={"stream_timeout": 1.0, "timeout": 1.0}, models=["mock-model", "ping-model", "silent-model"])

    def post(model: str, extra_headers: dict | None = None) -> bytes:
        body = {"model": model, "stream": True, "stream_options": {"include_usage": True}, "max_tokens": 5,
                "messages": [{"role": "user", "content": "hi"}]}
        req = urllib.request.Request(proxy.url + "/chat/completions", data=json.dumps(body).encode(), headers={
            "Authorization": f"Bearer {MASTER_KEY}", "Content-Type": "application/json", **(extra_headers or {})})
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(req, timeout=30) as r:
            return r.read()

    def chunks(raw: bytes) -> list[dict]:
        return [json.loads(e[len(b"data: "):]) for e in raw.split(b"\n\n") if e.strip() and e != b"data: [DONE]"]

    rid = "0b5f7c9e-1111-4222-8333-944445555666"
    raw = post("mock-model", {"X-Request-ID": rid})
    assert raw.rstrip().endswith(b"data: [DONE]") and raw.count(b"[DONE]") == 1
    cs = chunks(raw)
    assert sum(1 for c in cs if c["choices"] and c["choices"][0]["delta"].get("content")) == 5
    fin = [c for c in cs if c["choices"] and c["choices"][0].get("finish_reason")]
    assert len(fin) == 1 and fin[0]["choices"][0]["delta"] == {}  # finish_reason in a chunk of its own
    assert cs[-1]["choices"] == [{"index": 0, "delta": {}}] and cs[-1]["usage"]["completion_tokens"] == 5
    # the backend's name in system_fingerprint survives the proxy (the router soak bench's attribution)
    assert all(c.get("system_fingerprint") == "mock" for c in cs if c["choices"]), cs[1]
    print("a content chunk through LiteLLM:", cs[1])
    assert rid not in ok_mock.stats()["last_request_ids"]  # X-Request-ID is not forwarded

    t = time.monotonic()
    raw = post("ping-model")
    took = time.monotonic() - t
    assert pinging.stats()["completed"] == 1 and took >= 2.0  # the pause outlasted stream_timeout (1 s)
    assert b": ping" not in raw and raw.rstrip().endswith(b"data: [DONE]")  # pings dropped, stream whole
    assert sum(1 for c in chunks(raw) if c["choices"] and c["choices"][0]["delta"].get("content")) == 5

    t = time.monotonic()
    raw = post("silent-model")
    took = time.monotonic() - t
    assert b"[DONE]" not in raw and 1.0 <= took < 10, (took, raw[-300:])
    last = chunks(raw)[-1]
    assert last["error"]["code"] == "408" and "timed out" in last["error"]["message"], last
    assert sum(1 for c in chunks(raw)[:-1] if c["choices"][0]["delta"].get("content")) == 3


# ------------------------------------------------------------------ /v1/messages and /v1/responses (issue 29)


def _lines(log) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def _apis_seen(log, skip: int = 0) -> dict[str, int]:
    """{api: requests} from a mock's request log (the route each request came in on), past its
    first `skip` lines."""
    out: dict[str, int] = {}
    for line in _lines(log)[skip:]:
        api = json.loads(line)["api"]
        out[api] = out.get(api, 0) + 1
    return out


@pytest.fixture(scope="module")
def translating(tmp_path_factory):
    """(proxy, backends' request logs): the proxy with `use_chat_completions_api` in front of two
    logging chat backends, started once for both APIs' runs (its start is most of a run's time)."""
    d = tmp_path_factory.mktemp("litellm-translating")
    logs = [d / "a.log", d / "b.log"]
    with RouterStack(functools.partial(_start_proxy, d)) as s:
        proxy, _ = s.start([MockConfig(**BACKEND, request_log=str(p)) for p in logs],
                           params={"use_chat_completions_api": True})
        yield proxy, logs


@pytest.mark.parametrize("api", ["messages", "responses"])
def test_litellm_translates_each_api_to_chat_backends(tmp_path, translating, api):
    """LiteLLM's proxy answers /v1/messages and /v1/responses in front of chat/completions backends
    (deployments with `use_chat_completions_api: true`) by translating them: the backends see chat
    requests only, agentload reads the proxy's own Anthropic and OpenAI Responses streams into a
    healthy run. (Without that flag an openai/ deployment is assumed to speak Responses: the proxy
    sent /v1/messages on to the backends' /v1/responses, which the mock answers too.)"""
    proxy, logs = translating
    _warm_up(proxy, api)
    before = [len(_lines(log)) for log in logs]  # this run's requests only: the other API's run came first
    run = tmp_path / "run"
    res = run_scenario("healthy", run, _through(proxy, *LIGHT, f'target.api="{api}"'))
    seen: dict[str, int] = {}
    for log, skip in zip(logs, before):
        for k, v in _apis_seen(log, skip).items():
            seen[k] = seen.get(k, 0) + v
    print(api, "-> backends saw", seen)
    assert res.summary["verdict"]["kind"] == "healthy", res.text
    recs = load_records(run / "records.jsonl").records
    agents = [r for r in recs if r.kind == "agent"]
    assert agents and all(r.outcome == "ok" for r in agents), res.text
    assert all(r.output_tokens and r.prompt_tokens for r in agents)
    assert set(seen) == {"chat"}, seen  # translated: the backends speak chat only
    _no_key_on_disk(run)


def _warm_up(proxy: LiteLLMProcess, api: str) -> None:
    """One short streamed request of `api` through the proxy: its first one of a route imports the
    translation code (seconds on a busy machine), which would read as a stall in round 1."""
    import urllib.request
    body = ({"model": "mock-model", "max_tokens": 4, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
            if api == "messages" else {"model": "mock-model", "max_output_tokens": 4, "stream": True, "input": "hi"})
    req = urllib.request.Request(f"{proxy.url}/{api}", data=json.dumps(body).encode(), headers={
        "Authorization": f"Bearer {MASTER_KEY}", "Content-Type": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(req, timeout=60) as r:
        r.read()


@pytest.mark.parametrize("api", ["messages", "responses"])
def test_long_context_hang_behind_litellm_in_each_api(tmp_path, stack, api):
    """The long-context hang (no status, no headers once a prompt reaches 6,000 tokens) on a chat
    backend behind LiteLLM's translation: the same server_stall as with chat, in ttfb from round 4
    (tests/test_apis.py has it through smg and on the mock). The proxy sends no headers before the
    backend does, so the phase survives the translation; and it keeps waiting on the hung backend
    after agentload gave up, which its in-flight gauge shows (a router_leak beside the stall)."""
    log = tmp_path / "backend.log"
    proxy, (m,) = stack([MockConfig(**BACKEND, hang_above_tokens=6000, request_log=str(log))],
                        params={"use_chat_completions_api": True})
    _warm_up(proxy, api)
    run = tmp_path / "run"
    # stall.after_s / give_up_s above the scenario's (2 s / 5 s): on 2 shared cores the proxy can take
    # seconds over a request of its own, which is not the hang this test is about
    res = run_scenario("long-context-hang", run, _through(proxy, "agents.count=6", f'target.api="{api}"',
                                                            "canary.every_s=1.0", "stall.after_s=4.0",
                                                            "stall.give_up_s=10.0"))
    v = res.summary["verdict"]
    print(api, v)
    assert (v["kind"], v["phase"], v["first_round"]) == ("server_stall", "ttfb", 4), res.text
    recs = load_records(run / "records.jsonl").records
    stalled = [r for r in recs if r.kind == "agent" and r.stalled_phase]
    # the translated chat prompt is not quite agentload's count: an agent near the line may cross it in round 5
    assert stalled and min(r.round for r in stalled) == 4 and all(r.stalled_phase == "ttfb" for r in stalled), \
        [(r.round, r.stalled_phase) for r in stalled]
    assert all(r.prompt_tokens >= 5000 for r in stalled)
    # every stalled request hung at the backend (and so did the probe that resent its body)
    assert m.stats()["hung"] >= len(stalled)
    # the proxy still waits on the hung backend after agentload gave up: its in-flight gauge shows it
    assert any(s["kind"] == "router_leak" for s in v["secondary"]), v["secondary"]
    assert set(_apis_seen(log)) == {"chat"}
    _no_key_on_disk(run)
