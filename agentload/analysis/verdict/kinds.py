"""What the verdict can say (`Kind`) and what one rule found (`Finding`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class Kind(str, Enum):
    """What the verdict can say; the value is what summary.json and the report print."""

    HEALTHY = "healthy"
    NO_DATA = "no_data"  # no agent request was recorded
    AGENTLOAD_ERROR = "agentload_error"  # an agent or a background task of agentload crashed
    CLIENT_SATURATED = "client_saturated"  # agentload's own event loop lagged: its timings are suspect
    SERVER_STALL = "server_stall"  # requests made no progress past the pool, and did not all finish
    SERVER_SLOW = "server_slow"  # requests made no progress for a while (or were slow for everyone), but finished
    SERVER_QUEUE = "server_queue"  # requests waited for headers while the server served at most N others
    CLIENT_POOL = "client_pool"  # time lost waiting for a connection from the client's pool
    CONNECT = "connect"  # connections could not be opened
    DISCONNECTS = "disconnects"  # the other side closed connections, mid-answer or stale keep-alive
    RATE_LIMITED = "rate_limited"  # HTTP 429: the server (or a gateway) limited the request rate
    SERVER_ERRORS = "server_errors"  # HTTP errors or in-band error events
    BAD_RESPONSES = "bad_responses"  # answers agentload could not read as the protocol says
    PROTOCOL = "protocol"  # answers read, but the stream broke the protocol around [DONE]
    OTHER_ERRORS = "other_errors"  # request failures of a class no other rule explains
    TRUNCATED = "truncated"  # answers cut by max_tokens (finish_reason length) with a tool call in them or asked for
    MALFORMED_TOOL_CALLS = "malformed_tool_calls"  # tool calls that could not be sent back as they came
    NO_TOOL_CALLS = "no_tool_calls"  # mode model: the model answered without a tool call, agents ended early
    CANARY_FAILURES = "canary_failures"  # canaries failed while no agent finding explains it
    ROUTER_LEAK = "router_leak"  # the router still counts requests in flight after every one of agentload's ended
    CLIENT_STOPPED = "client_stopped"  # agentload proxy: a conversation got its answer, the harness never sent the next round
    PROXY_TIMEOUT = "proxy_timeout"  # failures ended at one fixed duration: a timeout in front of a server that hung
    CONCURRENCY_LIMIT = "concurrency_limit"  # quick 503s whenever N requests were in flight: a limit in front
    BUFFERED_STREAM = "buffered_stream"  # tokens came in bursts after long waits: a buffering proxy, timings distorted


@dataclass
class Finding:
    """One rule's finding: what it is, whom it touched, whom it stopped (which finding leads), and why."""

    kind: Kind
    summary: str
    phase: str | None = None
    first_round: int | None = None
    agents_affected: int = 0
    agents_stopped: int = 0  # agents whose conversation this ended (the precedence between findings)
    evidence: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "phase": self.phase, "first_round": self.first_round,
                "agents_affected": self.agents_affected, "agents_stopped": self.agents_stopped,
                "summary": self.summary, "evidence": list(self.evidence)}
