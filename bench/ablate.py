"""Turn agentload's performance changes off again, one by one, in the benchmark's process only.

Each change made for issue 7 keeps its "before" here, so its effect can be measured on the
same machine, same moment, same settings:

    python -m bench.agentload_client --url ... --ablate sink      # one off
    python -m bench.agentload_client --url ... --ablate all       # all off: roughly the code before
    python -m bench.ab                                            # every one, alternated, as a table

Nothing here is imported by agentload itself.
"""

from __future__ import annotations

import asyncio
from typing import Callable


def _sink() -> None:
    """Bodies read with `await content.readany()` (one task wake-up per read) and aiohttp's
    sock_read timer re-armed on every read, instead of agentload.run.body_sink."""
    import agentload.run.request as rq

    async def no_sink(content, feed, protocol=None, last_byte_ns=None) -> bool:
        return False

    rq.read_body = no_sink


def _idle() -> None:
    """Keep the sink, but leave aiohttp's sock_read timer (cancel + re-arm per read)."""
    import agentload.run.request as rq

    fast = rq.read_body

    async def no_idle(content, feed, protocol=None, last_byte_ns=None) -> bool:
        return await fast(content, feed)

    rq.read_body = no_idle


def _ssefast() -> None:
    """No one-event fast path in SSEDecoder.feed (every read split and scanned)."""
    from agentload.run.sse import SSEDecoder

    orig = SSEDecoder.feed

    def feed(self, data):
        self._bom = True  # the fast path is skipped while a BOM is still possible; _strip_bom clears it
        return orig(self, data)

    SSEDecoder.feed = feed


def _ua() -> None:
    """aiohttp told to skip its User-Agent (skip_auto_headers: a header-dict copy per request)
    instead of sending our own."""
    from multidict import istr

    import agentload.run.transport as tp

    orig = tp.Transport._new_session

    def new_session(self, *a, **k):
        s = orig(self, *a, **k)
        s._skip_auto_headers = frozenset({istr("User-Agent")})
        s._default_headers.popall("User-Agent", None)
        return s

    tp.Transport._new_session = new_session


def _convbuf() -> None:
    """Each message kept as its own orjson bytes (4 KiB allocation each) and as a dict; the
    body joined from the list on every request."""
    import orjson

    from agentload.run.conversation import Conversation
    from agentload.tokens import message_tokens

    parts: dict[int, list] = {}

    def append(self, message):
        lst = parts.setdefault(id(self), [])
        lst.append((message, orjson.dumps(message)))
        self.n_messages += 1
        self.tokens += message_tokens(message)

    def body(self):
        head = bytes(memoryview(self._body)[:self._head_len])  # everything before the messages
        return head + b",".join(p for _, p in parts[id(self)]) + b"]}"

    Conversation.append = append
    Conversation.body = body


def _sleep() -> None:
    """ctx.sleep() as asyncio.wait_for(stop_event.wait(), timeout): a task and more per sleeping agent."""
    import agentload.run.runner as runner

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0 or self.stopping:
            return
        try:
            await asyncio.wait_for(self.stop_event.wait(), timeout=seconds)
        except TimeoutError:
            pass

    runner.RunContext.sleep = sleep


def _gc() -> None:
    """The garbage collector as Python sets it (nothing frozen, thresholds 700/10/10)."""
    import agentload.run.runner as runner

    runner.gc_for_run = lambda: (lambda: None)


def _shape() -> None:
    """Every chunk parsed as an object (no learned token-chunk shapes in ChatStream)."""
    import agentload.run.chat_stream as cs

    cs._MAX_SHAPES = 0


def _direct() -> None:
    """Every request through ClientSession.post (a ClientRequest, a body-writing task and a
    ClientResponse per request) instead of agentload.run.direct."""
    import agentload.run.transport as tp

    tp.check_direct_path = lambda: False


ABLATIONS: dict[str, Callable[[], None]] = {
    "sink": _sink, "idle": _idle, "ssefast": _ssefast, "ua": _ua, "convbuf": _convbuf, "sleep": _sleep, "gc": _gc,
    "shape": _shape, "direct": _direct,
}


# Probes, not changes: a part of agentload's per-request work replaced by (almost) nothing, to
# measure what it costs in a real run (`python -m bench.ab --only probe-text`). A run with a probe
# is not a valid run of agentload; its figures are only that part's price.

def _probe_text() -> None:
    """Synthetic text: one fixed string of the right length (no random draw)."""
    import agentload.run.conversation as conv

    conv.synthetic_text = lambda rng, tokens: ("abc " * tokens)[:-1] if tokens > 0 else ""


def _probe_interval_log() -> None:
    """The interval log's histograms: nothing recorded."""
    from agentload.records.interval_log import IntervalLog

    IntervalLog.add = lambda self, rec: None


def _probe_request_id() -> None:
    """The request id header's value: the readable id itself (no SHA-1 UUID)."""
    import agentload.run.agent as agent

    agent.sent_request_id = lambda readable, fmt="uuid": readable


def _probe_trace() -> None:
    """aiohttp's trace signals: none (no pool, connect, sent or headers stamps; the session keeps
    its trace configs in `_trace_configs`)."""
    from agentload.run.transport import Transport

    orig = Transport._new_session

    def new_session(self, force_close=None, limit=None):
        s = orig(self, force_close, limit)
        s._trace_configs = []
        return s

    Transport._new_session = new_session


ABLATIONS.update({"probe-trace": _probe_trace, "probe-text": _probe_text, "probe-interval-log": _probe_interval_log,
                  "probe-request-id": _probe_request_id})


def ablate(names: list[str]) -> None:
    for name in names:
        if name == "all":
            for k, fn in ABLATIONS.items():
                if k != "idle" and not k.startswith("probe-"):  # "sink" already undoes the idle timer
                    fn()
            continue
        if name not in ABLATIONS:
            raise SystemExit(f"--ablate: unknown optimisation {name!r}; one of {', '.join(ABLATIONS)}, all")
        ABLATIONS[name]()
