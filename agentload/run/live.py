"""The live view while a run goes on, refreshed every second.

A rich panel when stderr is a terminal, one short plain line per second otherwise (logs, CI,
pipes), redrawn with each full snapshot of the run (`agentload.run.snapshot`, once a second:
the view reads it and walks nothing). Both show the same facts: elapsed time, agents per round,
requests in flight by phase, stalled requests by round x phase, the oldest request in flight
(agent, round, phase, age, request id), req/s, tokens/s, errors, the client pool against its
limit, and crashes of agentload itself when there are any.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TextIO

from agentload.records import PHASES
from agentload.run.snapshot import current

if TYPE_CHECKING:
    from rich.live import Live

    from agentload.run.context import RunContext
    from agentload.run.sampler import Sampler


@dataclass
class Snapshot:
    elapsed_s: float
    rounds: dict[int, int]  # round -> agents working in it
    finished: dict[str, int]  # done / stalled / error / cut_short -> agents
    inflight: dict[str, int]  # phase -> agent requests in flight
    stalled: dict[tuple[int, str], int]  # (round, phase) -> stalled requests in flight
    oldest: dict[str, Any] | None  # agent, round, phase, age_s, request_id, stalled
    req_s: float
    tok_s: float
    requests: int
    ok: int
    errors: int
    gave_up: int
    pool: dict[str, int] = field(default_factory=dict)
    lag_ms: float = 0.0
    crashes: int = 0  # crashes of agentload itself so far (run.json `crashes`)


class Rates:
    """Turns the run's latest full snapshot into what the live view shows, with per-second rates
    between two of them. Never walks the in-flight registry or the agents: the watchdog's
    snapshot (`ctx.snapshots.latest_full`) has it all."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.last_t = time.perf_counter_ns()
        self.last_req = 0
        self.last_tok = 0
        self.req_s = 0.0
        self.tok_s = 0.0

    def snapshot(self, ctx: "RunContext", sampler: "Sampler | None" = None) -> Snapshot:
        snap = current(ctx, full=True)
        c = snap.counts
        req, tok = c.get("requests", 0), c.get("output_tokens", 0)
        if snap.t > self.last_t:  # the same snapshot again: the rates stay
            dt = (snap.t - self.last_t) / 1e9
            self.req_s, self.tok_s = (req - self.last_req) / dt, (tok - self.last_tok) / dt
            self.last_t, self.last_req, self.last_tok = snap.t, req, tok
        return Snapshot(time.monotonic() - self.t0, dict(snap.rounds), dict(snap.finished), dict(snap.inflight),
                        dict(snap.stalled), snap.oldest._asdict() if snap.oldest is not None else None,
                        self.req_s, self.tok_s, req, c.get("ok", 0), c.get("error", 0), c.get("stalled", 0),
                        dict(snap.pool), snap.max_lag_ms, snap.crashes)


def plain_line(s: Snapshot) -> str:
    """One short line (for logs): the same facts as the rich view."""
    parts = [f"[{s.elapsed_s:6.1f}s] " + (" ".join(f"r{r}:{n}" for r, n in s.rounds.items()) or "-")
             + (f" done:{s.finished['done']}" if s.finished.get("done") else ""),
             f"fly {sum(s.inflight.values())}" + "".join(f" {p}:{n}" for p, n in s.inflight.items())]
    if s.stalled:
        parts.append(f"STALL {sum(s.stalled.values())}" + "".join(f" r{r}/{p}:{n}" for (r, p), n in s.stalled.items()))
    if s.oldest:
        o = s.oldest
        parts.append(f"oldest a{o['agent']} r{o['round']} {o['phase']} {o['age_s']:.1f}s {o['request_id']}")
    parts.append(f"{s.req_s:.0f} req/s {s.tok_s:.0f} tok/s")
    parts.append(f"err {s.errors} gaveup {s.gave_up}")
    if s.crashes:
        parts.append(f"AGENTLOAD CRASHES {s.crashes} (run.json)")
    if s.pool:
        parts.append(f"pool {s.pool.get('in_use', 0)}/{s.pool.get('limit') or 'inf'} w{s.pool.get('waiters', 0)}")
    return " | ".join(parts)


def rich_view(s: Snapshot, run_dir: str | None = None):
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", justify="right")
    grid.add_column()
    grid.add_row("elapsed", f"{s.elapsed_s:.1f} s" + (f"   run folder {run_dir}" if run_dir else ""))
    grid.add_row("agents per round", "  ".join(f"r{r}: {n}" for r, n in s.rounds.items()) or "-")
    grid.add_row("agents finished", "  ".join(f"{k} {n}" for k, n in s.finished.items()) or "-")
    grid.add_row("in flight", f"{sum(s.inflight.values())}   "
                 + "  ".join(f"{p} {n}" for p, n in s.inflight.items()))
    stalled = Text(f"{sum(s.stalled.values())}", style="bold red" if s.stalled else "green")
    grid.add_row("stalled", stalled)
    if s.oldest:
        o = s.oldest
        grid.add_row("oldest in flight", Text(
            f"agent {o['agent']}  round {o['round']}  {o['phase']}  {o['age_s']:.1f} s  {o['request_id']}",
            style="red" if o["stalled"] else ""))
    grid.add_row("throughput", f"{s.req_s:.1f} req/s   {s.tok_s:.0f} tokens/s   "
                 f"requests {s.requests}  ok {s.ok}")
    grid.add_row("errors", Text(f"{s.errors}   stalls given up {s.gave_up}",
                                style="red" if (s.errors or s.gave_up) else ""))
    if s.pool:
        p = s.pool
        grid.add_row("client pool", f"in use {p.get('in_use', 0)} / limit {p.get('limit') or 'unlimited'}   "
                     f"idle {p.get('idle', 0)}   waiters {p.get('waiters', 0)}   opened {p.get('opened', 0)}")
    if s.crashes:
        grid.add_row("agentload crashes", Text(f"{s.crashes} (see run.json crashes)", style="bold red"))
    if s.lag_ms >= 50:
        grid.add_row("event-loop lag", Text(f"{s.lag_ms:.0f} ms", style="yellow"))
    parts: list[Any] = [grid]
    if s.stalled:
        rounds = sorted({r for r, _ in s.stalled})
        phases = [p for p in PHASES if any(ph == p for _, ph in s.stalled)]
        parts.append(Text("stalled requests in flight, by round x phase:", style="bold red"))
        t = Table(show_edge=False)
        t.add_column("round", justify="right")
        for phase in phases:
            t.add_column(phase, justify="right")
        for r in rounds:
            t.add_row(str(r), *(str(s.stalled.get((r, phase), "")) for phase in phases))
        parts.append(t)
    return Group(*parts)


class PlainLive:
    """One line per second on a stream that is not a terminal."""

    def __init__(self, stream: TextIO):
        self.stream = stream
        self.rates = Rates()

    def __call__(self, ctx: "RunContext", sampler: "Sampler") -> None:
        print(plain_line(self.rates.snapshot(ctx, sampler)), file=self.stream, flush=True)

    def close(self) -> None:
        pass


class RichLive:
    """A panel redrawn in place on a terminal; stop it with close()."""

    def __init__(self, stream: TextIO, run_dir: str | None = None):
        from rich.console import Console

        self.console = Console(file=stream, stderr=stream is sys.stderr)
        self.rates = Rates()
        self.run_dir = run_dir
        self.live: Live | None = None

    def __call__(self, ctx: "RunContext", sampler: "Sampler") -> None:
        from rich.live import Live

        view = rich_view(self.rates.snapshot(ctx, sampler), self.run_dir)
        if self.live is None:
            self.live = Live(view, console=self.console, auto_refresh=False, transient=False,
                             redirect_stdout=True, redirect_stderr=True)
            self.live.start()
        self.live.update(view, refresh=True)

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None


def LiveLine(stream: TextIO | None = None, run_dir: str | None = None) -> PlainLive | RichLive:
    """The live view for `stream` (default stderr): rich on a terminal, plain lines otherwise."""
    stream = stream if stream is not None else sys.stderr
    isatty = getattr(stream, "isatty", lambda: False)
    try:
        tty = bool(isatty())
    except ValueError:  # a closed stream
        tty = False
    return RichLive(stream, run_dir) if tty else PlainLive(stream)
