"""Turn agentload's performance changes off again, one by one, in the benchmark's process only.

Each change made for issue 7 keeps its "before" here, so its effect can be measured on the
same machine, same moment, same settings:

    python -m bench.agentload_client --url ... --ablate sink      # one off
    python -m bench.agentload_client --url ... --ablate all       # all off: roughly the code before
    python -m bench.ab                                            # every one, alternated, as a table

An ablation replaces agentload internals by name, so a rename would silently turn it into a no-op
(the "before" row measuring the code as it is). Each one therefore names its targets through a
`Patch` ("module:Class.attr"), which resolves all of them before it changes anything and raises
`TargetGone` when one is missing; a module-level function it replaces must still be looked up by
name in that module (else replacing it changes nothing). tests/test_ablate.py resolves every
target and proves the failure. Nothing here is imported by agentload itself.
"""

from __future__ import annotations

import asyncio
import importlib
import types
from typing import Any, Callable


class TargetGone(RuntimeError):
    """An ablation's target is not where it patches it: applied, it would change nothing."""


def _code_objects(module: types.ModuleType) -> list[types.CodeType]:
    """The code of every function and method defined in `module`, nested code included."""
    todo: list[types.CodeType] = []
    seen: set[int] = set()

    def add(obj: Any) -> None:
        if isinstance(obj, (staticmethod, classmethod)):
            obj = obj.__func__
        if isinstance(obj, property):
            for f in (obj.fget, obj.fset, obj.fdel):
                add(f)
            return
        code = getattr(obj, "__code__", None)
        if isinstance(code, types.CodeType) and getattr(obj, "__module__", None) == module.__name__:
            todo.append(code)

    for obj in vars(module).values():
        if isinstance(obj, type) and obj.__module__ == module.__name__:
            for member in vars(obj).values():
                add(member)
        else:
            add(obj)
    out = []
    while todo:
        code = todo.pop()
        if id(code) not in seen:
            seen.add(id(code))
            out.append(code)
            todo.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    return out


class Patch:
    """The replacements one ablation makes, checked before any is made (`apply`)."""

    def __init__(self, ablation: str):
        self.ablation = ablation
        self.targets: list[str] = []  # every target named, in order
        self._sets: list[tuple[Any, str, Any]] = []

    def _gone(self, target: str, why: str) -> TargetGone:
        return TargetGone(f"ablation {self.ablation!r}: {target} {why}; bench/ablate.py must follow the code it "
                          f"turns off, else the ablation changes nothing")

    def _resolve(self, target: str) -> tuple[Any, str]:
        module_name, _, path = target.partition(":")
        self.targets.append(target)
        try:
            owner: Any = importlib.import_module(module_name)
        except ImportError:
            raise self._gone(target, f"cannot be imported (module {module_name} is gone)") from None
        *parents, attr = path.split(".")
        for name in parents:
            if not hasattr(owner, name):
                raise self._gone(target, f"is gone ({name} not found)")
            owner = getattr(owner, name)
        if not hasattr(owner, attr):
            raise self._gone(target, f"is gone ({attr} not found)")
        return owner, attr

    def get(self, target: str) -> Any:
        """The current value of a target (which must exist)."""
        owner, attr = self._resolve(target)
        return getattr(owner, attr)

    def reads(self, target: str, name: str) -> None:
        """The function `target` must still read `name` (a global or an attribute): the ablation
        works by changing what it reads."""
        fn = self.get(target)
        code = getattr(fn, "__code__", None)
        if code is None or not any(name in c.co_names for c in _codes_within(code)):
            raise self._gone(target, f"no longer reads {name}")

    def set(self, target: str, value: Any) -> None:
        """Replace a target when the patch is applied. A module's global must still be looked up
        by name by a function of that module."""
        owner, attr = self._resolve(target)
        if isinstance(owner, types.ModuleType) and not any(attr in c.co_names for c in _code_objects(owner)):
            raise self._gone(target, f"is no longer looked up by {owner.__name__}'s functions")
        self._sets.append((owner, attr, value))

    def apply(self) -> None:
        for owner, attr, value in self._sets:
            setattr(owner, attr, value)


def _codes_within(code: types.CodeType) -> list[types.CodeType]:
    out, todo = [], [code]
    while todo:
        c = todo.pop()
        out.append(c)
        todo.extend(x for x in c.co_consts if isinstance(x, types.CodeType))
    return out


def require_attr(obj: Any, attr: str, ablation: str) -> None:
    """At run time, inside a replacement: an attribute of a live object (an aiohttp session's
    private state) the ablation changes must exist."""
    if not hasattr(obj, attr):
        raise TargetGone(f"ablation {ablation!r}: {type(obj).__module__}.{type(obj).__name__} has no {attr} any more; "
                         f"bench/ablate.py must follow it, else the ablation changes nothing")


def _sink(p: Patch) -> None:
    """Bodies read with `await content.readany()` (one task wake-up per read) and aiohttp's
    sock_read timer re-armed on every read, instead of agentload.run.body_sink."""

    async def no_sink(content, feed, protocol=None, last_byte_ns=None) -> bool:
        return False

    p.set("agentload.run.request:read_body", no_sink)


def _idle(p: Patch) -> None:
    """Keep the sink, but leave aiohttp's sock_read timer (cancel + re-arm per read)."""
    fast = p.get("agentload.run.request:read_body")

    async def no_idle(content, feed, protocol=None, last_byte_ns=None) -> bool:
        return await fast(content, feed)

    p.set("agentload.run.request:read_body", no_idle)


def _ssefast(p: Patch) -> None:
    """No one-event fast path in SSEDecoder.feed (every read split and scanned)."""
    p.reads("agentload.run.sse:SSEDecoder.feed", "_bom")  # the fast path is skipped while a BOM is possible
    orig = p.get("agentload.run.sse:SSEDecoder.feed")

    def feed(self, data):
        self._bom = True  # _strip_bom clears it again
        return orig(self, data)

    p.set("agentload.run.sse:SSEDecoder.feed", feed)


def _ua(p: Patch) -> None:
    """aiohttp told to skip its User-Agent (skip_auto_headers: a header-dict copy per request)
    instead of sending our own."""
    from multidict import istr

    orig = p.get("agentload.run.transport:Transport._new_session")

    def new_session(self, *a, **k):
        s = orig(self, *a, **k)
        require_attr(s, "_skip_auto_headers", "ua")
        require_attr(s, "_default_headers", "ua")
        s._skip_auto_headers = frozenset({istr("User-Agent")})
        s._default_headers.popall("User-Agent", None)
        return s

    p.set("agentload.run.transport:Transport._new_session", new_session)


def _convbuf(p: Patch) -> None:
    """Each message kept as its own orjson bytes (4 KiB allocation each) and as a dict; the
    body joined from the list on every request."""
    import orjson

    for attr in ("_body", "_head_len", "n_messages", "tokens"):  # what the replacements use
        p.get(f"agentload.run.conversation:Conversation.{attr}")
    message_tokens = p.get("agentload.tokens:message_tokens")
    parts: dict[int, list] = {}

    def append(self, message, tokens=None):
        lst = parts.setdefault(id(self), [])
        lst.append((message, orjson.dumps(message)))
        self.n_messages += 1
        self.tokens += message_tokens(message) if tokens is None else tokens

    def body(self):
        head = bytes(memoryview(self._body)[:self._head_len])  # everything before the messages
        return head + b",".join(p for _, p in parts[id(self)]) + b"]}"

    p.set("agentload.run.conversation:Conversation.append", append)
    p.set("agentload.run.conversation:Conversation.body", body)


def _sleep(p: Patch) -> None:
    """ctx.sleep() as asyncio.wait_for(stop_event.wait(), timeout): a task and more per sleeping agent."""

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0 or self.stopping:
            return
        try:
            await asyncio.wait_for(self.stop_event.wait(), timeout=seconds)
        except TimeoutError:
            pass

    p.get("agentload.run.context:RunContext.stopping")
    p.set("agentload.run.context:RunContext.sleep", sleep)


def _gc(p: Patch) -> None:
    """The garbage collector as Python sets it (nothing frozen, thresholds 700/10/10)."""
    p.set("agentload.run.runner:gc_for_run", lambda: (lambda: None))


def _shape(p: Patch) -> None:
    """Every chunk parsed as an object (no learned token-event shapes in any API's reader)."""
    p.set("agentload.run.chat_stream:MAX_SHAPES", 0)
    p.set("agentload.run.apis.reader:MAX_SHAPES", 0)


def _direct(p: Patch) -> None:
    """Every request through ClientSession.post (a ClientRequest, a body-writing task and a
    ClientResponse per request) instead of agentload.run.direct."""
    p.set("agentload.run.transport:check_direct_path", lambda: False)


def _writestep(p: Patch) -> None:
    """Each request written at once, as it is made ready, not at the end of the loop step with the
    others made ready in it (agentload.run.direct.WRITE_AT_STEP_END)."""
    p.reads("agentload.run.direct:_Exchange.__aenter__", "WRITE_AT_STEP_END")
    p.set("agentload.run.direct:WRITE_AT_STEP_END", False)


ABLATIONS: dict[str, Callable[[Patch], None]] = {
    "sink": _sink, "idle": _idle, "ssefast": _ssefast, "ua": _ua, "convbuf": _convbuf, "sleep": _sleep, "gc": _gc,
    "shape": _shape, "direct": _direct, "writestep": _writestep,
}


# Probes, not changes: a part of agentload's per-request work replaced by (almost) nothing, to
# measure what it costs in a real run (`python -m bench.ab --only probe-text`). A run with a probe
# is not a valid run of agentload; its figures are only that part's price.

def _probe_text(p: Patch) -> None:
    """Synthetic text: one fixed string of the right length (no random draw)."""
    p.set("agentload.run.conversation:synthetic_text",
          lambda rng, tokens: ("abc " * tokens)[:-1] if tokens > 0 else "")


def _probe_interval_log(p: Patch) -> None:
    """The interval log's histograms: nothing recorded."""
    p.set("agentload.records.interval_log:IntervalLog.add", lambda self, rec: None)


def _probe_request_id(p: Patch) -> None:
    """The request id header's value: the readable id itself (no SHA-1 UUID)."""
    p.set("agentload.run.agent:sent_request_id", lambda readable, fmt="uuid": readable)


ABLATIONS.update({"probe-text": _probe_text, "probe-interval-log": _probe_interval_log,
                  "probe-request-id": _probe_request_id})


def patch_for(name: str) -> Patch:
    """The checked, not yet applied, patches of one ablation (TargetGone if a target is missing)."""
    p = Patch(name)
    ABLATIONS[name](p)
    return p


def ablate(names: list[str]) -> None:
    chosen: list[str] = []
    for name in names:
        if name == "all":  # "sink" already undoes the idle timer
            chosen += [k for k in ABLATIONS if k != "idle" and not k.startswith("probe-")]
        elif name in ABLATIONS:
            chosen.append(name)
        else:
            raise SystemExit(f"--ablate: unknown optimisation {name!r}; one of {', '.join(ABLATIONS)}, all")
    for name in chosen:  # one after the other: "idle" wraps whatever read_body is by then
        patch_for(name).apply()
