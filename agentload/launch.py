"""Run one scenario into one run folder, with the embedded mock when it has no endpoint.

The one path `run`, `compare` and the tests share: check what can be checked before any
traffic (the run folder is new or empty and writable, every secret the target names is set in
the environment), start the mock (a separate process), prepare the run, carry it out with the executor
the placement asks for (`agentload.run.executor`), stop the mock, write every report.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentload.endpoint import _VERSION_PART, without_version_hint
from agentload.errors import UserError
from agentload.redact import env_secrets, register_target, secret_field
from agentload.report.build import write_reports
from agentload.run.executor import Executor, RunOutcome, prepare
from agentload.run.runner import InProcess, OneShard
from agentload.run.scenario import Scenario


@dataclass
class Launched:
    outcome: RunOutcome
    summary: dict[str, Any]
    text: str


def run_to_dir(sc: Scenario, run_dir: Path, *, live: bool = True, install_signals: bool = True,
               log=lambda msg: print(msg, file=sys.stderr), metrics_port: int | None = None,
               workers: int = 1, ray: str | None = None, shards: int | None = None,
               shard: tuple[int, int] | None = None) -> Launched:
    """Run `sc` into run_dir and write every report. With workers > 1 the agents run in that many
    processes (agentload.cluster.processes), against one embedded mock shared by all of them. With `ray`
    (an address, "auto" or "local") the agents run in `shards` Ray actors (agentload.cluster.ray);
    with `shard` (I, N) only this process's share of the agents runs (`agentload merge` joins them)."""
    from agentload.mock.process import MockProcess

    if ray is None and shard is None and workers == 1 and sc.cluster.engine == "ray":
        ray = sc.cluster.address  # [cluster] engine = "ray" (--ray on the command line wins)
        shards = shards if shards is not None else sc.cluster.shard_count(sc.agents.count)
    check_placement(sc, workers, ray, shard)
    check_secrets(sc)
    prepare_run_dir(run_dir)
    hint = endpoint_hint(sc.target.endpoint, sc.target.api)
    if hint:
        log(f"agentload: warning: {hint}")
    mock = None
    fleet = schedule = None
    extra_meta: dict[str, Any] = {}
    try:
        if sc.fleet.enabled:
            fleet, schedule, sc = start_fleet(sc, run_dir, log)
            base_url = fleet.endpoint or ""
            extra_meta["fleet"] = fleet.meta(sc.schedule)
        elif sc.target.endpoint is None:
            mock = MockProcess.start(sc.mock)
            base_url = mock.url
        else:
            base_url = sc.target.endpoint
        log(f"agentload: running {sc.source} against {base_url}{' (embedded mock)' if mock else ''} -> {run_dir}")
        on_started = (lambda meta: schedule.start(meta["t0_ns"])) if schedule is not None else None
        executor = choose_executor(sc, workers, ray, shards, shard, InProcess(on_started=on_started))
        run = prepare(sc, run_dir, base_url, embedded_mock=mock is not None, extra_meta=extra_meta,
                      install_signals=install_signals, live=live, metrics_port=metrics_port, log=log)
        outcome = executor.execute(run)
    finally:
        if schedule is not None:
            schedule.stop()
            note_schedule_failures(run_dir)
        if fleet is not None:
            fleet.stop()
        if mock is not None:
            mock.stop()
    summary, text = write_reports(run_dir)
    export_after_run(sc, run_dir, log)
    return Launched(outcome, summary, text)


def check_placement(sc: Scenario, workers: int, ray: str | None, shard: tuple[int, int] | None) -> None:
    """Where the agents may run: a fleet in one process, Ray with an endpoint and on its own."""
    if workers > 1 and sc.fleet.enabled:
        raise UserError(f"{sc.source}: [fleet] runs in one process: leave out --workers")
    if ray is not None:
        if workers > 1 or shard is not None:
            raise UserError("--ray: leave out --workers and --shard (Ray places the shards)")
        if sc.target.endpoint is None:
            raise UserError(f"{sc.source}: --ray needs [target] endpoint (--endpoint URL): the embedded mock "
                            f"serves one machine only")
        if sc.fleet.enabled:
            raise UserError(f"{sc.source}: [fleet] runs in one process: leave out --ray")


def choose_executor(sc: Scenario, workers: int, ray: str | None, shards: int | None,
                    shard: tuple[int, int] | None, in_process: InProcess) -> Executor:
    """The executor the placement asks for: Ray actors, worker processes, one shard of N, or this process."""
    if ray is not None:
        from agentload.cluster.ray import RayShards

        return RayShards(ray, shards or sc.cluster.shard_count(sc.agents.count), cpus_per_shard=sc.cluster.cpus_per_shard)
    if workers > 1:
        from agentload.cluster.processes import Processes

        return Processes(workers)
    if shard is not None:
        return OneShard(shard[0], shard[1], in_process)
    return in_process


def export_after_run(sc: Scenario, run_dir: Path, log) -> None:
    """`[export] otlp_endpoint`: the run's requests as spans, once its reports are written. Whatever
    happens (no extra, no collector) is one line and leaves the run, its reports and exit status as they are."""
    if sc.export.otlp_endpoint:
        from agentload.report.otlp import export_run

        log(f"agentload: {export_run(run_dir, sc.export.otlp_endpoint, sc.export.otlp_timeout_s).line}")


def start_fleet(sc: Scenario, run_dir: Path, log) -> tuple[Any, Any, Scenario]:
    """Start the scenario's fleet and router; returns them, the schedule (not yet started) and the
    scenario with the router's metrics URL added to what the scraper reads."""
    import dataclasses

    from agentload.fleet.fleet import Fleet
    from agentload.fleet.schedule import Schedule

    fleet = Fleet(sc.fleet, sc.router, sc.mock, sc.target.model, run_dir, log, source=sc.source)
    fleet.start(external_endpoint=sc.target.endpoint)
    if fleet.metrics_url and fleet.metrics_url not in sc.target.metrics_urls:
        sc = dataclasses.replace(sc, target=dataclasses.replace(
            sc.target, metrics_urls=[*sc.target.metrics_urls, fleet.metrics_url]))
    return fleet, Schedule(fleet, sc.schedule, run_dir / "schedule.jsonl", log), sc


def note_schedule_failures(run_dir: Path) -> None:
    """A scheduled fault that could not be applied (or undone) is agentload not doing what the
    scenario asked: a crash entry in run.json (where "schedule"), so the verdict cannot be healthy."""
    import orjson

    from agentload.atomic import write_atomic

    try:
        lines = [orjson.loads(x) for x in (run_dir / "schedule.jsonl").read_bytes().splitlines() if x.strip()]
        meta = orjson.loads((run_dir / "run.json").read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return
    failed = [x for x in lines if isinstance(x, dict) and not x.get("ok", True)]
    if not failed:
        return
    for x in failed:
        meta.setdefault("crashes", []).append({
            "where": "schedule", "agent": None, "round": None, "error": "ScheduleFailed",
            "message": f"{x.get('event')} of fault {x.get('fault')} on backend {x.get('backend')} at "
                       f"{x.get('planned_s')} s failed: {x.get('error')}", "traceback": ""})
        meta["crash_count"] = int(meta.get("crash_count") or 0) + 1
    write_atomic(run_dir / "run.json", orjson.dumps(meta, option=orjson.OPT_INDENT_2))


def check_secrets(sc: Scenario) -> None:
    """Every variable `api_key_env` / `headers_env` / `metrics_api_key_env` names must be set: a run
    without its key would only show 401s. The values are remembered for redaction in this process."""
    for name, value in env_secrets(sc.target).items():
        if not value:
            field = secret_field(sc.target, name)
            raise UserError(f"{sc.source}: {field}: environment variable {name} is "
                            f"{'empty' if value == '' else 'not set'}; expected the secret in it")
    register_target(sc.target)


def prepare_run_dir(run_dir: Path) -> None:
    """A run writes into a new or empty folder: records appended to another run's would mix two
    runs in one records.jsonl (and "48 of 48" requests for a 40-request run)."""
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"{run_dir}: expected a folder for the run (--out), got an existing file")
    if run_dir.is_dir():
        try:
            entries = sorted(p.name for p in run_dir.iterdir())
        except OSError as e:
            raise UserError(f"{run_dir}: cannot read the run folder (--out): {e.strerror or e}") from e
        if entries:
            shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
            raise UserError(f"{run_dir}: expected a new or empty run folder (--out), it holds {len(entries)} "
                            f"entr{'y' if len(entries) == 1 else 'ies'} ({shown}); a second run would mix its "
                            f"records with them: choose another folder")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / ".agentload-write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise UserError(f"{run_dir}: cannot write the run folder (--out): {e.strerror or e.__class__.__name__}") from e


def endpoint_hint(endpoint: str | None, api: str = "chat") -> str | None:
    """A warning for an endpoint that is a bare host (requests would go to /chat/completions, not /v1/...)."""
    return without_version_hint(endpoint, api) if endpoint else None


LOOPBACK_HOSTS = ("127.0.0.1", "::1", "localhost")


def proxy_to_dir(sc: Scenario, run_dir: Path, upstream: str, *, host: str = "127.0.0.1", port: int = 0,
                 session_header: str | None = None, capture_bodies: bool = False, live: bool = True,
                 install_signals: bool = True,
                 log=lambda msg: print(msg, file=sys.stderr), on_listening=None) -> Launched:
    """`agentload proxy`: serve a proxy to `upstream` on host:port until a signal (or the scenario's
    agents.duration_s), recording every request the harness sends through it into run_dir, then write
    every report. `on_listening(host, port)` is called once the socket is bound (tests, a harness to start)."""
    import dataclasses
    import socket
    from urllib.parse import urlsplit

    from agentload.proxy.drive import drive

    parts = urlsplit(upstream)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UserError(f"--upstream {upstream!r}: expected an http:// or https:// URL of the server the harness talks to")
    if parts.query or parts.fragment or parts.username:
        raise UserError(f"--upstream {upstream!r}: expected scheme://host:port[/path], without a query, fragment or "
                        f"credentials (the harness's own path and query are appended)")
    check_secrets(sc)
    prepare_run_dir(run_dir)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(1024)
    except OSError as e:
        sock.close()
        raise UserError(f"--host {host} --port {port}: cannot listen there: {e.strerror or e}") from e
    bound = sock.getsockname()
    if on_listening is not None:
        on_listening(bound[0], bound[1])
    # canaries (and the scraper's defaults) need the upstream's API base: its /v1, if it did not name one
    base = upstream.rstrip("/")
    if not any(_VERSION_PART.match(p) for p in parts.path.split("/") if p):
        base += "/v1"
    sc = dataclasses.replace(sc, target=dataclasses.replace(sc.target, endpoint=base))
    meta = {"proxy": {"upstream": upstream, "listen": f"{bound[0]}:{bound[1]}", "session_header": session_header,
                      "bodies": "bodies.jsonl" if capture_bodies else None}}
    run = prepare(sc, run_dir, base, embedded_mock=False, extra_meta=meta, install_signals=install_signals,
                  live=live, log=log)
    serve = drive(sock, upstream, session_header, log, run_dir / "bodies.jsonl" if capture_bodies else None)
    try:
        outcome = InProcess(drive=serve).execute(run)
    finally:
        sock.close()
    summary, text = write_reports(run_dir)
    export_after_run(sc, run_dir, log)
    return Launched(outcome, summary, text)
