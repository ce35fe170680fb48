"""MockConfig validation, `--set` overrides, and the mock's process lifecycle."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from agentload.errors import ScenarioError
from agentload.mock import MockConfig, MockProcess, StallMidStream, parse_set_overrides


def err(d):
    with pytest.raises(ScenarioError) as info:
        MockConfig.from_dict(d, "scenarios/x.toml")
    text = str(info.value)
    assert "\n" not in text
    return text


def test_defaults():
    cfg = MockConfig.from_dict({}, "x")
    assert cfg == MockConfig()
    assert (cfg.base_latency_ms, cfg.prefill_tokens_per_s, cfg.decode_tokens_per_s) == (5.0, 50000.0, 500.0)
    assert (cfg.output_tokens, cfg.chunk_tokens, cfg.tool_call_rounds, cfg.tool_calls_per_response) == (32, 1, 0, 1)
    assert (cfg.style, cfg.seed, cfg.models) == ("vllm", 0, ("mock-model",))
    assert cfg.hang_above_tokens is None and cfg.hang_s is None and cfg.error_status == 500


def test_round_trip_through_json():
    cfg = MockConfig.from_dict({
        "base_latency_ms": 2, "style": "sglang", "models": ["a", "b"], "hang_above_tokens": 6000,
        "stall_mid_stream": {"after_tokens": 5, "for_s": 2}, "ping_while_stalled_s": 0.5, "max_running": 4,
        "error_rate": 0.1, "error_status": 429, "error_at_round": 3, "drop_mid_stream_rate": 0.01,
        "keepalive_timeout_s": 4, "hang_s": 30, "reject_protocol_violations": True}, "x")
    assert cfg.stall_mid_stream == StallMidStream(after_tokens=5, for_s=2.0, above_tokens=0)
    assert isinstance(cfg.base_latency_ms, float)
    d = json.loads(json.dumps(cfg.to_dict()))
    assert d["stall_mid_stream"] == {"after_tokens": 5, "for_s": 2.0, "above_tokens": 0}
    assert MockConfig.from_dict(d, "json") == cfg


@pytest.mark.parametrize("d, expected", [
    ({"base_latency_ms": "abc"}, "scenarios/x.toml: mock.base_latency_ms: expected a number >= 0, got 'abc'"),
    ({"decode_tokens_per_s": -1}, "scenarios/x.toml: mock.decode_tokens_per_s: expected a number >= 0, got -1"),
    ({"output_tokens": 2.5}, "scenarios/x.toml: mock.output_tokens: expected a whole number >= 0, got 2.5"),
    ({"chunk_tokens": 0}, "scenarios/x.toml: mock.chunk_tokens: expected a whole number >= 1, got 0"),
    ({"max_running": True}, "scenarios/x.toml: mock.max_running: expected a whole number >= 1, got True"),
    ({"error_rate": 1.5}, "scenarios/x.toml: mock.error_rate: expected a number >= 0 and <= 1, got 1.5"),
    ({"error_status": 404}, "scenarios/x.toml: mock.error_status: expected one of 429, 500, 503, got 404"),
    ({"style": "tgi"}, "scenarios/x.toml: mock.style: expected one of 'vllm', 'sglang', got 'tgi'"),
    ({"ping_while_stalled_s": 0}, "scenarios/x.toml: mock.ping_while_stalled_s: expected a number > 0, got 0"),
    ({"models": []}, "scenarios/x.toml: mock.models: expected a non-empty list of model names, got []"),
    ({"stall_mid_stream": 5}, "scenarios/x.toml: mock.stall_mid_stream: expected a table "
                              "{after_tokens = K, for_s = S, above_tokens = N}, got 5"),
    ({"stall_mid_stream": {"after_tokens": 1}}, "scenarios/x.toml: mock.stall_mid_stream.for_s: missing; "
                                                "expected a number > 0"),
    ({"stall_mid_stream": {"after_tokens": 1, "for_s": "x"}},
     "scenarios/x.toml: mock.stall_mid_stream.for_s: expected a number > 0, got 'x'"),
    # issue 10: no infinite or NaN setting, no zero-length fault
    ({"stall_mid_stream": {"after_tokens": 1, "for_s": 0}},
     "scenarios/x.toml: mock.stall_mid_stream.for_s: expected a number > 0, got 0"),
    ({"hang_s": float("inf")}, "scenarios/x.toml: mock.hang_s: expected a number >= 0, got inf"),
    ({"base_latency_ms": float("nan")}, "scenarios/x.toml: mock.base_latency_ms: expected a number >= 0, got nan"),
    ({"keepalive_timeout_s": 0}, "scenarios/x.toml: mock.keepalive_timeout_s: expected a number > 0, got 0"),
])
def test_validation_errors(d, expected):
    assert err(d) == expected


def test_unknown_keys():
    text = err({"hang_above": 5})
    assert text.startswith("scenarios/x.toml: mock.hang_above: unknown key (did you mean hang_above_tokens?); "
                           "expected one of: ")
    assert "hang_above_tokens" in text
    assert err({"stall_mid_stream": {"after_tokens": 1, "for_s": 1, "below": 2}}).startswith(
        "scenarios/x.toml: mock.stall_mid_stream.below: unknown key; expected one of: after_tokens")
    assert err([1]) == "scenarios/x.toml: mock: expected a table, got [1]"


def test_parse_set_overrides():
    base = {"output_tokens": 5, "stall_mid_stream": {"after_tokens": 1, "for_s": 1}}
    out = parse_set_overrides([
        "mock.hang_above_tokens=6000", "error_rate=0.25", "style=sglang", 'models=["a", "b"]',
        "reject_protocol_violations=true", "stall_mid_stream.for_s=2.5", "hang_s = 3",
        "error_status=429",
    ], base)
    assert out == {"output_tokens": 5, "hang_above_tokens": 6000, "error_rate": 0.25, "style": "sglang",
                   "models": ["a", "b"], "reject_protocol_violations": True,
                   "stall_mid_stream": {"after_tokens": 1, "for_s": 2.5}, "hang_s": 3, "error_status": 429}
    assert base["stall_mid_stream"]["for_s"] == 1  # the base is not modified
    cfg = MockConfig.from_dict(out, "--set")
    assert cfg.stall_mid_stream.for_s == 2.5 and cfg.models == ("a", "b")

    inline = parse_set_overrides(["stall_mid_stream={after_tokens = 5, for_s = 2, above_tokens = 100}"])
    assert inline == {"stall_mid_stream": {"after_tokens": 5, "for_s": 2, "above_tokens": 100}}
    assert parse_set_overrides(["style=vllm x", "a.b.c=1"]) == {"style": "vllm x", "a": {"b": {"c": 1}}}
    with pytest.raises(ScenarioError, match="--set: hang: expected key=value"):
        parse_set_overrides(["hang"])
    with pytest.raises(ScenarioError, match="mock.error_rate: expected a number"):
        MockConfig.from_dict(parse_set_overrides(["error_rate=abc"]), "--set")


def test_errors_name_where_the_value_came_from():
    from agentload.mock.serve import mock_config

    with pytest.raises(ScenarioError) as info:
        mock_config(["hang_s=5"], {"error_rate": 2}, "--config-json")
    assert str(info.value) == "--config-json: mock.error_rate: expected a number >= 0 and <= 1, got 2"
    with pytest.raises(ScenarioError) as info:
        mock_config(["stall_mid_stream.for_s=1"], {}, "scenarios/x.toml")  # the table the item made lacks a key
    assert str(info.value) == "--set: mock.stall_mid_stream.after_tokens: missing; expected a whole number >= 0"
    with pytest.raises(ScenarioError) as info:
        parse_set_overrides(["style.x=1"], {"style": "vllm"})
    assert str(info.value) == "--set: mock.style.x: expected mock.style to be a table, got 'vllm'"
    assert mock_config(["mock.models=solo", "chunk_tokens=2.0"]).models == ("solo",)


def test_cli_rejects_bad_config_on_one_line():
    proc = subprocess.run([sys.executable, "-m", "agentload.mock", "--port", "0", "--set", "error_rate=abc"],
                          capture_output=True, text=True, timeout=30, cwd=str(_repo_root()))
    assert proc.returncode == 2
    # the value came from --set, so the error names --set (not the --config-json it was applied to)
    assert proc.stderr.strip() == "--set: mock.error_rate: expected a number >= 0 and <= 1, got 'abc'"
    assert proc.stdout == ""


def _repo_root():
    from pathlib import Path

    import agentload
    return Path(agentload.__file__).resolve().parents[1]


# ------------------------------------------------------------------ process lifecycle


def _get(url, timeout=5):
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=timeout) as r:
        return r.status


def test_start_failure_reports_child_stderr():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        with pytest.raises(RuntimeError) as info:
            MockProcess.start(MockConfig(), port=busy.getsockname()[1], timeout_s=15)
    assert "mock server exited" in str(info.value)
    assert "address" in str(info.value).lower()  # the child's own error, e.g. "address already in use"


def test_stop_is_clean_even_with_a_hung_request():
    with MockProcess.start(MockConfig(hang_above_tokens=0)) as m:
        assert _get(m.base + "/health") == 200
        sock = socket.create_connection(("127.0.0.1", m.port), timeout=5)
        body = b'{"model":"m","messages":[{"role":"user","content":"x"}]}'
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        deadline = time.monotonic() + 5
        while m.stats()["hung"] < 1:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        t0 = time.monotonic()
        code = m.stop(timeout_s=5)
        assert code == 0  # exited on SIGTERM, not killed
        assert time.monotonic() - t0 < 5
        sock.close()
    assert m.stop() == 0  # idempotent


def test_child_exits_when_parent_lifeline_closes():
    m = MockProcess.start(MockConfig())
    try:
        m.proc.stdin.close()  # what the OS does when the parent dies
        assert m.proc.wait(timeout=10) == 0
    finally:
        m.stop()


def test_ipv6_loopback():
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        pytest.skip("no ::1")
    with MockProcess.start(MockConfig(), host="::1") as m:
        assert m.url == f"http://[::1]:{m.port}/v1"
        assert _get(m.base + "/health") == 200
