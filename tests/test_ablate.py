"""bench/ablate.py's ablations fail loudly when what they patch is gone: a rename in agentload must not
turn a "before" row of the benchmark into the code as it is without a word."""

from __future__ import annotations

import importlib
import sys

import aiohttp
import pytest

from bench.ablate import ABLATIONS, Patch, TargetGone, patch_for, require_attr


def _pairs() -> list[tuple[str, str]]:
    return [(name, target) for name in ABLATIONS for target in dict.fromkeys(patch_for(name).targets)]


def test_every_ablation_finds_its_targets():
    for name in ABLATIONS:
        assert patch_for(name).targets, name  # checked, not applied: this process stays as it is


@pytest.mark.parametrize("name, target", _pairs())
def test_an_ablation_fails_when_its_target_is_gone(monkeypatch, name, target):
    """Each target in turn removed from the real module or class (restored after the test)."""
    module_name, _, path = target.partition(":")
    owner = importlib.import_module(module_name)
    *parents, attr = path.split(".")
    for p in parents:
        owner = getattr(owner, p)
    monkeypatch.delattr(owner, attr)
    with pytest.raises(TargetGone, match=f"ablation {name!r}: .*{attr}"):
        patch_for(name)


def test_a_global_no_function_looks_up_any_more_is_gone(tmp_path, monkeypatch):
    """A module's function replaced by name changes nothing once the module's code stops looking it
    up (imported under another name, moved, inlined): a real module, before and after."""
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "ablate_target_used.py").write_text("def helper():\n    return 1\n\n\ndef work():\n    return helper()\n")
    (tmp_path / "ablate_target_unused.py").write_text("def helper():\n    return 1\n\n\ndef work():\n    return 1\n")
    try:
        p = Patch("example")
        p.set("ablate_target_used:helper", lambda: 2)
        p.apply()
        assert sys.modules["ablate_target_used"].work() == 2
        with pytest.raises(TargetGone, match="ablate_target_unused:helper is no longer looked up"):
            Patch("example").set("ablate_target_unused:helper", lambda: 2)
        with pytest.raises(TargetGone, match="ablate_target_gone:helper cannot be imported"):
            Patch("example").set("ablate_target_gone:helper", lambda: 2)
    finally:
        for m in ("ablate_target_used", "ablate_target_unused"):
            sys.modules.pop(m, None)


def test_nothing_is_changed_until_every_target_is_found(monkeypatch):
    """convbuf replaces two methods: with the second's class attribute it needs gone, the first is
    not replaced either."""
    from agentload.run.conversation import Conversation

    append = Conversation.append
    monkeypatch.delattr(Conversation, "_head_len")
    with pytest.raises(TargetGone):
        patch_for("convbuf").apply()
    assert Conversation.append is append


async def test_the_live_session_state_the_ablations_change_exists():
    """ua changes an aiohttp session's private state when the run makes its sessions: that state
    exists on a real session, and a missing one is named."""
    async with aiohttp.ClientSession() as s:
        for attr in ("_skip_auto_headers", "_default_headers"):
            require_attr(s, attr, "ua")
        with pytest.raises(TargetGone, match="ablation 'ua': aiohttp.client.ClientSession has no _gone"):
            require_attr(s, "_gone", "ua")


@pytest.mark.slow
def test_every_ablation_still_runs_agentload():
    """All of them at once (and the probes that touch the run path), a real run against the bench
    server: every request answered."""
    from bench.harness import Server, client

    with Server(None, ttft_ms=5, chunks=4, interval_ms=0) as srv:
        args = ["--url", srv.url, "--concurrency", "4", "--requests", "3"]
        for name in ("all", "probe-text", "probe-request-id", "probe-interval-log"):
            args += ["--ablate", name]
        res = client("bench.agentload_client", args, None, 180, srv)
    assert res["requests"] == 12 and res["failed"] == 0, res
