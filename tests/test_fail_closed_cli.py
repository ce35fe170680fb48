"""Issue 10, user input, the run folder and secrets: bad input is one line and exit 2, never a
traceback; a run folder holds one run; a secret never leaves agentload.

Traffic goes to `fakeserver.FakeServer` on 127.0.0.1 (or the embedded mock); runs are 2 agents x
2 rounds without canaries. CLI cases run `agentload` as a subprocess for its exit status and its
stderr (exactly one line starting `agentload: error:`, no traceback).
"""

from __future__ import annotations

import re
import socket
import subprocess
from pathlib import Path

import orjson
import pytest
from aiohttp import web

from agentload import redact
from agentload.launch import run_to_dir
from agentload.records import load_records
from agentload.records.rundir import load_run
from agentload.report.build import write_reports
from agentload.run.scenario import load_scenario
from fakeserver import DONE, FakeServer, chunk, sse_response
from helpers import cli, run_scenario

SMALL = ["--set", "agents.count=2", "--set", "agents.rounds=2", "--set", "canary.every_s=0", "--no-live"]
GOOD = [chunk({"role": "assistant", "content": ""}), chunk({"content": "hel"}), chunk({"content": "lo"}),
        chunk({}, "stop"), DONE]

BEARER = "sk-agentload-TEST-" + "0123456789abcdef" * 2
AZURE = "az-agentload-TEST-" + "fedcba9876543210" * 2
XKEY = "xk-agentload-TEST-" + "a1b2c3d4e5f6a7b8" * 2
SECRETS = (BEARER, AZURE, XKEY)
SECRET_ENV = {"AGENTLOAD_T_BEARER": BEARER, "AGENTLOAD_T_AZURE": AZURE, "AGENTLOAD_T_XKEY": XKEY}
SECRET_SETS = ["--set", 'target.api_key_env="AGENTLOAD_T_BEARER"',
               "--set", 'target.headers_env={"api-key" = "AGENTLOAD_T_AZURE", "x-api-key" = "AGENTLOAD_T_XKEY"}']


@pytest.fixture(autouse=True)
def _forget_secrets():
    yield
    redact.clear()


def one_error_line(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 2, (r.returncode, r.stdout[-500:], r.stderr[-2000:])
    assert "Traceback" not in r.stderr, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("agentload: error: "), r.stderr
    return lines[0]


def _sse(events: list[str]):
    async def handler(request: web.Request) -> web.StreamResponse:
        return await sse_response(request, events)
    return handler


# ----------------------------------------------------------------------------- 6. one run per folder


def test_run_into_a_non_empty_folder_is_refused_and_the_first_run_stays_whole(tmp_path):
    out = tmp_path / "run"
    with FakeServer(_sse(GOOD)) as srv:
        r = cli("run", "demo", "--endpoint", srv.url, "--out", str(out), *SMALL, timeout=90)
        assert r.returncode == 0, r.stderr
        before = (out / "records.jsonl").read_bytes()
        r = cli("run", "demo", "--endpoint", srv.url, "--out", str(out), *SMALL, timeout=90)
        line = one_error_line(r)
        assert str(out) in line and "empty" in line and "--out" in line, line
        assert len(srv.requests) == 4, "the refused run sent requests"
    assert (out / "records.jsonl").read_bytes() == before
    assert len({orjson.loads(ln)["run"] for ln in before.splitlines()}) == 1


def test_reports_read_only_the_run_of_run_json_and_count_the_others(tmp_path):
    with FakeServer(_sse(GOOD)) as srv:
        sets = [f'target.endpoint="{srv.url}"', "agents.count=2", "agents.rounds=2", "canary.every_s=0"]
        a = run_scenario("demo", tmp_path / "a", sets)
        run_scenario("demo", tmp_path / "b", sets + ["agents.count=3"])
    # What `run --out` used to do to a reused folder: a second run appended to the first's records.
    other = (tmp_path / "b" / "records.jsonl").read_bytes()
    n_other = len(other.splitlines())
    with open(tmp_path / "a" / "records.jsonl", "ab") as f:
        f.write(other)
    data = load_run(tmp_path / "a")
    assert data.other_run_records == n_other == 6
    assert {r.run for r in data.records} == {a.outcome.run_id}
    summary, text = write_reports(tmp_path / "a")
    assert summary["totals"]["requests"] == a.summary["totals"]["requests"] == 4
    warn = [w for w in summary["warnings"] if "other runs" in w]
    assert len(warn) == 1 and f"{n_other} record(s)" in warn[0] and a.outcome.run_id in warn[0], summary["warnings"]
    assert warn[0] in text


def test_out_that_is_a_file_or_cannot_be_written_is_one_line(tmp_path):
    f = tmp_path / "a-file"
    f.write_text("x")
    for out, words in ((f, "file"), (f / "sub", "cannot write")):
        line = one_error_line(cli("run", "demo", "--out", str(out), *SMALL, timeout=60))
        assert str(out) in line and words in line, line


# ----------------------------------------------------------------------------- 7. secrets


def test_api_key_env_or_headers_env_naming_an_unset_variable_is_exit_2(tmp_path):
    env = {k: v for k, v in SECRET_ENV.items() if k != "AGENTLOAD_T_AZURE"}
    with FakeServer(_sse(GOOD)) as srv:
        line = one_error_line(cli("run", "demo", "--endpoint", srv.url, "--out", str(tmp_path / "r1"), *SMALL,
                                  "--set", 'target.api_key_env="AGENTLOAD_T_UNSET_VAR"', timeout=60))
        assert "AGENTLOAD_T_UNSET_VAR" in line and "target.api_key_env" in line and "not set" in line, line
        line = one_error_line(cli("run", "demo", "--endpoint", srv.url, "--out", str(tmp_path / "r2"), *SMALL,
                                  *SECRET_SETS, env=env, timeout=60))
        assert "AGENTLOAD_T_AZURE" in line and "target.headers_env" in line, line
        assert not srv.requests, "a run without its key sent requests"
    assert not (tmp_path / "r1").exists() and not (tmp_path / "r2").exists()


def _echo_handler(srv_box: list):
    """Answers every request with its own headers echoed back, three ways in turn: a 401 JSON body,
    a 200 stream whose in-band error quotes them, and a 400 whose body is cut off by agentload's
    error-body limit in the middle of the bearer key."""
    async def handler(request: web.Request) -> web.StreamResponse:
        n = len(srv_box[0].requests)
        hdrs = "; ".join(f"{k}: {v}" for k, v in request.headers.items())
        if n % 3 == 1:
            return web.json_response({"error": {"message": f"invalid key, you sent {hdrs}", "code": 401}}, status=401)
        if n % 3 == 2:
            ev = "data: " + orjson.dumps({"error": {"message": f"upstream rejected {hdrs}", "type": "auth"}}).decode()
            return await sse_response(request, [chunk({"role": "assistant", "content": ""}), ev + "\n\n", DONE])
        auth = request.headers.get("Authorization", "")
        return web.Response(status=400, text="x" * (300 - len(auth) + 20) + auth, content_type="text/plain")
    return handler


def _assert_no_secret(texts: dict[str, str]) -> None:
    for where, text in texts.items():
        for s in SECRETS:
            assert s[:14] not in text, f"{s[:14]}... found in {where}"


def _folder_texts(d: Path) -> dict[str, str]:
    return {str(p): p.read_bytes().decode("utf-8", "replace") for p in sorted(d.rglob("*")) if p.is_file()}


def test_secrets_reach_the_server_but_no_output_even_when_the_server_echoes_them(tmp_path):
    out = tmp_path / "run"
    box: list = []
    with FakeServer(_echo_handler(box)) as srv:
        box.append(srv)
        r = cli("run", "demo", "--endpoint", srv.url, "--out", str(out), *SMALL, *SECRET_SETS,
                "--set", "agents.error_retries=2", "--fail-on", "never", env=SECRET_ENV, timeout=90)
        assert r.returncode == 0, r.stderr[-2000:]
        assert len(srv.requests) >= 6
        for h in srv.headers:  # the keys were sent, each in its header
            assert h["Authorization"] == f"Bearer {BEARER}" and h["api-key"] == AZURE and h["x-api-key"] == XKEY
    recs = load_records(out / "records.jsonl").records
    errs = {r.error for r in recs}
    assert {"http_401", "http_400"} <= errs and len(errs) >= 3, errs  # all three echoes were recorded
    assert any("***" in (r.error_msg or "") for r in recs)
    assert (out / "report.html").exists()
    _assert_no_secret({"stdout": r.stdout, "stderr": r.stderr, **_folder_texts(out)})
    run_json = (out / "run.json").read_text()
    assert "AGENTLOAD_T_AZURE" in run_json  # the variables' names are recorded, never their values

    # `agentload report` in a new process over records written before redaction existed: it hides
    # what its environment holds.
    raw = tmp_path / "old"
    raw.mkdir()
    for name in ("run.json", "samples.jsonl"):
        (raw / name).write_bytes((out / name).read_bytes())
    (raw / "records.jsonl").write_bytes((out / "records.jsonl").read_bytes().replace(b"***", BEARER.encode()))
    assert BEARER.encode() in (raw / "records.jsonl").read_bytes()
    r = cli("report", str(raw), env=SECRET_ENV, timeout=90)
    assert r.returncode == 0, r.stderr[-2000:]
    texts = _folder_texts(raw)
    texts.pop(str(raw / "records.jsonl"))
    _assert_no_secret({"stdout": r.stdout, "stderr": r.stderr, **texts})


def test_with_workers_no_secret_is_on_a_command_line(tmp_path, monkeypatch):
    import agentload.process as process  # the one supervisor every worker is started by

    for k, v in SECRET_ENV.items():
        monkeypatch.setenv(k, v)
    cmds: list[list[str]] = []
    real = subprocess.Popen

    def spy(cmd, *a, **kw):
        if "agentload" in " ".join(map(str, cmd)):  # the workers (not platform's own `uname -p`)
            cmds.append(list(cmd))
        return real(cmd, *a, **kw)

    monkeypatch.setattr(process.subprocess, "Popen", spy)
    box: list = []
    with FakeServer(_echo_handler(box)) as srv:
        box.append(srv)
        sets = [s for s in SECRET_SETS if s != "--set"]
        sc = load_scenario("demo", [f'target.endpoint="{srv.url}"', "agents.count=2", "agents.rounds=2",
                                    "canary.every_s=0", "agents.error_retries=1", *sets])
        run_to_dir(sc, tmp_path / "run", live=False, install_signals=False, log=lambda m: None, workers=2)
        assert srv.requests and all(h.get("api-key") == AZURE for h in srv.headers)
    assert len(cmds) == 2
    _assert_no_secret({f"worker command line {i}": " ".join(c) for i, c in enumerate(cmds)})
    _assert_no_secret(_folder_texts(tmp_path / "run"))


def test_secret_headers_are_refused_in_the_scenario_and_credentials_in_urls(tmp_path):
    line = one_error_line(cli("run", "demo", "--out", str(tmp_path / "r"), *SMALL,
                              "--set", 'target.headers={"api-key" = "literal-secret-value"}', timeout=60))
    assert "target.headers.api-key" in line and "headers_env" in line and "literal-secret-value" not in line, line
    line = one_error_line(cli("run", "demo", "--out", str(tmp_path / "r"), *SMALL,
                              "--endpoint", "http://user:pw-secret@127.0.0.1:9/v1", timeout=60))
    assert "target.endpoint" in line and "credentials" in line and "pw-secret" not in line, line


def test_redact_hides_every_form_and_a_key_cut_off_at_the_end():
    redact.add_secret('k3y"<with>&quotes-0123456789')
    s = 'k3y"<with>&quotes-0123456789'
    assert redact.redact(f"a {s} b") == "a *** b"
    assert redact.redact(orjson.dumps(f"a {s}").decode()) == '"a ***"'
    assert redact.redact_bytes(orjson.dumps({"m": s})) == b'{"m":"***"}'
    import html
    assert s not in redact.redact(html.escape(s)) and html.escape(s) not in redact.redact(html.escape(s))
    assert redact.redact("body: " + s[:9]) == "body: ***"  # truncated mid-key
    assert redact.redact("no secret here") == "no secret here"
    assert redact.redact("upstream said: " + s[:20] + "...") == "upstream said: ***..."  # cut, then an ellipsis
    redact.add_secret("EMPTY")  # a placeholder key (vLLM's convention), not a credential: text stays readable
    assert redact.redact("EMPTY") == "EMPTY"


# ----------------------------------------------------------------------------- 8. one line, not a traceback


def test_report_on_a_run_with_empty_records_writes_every_report(tmp_path):
    with FakeServer(_sse(GOOD)) as srv:
        run_scenario("demo", tmp_path / "run", [f'target.endpoint="{srv.url}"', "agents.count=2", "agents.rounds=2",
                                                "canary.every_s=0"])
    (tmp_path / "run" / "records.jsonl").write_bytes(b"")
    (tmp_path / "run" / "report.html").unlink()
    r = cli("report", str(tmp_path / "run"), timeout=90)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert (tmp_path / "run" / "report.html").stat().st_size > 1000
    assert r.stdout.startswith("VERDICT [no_data]"), r.stdout[:300]


def test_open_loop_run_that_records_nothing_ends_with_a_report(tmp_path):
    with FakeServer(_sse(GOOD)) as srv:
        r = cli("run", "demo", "--endpoint", srv.url, "--out", str(tmp_path / "run"), *SMALL,
                "--set", 'agents.arrival="open"', "--set", "agents.rate_per_s=0.001", "--set", "agents.duration_s=0.3",
                timeout=90)
        assert not srv.requests
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
    assert r.returncode == 1, (r.returncode, r.stderr[-1000:])  # no data is not healthy
    assert r.stdout.startswith("VERDICT [no_data]")
    assert (tmp_path / "run" / "report.html").exists()


def test_mock_port_in_use_or_out_of_range_is_one_line():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        line = one_error_line(cli("mock", "--port", str(port), timeout=30))
        assert f"127.0.0.1:{port}" in line and "in use" in line, line
    line = one_error_line(cli("mock", "--port", "70000", timeout=30))
    assert "--port" in line and "0-65535" in line and "70000" in line, line


# ----------------------------------------------------------------------------- 13. what `run` and `scenarios` print


def test_run_prints_where_report_html_is(tmp_path):
    with FakeServer(_sse(GOOD)) as srv:
        r = cli("run", "demo", "--endpoint", srv.url, "--out", str(tmp_path / "run"), *SMALL, timeout=90)
    assert r.returncode == 0, r.stderr[-2000:]
    assert str(tmp_path / "run" / "report.html") in r.stderr
    assert str(tmp_path / "run" / "records.jsonl") in r.stderr


def test_scenarios_prints_whole_sentences():
    r = cli("scenarios", timeout=60)
    assert r.returncode == 0, r.stderr
    entries: dict[str, str] = {}
    name = None
    for line in r.stdout.splitlines():
        if line[:1].strip():
            name, _, rest = line.partition(" ")
            entries[name] = rest.strip()
        else:
            entries[name] += " " + line.strip()
    assert {"demo", "long-context-hang", "stale-keepalive"} <= set(entries)
    for name, text in entries.items():
        assert re.search(r"[.!?][\"')]?$", text), f"{name}: cut mid-sentence: {text!r}"
        assert len(text) < 600, name
        assert all(len(line) <= 120 for line in r.stdout.splitlines())


def test_an_endpoint_without_v1_gets_a_warning_line(tmp_path):
    logs: list[str] = []
    with FakeServer(_sse(GOOD), path="/chat/completions") as srv:
        base = f"http://127.0.0.1:{srv.port}"
        sc = load_scenario("demo", [f'target.endpoint="{base}"', "agents.count=2", "agents.rounds=2",
                                    "canary.every_s=0"])
        run_to_dir(sc, tmp_path / "a", live=False, install_signals=False, log=logs.append)
        warn = [m for m in logs if "warning" in m]
        assert len(warn) == 1 and "/v1" in warn[0] and f"{base}/chat/completions" in warn[0], logs
        logs.clear()
        sc = load_scenario("demo", [f'target.endpoint="{base}/v1"', "agents.count=2", "agents.rounds=1",
                                    "canary.every_s=0", "agents.error_retries=0"])
        run_to_dir(sc, tmp_path / "b", live=False, install_signals=False, log=logs.append)
        assert not [m for m in logs if "warning" in m], logs


def test_help_texts_show_the_section_names_rich_would_swallow():
    """`[cluster]` in a help text is rich markup to typer unless escaped: --shards' help read
    "(default:  shards, 2)". Every `[section]` a help text names is printed."""
    import typer.main

    from agentload.cli import app

    group = typer.main.get_command(app)
    checked = 0
    for name, cmd in group.commands.items():
        wanted = set()
        for p in cmd.params:
            wanted |= set(re.findall(r"\[[a-z_]+\]", (getattr(p, "help", None) or "").replace("\\[", "[")))
        if not wanted:
            continue
        r = cli(name, "--help", env={"COLUMNS": "400", "TERM": "dumb"}, timeout=60)
        assert r.returncode == 0, r.stderr
        for w in wanted:
            assert w in r.stdout, (name, w, r.stdout)
            checked += 1
    assert checked >= 3
