"""agentload through real nginx (1.22) and haproxy (2.6), Debian's packages that .ci/run installs, each
started with its own config file on a free loopback port in front of the real mock (tests/proxyprocs.py).

What these runs rely on (measured here, /work/shared/DESIGN.md):

- nginx's `proxy_read_timeout` ends a hang before headers with its 504 HTML page (Server: nginx/1.22.1)
  and cuts a stream that went silent (no last chunk) at that duration after its send: its timer is
  re-armed lazily (not when a read moves it by under 300 ms). haproxy's `timeout server` does the same,
  with its own 504 page and no Server header; on a cut stream it passes the server's Server header on.
- nginx by default buffers the upstream's answer (`proxy_buffering on`, HTTP/1.0 upstream): a short
  answer arrives in one read when it is complete, headers included (the wait shows as ttfb).
- `limit_conn` answers 503 with its HTML page within ~1 ms while the limit is reached.
"""

from __future__ import annotations

import orjson
import pytest

from agentload.mock.config import MockConfig
from agentload.records import load_records
from helpers import run_cli_together, run_scenario
from proxyprocs import SSE_LOCATION, HaproxyProcess, NginxProcess, proxy_skip_reason
from serverprocs import RouterStack

_skip = proxy_skip_reason("nginx", "haproxy")
pytestmark = [pytest.mark.slow, pytest.mark.proxies, pytest.mark.skipif(_skip is not None, reason=_skip or "")]

HANG = dict(decode_tokens_per_s=200, output_tokens=16, hang_above_tokens=2500)  # from round 2-3 on
CUT = dict(decode_tokens_per_s=200, output_tokens=16,
           stall_mid_stream={"after_tokens": 3, "for_s": 30, "above_tokens": 2500})
TEXT = dict(tool_call_rate=0.0, output_tokens=32)  # answers of 32 token chunks (scripted mode goes on anyway)
RUN = ["agents.count=4", "agents.rounds=3", "stall.after_s=5", "stall.give_up_s=20", "canary.every_s=1"]


@pytest.fixture
def behind(tmp_path):
    """behind(proxy_class, mock_config, **proxy_config) -> (proxy, mock); both stopped after the test."""
    with RouterStack(lambda urls, cls, **kw: cls.start(urls[0], tmp_path / cls.NAME, **kw)) as stack:
        def start(cls, cfg: dict, **kw):
            proxy, (mock,) = stack.start([MockConfig(**cfg)], cls, **kw)
            return proxy, mock

        yield start


def _run(tmp_path, proxy, *extra: str):
    out = tmp_path / "run"
    res = run_scenario("healthy", out, [f'target.endpoint="{proxy.url}"', *RUN, *extra])
    recs = [r for r in load_records(out / "records.jsonl").records if r.kind == "agent"]
    return res, res.summary["verdict"], recs


def _kinds(v: dict) -> list[str]:
    return [v["kind"]] + [s["kind"] for s in v["secondary"]]


# each proxy with a 2 s timeout in front of the mock
TIMEOUT_PROXIES = {"nginx": (NginxProcess, dict(location="proxy_read_timeout 2s; " + SSE_LOCATION)),
                   "haproxy": (HaproxyProcess, dict(timeouts="timeout server 2s"))}


@pytest.fixture(scope="module")
def timeout_runs(tmp_path_factory):
    """timeout_runs(mock) -> {proxy name: (report text, verdict, agent records)}: a run of RUN through
    each of TIMEOUT_PROXIES in front of a mock of its own with config `mock` (HANG or CUT), both runs at
    once, each the CLI in its own process: a run waits out the mock's hang behind the proxy's timer, so
    the two waits overlap."""
    done: dict[str, dict] = {}

    def get(name: str, cfg: dict) -> dict:
        if name not in done:
            base = tmp_path_factory.mktemp(f"timeout-{name}")
            with RouterStack(lambda urls, cls, **kw: cls.start(urls[0], base / f"{cls.NAME}-proxy", **kw)) as stack:
                runs = {}
                for proxy_name, (cls, conf) in TIMEOUT_PROXIES.items():
                    proxy, _ = stack.start([MockConfig(**cfg)], cls, **conf)
                    runs[proxy_name] = ["run", "healthy", "--no-live", "--fail-on", "never", "--endpoint", proxy.url]
                    for o in RUN:
                        runs[proxy_name] += ["--set", o]
                read = {}
                for proxy_name, out in run_cli_together(base, runs, timeout=300).items():
                    summary = orjson.loads((out / "summary.json").read_bytes())
                    recs = [r for r in load_records(out / "records.jsonl").records if r.kind == "agent"]
                    read[proxy_name] = ((out / "report.txt").read_text(), summary["verdict"], recs)
                done[name] = read
        return done[name]

    return get


@pytest.mark.parametrize("name", TIMEOUT_PROXIES)
def test_a_proxy_timeout_in_front_of_a_hang_names_the_proxy_and_the_servers_hang(timeout_runs, name):
    """The mock hangs before headers from ~2,500 prompt tokens on; the proxy's 2 s timeout answers 504
    first (agentload's stall.after_s is 5 s): every failure is the proxy's 504 at 2.0 s after its send."""
    cls = TIMEOUT_PROXIES[name][0]
    text, v, recs = timeout_runs("hang", HANG)[name]
    failed = [r for r in recs if r.outcome == "error"]
    assert failed and all(r.error == "http_504" for r in failed), [(r.error, r.error_msg) for r in failed][:3]
    # (a busy machine fires a timer late, and stamps a send late: agentload's "sent" is after the write)
    took = sorted((r.t["headers"] - r.t["sent"]) / 1e9 for r in failed)
    assert took[0] >= 1.9 and 2.0 <= took[len(took) // 2] < 2.1 and took[-1] < 2.5, took
    assert v["kind"] == "proxy_timeout" and v["phase"] == "ttfb", text
    by = "nginx/1.22" if cls is NginxProcess else "haproxy"
    assert "ended 2.0" in v["summary"] and "after send" in v["summary"] and f"by {by}" in v["summary"], v["summary"]
    assert "the hang is the server's" in v["summary"]
    ev = "\n".join(v["evidence"])
    assert "504 Gateway Time-out" in ev and "proxy_read_timeout" in ev and "timeout server" in ev, ev
    assert "server_errors" not in _kinds(v), text
    if cls is NginxProcess:
        assert all(r.server and r.server.startswith("nginx/") for r in failed)
    else:  # haproxy signs its page, not a header
        assert all(r.server is None for r in failed) and "The server didn't respond in time" in ev


@pytest.mark.parametrize("name", TIMEOUT_PROXIES)
def test_a_stream_cut_by_a_proxy_timeout_counts_its_silence_in_its_largest_gap(timeout_runs, name):
    """The mock stops mid-stream after 3 tokens: the proxy cuts the chunked body ~2 s later. The cut
    is a proxy timeout in `stream`, and each stream's silence before the cut is its largest gap."""
    cls = TIMEOUT_PROXIES[name][0]
    text, v, recs = timeout_runs("cut", CUT)[name]
    failed = [r for r in recs if r.outcome == "error"]
    assert failed and all(r.error == "ClientPayloadError" and r.token_chunks >= 1 for r in failed), \
        [(r.error, r.token_chunks) for r in failed][:3]
    assert all(r.max_gap_at == r.t["end"] and r.max_gap_ns >= 1.5e9 for r in failed), \
        [(r.max_gap_ns, r.max_gap_at - r.t["end"]) for r in failed][:3]
    assert v["kind"] == "proxy_timeout" and v["phase"] == "stream", text
    assert "stream(s) cut" in v["summary"] and "disconnects" not in _kinds(v), text
    if cls is NginxProcess:
        assert "by nginx/1.22" in v["summary"], v["summary"]
    else:  # haproxy passes the mock's Server header on: nothing names it, and the verdict says so
        assert any("names itself nowhere" in e for e in v["evidence"]), v["evidence"]


def test_nginxs_default_buffering_is_a_buffered_stream_not_healthy(tmp_path, behind):
    """nginx with its defaults (proxy_buffering on): each 32-token answer, paced at 20 tokens/s by the
    mock, arrives in one read when complete. Before, this was `healthy` with the wait in ttfb."""
    proxy, _ = behind(NginxProcess, dict(TEXT, decode_tokens_per_s=20))
    res, v, recs = _run(tmp_path, proxy, "agents.rounds=2")
    assert recs and all(r.outcome == "ok" for r in recs), res.text
    assert all(r.token_chunks >= 16 and r.token_chunks >= 4 * r.token_reads for r in recs), \
        [(r.token_chunks, r.token_reads) for r in recs]
    assert v["kind"] == "buffered_stream" and v["agents_stopped"] == 0, res.text
    assert v["summary"].startswith("a buffering proxy?"), v["summary"]
    ev = "\n".join(v["evidence"])
    assert "proxy_buffering off" in ev and "X-Accel-Buffering: no" in ev and "nginx/1.22" in ev, ev
    # the mock stamps its first token: nginx held it for most of the answer
    assert "before agentload read it" in ev, ev


def test_an_nginx_connection_limit_is_a_concurrency_limit_in_front(tmp_path, behind):
    """limit_conn 2 with 8 agents: the rest get nginx's 503 page within milliseconds, each while two
    requests are on the wire. Before, this was `server_errors`, as if the server had refused them."""
    proxy, mock = behind(NginxProcess, dict(decode_tokens_per_s=100, output_tokens=16),
                         location="limit_conn perip 2; " + SSE_LOCATION,
                         http="limit_conn_zone $binary_remote_addr zone=perip:1m;")
    res, v, recs = _run(tmp_path, proxy, "agents.count=8", "canary.every_s=0")
    refused = [r for r in recs if r.error == "http_503"]
    assert refused and all(r.server and r.server.startswith("nginx/") for r in refused), res.text
    assert v["kind"] == "concurrency_limit", res.text
    assert "each while 2 other request(s) were in flight" in v["summary"] and "by nginx/1.22" in v["summary"], \
        v["summary"]
    assert "server_errors" not in _kinds(v), res.text
    assert mock.stats()["errors_injected"] == 0  # the server refused nothing


@pytest.mark.parametrize("cls,conf", [(NginxProcess, dict(location=SSE_LOCATION)),
                                      (HaproxyProcess, dict(timeouts="option http-no-delay"))],
                         ids=["nginx-sse-config", "haproxy-http-no-delay"])
def test_a_correctly_configured_proxy_in_front_of_a_healthy_server_is_healthy(tmp_path, behind, cls, conf):
    """nginx with the SSE config (proxy_buffering off, HTTP/1.1 upstream, no Connection header) and
    haproxy with `option http-no-delay` pass each token on as it comes: healthy, about one read a token
    chunk. (haproxy's default sends with MSG_MORE and holds data up to ~200 ms: 32 tokens at 20/s came
    in 7 reads ~230 ms apart here, the first token ~160 ms late by the mock's own stamp; at 200/s a
    whole answer came in one or two reads. Under BURST_MIN_WAIT_MS, so not called a buffering proxy.)"""
    proxy, _ = behind(cls, dict(TEXT, decode_tokens_per_s=50), **conf)
    res, v, recs = _run(tmp_path, proxy)
    assert v["kind"] == "healthy" and not v["secondary"], res.text
    assert recs and all(r.outcome == "ok" for r in recs)
    # tokens 20 ms apart came as they were sent (a busy client may read two or three at once)
    assert all(r.token_reads >= 8 for r in recs) and \
        sum(r.token_reads for r in recs) >= 0.5 * sum(r.token_chunks for r in recs), \
        [(r.token_chunks, r.token_reads) for r in recs][:5]


def test_a_hang_seen_as_a_stall_before_the_proxys_timeout_names_the_proxy_that_ended_it(tmp_path, behind):
    """stall.after_s (1 s) shorter than nginx's proxy_read_timeout (3 s): the hang is a server stall in
    ttfb (the verdict the server earns), and its evidence names nginx's 504 at 3.0 s that ended it."""
    proxy, _ = behind(NginxProcess, HANG, location="proxy_read_timeout 3s; " + SSE_LOCATION)
    res, v, recs = _run(tmp_path, proxy, "stall.after_s=1", "agents.error_retries=0")
    assert v["kind"] == "server_stall" and v["phase"] == "ttfb", res.text
    assert any("ended 3.0" in e and "by nginx/1.22" in e and "proxy_read_timeout" in e for e in v["evidence"]), \
        v["evidence"]
