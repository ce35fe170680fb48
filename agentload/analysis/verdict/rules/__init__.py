"""The verdict's rules, in order. Each is `rule_<name>(f: Facts) -> Finding | None`; the order breaks
ties between findings that stopped as many agents (the one listed first leads).

The rules live by where the trouble sits, so a new rule goes beside those it must not repeat:
`client` (agentload itself, its pool, the harness behind `agentload proxy`), `server` (stalls and
queues at the server, with `probes` and `canaries` as their evidence), `connections` (connects and
disconnects), `errors` (HTTP errors and other failures), `between` (layers between agentload and the
server: a proxy's timeout, a concurrency limit, a buffering proxy, a router's in-flight count),
`answers` (answers read but wrong: the protocol, tool calls). `evidence` holds what several share.
"""

from __future__ import annotations

from typing import Callable

from agentload.analysis.verdict.facts import Facts
from agentload.analysis.verdict.kinds import Finding
from agentload.analysis.verdict.rules.answers import (
                                                      rule_bad_responses,
                                                      rule_malformed_tool_calls,
                                                      rule_no_tool_calls,
                                                      rule_protocol,
                                                      rule_truncated,
)
from agentload.analysis.verdict.rules.between import (
                                                      rule_buffered_stream,
                                                      rule_concurrency_limit,
                                                      rule_proxy_timeout,
                                                      rule_router_leak,
)
from agentload.analysis.verdict.rules.canaries import rule_canary_failures
from agentload.analysis.verdict.rules.client import (
                                                      rule_agentload_error,
                                                      rule_client_pool,
                                                      rule_client_saturated,
                                                      rule_client_stopped,
)
from agentload.analysis.verdict.rules.connections import rule_connect, rule_disconnects
from agentload.analysis.verdict.rules.errors import (
                                                      rule_other_errors,
                                                      rule_rate_limited,
                                                      rule_server_errors,
)
from agentload.analysis.verdict.rules.server import (
                                                      rule_killed_while_stalled,
                                                      rule_server_stall,
)

Rule = Callable[[Facts], Finding | None]

RULES: list[Rule] = [
    rule_agentload_error,
    rule_client_saturated,
    rule_server_stall,
    rule_client_pool,
    rule_connect,
    rule_proxy_timeout,
    rule_concurrency_limit,
    rule_disconnects,
    rule_rate_limited,
    rule_server_errors,
    rule_bad_responses,
    rule_protocol,
    rule_other_errors,
    rule_truncated,
    rule_malformed_tool_calls,
    rule_no_tool_calls,
    rule_client_stopped,
    rule_buffered_stream,
    rule_canary_failures,
    rule_router_leak,
    rule_killed_while_stalled,
]
