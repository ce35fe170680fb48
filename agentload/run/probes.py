"""Stall probes: during a stall wave, requests that change one factor at a time.

A request that hangs on a reused keep-alive connection with a large prompt could hang because of
either: the records cannot tell them apart when the first larger prompt and the first reused
connection come in the same round (and a canary changes both at once: a fresh connection *and*
a short prompt). So once per stall wave (the count of requests stalled past the pool going from 0
to more than 0), while the stall lasts, this job sends:

- `probe_body_fresh`: the stalled request's own body (same prompt, same size) on a fresh connection;
- `probe_short_reused`: a short prompt (the canary's) on a reused connection: an idle one of the
  agents' shared pool when it has one, else the probes' own kept-alive connection after
- `probe_short_fresh`: a short prompt on a fresh connection (that connection's first request; the
  canary's condition, also when canaries are off);
- `probe_body_reused`: only when the first two both answered, the stalled body on a reused
  connection: whether the hang needs both factors, or was transient.

Each is one record of its own kind (`agentload.records.PROBE_KINDS`), sent to the agents' URL
(through a router or a fleet, the way the agents' requests went) with the agents' headers and
timeouts. A probe is in the in-flight registry like any request, so the watchdog marks it stalled
after `stall.after_s` without progress; it is then given up at once (the rule the agents' requests
were judged by: no need to wait for `give_up_s`), and the watchdog's own give-up bounds it anyway.
At most MAX_WAVES waves are probed a run, at most four requests each, so a wave costs at most
about 3 x stall.after_s; the run waits for an experiment in progress at its end, within the same
bound as for the agents (`stall.give_up_s` plus a grace period). `[stall] probes = false` turns
them off; like the canaries they run in the first worker or shard only.
"""

from __future__ import annotations

import asyncio
import random
from typing import TYPE_CHECKING, Any

from agentload.records import PROBE_KINDS, Record, Trace
from agentload.records.phases import SERVER_PHASES
from agentload.run.agent import attempt
from agentload.run.conversation import Conversation
from agentload.run.dist import const
from agentload.run.scenario import Scenario

if TYPE_CHECKING:
    import aiohttp

    from agentload.run.context import RunContext

MAX_WAVES = 5  # stall waves probed per run (each: at most four requests)


def short_conversation(sc: Scenario, n: int) -> Conversation:
    """The canary's request: one round, `canary.prompt_tokens` of user prompt, no tools, no system
    prompt (seeded by `n`)."""
    cfg = sc.canary
    conv_cfg = sc.conversation.__class__(
        mode="scripted", system_tokens=const(0), user_tokens=const(cfg.prompt_tokens), tools=0,
        max_tokens=cfg.max_tokens, stream=sc.conversation.stream, include_usage=sc.conversation.include_usage)
    return Conversation(conv_cfg, sc.target.model, random.Random(n), -1, tools=[], api=sc.target.api)


def replayable(tr: Trace | None) -> bool:
    """An agent request still in flight, stalled past the pool, whose body it still holds."""
    return (tr is not None and tr.kind == "agent" and tr.stalled_phase in SERVER_PHASES and not tr.gave_up
            and tr.body is not None)


def server_stalled(stalled: Any) -> int:
    """Agent requests stalled past the pool, from a snapshot's `stalled` ((round, phase) -> n)."""
    return sum(n for (_, ph), n in stalled.items() if ph in SERVER_PHASES)


class Prober:
    """The probes of one run: the pools they use, and the waves probed so far."""

    def __init__(self, ctx: "RunContext"):
        self.ctx = ctx
        self.waves = 0
        self.idle = asyncio.Event()
        self.idle.set()
        self._fresh: "aiohttp.ClientSession | None" = None
        self._kept: "aiohttp.ClientSession | None" = None
        self._n = 0

    async def close(self) -> None:
        for s in (self._fresh, self._kept):
            if s is not None:
                await s.close()
        self._fresh = self._kept = None

    async def run(self) -> None:
        """Watch every snapshot the watchdog publishes for a new stall wave; probe it."""
        ctx = self.ctx
        feed = ctx.snapshots
        seen = feed.latest.seq
        before = 0
        try:
            while self.waves < MAX_WAVES:
                snap = await feed.newer_than(seen, False)
                seen = snap.seq
                n = server_stalled(snap.stalled)
                new, before = n > 0 and before == 0, n
                if not new or ctx.stopping:
                    continue
                # the request that stalled at this tick (the watchdog's pass, which alone walks the registry)
                target = snap.new_stall
                if not replayable(target):  # (ended, or given up, already: the next wave, if any)
                    continue
                self.waves += 1
                self.idle.clear()
                try:
                    await self.experiment(self.waves, target)
                finally:
                    self.idle.set()
                    before = server_stalled(feed.latest.stalled)  # a wave that went on meanwhile is not new
        finally:
            await self.close()

    def _session(self, kept: bool) -> "aiohttp.ClientSession":
        if kept:
            if self._kept is None:
                self._kept = self.ctx.transport.probe_session(keep_alive=True)
            return self._kept
        if self._fresh is None:
            self._fresh = self.ctx.transport.probe_session(keep_alive=False)
        return self._fresh

    async def experiment(self, wave: int, target: Trace) -> None:
        """The wave's probes: the stalled body on a fresh connection, and (at once, beside it) a
        short prompt on a reused one; then, if both answered, the body on a reused connection."""
        body = target.body.raw() if target.body is not None else None
        if body is None:
            return
        base = (target.agent, target.round, target.messages, target.prompt_tokens)
        short_conv = short_conversation(self.ctx.scenario, wave)
        short = short_conv.body()
        short_base = (target.agent, target.round, short_conv.n_messages, short_conv.tokens)
        fresh_body = asyncio.ensure_future(self.probe("probe_body_fresh", wave, base, body, self._session(False)))
        try:
            reused, via = await self.short_reused(wave, short_base, short)
            rec_body = await fresh_body
        finally:
            if not fresh_body.done():
                fresh_body.cancel()
                await asyncio.wait([fresh_body])
        if reused is None or not (reused.reused and answered(reused) and answered(rec_body)):
            return
        # neither factor alone hung: both together? On a connection that has served requests: the
        # agents' pool's if the short probe went that way and it still has one idle, else the probes' own
        session = self.ctx.transport.idle_shared() if via is not self._kept else None
        await self.probe("probe_body_reused", wave, base, body, session or self._session(True))

    async def short_reused(self, wave: int, base: tuple[int, int, int, int],
                           short: bytes) -> "tuple[Record | None, aiohttp.ClientSession | None]":
        """A short prompt on a reused connection: an idle one of the agents' pool if there is one;
        else a short prompt on the probes' own fresh kept-alive connection, then another on it.
        The record, and the session it went through (None: there was no connection to reuse)."""
        shared = self.ctx.transport.idle_shared()
        if shared is not None:
            rec = await self.probe("probe_short_reused", wave, base, short, shared)
            if rec.reused:
                return rec, shared
        kept = self._session(True)
        first = await self.probe("probe_short_fresh", wave, base, short, kept)
        if not answered(first):
            return None, None  # no connection that has served a request to reuse
        return await self.probe("probe_short_reused", wave, base, short, kept), kept

    async def probe(self, kind: str, wave: int, base: tuple[int, int, int, int], body: bytes,
                    session: "aiohttp.ClientSession") -> Record:
        """One probe request under the stall rule: given up once the watchdog marks it stalled
        (no progress for stall.after_s); its record is written like any other (`call`: the wave)."""
        assert kind in PROBE_KINDS
        ctx = self.ctx
        agent, rnd, messages, tokens = base
        self._n += 1
        trace = Trace(kind, agent, rnd, wave, f"{ctx.run_id}-probe{wave}-{self._n}-{kind.removeprefix('probe_')}",
                      messages, len(body), tokens)
        task = asyncio.ensure_future(attempt(ctx, session, trace, body))
        tick = ctx.snapshots.tick_s or 0.25
        try:
            while not task.done():
                await asyncio.wait([task], timeout=tick)
                if trace.stalled_phase is not None and not task.done() and not trace.gave_up:
                    trace.gave_up = True  # (the watchdog's give-up then never fires: it checks this)
                    task.cancel()
        except asyncio.CancelledError:  # the run ends: the probe is recorded as cut short
            task.cancel()
            await asyncio.wait([task])
            raise
        rec, _ = task.result()
        return rec


def answered(rec: Record | None) -> bool:
    """The probe completed without a stall."""
    return rec is not None and rec.outcome == "ok" and not rec.stalled_phase
