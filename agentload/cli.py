"""The command line: run, mock, report, scenarios.

Exit status of `run`: 0 healthy, 1 a problem was found (`--fail-on never` turns that off),
2 a usage error (bad scenario, bad flag, missing file) with one line naming what is wrong.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from agentload.errors import UserError

app = typer.Typer(add_completion=False, no_args_is_help=False, pretty_exceptions_enable=False,
                  help="Load generator for LLM serving stacks: tool-calling agents, traced phases, stall verdicts.")


def _fail(msg: str) -> None:
    typer.echo(f"agentload: error: {msg}", err=True)
    raise typer.Exit(2)


SetOpt = Annotated[Optional[list[str]], typer.Option("--set", "-s", help="Override a field: section.key=value (repeatable)")]


@app.command()
def run(
    scenario: Annotated[Optional[str], typer.Argument(help="Scenario TOML file or packaged name (default: demo)")] = None,
    endpoint: Annotated[Optional[str], typer.Option(help="OpenAI-compatible base URL, e.g. http://127.0.0.1:30000/v1; default: start the embedded mock")] = None,
    model: Annotated[Optional[str], typer.Option(help="Model name to request")] = None,
    set_: SetOpt = None,
    out: Annotated[Optional[Path], typer.Option(help="Run folder (default: reports/<time>-<scenario>)")] = None,
    fail_on: Annotated[str, typer.Option(help="'problem': exit 1 when the verdict is not healthy; 'never'")] = "problem",
    live: Annotated[bool, typer.Option(help="Print a live line every second")] = True,
) -> None:
    """Run a scenario and print its report (verdict first)."""
    from agentload.launch import run_to_dir
    from agentload.runner import default_out_dir
    from agentload.scenario import load_scenario

    if fail_on not in ("problem", "never"):
        _fail(f"--fail-on: expected 'problem' or 'never', got {fail_on!r}")
    overrides = list(set_ or [])
    if endpoint:
        overrides.append(f"target.endpoint={_toml_str(endpoint)}")
    if model:
        overrides.append(f"target.model={_toml_str(model)}")
    try:
        sc = load_scenario(scenario, overrides)
    except UserError as e:
        _fail(str(e))
    run_dir = out or default_out_dir(sc)
    try:
        launched = run_to_dir(sc, run_dir, live=live)
    except UserError as e:
        _fail(str(e))
    summary, text, outcome = launched.summary, launched.text, launched.outcome
    typer.echo(text)
    typer.echo(f"records: {run_dir / 'records.jsonl'}  summary: {run_dir / 'summary.json'}", err=True)
    kind = summary["verdict"]["kind"]
    if outcome.interrupted:
        raise typer.Exit(130 if kind == "healthy" or fail_on == "never" else 1)
    if fail_on == "problem" and kind != "healthy":
        raise typer.Exit(1)


def _toml_str(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


@app.command()
def mock(
    host: Annotated[str, typer.Option(help="Address to bind (loopback by default)")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port (0 picks a free one)")] = 8000,
    scenario: Annotated[Optional[str], typer.Option(help="Take [mock] settings from this scenario")] = None,
    set_: SetOpt = None,
) -> None:
    """Run the mock OpenAI-compatible server standalone (e.g. behind a router)."""
    from agentload.mock.__main__ import serve
    from agentload.mock.config import MockConfig
    from agentload.scenario import load_scenario

    try:
        if scenario:
            base = load_scenario(scenario).mock.to_dict()
        else:
            base = {}
        sets = [s if s.startswith("mock.") else f"mock.{s}" for s in (set_ or [])]
        from agentload.scenario import apply_overrides

        raw = {"mock": base}
        apply_overrides(raw, sets, "--set")
        cfg = MockConfig.from_dict(raw["mock"], scenario or "--set")
    except UserError as e:
        _fail(str(e))
    from agentload.launch import use_uvloop

    use_uvloop()
    serve(cfg, host, port)


@app.command()
def report(run_dir: Annotated[Path, typer.Argument(help="A run folder written by `agentload run`")]) -> None:
    """Rebuild every report of a run from its records (also of a run that was killed)."""
    from agentload.report.build import write_reports

    try:
        summary, text = write_reports(run_dir)
    except UserError as e:
        _fail(str(e))
    typer.echo(text)


@app.command()
def scenarios() -> None:
    """List the packaged scenarios with what each demonstrates."""
    from agentload.scenario import load_scenario, packaged_scenarios

    for name in packaged_scenarios():
        sc = load_scenario(name)
        first = (sc.description.strip().splitlines() or [""])[0]
        typer.echo(f"{name:24s} {first}")


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
