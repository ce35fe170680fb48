"""Recorded answers of real servers, replayed through agentload's read path without a network.

Every capture under tests/data/sse/ is the raw body of one streamed answer (chat completion, or
the `api` its table names: messages, responses) (the bytes
after HTTP's chunked framing, as a server sent them), with one table in
tests/data/sse/captures.toml saying where it came from and what agentload must find in it. Each
is fed to the read loop's per-read work (`sse_body.SSEBody`: the SSE decoder, the API's reader, the
token stamps) in random splits, from one read down to a byte a read (and an event a read), then judged the way a
finished stream is (`answer.stream_verdict`): every split must give the same result, and that
result must be the one written down.

A new capture: the body bytes in a file here (e.g. `curl -sN ... > tests/data/sse/NAME.sse`), and
a `["NAME.sse"]` table in captures.toml; a capture without a table fails and prints the table
agentload would write for it now, to check by eye and paste.
"""

from __future__ import annotations

import json
import random
import tomllib
from pathlib import Path

import pytest

from agentload.records import Trace
from agentload.run import apis
from agentload.run.answer import stream_verdict
from agentload.run.sse_body import SSEBody

DIR = Path(__file__).resolve().parent / "data" / "sse"
EXPECTED = DIR / "captures.toml"
KEYS = ("verdict", "finish_reason", "content", "tool_calls", "token_chunks", "events", "comments", "done",
        "usage", "bad_events", "errors")
SPLITS = 60  # random splittings per capture, besides one read and one byte a read


def captures() -> list[str]:
    return sorted(p.name for p in DIR.iterdir() if p.is_file() and p.suffix not in (".toml", ".md"))


def expectations() -> dict:
    with open(EXPECTED, "rb") as f:
        return tomllib.load(f)


def replay(data: bytes, pieces: list[bytes], api: str = "chat") -> dict:
    """What agentload finds in a body of `api` (`[target] api`) that arrived in these reads."""
    assert b"".join(pieces) == data
    trace = Trace("agent", 0, 1, 0, "replay", 2, 0, 0)
    body = SSEBody(trace, apis.get(api).Stream)
    for p in pieces:
        body.feed(p)
    cs = body.finish()
    error, msg = stream_verdict(cs, trace)
    # the read loop's own counts agree with the ChatStream's, and first_token is stamped iff a token came
    assert trace.token_chunks == cs.token_chunks and trace.bad_events == cs.bad_json
    assert ("first_token" in trace.t) == (cs.token_chunks > 0) == (trace.first_output is not None)
    return {
        "verdict": error or "ok",
        "message": msg,
        "finish_reason": cs.finish_reason or "",
        "content": cs.content,
        "tool_calls": [{"id": c["id"] or "", "name": c["function"]["name"] or "",
                        "arguments": c["function"]["arguments"]} for c in cs.tool_calls],
        "token_chunks": cs.token_chunks,
        "events": cs.chunks,  # data events and error events (comments apart)
        "comments": trace.comments,
        "done": cs.done,
        "usage": cs.usage is not None,
        "bad_events": cs.bad_json,
        "errors": cs.errors,
    }


def splits(data: bytes, seed: int) -> list[bytes]:
    """Reads of random sizes: mostly small (a byte to a few events), now and then large."""
    rng = random.Random(seed)
    out, i = [], 0
    while i < len(data):
        n = rng.choice((1, 2, 3, rng.randint(1, 16), rng.randint(1, 300), rng.randint(1, 4000)))
        out.append(data[i:i + n])
        i += n
    return out


def event_a_read(data: bytes) -> list[bytes]:
    """A read for each event, as a paced server's reads carry them (a token event a read)."""
    out, i = [], 0
    while i < len(data):
        j = data.find(b"\n\n", i)
        j = len(data) if j < 0 else j + 2
        out.append(data[i:j])
        i = j
    return out


def as_toml(name: str, found: dict) -> str:
    """The captures.toml table for what agentload found (to check by eye before pasting)."""
    q = json.dumps  # a JSON string is a TOML basic string
    calls = ", ".join("{ id = %s, name = %s, arguments = %s }" % (q(c["id"]), q(c["name"]), q(c["arguments"]))
                      for c in found["tool_calls"])
    lines = [f"[{q(name)}]", 'source = "WHERE IT CAME FROM: server and version, request, how captured"']
    for k in KEYS:
        v = found[k]
        lines.append(f"{k} = " + (f"[{calls}]" if k == "tool_calls" else q(v) if isinstance(v, str)
                                  else str(v).lower() if isinstance(v, bool) else str(v)))
    return "\n".join(lines)


def test_every_capture_has_expectations_and_every_expectation_a_capture():
    have, want = set(captures()), set(expectations())
    assert have, f"no capture under {DIR}"
    assert not want - have, f"captures.toml has tables for missing files: {sorted(want - have)}"
    for name in sorted(have - want):
        api = "messages" if "messages" in name else "responses" if "responses" in name else "chat"
        found = replay((DIR / name).read_bytes(), [(DIR / name).read_bytes()], api)
        pytest.fail(f"{name} has no table in {EXPECTED.name}; what agentload finds in it now:\n\n"
                    f"{as_toml(name, found)}\n", pytrace=False)


@pytest.mark.parametrize("name", captures())
def test_capture_replays_to_its_expectations_in_any_split(name):
    exp = expectations().get(name)
    if exp is None:
        pytest.skip(f"no table for {name} (test_every_capture_has_expectations... fails for it)")
    assert exp.get("source"), f"{name}: say where the capture came from (source = ...)"
    missing = [k for k in KEYS if k not in exp]
    assert not missing, f"{name}: captures.toml table lacks {missing}"
    data = (DIR / name).read_bytes()
    api = exp.get("api", "chat")
    first = replay(data, [data], api)
    got = {k: first[k] for k in KEYS}
    assert got == {k: exp[k] for k in KEYS}, f"{name}: agentload now finds\n{as_toml(name, first)}"
    if exp.get("message"):
        assert first["message"] == exp["message"], first["message"]
    for pieces in ([data[i:i + 1] for i in range(len(data))], event_a_read(data),
                   *(splits(data, seed) for seed in range(SPLITS))):
        assert replay(data, pieces, api) == first, f"{name}: a split into {len(pieces)} reads changed the result"
