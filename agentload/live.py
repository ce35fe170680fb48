"""The live line while a run goes on: agents per round, in flight by phase, stalls, errors."""

from __future__ import annotations

import sys
import time
from collections import Counter
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentload.runner import RunContext, Sampler


class LiveLine:
    def __init__(self, stream=sys.stderr):
        self.stream = stream
        self.t0 = time.monotonic()
        self.last_requests = 0

    def __call__(self, ctx: "RunContext", sampler: "Sampler") -> None:
        c = ctx.counts
        rounds = Counter(st.round for st in ctx.agent_states.values() if st.state not in ("done", "stalled", "error"))
        phases = Counter(tr.phase() for tr in list(ctx.inflight.values()) if tr.kind == "agent")
        stalled = sum(1 for tr in list(ctx.inflight.values()) if tr.stalled_phase)
        rps = c["requests"] - self.last_requests
        self.last_requests = c["requests"]
        pool = ctx.transport.pool_state()
        line = (f"[{time.monotonic() - self.t0:6.1f}s] rounds {dict(sorted(rounds.items()))} "
                f"in flight {sum(phases.values())} {dict(phases)} stalled {stalled} "
                f"done {c['ok']} err {c['error']} gave-up {c['stalled']} {rps} req/s "
                f"pool {pool['in_use']}/{pool['limit'] or 'inf'} waiters {pool['waiters']}")
        print(line, file=self.stream, flush=True)
