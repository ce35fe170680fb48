"""One run: prepared once, then carried out by one executor.

`prepare()` makes the `PreparedRun`: the validated scenario, the run folder, the run id and
run.json as it starts (scenario, fingerprint, versions, the clock anchor t0). Nothing is sent and
nothing is written into the folder yet. An `Executor` carries it out and returns the `RunOutcome`
once run.json says how the run ended:

- `runner.InProcess`: the agents on this process's event loop (or, with a drive, the requests of
  `agentload proxy`'s harness instead of agents);
- `runner.OneShard`: in-process, only the agents i with i % N == I (`run --shard I/N`; `agentload
  merge` joins the folders);
- `cluster.processes.Processes`: N processes on this machine (`run --workers N`);
- `cluster.ray.RayShards`: N Ray actors (`run --ray ADDRESS`).

The multi-part executors hand each part `part_spec(I, N)`; the part rebuilds its own
`PreparedRun` from it (`part_of`: the parent's run id and clock anchor, files named -wI) and runs
it in-process, so every part is the same run path.
"""

from __future__ import annotations

import os
import platform
import secrets
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol

import aiohttp
import orjson

from agentload import __version__
from agentload.atomic import write_atomic

if TYPE_CHECKING:
    from agentload.run.scenario import Scenario


@dataclass
class RunOutcome:
    out_dir: Path
    run_id: str
    cut_short: bool
    stop_reason: str | None
    interrupted: bool
    ended_by: str = "finished"  # finished | duration | interrupted | crashed


def write_run_json(path: Path, obj: Any) -> None:
    write_atomic(path, orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))


def clock_anchor() -> dict[str, Any]:
    """The run's clock anchor: this host's monotonic clock and the wall clock, read together."""
    return {"t0_ns": time.perf_counter_ns(), "t0_unix": time.time()}


def run_metadata(sc: Scenario, run_id: str, endpoint: str, embedded_mock: bool) -> dict[str, Any]:
    return {
        "run": run_id,
        "version": __version__,
        "record_version": 1,
        "scenario": sc.to_dict(),
        "fingerprint": sc.workload_fingerprint(),
        "endpoint": endpoint,
        "api": sc.target.api,  # the API the agents spoke (chat, messages, responses)
        "embedded_mock": embedded_mock,
        "client": sc.to_dict()["client"],
        "stall": sc.to_dict()["stall"],
        "versions": {"python": platform.python_version(), "aiohttp": aiohttp.__version__,
                     "platform": platform.platform()},
        "argv": sys.argv,
        "pid": os.getpid(),
        **clock_anchor(),
        "ended": False,
        "ended_normally": False,
        "cut_short": False,
        "crashes": [],
    }


def _to_stderr(msg: str) -> None:
    print(msg, file=sys.stderr)


@dataclass
class PreparedRun:
    """A run ready to execute: what it is (scenario, folder, target, run.json so far) and how its
    driver behaves (signals, the live line, the --metrics-port exporter, where messages go).
    `shard` (I, N): only the agents i with i % N == I run here; `files_suffix`: "-wI" for one part
    of a run in several processes or shards (run-wI.json, records-wI.jsonl, ...)."""

    scenario: Scenario
    run_dir: Path
    base_url: str
    embedded_mock: bool
    meta: dict[str, Any]
    install_signals: bool = True
    live: bool = False
    metrics_port: int | None = None
    log: Callable[[str], None] = field(default=_to_stderr)
    shard: tuple[int, int] = (0, 1)
    files_suffix: str = ""

    @property
    def run_id(self) -> str:
        return str(self.meta["run"])

    @property
    def first(self) -> bool:
        """The part that runs the canaries and the stall probes and asks the server about itself."""
        return self.shard[0] == 0

    def path(self, stem: str, ext: str = "jsonl") -> Path:
        return self.run_dir / f"{stem}{self.files_suffix}.{ext}"

    def write_meta(self) -> None:
        write_run_json(self.path("run", "json"), self.meta)

    def outcome(self, interrupted: bool) -> RunOutcome:
        """How the run ended, as its finished run.json says."""
        m = self.meta
        return RunOutcome(self.run_dir, self.run_id, bool(m["cut_short"]), m.get("stop_reason"), interrupted,
                          m["ended_by"])

    def part_spec(self, index: int, count: int) -> dict[str, Any]:
        """What part `index` of `count` needs to rebuild this run on its own (`part_of`): plain JSON."""
        sc = self.scenario
        return {"scenario": sc.to_dict(), "source": sc.source, "base_url": self.base_url,
                "run_dir": str(self.run_dir), "embedded_mock": self.embedded_mock, "index": index, "count": count,
                "run_id": self.run_id, "t0_ns": self.meta["t0_ns"], "t0_unix": self.meta["t0_unix"]}


def part_of(spec: dict[str, Any], *, run_dir: Path | None = None, t0_ns: int | None = None,
            install_signals: bool = True) -> PreparedRun:
    """One part of a run prepared in another process (`PreparedRun.part_spec`): its own run.json
    (this process's pid, versions) with the run's id and clock anchor (`t0_ns`: the anchor on this
    host's clock, when that differs), files named -wI, only its share of the agents."""
    from agentload.run.scenario import parse_scenario

    sc = parse_scenario(spec["scenario"], spec["source"])
    index, count = spec["index"], spec["count"]
    sfx = f"-w{index}"
    meta = run_metadata(sc, spec["run_id"], spec["base_url"], spec["embedded_mock"])
    meta.update(t0_ns=spec["t0_ns"] if t0_ns is None else t0_ns, t0_unix=spec["t0_unix"], worker=index,
                workers=count, files_suffix=sfx)
    run_dir = Path(spec["run_dir"]) if run_dir is None else run_dir
    return PreparedRun(sc, run_dir, spec["base_url"], spec["embedded_mock"], meta, install_signals=install_signals,
                       shard=(index, count), files_suffix=sfx)


def prepare(sc: Scenario, run_dir: Path, base_url: str, *, embedded_mock: bool,
            extra_meta: dict[str, Any] | None = None, install_signals: bool = True, live: bool = False,
            metrics_port: int | None = None, log: Callable[[str], None] = _to_stderr) -> PreparedRun:
    """The run of `sc` against base_url into run_dir, ready for an executor. `extra_meta` goes into
    run.json (the fleet of a router soak, the proxy's listen address)."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    meta = run_metadata(sc, secrets.token_hex(4), base_url, embedded_mock)
    meta.update(extra_meta or {})
    return PreparedRun(sc, run_dir, base_url, embedded_mock, meta, install_signals=install_signals, live=live,
                       metrics_port=metrics_port, log=log)


class Executor(Protocol):
    """Carries out a prepared run and returns how it ended (run.json written, whatever happened)."""

    def execute(self, run: PreparedRun) -> RunOutcome: ...
