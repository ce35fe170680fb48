"""The command line: run, mock, report, scenarios.

Exit status of `run`: 0 healthy, 1 a problem was found (`--fail-on never` turns that off),
2 a usage error (bad scenario, bad flag, missing file, a run folder that is not new or empty, an
unset secret variable) with one line naming what is wrong, 130 interrupted with a healthy verdict.
`report` and `compare`: 0 when they wrote their output, whatever the verdicts; 2 a usage error;
`compare` 130 when interrupted; `report --otlp-endpoint` 1 when the spans were not sent (the reports
were written). `run --otlp-endpoint` (or `[export] otlp_endpoint`): an export that failed or could not
start (the `otlp` extra not installed) is one line on stderr and leaves the exit status the verdict's.

Everything printed goes through `agentload.redact`: a secret the environment holds is printed as `***`.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn, Optional

import typer

from agentload.errors import UserError
from agentload.redact import redact

if TYPE_CHECKING:
    from agentload.launch import Launched
    from agentload.run.scenario import Scenario

app = typer.Typer(add_completion=False, no_args_is_help=False, pretty_exceptions_enable=False,
                  help="Load generator for LLM serving stacks: tool-calling agents, traced phases, stall verdicts.")


def _fail(msg: str) -> NoReturn:
    one_line = " ".join(redact(msg).split())
    typer.echo(f"agentload: error: {one_line}", err=True)
    raise typer.Exit(2)


def _echo(text: str, err: bool = False) -> None:
    typer.echo(redact(text), err=err)


def _version(value: bool) -> None:
    if value:
        from agentload import __version__

        typer.echo(f"agentload {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print agentload's version and exit")] = False,
) -> None:
    pass


SetOpt = Annotated[Optional[list[str]], typer.Option("--set", "-s", help="Override a field: section.key=value (repeatable)")]


@app.command()
def run(
    scenario: Annotated[Optional[str], typer.Argument(help="Scenario TOML file or packaged name (default: demo)")] = None,
    endpoint: Annotated[Optional[str], typer.Option(help="OpenAI-compatible base URL, e.g. http://127.0.0.1:30000/v1 (a query string is kept), or the API's full URL (.../chat/completions); default: start the embedded mock")] = None,
    model: Annotated[Optional[str], typer.Option(help="Model name to request")] = None,
    set_: SetOpt = None,
    out: Annotated[Optional[Path], typer.Option(help="Run folder (default: reports/<time>-<scenario>)")] = None,
    fail_on: Annotated[str, typer.Option(help="'problem': exit 1 when the verdict is not healthy; 'never'")] = "problem",
    live: Annotated[bool, typer.Option(help="Print a live line every second")] = True,
    metrics_port: Annotated[Optional[int], typer.Option("--metrics-port", help="Serve agentload's own live state in Prometheus format at 127.0.0.1:PORT/metrics (0: a free port, printed)")] = None,
    workers: Annotated[int, typer.Option("--workers", help="Run the agents in N processes (own event loop and client pool each: \\[client] pool settings apply per process); one report")] = 1,
    ray: Annotated[Optional[str], typer.Option("--ray", help="Run the agents in Ray actors (shards) on this cluster: host:port, 'auto', or 'local' (a throwaway one on this machine); needs --endpoint")] = None,
    shards: Annotated[Optional[int], typer.Option("--shards", help="With --ray: how many shards (actors), each its own event loop and pool (default: \\[cluster] shards, 2)")] = None,
    shard: Annotated[Optional[str], typer.Option("--shard", help="Run only shard I of N (agents i with i % N == I), e.g. 0/4; join the folders with `agentload merge`")] = None,
    otlp_endpoint: Annotated[Optional[str], typer.Option("--otlp-endpoint", help="Send each request as an OpenTelemetry span to this OTLP/HTTP collector once the run is written, e.g. http://127.0.0.1:4318 (the otlp extra: pip install 'agentload\\[otlp]')")] = None,
) -> None:
    """Run a scenario and print its report (verdict first)."""
    from agentload.launch import run_to_dir
    from agentload.run.runner import default_out_dir
    _check_fail_on(fail_on)
    if metrics_port is not None and not 0 <= metrics_port <= 65535:
        _fail(f"--metrics-port: expected a port 0-65535, got {metrics_port}")
    if workers < 1:
        _fail(f"--workers: expected a whole number >= 1, got {workers}")
    if shards is not None and shards < 1:
        _fail(f"--shards: expected a whole number >= 1, got {shards}")
    shard_of = None
    if shard is not None:
        m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", shard)
        if not m or int(m.group(2)) < 1 or int(m.group(1)) >= int(m.group(2)):
            _fail(f"--shard: expected I/N with 0 <= I < N, e.g. 0/4, got {shard!r}")
        shard_of = (int(m.group(1)), int(m.group(2)))
    overrides = list(set_ or [])
    if endpoint:
        overrides.append(f"target.endpoint={_toml_str(endpoint)}")
    if model:
        overrides.append(f"target.model={_toml_str(model)}")
    if otlp_endpoint:
        overrides.append(f"export.otlp_endpoint={_toml_str(otlp_endpoint)}")
    sc = _load(scenario, overrides)
    run_dir = out or default_out_dir(sc)
    try:
        launched = run_to_dir(sc, run_dir, live=live, metrics_port=metrics_port, workers=workers, ray=ray,
                              shards=shards, shard=shard_of)
    except UserError as e:
        _fail(str(e))
    _finish(launched, run_dir, fail_on, "records-w*.jsonl" if workers > 1 or ray else "records.jsonl")


@app.command()
def proxy(
    upstream: Annotated[str, typer.Option("--upstream", help="The server the harness talks to, e.g. http://127.0.0.1:30000/v1")],
    scenario: Annotated[Optional[str], typer.Argument(help="Scenario whose \\[client], \\[stall], \\[canary] settings apply (default: demo)")] = None,
    port: Annotated[int, typer.Option(help="Port to listen on (0: a free one, printed)")] = 8080,
    host: Annotated[str, typer.Option(help="Address to listen on (loopback unless you say otherwise)")] = "127.0.0.1",
    out: Annotated[Optional[Path], typer.Option(help="Run folder (default: reports/<time>-proxy)")] = None,
    session_header: Annotated[Optional[str], typer.Option("--session-header", help="A request header that names the conversation (e.g. x-session-id); wins over the messages")] = None,
    duration: Annotated[Optional[float], typer.Option(help="Stop after this many seconds (default: until Ctrl-C or SIGTERM)")] = None,
    capture_bodies: Annotated[bool, typer.Option("--capture-bodies", help="Also keep each request's body (bodies.jsonl, secrets redacted): `replay` then sends the real text")] = False,
    set_: SetOpt = None,
    fail_on: Annotated[str, typer.Option(help="'problem': exit 1 when the verdict is not healthy; 'never'")] = "problem",
    live: Annotated[bool, typer.Option(help="Print a live line every second")] = True,
) -> None:
    """Sit between a real harness and its server: record every request with a run's phases, then the verdict."""
    from agentload.launch import proxy_to_dir
    from agentload.run.runner import default_out_dir
    _check_fail_on(fail_on)
    if not 0 <= port <= 65535:
        _fail(f"--port: expected a port 0-65535, got {port}")
    if duration is not None and duration <= 0:
        _fail(f"--duration: expected a number of seconds > 0, got {duration:g}")
    overrides = list(set_ or [])
    if duration is not None:
        overrides.append(f"agents.duration_s={duration!r}")
    sc = _load(scenario, overrides)
    run_dir = out or default_out_dir(sc, name="proxy")
    try:
        launched = proxy_to_dir(sc, run_dir, upstream, host=host, port=port, session_header=session_header,
                                capture_bodies=capture_bodies, live=live)
    except UserError as e:
        _fail(str(e))
    _finish(launched, run_dir, fail_on, interrupted_is_an_end=True)  # Ctrl-C is how a proxy session ends


@app.command()
def replay(
    capture: Annotated[str, typer.Argument(help="A capture: an `agentload proxy` run folder, a conversation JSONL file (one {\"messages\": [...]} a line), or a Mooncake-style trace (timestamp, input_length, output_length, hash_ids)")],
    scenario: Annotated[Optional[str], typer.Argument(help="Scenario for everything else: target, client, stall, mock (default: demo)")] = None,
    agents: Annotated[Optional[str], typer.Option(help="How many agents: N, or Nx (N times the captured conversations); they cycle over the conversations (default: 1x)")] = None,
    speed: Annotated[float, typer.Option(help="Think times between rounds divided by this (10: ten times faster)")] = 1.0,
    fmt: Annotated[str, typer.Option("--format", help="'auto', 'proxy', 'openai' or 'mooncake'")] = "auto",
    endpoint: Annotated[Optional[str], typer.Option(help="OpenAI-compatible base URL; default: the scenario's, else the embedded mock")] = None,
    set_: SetOpt = None,
    out: Annotated[Optional[Path], typer.Option(help="Run folder (default: reports/<time>-replay)")] = None,
    fail_on: Annotated[str, typer.Option(help="'problem': exit 1 when the verdict is not healthy; 'never'")] = "problem",
    live: Annotated[bool, typer.Option(help="Print a live line every second")] = True,
) -> None:
    """Play captured conversations back as scripted agents: their rounds, tool calls, prompt sizes and think times."""
    from agentload.launch import run_to_dir
    from agentload.run.replay import load_plans, max_rounds
    from agentload.run.runner import default_out_dir
    _check_fail_on(fail_on)
    if fmt not in ("auto", "proxy", "openai", "mooncake"):
        _fail(f"--format: expected 'auto', 'proxy', 'openai' or 'mooncake', got {fmt!r}")
    if not speed > 0:
        _fail(f"--speed: expected a number > 0, got {speed:g}")
    try:
        plans = load_plans(capture, fmt)
    except UserError as e:
        _fail(str(e))
    n = len(plans)
    if agents is not None:
        m = re.fullmatch(r"\s*(\d+)\s*(x?)\s*", agents)
        if not m or int(m.group(1)) < 1:
            _fail(f"--agents: expected N or Nx with N >= 1 (e.g. 100 or 10x), got {agents!r}")
        n = int(m.group(1)) * (len(plans) if m.group(2) else 1)
    if plans[0].arrival_s is not None:  # a trace with arrival times: open loop, on its clock
        set_ = ['agents.arrival="open"', *(set_ or [])]
    overrides = [f"replay.source={_toml_str(str(Path(capture).resolve()))}", f"replay.format={_toml_str(fmt)}",
                 f"replay.speed={speed!r}", 'conversation.mode="scripted"', f"agents.count={n}",
                 f"agents.rounds={max_rounds(plans)}", *(set_ or [])]
    if endpoint:
        overrides.append(f"target.endpoint={_toml_str(endpoint)}")
    sc = _load(scenario, overrides)
    run_dir = out or default_out_dir(sc, name="replay")
    try:
        launched = run_to_dir(sc, run_dir, live=live)
    except UserError as e:
        _fail(str(e))
    _finish(launched, run_dir, fail_on)


def _toml_str(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _check_fail_on(fail_on: str) -> None:
    if fail_on not in ("problem", "never"):
        _fail(f"--fail-on: expected 'problem' or 'never', got {fail_on!r}")


def _load(scenario: Optional[str], overrides: list[str]) -> Scenario:
    from agentload.run.scenario import load_scenario

    try:
        return load_scenario(scenario, overrides)
    except UserError as e:
        _fail(str(e))


def _finish(launched: Launched, run_dir: Path, fail_on: str, records: str = "records.jsonl",
            interrupted_is_an_end: bool = False) -> None:
    """Print the report and where the run's files are; exit 1 on a problem (under --fail-on problem),
    130 on an interrupted run that was healthy so far (unless an interrupt is how this command ends)."""
    _echo(launched.text)
    _echo(f"records: {run_dir / records}  summary: {run_dir / 'summary.json'}  html: {run_dir / 'report.html'}",
          err=True)
    kind = launched.summary["verdict"]["kind"]
    if launched.outcome.interrupted and not interrupted_is_an_end:
        raise typer.Exit(130 if kind == "healthy" or fail_on == "never" else 1)
    if fail_on == "problem" and kind != "healthy":
        raise typer.Exit(1)


@app.command()
def mock(
    host: Annotated[str, typer.Option(help="Address to bind (loopback by default)")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port (0 picks a free one)")] = 8000,
    scenario: Annotated[Optional[str], typer.Option(help="Take \\[mock] settings from this scenario")] = None,
    set_: SetOpt = None,
) -> None:
    """Run the mock OpenAI-compatible server standalone (e.g. behind a router)."""
    from agentload.mock.serve import mock_config, serve
    from agentload.run.scenario import load_scenario

    try:
        base = load_scenario(scenario).mock.to_dict() if scenario else {}
        cfg = mock_config(set_ or [], base, scenario or "--set")
        serve(cfg, host, port)  # a port out of range or in use: one line, exit 2
    except UserError as e:
        _fail(str(e))


@app.command()
def merge(
    run_dirs: Annotated[list[Path], typer.Argument(help="Run folders of `agentload run --shard I/N`, one per shard")],
    out: Annotated[Path, typer.Option(help="The merged run folder (new or empty)")],
) -> None:
    """Join the folders of a run made in shards (`run --shard I/N`) into one run folder and report it;
    clocks are aligned by each shard's wall-clock anchor (NTP grade, stated in the report)."""
    from agentload.cluster.shards import merge_dirs
    from agentload.report.build import write_reports

    try:
        meta = merge_dirs(run_dirs, out)
        summary, text = write_reports(out)
    except UserError as e:
        _fail(str(e))
    _echo(text)
    _echo(f"merged {len(run_dirs)} shard folder(s) into {out}; clock alignment: {meta['clock_alignment']}", err=True)


@app.command()
def report(
    run_dir: Annotated[Path, typer.Argument(help="A run folder written by `agentload run`")],
    otlp_endpoint: Annotated[Optional[str], typer.Option("--otlp-endpoint", help="Also send the run's requests as OpenTelemetry spans to this OTLP/HTTP collector, e.g. http://127.0.0.1:4318 (the otlp extra)")] = None,
) -> None:
    """Rebuild every report of a run from its records (also of a run that was killed)."""
    from agentload.report.build import write_reports

    if otlp_endpoint:
        from agentload.run.scenario import otlp_endpoint_arg

        try:
            otlp_endpoint_arg(otlp_endpoint)
        except UserError as e:
            _fail(str(e))
    try:
        summary, text = write_reports(run_dir)
    except UserError as e:
        _fail(str(e))
    _echo(text)
    _echo(f"html: {run_dir / 'report.html'}", err=True)
    if otlp_endpoint:
        _export_otlp(run_dir, otlp_endpoint)


def _export_otlp(run_dir: Path, endpoint: str) -> None:
    """`report --otlp-endpoint`: the spans of a run folder; exit 1 when they were not sent (the reports are)."""
    import orjson

    from agentload.report.otlp import export_run
    from agentload.run.scenario import ExportConfig

    try:  # the run's own [export] timeout, where it had one
        timeout_s = float(orjson.loads((run_dir / "run.json").read_bytes())["scenario"]["export"]["otlp_timeout_s"])
    except (OSError, ValueError, KeyError, TypeError):
        timeout_s = ExportConfig().otlp_timeout_s
    res = export_run(run_dir, endpoint, timeout_s)
    _echo(f"agentload: {res.line}", err=True)
    if not res.ok:
        raise typer.Exit(1)


@app.command()
def export(
    run_dir: Annotated[Path, typer.Argument(help="A run folder written by `agentload run`")],
    format: Annotated[str, typer.Option("--format", help="'perfetto': Chrome trace-event JSON (Perfetto, chrome://tracing)")] = "perfetto",
    out: Annotated[Optional[Path], typer.Option(help="Output file (default: RUN_DIR/trace.perfetto.json)")] = None,
) -> None:
    """Export a run's timeline: a track per agent, a slice per phase, request ids in the args."""
    from agentload.report.perfetto import export_perfetto

    if format != "perfetto":
        _fail(f"--format: expected 'perfetto', got {format!r}")
    try:
        path, n = export_perfetto(run_dir, out)
    except UserError as e:
        _fail(str(e))
    typer.echo(f"{path}  ({n} slices; open it in https://ui.perfetto.dev or chrome://tracing)")


@app.command()
def compare(
    targets: Annotated[list[str], typer.Argument(help="A scenario (file or packaged name) with --vary; or two or more run folders; or one comparison folder to rebuild")],
    vary: Annotated[Optional[list[str]], typer.Option("--vary", help="section.key=v1,v2,... (repeatable): one run per combination, e.g. client.limit=20,100,0")] = None,
    set_: SetOpt = None,
    endpoint: Annotated[Optional[str], typer.Option(help="OpenAI-compatible base URL; default: an embedded mock per run")] = None,
    model: Annotated[Optional[str], typer.Option(help="Model name to request")] = None,
    out: Annotated[Optional[Path], typer.Option(help="Comparison folder (default: reports/<time>-compare-<scenario>)")] = None,
    force: Annotated[bool, typer.Option(help="Compare runs even when their workload fingerprints differ")] = False,
    live: Annotated[bool, typer.Option(help="Print a live line every second while each variant runs")] = True,
) -> None:
    """Compare client settings on the same seeded workload, side by side (verdict, rounds, phases, connections)."""
    from agentload import compare as cmp
    from agentload.analysis import compare as cmp_math
    from agentload.report import compare_text

    try:
        paths = [Path(t) for t in targets]
        if not vary:
            # No --vary: compare runs that already exist (or rebuild a comparison folder).
            if set_ or endpoint or model:
                _fail("--set, --endpoint and --model apply when running a scenario with --vary, not to existing runs")
            not_dirs = [t for t, p in zip(targets, paths) if not p.is_dir()]
            if not_dirs:
                _fail(f"{not_dirs[0]}: not a run folder; to run a scenario, give --vary section.key=v1,v2")
            runs, names, base = cmp_math.expand_targets(paths)
            doc = cmp_math.compare_dirs(runs, force=force, names=names, base=out or base)
            dest = out or base
            if dest is not None:
                text = compare_text.write_outputs(doc, dest)
                _echo(text)
                typer.echo(f"comparison: {dest / 'compare.html'}  {dest / 'compare.json'}", err=True)
            else:
                _echo(compare_text.render_text(doc))
                typer.echo("(pass --out DIR to write compare.json and compare.html)", err=True)
            return
        if len(paths) > 1:
            _fail("--vary runs one scenario: give one scenario file or packaged name (existing runs compare without --vary)")
        overrides = list(set_ or [])
        if endpoint:
            overrides.append(f"target.endpoint={_toml_str(endpoint)}")
        if model:
            overrides.append(f"target.model={_toml_str(model)}")
        variants = cmp.plan_variants(targets[0], cmp.parse_vary(list(vary or [])), overrides, force=force)
        assert variants[0].scenario is not None
        dest = out or cmp.default_compare_dir(variants[0].scenario)
        res = cmp.run_variants(variants, dest, live=live)
        if len(res.done) < 2 and res.interrupted:
            typer.echo(f"agentload: interrupted before two variants finished; runs so far are in {dest}", err=True)
            raise typer.Exit(130)
        doc = cmp_math.compare_dirs([dest / v.folder for v in res.done], force=force, names=[v.name for v in res.done],
                               base=dest)
        text = compare_text.write_outputs(doc, dest)
    except UserError as e:
        _fail(str(e))
    _echo(text)
    typer.echo(f"comparison: {dest / 'compare.html'}  {dest / 'compare.json'}", err=True)
    if res.interrupted:
        raise typer.Exit(130)


@app.command()
def scenarios() -> None:
    """List the packaged scenarios with what each demonstrates."""
    import shutil
    import textwrap

    from agentload.run.scenario import load_scenario, packaged_scenarios

    width = max(60, min(120, shutil.get_terminal_size((100, 24)).columns))
    for name in packaged_scenarios():
        sc = load_scenario(name)
        text = " ".join(s for s in (_first_sentence(sc.description), _expected(sc.description)) if s)
        text = re.sub(r"(\d) (?=m?s\b)", "\\1\u00a0", text)  # never "0.3" at a line's end, "s" on the next
        lines = [ln.replace("\u00a0", " ") for ln in
                 textwrap.wrap(text, width=width - 25, break_long_words=False, break_on_hyphens=False)] or [""]
        typer.echo(f"{name:24s} {lines[0]}")
        for line in lines[1:]:
            typer.echo(" " * 25 + line)


# A sentence ends at . ! or ? (maybe closing a quote or parenthesis) before a space and a capital
# or a backtick: "3,000 tokens", "0.5 s" and "e.g. x" do not end one.
_SENTENCE_END = re.compile(r"""[.!?]["')\]]?(?=\s+[A-Z`])""")


def _first_sentence(description: str) -> str:
    """The description's first sentence, whole (its first paragraph joined onto one line)."""
    para = " ".join(description.strip().split("\n\n")[0].split())
    m = _SENTENCE_END.search(para)
    return para[:m.end()] if m else para


def _expected(description: str) -> str:
    """The "Expected verdict: ..." sentence, where the description has one."""
    flat = " ".join(description.split())
    m = re.search(r"\bExpect(?:ed)? verdict\b", flat)
    return _first_sentence(flat[m.start():]) if m else ""


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
