"""agentload through vllm-router (PyPI `vllm-router` 0.1.17, a Rust router; not vLLM's
production-stack router) on loopback in front of two mock backends (each a real `agentload.mock`
process), like tests/test_smg.py.

What these runs rely on (checked against 0.1.17):

- It has no in-flight gauge. Per worker it counts attempts routed
  (`vllm_router_policy_decisions_total`) and attempts ended (`vllm_router_cb_outcomes_total`,
  outcome success|failure); an attempt the client abandoned gets no outcome, ever, so routed minus
  ended names the worker a hang sits on (agentload.analysis.target_evidence).
- It retries a worker's 5xx on another worker by default (`vllm_router_retries_total`), so agents
  see no error while one worker fails half its requests: summary.json warns, naming the worker.
- `--request-timeout-secs 60`: far above the scenarios' give_up_s, so agentload names the stall.
"""

from __future__ import annotations

import pytest

from agentload.mock.config import MockConfig
from agentload.records import load_records
from agentload.records.target_metrics import load_target_metrics
from helpers import hung_probes, run_scenario
from routerprocs import VllmRouterProcess, skip_reason
from serverprocs import router_stack

_skip = skip_reason("vllm-router", "pip install vllm-router")
pytestmark = [pytest.mark.slow, pytest.mark.vllm_router, pytest.mark.skipif(_skip is not None, reason=_skip or "")]

FLAGS = ["--request-timeout-secs", "60"]
HANG_TOKENS = 6000  # long-context-hang: agents cross it in round 4
BACKEND = dict(decode_tokens_per_s=2000, output_tokens=16)


# stack(backends, flags) -> (router, mocks); everything started is stopped by PID at teardown
stack = router_stack(lambda tmp_path, urls, flags: VllmRouterProcess.start(urls, tmp_path / "vllm-router.log", flags))


def _through(router: VllmRouterProcess, *extra: str) -> list[str]:
    return [f'target.endpoint="{router.url}"', f'target.metrics_urls=["{router.metrics_url}"]',
            "target.metrics_every_s=0.5", *extra]


def _sent_ids(recs) -> set[str]:
    return {getattr(r, "id_sent", None) or r.request_id for r in recs}


def test_healthy_run_through_vllm_router_and_request_ids_reach_the_backends(tmp_path, stack):
    router, (a, b) = stack([MockConfig(**BACKEND), MockConfig(**BACKEND)], FLAGS)
    res = run_scenario("healthy", tmp_path / "run", _through(router))
    assert res.summary["verdict"]["kind"] == "healthy", res.text
    assert not [w for w in res.summary["warnings"] if "router" in w], res.summary["warnings"]
    recs = load_records(tmp_path / "run" / "records.jsonl").records
    assert recs and all(r.outcome == "ok" for r in recs), res.text
    sa, sb = a.stats(), b.stats()
    assert sa["completed"] > 0 and sb["completed"] > 0  # round robin used both
    assert sa["requests_total"] + sb["requests_total"] == len(recs)
    assert len(recs) <= 200  # each mock keeps its last 100 ids
    # vllm-router forwards X-Request-ID to the worker
    assert set(sa["last_request_ids"]) | set(sb["last_request_ids"]) == _sent_ids(recs)
    tm = load_target_metrics(tmp_path / "run")
    assert tm.scrapes[router.metrics_url]["ok"] >= 2
    workers = {s.labels.get("worker") for s in tm.family(router.metrics_url, "vllm_router_policy_decisions_total")}
    assert workers == {a.base, b.base}


def test_long_context_hang_on_one_backend_is_named_from_the_routers_counters(tmp_path, stack):
    router, (good, bad) = stack([MockConfig(**BACKEND), MockConfig(**BACKEND, hang_above_tokens=HANG_TOKENS)], FLAGS)
    res = run_scenario("long-context-hang", tmp_path / "run", _through(router, "canary.every_s=1.0"))
    v = res.summary["verdict"]
    # no headers until the worker answers: the hang shows as ttfb
    assert (v["kind"], v["phase"], v["first_round"]) == ("server_stall", "ttfb", 4), res.text
    recs = load_records(tmp_path / "run" / "records.jsonl").records
    stalled = [r for r in recs if r.kind == "agent" and r.stalled_phase]
    assert stalled and all(r.stalled_phase == "ttfb" and r.prompt_tokens >= HANG_TOKENS for r in stalled)
    # (and the stall probes that resent a stalled body, where the router sent them to the hung backend)
    assert good.stats()["hung"] == 0 and bad.stats()["hung"] == len(stalled) + len(hung_probes(recs, HANG_TOKENS))
    ev = "\n".join(v["evidence"])
    # routed - ended per worker names the hung worker. The count is the stalled requests, less any
    # request every scrape before the hang caught in flight on that worker (the first scrape races
    # the first requests; a scrape before traffic would make it exact)
    import re
    m = re.search(r"the router counted (\d+) of its (\d+) attempt\(s\) that never ended on worker (\S+) while "
                  rf"{len(stalled)} agent request\(s\) stalled: they came from that worker", ev)
    assert m and m.group(3) == bad.base and m.group(1) == m.group(2), ev
    assert len(stalled) - 2 <= int(m.group(1)) <= len(stalled) + len(hung_probes(recs, HANG_TOKENS)), ev
    assert f"unended attempt(s) on worker {bad.base} while" in ev and "what held them is behind the router" in ev, ev
    assert f"0 for worker {good.base}" in ev, ev


def test_failures_the_router_retried_on_the_other_worker_are_a_warning(tmp_path, stack):
    """One worker fails half its requests with 500; vllm-router retries each on the other worker,
    agents see no error: the verdict stays healthy (every answer agentload got was right), and
    summary.json warns with the failing worker and the count the router gave.

    The router picks a retry's worker by its policy, which can be the failing one again: with its
    default retries, 0.5 per attempt let one request in CI fail every attempt (an agent saw a 500,
    rightly server_errors). 0.3 and ten quick retries make that about 2e-6 per request."""
    retries = ["--retry-max-retries", "10", "--retry-max-backoff-ms", "200"]
    router, (good, bad) = stack([MockConfig(**BACKEND), MockConfig(**BACKEND, error_rate=0.3)], FLAGS + retries)
    res = run_scenario("healthy", tmp_path / "run", _through(router))
    assert res.summary["verdict"]["kind"] == "healthy", res.text
    injected = bad.stats()["errors_injected"]
    assert injected > 0 and good.stats()["errors_injected"] == 0
    w = [x for x in res.summary["warnings"] if "hid" in x]
    assert len(w) == 1, res.summary["warnings"]
    assert (f"counted {injected} failed attempt(s) on its workers ({injected} for worker {bad.base};" in w[0]
            and f"the router hid {injected} failure(s) by retrying them; worker {bad.base} is failing" in w[0]), w
