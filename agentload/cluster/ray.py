"""`agentload run SCENARIO --ray ADDRESS`: the agents in N shards, each a Ray actor.

Each shard runs its part of the run (`PreparedRun.part_spec`: agents i with i % N == I, the same
seeded conversations as a one-process run) with the in-process executor in a thread of its actor,
with its own event loop and client pool, writing its files into a folder on its node. The driver
(`RayShards`, an executor, in this process):

- spreads the actors over the cluster's nodes (scheduling strategy SPREAD, `cpus_per_shard`
  each), estimates each shard's clock offset by round trips (smallest round trip kept) and starts
  all shards at one moment of its own clock;
- once a second asks every shard for what its records and samples files gained, moves the stamps
  onto its own clock and appends them to records-wI.jsonl / samples-wI.jsonl in the run folder, so
  a shard (or node) that dies loses at most its last second; the live line reads those files;
- a shard whose answer does not come within `poll_timeout_s` is noted as stalled (its event loop
  or process is stuck) and asked again; an actor that died is a lost shard: run.json names it,
  its agents are cut short with the reason, and the run goes on;
- Ctrl-C / SIGTERM stop every shard as a one-process run stops (no new rounds, in-flight requests
  get give_up_s), a second signal stops them now;
- at the end merges the shards' run.json (`shards.merge_meta`, the same as `--workers`) and
  states each shard's clock offset and its uncertainty in run.json `shards`.

Ray is an optional extra (`pip install 'agentload[ray]'`), imported only here.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import orjson

from agentload.cluster.shards import (
    ClockOffset,
    FileTail,
    Interrupts,
    estimate_offset,
    fmt_uncertainty,
    live_line,
    merge_meta,
    shift_lines,
    shift_record,
    shift_sample,
    split,
)
from agentload.errors import UserError
from agentload.run.executor import PreparedRun, RunOutcome, clock_anchor, part_of

POLL_EVERY_S = 1.0
POLL_TIMEOUT_S = 5.0
START_LEAD_S = 1.0  # all shards start this long after the driver told them (a round trip or two)


class ShardActor:
    """One shard: `start()` runs the scenario's share of agents in a thread; `poll()` hands over what
    its files gained. Plain class; `RayShards` wraps it with `ray.remote`."""

    def __init__(self, spec: dict[str, Any]):
        self.spec = spec
        self.index = spec["index"]
        self.dir = Path(tempfile.mkdtemp(prefix=f"agentload-shard{self.index}-"))
        self.sfx = f"-w{self.index}"
        self.tails = {stem: FileTail(self.dir / f"{stem}{self.sfx}.jsonl") for stem in ("records", "samples")}
        self.thread: threading.Thread | None = None
        self.loop: Any = None
        self.ctx: Any = None
        self.error: str | None = None
        self.finished = False
        self.beat_ns = time.perf_counter_ns()  # when the shard's event loop last ran a callback of ours

    def node(self) -> dict[str, Any]:
        import socket

        import ray

        return {"pid": os.getpid(), "host": socket.gethostname(), "node": ray.get_runtime_context().get_node_id(),
                "dir": str(self.dir)}

    def clock(self) -> int:
        return time.perf_counter_ns()

    def start(self, start_ns: int, t0_ns: int) -> bool:
        """Run the shard, its agents from `start_ns` (this host's clock); t0_ns: the run's anchor here."""
        self.thread = threading.Thread(target=self._run, args=(start_ns, t0_ns), name=f"shard-{self.index}",
                                       daemon=True)
        self.thread.start()
        return True

    def _run(self, start_ns: int, t0_ns: int) -> None:
        import asyncio

        from agentload.run.runner import InProcess, use_uvloop

        async def gate() -> int:
            delay = (start_ns - time.perf_counter_ns()) / 1e9
            if delay > 0:
                await asyncio.sleep(delay)
            return start_ns

        def got(ctx: Any) -> None:
            self.ctx = ctx
            self.loop = asyncio.get_running_loop()

        try:
            use_uvloop()
            run = part_of(self.spec, run_dir=self.dir, t0_ns=t0_ns, install_signals=False)
            asyncio.run(InProcess(gate=gate, on_context=got).run(run))
        except BaseException as e:  # recorded in run.json by the driver
            self.error = f"{e.__class__.__name__}: {e}"[:500]
        finally:
            self.finished = True

    def poll(self) -> dict[str, Any]:
        """What the shard's files gained since the last poll (bounded), and whether it is over."""
        done = self.finished
        # the actor answers from its own thread; whether the shard's event loop still runs is told
        # by a callback it should have run since the last poll
        now = time.perf_counter_ns()
        out: dict[str, Any] = {"done": done, "error": self.error, "loop_silent_s": (now - self.beat_ns) / 1e9}
        if self.loop is not None and not done:
            try:
                self.loop.call_soon_threadsafe(self._beat)
            except RuntimeError:  # the loop closed between the check and the call
                pass
        for stem, tail in self.tails.items():
            out[stem] = tail.rest() if done else tail.read()
        if done:
            try:
                out["meta"] = orjson.loads((self.dir / f"run{self.sfx}.json").read_bytes())
            except (OSError, orjson.JSONDecodeError):
                out["meta"] = None
        return out

    def _beat(self) -> None:
        self.beat_ns = time.perf_counter_ns()

    def stop(self, now: bool = False) -> bool:
        ctx, loop = self.ctx, self.loop
        if ctx is None or loop is None:
            return False
        reason = "interrupted (driver)"
        loop.call_soon_threadsafe(ctx.stop, reason, "interrupted")
        if now:  # as a second Ctrl-C: in-flight requests are not waited for
            loop.call_soon_threadsafe(lambda: [t.cancel() for t in __import__("asyncio").all_tasks(loop)
                                               if t.get_name().startswith("agent-")])
        return True

    def block_loop(self, seconds: float) -> bool:
        """Freeze this shard's event loop (tests: a stalled shard must be noticed by the driver)."""
        if self.loop is None:
            return False
        self.loop.call_soon_threadsafe(time.sleep, seconds)
        return True


def init_ray(address: str) -> bool:
    """Connect to (or start) Ray; True when this call started a throwaway local cluster."""
    try:
        import ray
    except ImportError:
        raise UserError("--ray: Ray is not installed; pip install 'agentload[ray]'") from None
    kw: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False}
    if address == "local":
        # loopback only: a throwaway cluster never listens on the machine's interface
        ray.init(address="local", _node_ip_address="127.0.0.1", **kw)
        return True
    try:
        ray.init(address=address, **kw)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise UserError(f"--ray {address}: cannot connect to a Ray cluster there ({e.__class__.__name__}: "
                        f"{str(e).splitlines()[0] if str(e) else ''})") from None
    return False


@dataclass
class RayShards:
    """The executor of `run --ray ADDRESS`: the run in `shards` Ray actors, its files brought to
    run_dir once a second. `on_shards(actors)` is called once they run (tests kill or freeze one
    through it)."""

    address: str
    shards: int
    cpus_per_shard: float = 1.0
    poll_timeout_s: float = POLL_TIMEOUT_S
    on_shards: Callable[[list[Any]], None] | None = None

    def execute(self, run: PreparedRun) -> RunOutcome:
        import ray

        n = self.shards
        if n < 1:
            raise UserError(f"--shards: expected a whole number >= 1, got {n}")
        started_ray = init_ray(self.address)
        run.meta.update(clock_anchor())  # the run starts once Ray is up (a throwaway cluster takes seconds)
        run.meta.update(workers=n, agents_per_worker=[len(a) for a in split(run.scenario.agents.count, n)],
                        engine="ray", ray={"address": self.address,
                                           "nodes": len([x for x in ray.nodes() if x.get("Alive")])})
        run.write_meta()
        actors = self.spawn(run)
        driver = _Driver(run, actors, self.poll_timeout_s)
        with Interrupts(driver.stop_all, run.install_signals) as interrupts:
            try:
                driver.open_exporter()  # first: a port in use fails before any shard starts
                driver.start_all()
                if self.on_shards is not None:
                    self.on_shards(actors)
                driver.follow()
            finally:
                driver.close()
                if started_ray:
                    ray.shutdown()
        driver.finish(interrupts.count)
        run.write_meta()
        return run.outcome(interrupts.count > 0)

    def spawn(self, run: PreparedRun) -> list[Any]:
        """One actor per shard, spread over the cluster's nodes."""
        import ray

        actor = ray.remote(ShardActor)
        return [actor.options(num_cpus=self.cpus_per_shard, scheduling_strategy="SPREAD", max_concurrency=4,
                              name=f"agentload-{run.run_id}-shard{i}").remote(run.part_spec(i, self.shards))
                for i in range(self.shards)]


class _Driver:
    """What the driver knows of its shards while they run, and what it does with their answers."""

    def __init__(self, run: PreparedRun, actors: list[Any], poll_timeout_s: float):
        self.run, self.actors, self.poll_timeout_s = run, actors, poll_timeout_s
        n = len(actors)
        self.n = n
        self.per = list(run.meta["agents_per_worker"])
        self.infos: list[dict[str, Any]] = [{"shard": i} for i in range(n)]
        self.offsets: list[ClockOffset] = []
        self.lost: dict[int, str] = {}
        self.last_sample: dict[int, dict[str, Any]] = {}
        self.stalls: list[dict[str, Any]] = []
        self.metas: list[dict[str, Any] | None] = [None] * n
        self.done = [False] * n
        self.moved_lines = {"records": 0, "samples": 0}
        self.pending: dict[int, Any] = {}  # shard -> its poll's answer, not yet in
        self.asked_at: dict[int, float] = {}
        self.exporter: Any = None

    def since_t0_s(self) -> float:
        return time.perf_counter_ns() / 1e9 - self.run.meta["t0_ns"] / 1e9

    def stop_all(self, _signum: int, count: int) -> None:
        """A signal: every shard stops as a one-process run does; a second one, now."""
        for a in self.actors:
            try:
                a.stop.remote(now=count > 1)
            except Exception:
                pass

    def open_exporter(self) -> None:
        run = self.run
        if run.metrics_port is None:
            return
        from agentload.cluster.exporter import ShardsExporter

        self.exporter = ShardsExporter(run.metrics_port, lambda: [(i, self.last_sample.get(i), i not in self.lost)
                                                                  for i in range(self.n)])
        run.meta["metrics_port"] = self.exporter.start()
        run.log(f"agentload: live metrics at http://127.0.0.1:{run.meta['metrics_port']}/metrics (a shard label each)")

    def start_all(self) -> None:
        """Each shard's node and clock offset (round trips), then every shard's agents at one moment."""
        import ray

        for i, a in enumerate(self.actors):
            self.infos[i].update(ray.get(a.node.remote(), timeout=120))

            def clock(actor: Any = a) -> int:
                return int(ray.get(actor.clock.remote(), timeout=30))

            off = estimate_offset(clock)
            self.offsets.append(off)
            self.infos[i].update(off.to_json())
        start = time.perf_counter_ns() + int(START_LEAD_S * 1e9)
        t0_ns = self.run.meta["t0_ns"]
        ray.get([a.start.remote(start + off.offset_ns, t0_ns + off.offset_ns)
                 for a, off in zip(self.actors, self.offsets)], timeout=60)
        self.run.log(f"agentload: {self.n} shard(s) on {len({x.get('node') for x in self.infos})} Ray node(s), "
                     "clock offsets " + ", ".join(f"{x['shard']}: {x['uncertainty']}" for x in self.infos))

    def follow(self) -> None:
        """Until every shard is done or lost: once a second ask each for what its files gained (a
        shard's answers wait in its files meanwhile), take the answers in, note who is silent."""
        import ray

        cpu0, wall0 = _cpu_s(), time.monotonic()
        t_run = t_live = next_poll = time.monotonic()
        while not all(self.done[i] or i in self.lost for i in range(self.n)):
            now = time.monotonic()
            if now >= next_poll:
                next_poll = now + POLL_EVERY_S
                self.ask(now)
            wait_s = max(0.01, next_poll - time.monotonic())
            refs = list(self.pending.values())
            if not refs:
                time.sleep(wait_s)
                continue
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=wait_s)
            for i in [k for k, r in self.pending.items() if r in ready]:
                self.take(i, self.pending.pop(i))
            self.note_unanswered()
            if self.run.live and time.monotonic() - t_live >= 1.0:
                t_live = time.monotonic()
                self.run.log(live_line(self.run.run_dir, self.n, t_live - t_run))
        # what the driver itself cost: its process (Ray's threads in it included) over the run
        driver = {"cpu_s": round(_cpu_s() - cpu0, 3), "wall_s": round(time.monotonic() - wall0, 3),
                  "records": self.moved_lines["records"], "samples": self.moved_lines["samples"]}
        driver["cpu_per_shard_per_s"] = round(driver["cpu_s"] / max(driver["wall_s"], 1e-9) / self.n, 4)
        self.run.meta["driver"] = driver

    def ask(self, now: float) -> None:
        for i, a in enumerate(self.actors):
            if not (self.done[i] or i in self.lost or i in self.pending):
                self.pending[i] = a.poll.remote()
                self.asked_at[i] = now

    def take(self, i: int, ref: Any) -> None:
        """Shard i's answer: its lines moved onto the driver's clock and appended, its loop's silence,
        its end; an actor (or node) that died is a lost shard."""
        import ray

        try:
            got = ray.get(ref)
        except Exception as e:
            self.lost[i] = f"{e.__class__.__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
            self.run.log(f"agentload: shard {i} lost: {self.lost[i]}")
            return
        delta = -self.offsets[i].offset_ns
        self.append_lines(i, got, delta)
        self.note_loop_silence(i, float(got.get("loop_silent_s") or 0.0), bool(got.get("done")))
        if got.get("done"):
            self.done[i] = True
            m = got.get("meta")
            if m is not None:
                m["t0_ns"] = self.run.meta["t0_ns"]
                if m.get("t_end_ns"):
                    m["t_end_ns"] += delta
            self.metas[i] = m
            if got.get("error"):
                self.lost[i] = f"the shard's run failed: {got['error']}"

    def append_lines(self, i: int, got: dict[str, Any], delta: int) -> None:
        for stem, shift in (("records", shift_record), ("samples", shift_sample)):
            data = got.get(stem) or b""
            if not data:
                continue
            moved, n = shift_lines(data, shift, delta, i)
            self.moved_lines[stem] += n
            if stem == "samples":
                try:
                    self.last_sample[i] = orjson.loads(moved.rstrip(b"\n").rpartition(b"\n")[2])
                except orjson.JSONDecodeError:
                    pass
            with open(self.run.run_dir / f"{stem}-w{i}.jsonl", "ab") as f:
                f.write(moved)

    def open_stall(self, i: int, what: str) -> dict[str, Any] | None:
        return next((x for x in self.stalls if x["shard"] == i and x.get("open") and x.get("what") == what), None)

    def note_loop_silence(self, i: int, silent: float, done: bool) -> None:
        """A shard whose event loop ran none of the driver's callbacks for poll_timeout_s is stalled."""
        if not done and silent > self.poll_timeout_s:
            if not any(x["shard"] == i and x.get("open") for x in self.stalls):
                self.stalls.append({"shard": i, "since_s": round(self.since_t0_s() - silent, 3), "open": True,
                                    "what": "event loop"})
                self.run.log(f"agentload: shard {i}: its event loop has not run for {silent:.0f} s")
        elif silent < self.poll_timeout_s and (x := self.open_stall(i, "event loop")) is not None:
            x["open"] = False
            x["for_s"] = round(self.since_t0_s() - x["since_s"], 3)

    def note_unanswered(self) -> None:
        """A shard whose poll has not been answered for poll_timeout_s: its event loop or process is stuck."""
        for i in list(self.pending):
            waited = time.monotonic() - self.asked_at[i]
            if waited > self.poll_timeout_s and not any(s["shard"] == i and s.get("open") for s in self.stalls):
                self.stalls.append({"shard": i, "since_s": round(self.since_t0_s() - waited, 3), "open": True,
                                    "what": "no answer"})
                self.run.log(f"agentload: shard {i} has not answered for {waited:.0f} s "
                             f"(its event loop or process is stuck)")
        for s in self.stalls:
            if s.get("open") and s.get("what") == "no answer" and s["shard"] not in self.pending:
                s["open"] = False
                s["for_s"] = round(self.since_t0_s() - s["since_s"], 3)

    def close(self) -> None:
        import ray

        if self.exporter is not None:
            self.exporter.stop()
        for a in self.actors:
            try:
                ray.kill(a)
            except Exception:
                pass

    def finish(self, interrupts: int) -> None:
        """run.json of the whole run: the shards' merged, each shard's clock offset, its stalls."""
        meta = self.run.meta
        codes: list[int | None] = [0 if (self.metas[i] is not None and i not in self.lost) else None
                                   for i in range(self.n)]
        merge_meta(meta, self.metas, codes, interrupts > 0)
        for s in self.stalls:
            s.pop("open", None)
        meta.update(engine="ray", shards=self.infos, shard_stalls=self.stalls,
                    clock_alignment="round trips to each shard; per shard: " + ", ".join(
                        f"{x['shard']} {x.get('uncertainty', '?')}" for x in self.infos))
        if self.lost:
            self.note_lost(interrupts)

    def note_lost(self, interrupts: int) -> None:
        """A lost shard is named with its agents (cut short, a crash entry); the run went on without it."""
        meta, lost, per = self.run.meta, self.lost, self.per
        # the shards that ran on ended as they say (a lost shard is named below, not an interruption)
        alive = [m.get("ended_by") for i, m in enumerate(self.metas) if m is not None and i not in lost]
        if interrupts == 0 and alive and meta["ended_by"] == "interrupted":
            meta["ended_by"] = next((b for b in ("crashed", "interrupted", "duration") if b in alive), "finished")
        meta["lost_shards"] = [{"shard": i, "reason": r, "agents": per[i]} for i, r in sorted(lost.items())]
        meta["cut_short"] = True
        meta["ended_normally"] = False
        meta["stop_reason"] = "; ".join([f"shard {i} lost ({r})" for i, r in sorted(lost.items())]
                                        + ([meta["stop_reason"]] if meta.get("stop_reason") else []))
        for i, r in sorted(lost.items()):
            meta.setdefault("crashes", []).append({"where": "shard", "agent": None, "round": None, "error": "ShardLost",
                                                   "message": f"shard {i} ({per[i]} agents) lost: {r}",
                                                   "traceback": "", "worker": i})
            meta["crash_count"] = int(meta.get("crash_count") or 0) + 1


def _cpu_s() -> float:
    import resource

    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def describe_offsets(infos: list[dict[str, Any]]) -> str:
    return ", ".join(f"shard {x['shard']} {fmt_uncertainty(int(x.get('uncertainty_ns') or 0))}" for x in infos)
