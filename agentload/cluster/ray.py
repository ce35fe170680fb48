"""`agentload run SCENARIO --ray ADDRESS`: the agents in N shards, each a Ray actor.

Each shard runs the one-process run path (`runner.execute` with a `WorkerSpec`: agents i with
i % N == I, the same seeded conversations as a one-process run) in a thread of its actor, with its
own event loop and client pool, writing its files into a folder on its node. The driver (this
process):

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
import secrets
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import orjson

from agentload.cluster.shards import FileTail, estimate_offset, fmt_uncertainty, shift_lines, shift_record, shift_sample
from agentload.errors import UserError

POLL_EVERY_S = 1.0
POLL_TIMEOUT_S = 5.0
START_LEAD_S = 1.0  # all shards start this long after the driver told them (a round trip or two)


class ShardActor:
    """One shard: `start()` runs the scenario's share of agents in a thread; `poll()` hands over what
    its files gained. Plain class; `run_ray` wraps it with `ray.remote`."""

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

        from agentload.run.context import WorkerSpec
        from agentload.run.runner import execute, use_uvloop
        from agentload.run.scenario import parse_scenario

        spec = self.spec

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
            sc = parse_scenario(spec["scenario"], spec["source"])
            ws = WorkerSpec(self.index, spec["count"], spec["run_id"], t0_ns, spec["t0_unix"], gate)
            asyncio.run(execute(sc, self.dir, spec["base_url"], embedded_mock=False, install_signals=False,
                                worker=ws, on_context=got))
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


def run_ray(sc: Any, run_dir: Path, base_url: str, address: str, shards: int, *, cpus_per_shard: float = 1.0,
            install_signals: bool = True, live: bool = False, log: Callable[[str], None] = lambda m: print(m, file=sys.stderr),
            poll_timeout_s: float = POLL_TIMEOUT_S, on_shards: Callable[[list[Any]], None] | None = None,
            metrics_port: int | None = None) -> Any:
    """Run the scenario in `shards` Ray actors into run_dir; returns a runner.RunOutcome.
    `on_shards(actors)` is called once they run (tests kill or freeze one through it)."""
    import ray

    from agentload.cluster.shards import live_line, merge_meta, split
    from agentload.run.runner import RunOutcome, run_metadata, write_run_json

    if shards < 1:
        raise UserError(f"--shards: expected a whole number >= 1, got {shards}")
    started_ray = init_ray(address)
    run_id = secrets.token_hex(4)
    meta = run_metadata(sc, run_id, base_url, False)
    per = [len(a) for a in split(sc.agents.count, shards)]
    meta.update(workers=shards, agents_per_worker=per, engine="ray",
                ray={"address": address, "nodes": len([n for n in ray.nodes() if n.get("Alive")])})
    write_run_json(run_dir / "run.json", meta)
    Actor = ray.remote(ShardActor)
    actors: list[Any] = []  # Ray's actor handles (their methods' .remote is not in Ray's types)
    for i in range(shards):
        spec = {"scenario": sc.to_dict(), "source": sc.source, "base_url": base_url, "index": i, "count": shards,
                "run_id": run_id, "t0_unix": meta["t0_unix"]}
        actors.append(Actor.options(num_cpus=cpus_per_shard, scheduling_strategy="SPREAD",
                                    max_concurrency=4, name=f"agentload-{run_id}-shard{i}").remote(spec))
    interrupts = 0
    old: dict[int, Any] = {}

    def on_signal(signum: int, frame: Any) -> None:
        nonlocal interrupts
        interrupts += 1
        for a in actors:
            try:
                a.stop.remote(now=interrupts > 1)
            except Exception:
                pass

    lost: dict[int, str] = {}
    last_sample: dict[int, dict[str, Any]] = {}
    exporter = None
    if metrics_port is not None:  # first: a port in use fails before any shard starts
        from agentload.cluster.exporter import ShardsExporter

        exporter = ShardsExporter(metrics_port, lambda: [(i, last_sample.get(i), i not in lost) for i in range(shards)])
        meta["metrics_port"] = exporter.start()
        log(f"agentload: live metrics at http://127.0.0.1:{meta['metrics_port']}/metrics (a shard label each)")
    stalls: list[dict[str, Any]] = []
    metas: list[dict[str, Any] | None] = [None] * shards
    done = [False] * shards
    infos: list[dict[str, Any]] = [{"shard": i} for i in range(shards)]
    try:
        if install_signals:
            for sig in (signal.SIGINT, signal.SIGTERM):
                old[sig] = signal.signal(sig, on_signal)
        offsets = []
        for i, a in enumerate(actors):
            infos[i].update(ray.get(a.node.remote(), timeout=120))

            def clock(actor: Any = a) -> int:
                return int(ray.get(actor.clock.remote(), timeout=30))

            off = estimate_offset(clock)
            offsets.append(off)
            infos[i].update(off.to_json())
        start = time.perf_counter_ns() + int(START_LEAD_S * 1e9)
        ray.get([a.start.remote(start + off.offset_ns, meta["t0_ns"] + off.offset_ns)
                 for a, off in zip(actors, offsets)], timeout=60)
        log(f"agentload: {shards} shard(s) on {len({x.get('node') for x in infos})} Ray node(s), clock offsets "
            + ", ".join(f"{x['shard']}: {x['uncertainty']}" for x in infos))
        if on_shards is not None:
            on_shards(actors)
        cpu0, wall0 = _cpu_s(), time.monotonic()
        moved_lines = {"records": 0, "samples": 0}
        pending: dict[int, Any] = {}
        asked_at: dict[int, float] = {}
        t_live = t_run = time.monotonic()
        next_poll = time.monotonic()
        while not all(done[i] or i in lost for i in range(shards)):
            now = time.monotonic()
            if now >= next_poll:  # once a second: a shard's answers wait in its files meanwhile
                next_poll = now + POLL_EVERY_S
                for i, a in enumerate(actors):
                    if done[i] or i in lost or i in pending:
                        continue
                    pending[i] = a.poll.remote()
                    asked_at[i] = now
            refs = list(pending.values())
            wait_s = max(0.01, next_poll - time.monotonic())
            if not refs:
                time.sleep(wait_s)
                continue
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=wait_s)
            for i in [k for k, r in pending.items() if r in ready]:
                ref = pending.pop(i)
                try:
                    got = ray.get(ref)
                except Exception as e:  # the actor (or its node) died
                    lost[i] = f"{e.__class__.__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
                    log(f"agentload: shard {i} lost: {lost[i]}")
                    continue
                delta = -offsets[i].offset_ns
                for stem, shift in (("records", shift_record), ("samples", shift_sample)):
                    data = got.get(stem) or b""
                    if data:
                        moved, n = shift_lines(data, shift, delta, i)
                        moved_lines[stem] += n
                        if stem == "samples":
                            try:
                                last_sample[i] = orjson.loads(moved.rstrip(b"\n").rpartition(b"\n")[2])
                            except orjson.JSONDecodeError:
                                pass
                        with open(run_dir / f"{stem}-w{i}.jsonl", "ab") as f:
                            f.write(moved)
                silent = float(got.get("loop_silent_s") or 0.0)
                if not got.get("done") and silent > poll_timeout_s:
                    if not any(x["shard"] == i and x.get("open") for x in stalls):
                        stalls.append({"shard": i, "since_s": round(time.perf_counter_ns() / 1e9 - meta["t0_ns"] / 1e9
                                                                    - silent, 3), "open": True, "what": "event loop"})
                        log(f"agentload: shard {i}: its event loop has not run for {silent:.0f} s")
                elif silent < poll_timeout_s:
                    for x in stalls:
                        if x["shard"] == i and x.get("open") and x.get("what") == "event loop":
                            x["open"] = False
                            x["for_s"] = round(time.perf_counter_ns() / 1e9 - meta["t0_ns"] / 1e9 - x["since_s"], 3)
                if got.get("done"):
                    done[i] = True
                    m = got.get("meta")
                    if m is not None:
                        m["t0_ns"] = meta["t0_ns"]
                        for k in ("t_end_ns",):
                            if m.get(k):
                                m[k] += delta
                    metas[i] = m
                    if got.get("error"):
                        lost[i] = f"the shard's run failed: {got['error']}"
            for i in list(pending):
                waited = time.monotonic() - asked_at[i]
                if waited > poll_timeout_s and not any(s["shard"] == i and s.get("open") for s in stalls):
                    stalls.append({"shard": i, "since_s": round(time.perf_counter_ns() / 1e9 - meta["t0_ns"] / 1e9 - waited, 3),
                                   "open": True, "what": "no answer"})
                    log(f"agentload: shard {i} has not answered for {waited:.0f} s (its event loop or process is stuck)")
            for s in stalls:
                if s.get("open") and s.get("what") == "no answer" and s["shard"] not in pending:
                    s["open"] = False
                    s["for_s"] = round(time.perf_counter_ns() / 1e9 - meta["t0_ns"] / 1e9 - s["since_s"], 3)
            if live and time.monotonic() - t_live >= 1.0:
                t_live = t_run = time.monotonic()
                log(live_line(run_dir, shards, t_live - t_run))
        # what the driver itself cost: its process (Ray's threads in it included) over the run
        driver = {"cpu_s": round(_cpu_s() - cpu0, 3), "wall_s": round(time.monotonic() - wall0, 3),
                  "records": moved_lines["records"], "samples": moved_lines["samples"]}
        driver["cpu_per_shard_per_s"] = round(driver["cpu_s"] / max(driver["wall_s"], 1e-9) / shards, 4)
        meta["driver"] = driver
    finally:
        if exporter is not None:
            exporter.stop()
        for signum, h in old.items():
            signal.signal(signum, h)
        for a in actors:
            try:
                ray.kill(a)
            except Exception:
                pass
        if started_ray:
            ray.shutdown()
    codes: list[int | None] = [0 if (metas[i] is not None and i not in lost) else None for i in range(shards)]
    merge_meta(meta, metas, codes, interrupts > 0)
    for s in stalls:
        s.pop("open", None)
    meta.update(engine="ray", shards=infos, shard_stalls=stalls,
                clock_alignment="round trips to each shard; per shard: " + ", ".join(
                    f"{x['shard']} {x.get('uncertainty', '?')}" for x in infos))
    if lost:
        # the shards that ran on ended as they say (a lost shard is named below, not an interruption)
        alive = [m.get("ended_by") for i, m in enumerate(metas) if m is not None and i not in lost]
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
    write_run_json(run_dir / "run.json", meta)
    return RunOutcome(run_dir, run_id, bool(meta["cut_short"]), meta.get("stop_reason"), interrupts > 0,
                      meta["ended_by"])


def _cpu_s() -> float:
    import resource

    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def describe_offsets(infos: list[dict[str, Any]]) -> str:
    return ", ".join(f"shard {x['shard']} {fmt_uncertainty(int(x.get('uncertainty_ns') or 0))}" for x in infos)
