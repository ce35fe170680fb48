"""The routers whose Prometheus metrics agentload reads, as one table: per family its metric
names, what each means, and how its in-flight attempts are read (at one moment, over the run, and
what it holds at the end). Every reader (`target_evidence`'s stall and error lines,
`inflight.router_inflight`) takes a family from here; none knows a router by name.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentload.records.target_metrics import TargetMetrics


@dataclass(frozen=True)
class RouterFamily:
    """One router's Prometheus names (per worker: label `worker`) and what each counts."""

    name: str
    routed: str  # counter: attempts the router sent to a worker (a retry is another attempt)
    outcomes: str  # counter, label outcome = success | failure: attempts that ended, per worker
    retries: str | None = None  # counter: attempts retried (not per worker)
    active: str | None = None  # gauge: attempts in flight per worker, live
    meaning: tuple[tuple[str, str], ...] = ()  # the table: metric -> what it means here
    worker_label: str = "worker"  # the label naming the worker (LiteLLM: api_base)
    # a counter of failed attempts alone (no outcome label), read instead of outcomes{outcome="failure"}
    failures: str | None = None
    # routed counts an attempt when it is sent (routed - outcomes: not ended); False: when it ends,
    # so nothing in flight shows and a hang is not localised
    counts_at_send: bool = True
    # gauges of what the router holds in flight: (name, how many the scrape itself adds, what it
    # counts); agentload.analysis.router.inflight compares them with agentload's own requests (a
    # leak: the router still counts requests after every one of agentload's ended)
    inflight: tuple[tuple[str, int, str], ...] = ()

    @property
    def moment(self) -> str | None:
        """How its attempts in flight per worker are read at one scrape: "gauge" (its live `active`
        gauge), "unended" (routed - outcomes, when routed counts at send), None (neither shows)."""
        if self.active:
            return "gauge"
        return "unended" if self.counts_at_send else None


# smg (SGLang's model gateway, PyPI `smg`): checked against 1.13
SMG = RouterFamily(
    "smg", routed="smg_worker_requests_total", outcomes="smg_worker_cb_outcomes_total",
    retries="smg_worker_retries_total", active="smg_worker_requests_active",
    meaning=(
        ("smg_worker_requests_active", "attempts in flight per worker (live gauge)"),
        ("smg_worker_requests_total", "attempts sent per worker"),
        ("smg_worker_cb_outcomes_total", "attempts ended per worker, outcome=success|failure (failure: an error "
                                         "status or no answer)"),
        ("smg_worker_retries_total", "attempts retried on another worker (per endpoint, not per worker)"),
        ("smg_admission_inflight", "requests holding an admission permit"),
    ),
    inflight=(("smg_worker_requests_active", 0, "attempts in flight per worker"),
              ("smg_admission_inflight", 0, "requests holding an admission permit")))
# vllm-router (PyPI `vllm-router`, a Rust router; not vLLM's production-stack router): checked against 0.1.17.
# It has no in-flight gauge: routed minus outcomes is what it sent a worker and never saw end.
VLLM_ROUTER = RouterFamily(
    "vllm-router", routed="vllm_router_policy_decisions_total", outcomes="vllm_router_cb_outcomes_total",
    retries="vllm_router_retries_total",
    meaning=(
        ("vllm_router_policy_decisions_total", "attempts routed per worker (label policy too)"),
        ("vllm_router_cb_outcomes_total", "attempts ended per worker, outcome=success|failure; none is counted "
                                          "for an attempt the client abandoned"),
        ("vllm_router_retries_total", "attempts retried (per route, not per worker): a worker's 5xx is retried "
                                      "on another worker by default"),
        ("vllm_router_worker_health", "1 while the worker passes its health check"),
    ))
# LiteLLM's proxy (PyPI `litellm[proxy]`, with `callbacks: ["prometheus"]`; /metrics behind the
# master key: [target] metrics_api_key_env): checked against 1.108.7. Per deployment (label api_base,
# "" for a request refused before routing) it counts attempts when they end, so a hang shows only
# once it ends (a timeout: a failure); litellm_in_flight_requests is one gauge for the whole proxy.
LITELLM = RouterFamily(
    "litellm", routed="litellm_deployment_total_requests_total", outcomes="litellm_deployment_success_responses_total",
    failures="litellm_deployment_failure_responses_total", worker_label="api_base", counts_at_send=False,
    meaning=(
        ("litellm_deployment_total_requests_total", "attempts ended per deployment (success + failure), counted at "
                                                    "the end"),
        ("litellm_deployment_success_responses_total", "attempts that succeeded per deployment"),
        ("litellm_deployment_failure_responses_total", "attempts that failed per deployment (label exception_class: "
                                                       "APITimeoutError for a stream_timeout, an in-band 408)"),
        ("litellm_deployment_state", "0 healthy, 1 partial outage (a failure), 2 complete outage"),
        ("litellm_in_flight_requests", "HTTP requests in flight at the proxy (all routes, every deployment)"),
    ),
    # the gauge counts every HTTP request in flight, the /metrics scrape reading it included
    inflight=(("litellm_in_flight_requests", 1, "HTTP requests in flight at the proxy, the scrape itself "
                                                "not counted"),))
ROUTERS = (SMG, VLLM_ROUTER, LITELLM)


def family_of(tm: TargetMetrics, url: str) -> RouterFamily | None:
    """The router family whose per-worker counters this URL serves (None: not a router we know)."""
    names = {s.name for (u, _), s in tm.series.items() if u == url}
    return next((fam for fam in ROUTERS if fam.routed in names or fam.outcomes in names
                 or (fam.failures and fam.failures in names)), None)
