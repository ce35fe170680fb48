"""TLS over real sockets: a FakeServer behind an ssl context with certificates made in the test
(tests/tlscerts.py). `[target] tls_ca_file` verifies against the scenario's CA bundle; `tls_verify =
false` skips verifying and every report says so; a refused certificate is a `connect` finding whose
evidence names the problem (unknown CA, wrong host, expired); SSL_CERT_FILE works as documented."""

from __future__ import annotations

import orjson
import pytest
from aiohttp import web

from agentload.launch import run_to_dir
from agentload.run.scenario import load_scenario
from fakeserver import DONE, FakeServer, chunk, sse_response
from helpers import cli
from tlscerts import make_certs

GOOD = [chunk({"role": "assistant", "content": ""}), chunk({"content": "hi"}), chunk({}, "stop"), DONE]
SMALL = ["agents.count=2", "agents.rounds=2", "canary.every_s=0", "agents.error_retries=0"]


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("certs"))


async def _good(request: web.Request) -> web.StreamResponse:
    return await sse_response(request, GOOD)


def _run(tmp_path, name, srv, sets):
    sc = load_scenario("demo", [f'target.endpoint="{srv.url}"', *SMALL, *sets])
    out = run_to_dir(sc, tmp_path / name, live=False, install_signals=False, log=lambda m: None)
    return out, orjson.loads((tmp_path / name / "run.json").read_bytes())


def test_a_ca_file_verifies_an_https_endpoint(tmp_path, certs):
    with FakeServer(_good, ssl_context=certs.server_context("good")) as srv:
        assert srv.url.startswith("https://")
        out, meta = _run(tmp_path, "ca", srv, [f'target.tls_ca_file="{certs.ca_file}"'])
        assert len(srv.requests) == 4
    assert out.summary["verdict"]["kind"] == "healthy", out.summary["verdict"]
    assert meta["scenario"]["target"]["tls_ca_file"] == str(certs.ca_file.resolve())
    assert out.summary["run"]["tls"] == {"verify": True, "ca_file": str(certs.ca_file.resolve())}
    assert f"TLS certificate verified against {certs.ca_file.resolve()}" in out.text


@pytest.mark.parametrize("which,sets,problem,hint", [
    ("good", [], "unable to get local issuer certificate", "tls_ca_file (or SSL_CERT_FILE)"),
    ("selfsigned", ["ca"], "self-signed certificate", "tls_ca_file (or SSL_CERT_FILE)"),
    ("otherhost", ["ca"], "IP address mismatch, certificate is not valid for '127.0.0.1'", "does not name the endpoint's host"),
    ("expired", ["ca"], "certificate has expired", "outside its validity dates"),
])
def test_a_refused_certificate_is_a_connect_finding_naming_the_problem(tmp_path, certs, which, sets, problem, hint):
    sets = [f'target.tls_ca_file="{certs.ca_file}"' if s == "ca" else s for s in sets]
    with FakeServer(_good, ssl_context=certs.server_context(which)) as srv:
        out, _ = _run(tmp_path, which, srv, sets)
        assert srv.requests == []  # refused in the handshake: no request reached the handler
    v = out.summary["verdict"]
    assert v["kind"] == "connect", v
    assert "tls_certificate x2" in v["summary"], v["summary"]
    ev = " | ".join(v["evidence"])
    assert f"certificate problem (2 request(s)): {problem}" in ev and hint in ev, ev


def test_tls_verify_false_is_stated_by_every_report(tmp_path, certs):
    with FakeServer(_good, ssl_context=certs.server_context("selfsigned")) as srv:
        out, _ = _run(tmp_path, "noverify", srv, ["target.tls_verify=false"])
    assert out.summary["verdict"]["kind"] == "healthy", out.summary["verdict"]
    assert out.summary["run"]["tls"] == {"verify": False, "ca_file": None}
    assert any("TLS certificate was not verified (tls_verify = false)" in w for w in out.summary["warnings"])
    assert "TLS certificate NOT verified (tls_verify = false)" in out.text
    assert "warning: the endpoint's TLS certificate was not verified" in out.text
    html = (tmp_path / "noverify" / "report.html").read_text()
    assert "TLS certificate NOT verified (tls_verify = false)" in html and "was not verified" in html
    summary = orjson.loads((tmp_path / "noverify" / "summary.json").read_bytes())
    assert summary["run"]["tls"]["verify"] is False


def test_ssl_cert_file_in_the_environment_is_trusted(tmp_path, certs):
    with FakeServer(_good, ssl_context=certs.server_context("good")) as srv:
        sets = [x for s in SMALL for x in ("--set", s)]
        r = cli("run", "demo", "--no-live", "--out", str(tmp_path / "env"), "--endpoint", srv.url, *sets,
                env={"SSL_CERT_FILE": str(certs.ca_file)}, timeout=120)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        assert len(srv.requests) == 4


def test_https_to_a_plain_http_port_is_a_handshake_failure(tmp_path):
    with FakeServer(_good) as srv:
        sc = load_scenario("demo", [f'target.endpoint="{srv.url.replace("http://", "https://")}"', *SMALL])
        out = run_to_dir(sc, tmp_path / "plain", live=False, install_signals=False, log=lambda m: None)
    v = out.summary["verdict"]
    assert v["kind"] == "connect" and "tls_handshake" in v["summary"], v
    assert any("does the endpoint speak TLS" in e for e in v["evidence"]), v["evidence"]


@pytest.mark.parametrize("sets,says", [
    (["target.tls_verify=false"], "target.tls_verify: expected an https:// endpoint"),
    (['target.endpoint="http://127.0.0.1:9/v1"', 'target.tls_ca_file="{ca}"'],
     "target.tls_ca_file: expected an https:// endpoint"),
    (['target.endpoint="https://127.0.0.1:9/v1"', 'target.tls_ca_file="{ca}"', "target.tls_verify=false"],
     "target.tls_verify: expected tls_verify = true with target.tls_ca_file"),
    (['target.endpoint="https://127.0.0.1:9/v1"', 'target.tls_ca_file="/nonexistent/ca.pem"'],
     "target.tls_ca_file: expected the path of a CA bundle file (PEM); no such file"),
    (['target.endpoint="https://127.0.0.1:9/v1"', 'target.tls_ca_file="{notpem}"'],
     "target.tls_ca_file: expected the path of a CA bundle file (PEM) that loads"),
])
def test_tls_settings_that_cannot_work_are_one_line(tmp_path, certs, sets, says):
    notpem = tmp_path / "not.pem"
    notpem.write_text("hello\n")
    args = [x for s in sets for x in ("--set", s.format(ca=certs.ca_file, notpem=notpem))]
    r = cli("run", "demo", "--no-live", "--out", str(tmp_path / "r"), *args, timeout=60)
    assert r.returncode == 2, r.stderr[-2000:]
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and says in lines[0], lines
