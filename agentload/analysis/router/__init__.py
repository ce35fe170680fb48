"""How a router in front of a fleet of backends behaved (the router soak bench): summary.json's
`router` section, the verdict's evidence by backend and its router-leak facts. Pure functions of
what `agentload.records` reads of the run folder, so `agentload report RUN_DIR` rebuilds them byte
for byte.

Inputs (read by `records.fleet` and `records.target_metrics`):

- the records, streamed once (`RouterPass` is a consumer of `analysis.passes.one_pass`): each one's
  `backend` (the backend's name from `system_fingerprint`), `cached_tokens`, `conversation` and
  `id_sent` (the X-Request-ID value sent);
- run.json's `fleet` (mode, backends and their roles, the router, the planned schedule), `t0_ns`;
- `schedule.jsonl`: each scheduled fault as applied; without it, the planned times of run.json's;
- each backend's request log: one line per request it received;
- target_metrics.jsonl: the router's in-flight gauges (`families.RouterFamily.inflight`).

A record is attributed to the backend it names (`backend`), else to the backend whose log has a
line with its request id (the latest arrival, when a router retried it elsewhere); in PD mode a
record also gets its prefill worker from the prefill workers' logs. The backend logs are read
before the pass into `log_index.LogIndex`; the pass itself keeps counters, histograms, per-agent
state (stickiness) and time cells, never a list of the records.

Modules, in the order a run's data goes through them:

- `families`: the routers' Prometheus metric families as one table (names, meanings, how to read);
- `log_index`: the backend logs as numpy arrays keyed by a hash of the request id;
- `tallies`: the pass's counters per backend, round and fault;
- `facts`: `RouterFacts`, what the verdict reads of the fleet (made once, given to its facts);
- `state`, `collect`: the pass (`RouterPass`), its counters and `add`;
- `section`: summary.json's `router` section from the finished pass;
- `inflight`: the router's in-flight gauges against agentload's own requests.
"""

from agentload.analysis.router.collect import RouterPass
from agentload.analysis.router.facts import RouterFacts, fault_text
from agentload.analysis.router.families import ROUTERS, RouterFamily, family_of
from agentload.analysis.router.inflight import inflight_series, router_inflight
from agentload.analysis.router.log_index import LogIndex, id_hash
from agentload.analysis.router.tallies import ttft_ns

__all__ = ["ROUTERS", "LogIndex", "RouterFacts", "RouterFamily", "RouterPass", "family_of", "fault_text", "id_hash",
           "inflight_series", "router_inflight", "ttft_ns"]
