"""The one transport seam: aiohttp sessions built from `[client]`, traced by timestamp-only hooks.

Every limit and timeout comes from the scenario; nothing falls back to aiohttp's defaults
(its `ClientTimeout(total=300)` would kill long streams). Hooks stamp
`time.perf_counter_ns()` into the request's Trace and do nothing else.

The hooks are the session's own classes: a connector that stamps the pool wait (`queued_start`,
`queued_end`), a new connection (`conn_start`, `conn_end`, `reused`), and a request that stamps
`sent` once its body is handed to the socket; they find the request's Trace in `current_trace`,
which `request.send` sets in the request's task (aiohttp's body-writing task inherits it). The
direct path (`agentload.run.direct`) writes requests straight to this connector's connections, so
these are the only stamps there are (aiohttp's TraceConfig signals, the public way, would cost
three coroutines and a parameters object per signal and not see a direct request at all).

Four things read aiohttp's private internals (pyproject pins the aiohttp minors they were tested
with): these hooks (the connector's and request's methods they override), the request path
(`direct`: a request written straight to a pooled connection), the body read path (`body_sink`)
and the pool's state (`pool_state`: the connector's `_acquired`, `_conns`, `_waiters`). Each is
checked once per process, when the first Transport is made (the connector's when its first pool
is made). Without the hooks no phase could be stamped: that is an error naming the installed
aiohttp and what it lacks (`check_trace_hooks`). Whatever else is missing is named in one warning
line on stderr: requests then go through `ClientSession.post`, bodies are read with `readany()`
and the pool's unknown counts are left out of `pool_state()` (listed under `unknown`) instead of
read as 0.
"""

from __future__ import annotations

import asyncio
import inspect
import ssl
import sys
import time
from collections import deque
from contextvars import ContextVar
from typing import Any, Callable

import aiohttp

from agentload import __version__
from agentload.endpoint import api_url
from agentload.errors import UserError
from agentload.records import Trace
from agentload.redact import env_secrets, register_target, secret_field
from agentload.run import apis, body_sink
from agentload.run.direct import DirectPost
from agentload.run.direct import missing_hooks as direct_missing_hooks
from agentload.run.scenario import ClientConfig, TargetConfig

_now = time.perf_counter_ns

# pool_state() field -> (connector attribute, a mapping of per-host collections?)
_POOL_HOOKS = {"in_use": ("_acquired", False), "idle": ("_conns", True), "waiters": ("_waiters", True)}
_pool_unknown: list[str] | None = None  # pool_state() fields this aiohttp cannot give; None: not checked yet
_warned: set[str] = set()


def _warn_once(what: str, message: str) -> None:
    """One line on stderr per kind of missing internals, once per process."""
    if what not in _warned:
        _warned.add(what)
        print(f"agentload: warning: aiohttp {aiohttp.__version__}: {message}", file=sys.stderr, flush=True)


def check_read_path() -> bool:
    """The sink read path's aiohttp internals are all there (else: one warning, `readany()`)."""
    missing = body_sink.missing_hooks()
    if missing:
        _warn_once("read", f"missing {', '.join(missing)}: reading response bodies with readany() "
                           "(the public path) instead of the sink path")
    return not missing


def check_direct_path() -> bool:
    """The direct request path's aiohttp internals are all there (else: one warning, `session.post`)."""
    missing = direct_missing_hooks()
    if missing:
        _warn_once("direct", f"missing {', '.join(missing)}: requests sent through ClientSession.post "
                             "(the public path, more CPU per request) instead of the direct path")
    return not missing


def _pool_count(connector: Any, field: str) -> int:
    attr, per_host = _POOL_HOOKS[field]
    v = getattr(connector, attr)
    return sum(len(x) for x in v.values()) if per_host else len(v)


def check_pool_hooks(connector: Any) -> list[str]:
    """pool_state() fields this connector cannot give (its internals are missing or of another
    shape); checked on the first connector of the process, one warning if any."""
    global _pool_unknown
    if _pool_unknown is None:
        unknown = []
        for field in _POOL_HOOKS:
            try:
                _pool_count(connector, field)
            except (AttributeError, TypeError):
                unknown.append(field)
        _pool_unknown = unknown
        if unknown:
            base = next(c for c in type(connector).__mro__ if c.__module__.startswith("aiohttp"))  # (not ours)
            names = ", ".join(f"{base.__name__}.{_POOL_HOOKS[f][0]}" for f in unknown)
            _warn_once("pool", f"missing or reshaped {names}: the pool's {'/'.join(unknown)} are unknown "
                               "(left out of samples, live view and dumps)")
    return _pool_unknown


def _wait_begins(t: dict[str, int]) -> None:
    # A wait that follows an earlier one of the same request (agentload's queue, then aiohttp's; or
    # aiohttp queueing it again) continues it: the first start stays, the end is open again.
    if t.pop("queued_end", None) is None:
        t["queued_start"] = _now()


# The Trace of the request the running task is sending (None: a request sent without one).
current_trace: ContextVar[Trace | None] = ContextVar("agentload_trace", default=None)


class QueuedBodies:
    """The request bodies waiting for a pool connection: their bytes, and parking past a limit.

    100,000 agents on a pool of 100 hold 100,000 request bodies while they wait (1.3-1.6 GB in
    round 5 of the demo's conversations). Past `park_above` bytes queued, a body that starts to
    wait is parked: kept compressed by its conversation until it is written (`Conversation.park`).
    Only bodies that can park are counted (a conversation's; canaries and raw bytes are not)."""

    __slots__ = ("park_above", "queued_bytes", "parked")

    def __init__(self, park_above_bytes: float):
        self.park_above = park_above_bytes
        self.queued_bytes = 0
        self.parked = 0  # bodies parked so far

    def enter(self, body: Any) -> int:
        size = body.size
        self.queued_bytes += size
        if self.queued_bytes > self.park_above and body.park():
            self.parked += 1
        return size

    def leave(self, size: int) -> None:
        self.queued_bytes -= size


class PoolGate:
    """agentload's own queue in front of a pool: at most `room` requests inside aiohttp at once.

    A request queued in aiohttp's pool has already had its request built (a ClientRequest, its
    headers, timers, coroutine frames: ~6 KB); 100,000 agents on a pool of 100 would hold 600 MB of
    them. Past the pool's limit plus `client.aiohttp_waiters_max`, a request waits here instead, on
    one future, before `session.post`. It is the same wait: `queued_start` is stamped here and
    aiohttp's own wait, if any, continues it (`_wait_begins`); it is bounded by the pool timeout
    (what is left of it goes to aiohttp); its body is counted and parked like one in aiohttp's queue.
    A place freed goes straight to the longest waiter; but a request that finds the pool itself
    with a connection to give (idle, or under the limit) goes in at once, as it would in aiohttp
    (whose `connect` takes an idle connection before any woken waiter can), so the queue changes
    what a request holds while it waits, not who waits."""

    __slots__ = ("room", "waiting", "n_waiting", "waited", "_pool", "_queue", "_timeout")

    def __init__(self, room: int, pool: aiohttp.TCPConnector, queue: QueuedBodies, timeout: aiohttp.ClientTimeout):
        self.room = room  # places free (only while nobody waits; below 0: requests let in past it)
        self._pool = pool
        self.waiting: deque[asyncio.Future[None]] = deque()  # (a cancelled waiter's future stays until passed)
        self.n_waiting = 0  # requests waiting now
        self.waited = 0  # requests that waited here, so far
        self._queue = queue
        self._timeout = timeout

    def enter_now(self) -> bool:
        """Take a place if one is free (or the pool can serve at once): then `leave()` exactly once;
        else `wait`. (Not a coroutine: the common case costs no coroutine per request.)"""
        if self.room > 0 or self._pool_can_serve():
            self.room -= 1
            return True
        return False

    async def wait(self, tr: Trace, url: str) -> aiohttp.ClientTimeout:
        """Wait for a place (after `enter_now` said no); then `leave()` exactly once. The request's
        timeout with the wait taken off."""
        t = tr.t
        _wait_begins(t)
        fut = asyncio.get_running_loop().create_future()
        self.waiting.append(fut)
        body = tr.body
        size = self._queue.enter(body) if body is not None else 0
        pool_s = self._timeout.connect
        self.n_waiting += 1
        self.waited += 1
        try:
            async with asyncio.timeout(pool_s):
                await fut
        except BaseException as e:
            if fut.done() and not fut.cancelled():  # given a place, then cancelled: pass it on
                self.leave()
            fut.cancel()
            if isinstance(e, TimeoutError):  # as aiohttp names its own pool timeout
                raise aiohttp.ConnectionTimeoutError(f"Connection timeout to host {url}") from e
            raise
        finally:
            self.n_waiting -= 1
            if size:
                self._queue.leave(size)
        now = t["queued_end"] = _now()
        waited = (now - t["queued_start"]) / 1e9
        tm = self._timeout
        return aiohttp.ClientTimeout(  # the pool timeout and total timeout count from the request's start
            total=None if tm.total is None else max(tm.total - waited, 1e-3),
            connect=None if pool_s is None else max(pool_s - waited, 1e-3),
            sock_read=tm.sock_read, sock_connect=tm.sock_connect, ceil_threshold=tm.ceil_threshold)

    def _pool_can_serve(self) -> bool:
        """aiohttp would hand this request a connection without queueing it: one is idle, or fewer
        are in use than the limit (read as `pool_state` reads them; if they are missing: no)."""
        pool = self._pool
        try:
            return _pool_count(pool, "idle") > 0 or _pool_count(pool, "in_use") < pool.limit
        except (AttributeError, TypeError):
            return False

    def leave(self) -> None:
        if self.room < 0:  # one let in past the limit: its place was never there to give
            self.room += 1
            return
        waiting = self.waiting
        while waiting:
            fut = waiting.popleft()
            if not fut.done():
                fut.set_result(None)
                return
        self.room += 1


_RELEASED = "_agentload_released_ns"  # the attribute of a pooled connection's protocol: when it was released


class _TracedConnector(aiohttp.TCPConnector):
    """aiohttp's TCP connector, stamping the current request's Trace (see the module docstring).
    `on_open(trace)`: a connection was opened for that request. `queue`: where the bodies of the
    requests waiting for a connection are counted, and parked past its limit."""

    on_open: Callable[[Trace | None], None] | None = None
    queue: QueuedBodies | None = None
    gate: PoolGate | None = None  # agentload's queue in front of this pool (`request.send` passes it)
    direct: DirectPost | None = None  # requests to the target sent on this pool without ClientSession's layers

    async def connect(self, req: Any, traces: Any, timeout: Any) -> Any:
        conn = await super().connect(req, traces, timeout)
        tr = current_trace.get()
        if tr is not None and tr.reused is None:  # not a new connection: one from the pool
            tr.reused = True
            idle = getattr(conn.protocol, _RELEASED, None)
            if idle is not None:
                tr.idle_ns = _now() - idle
        return conn

    def _release(self, key: Any, protocol: Any, *args: Any, **kwargs: Any) -> None:
        # the moment a connection goes back to the pool: a reuse's idle time counts from here, kept on
        # the protocol itself (a weak map of protocols cost a weak reference made per release and per
        # reuse)
        try:
            setattr(protocol, _RELEASED, _now())
        except AttributeError:  # (a protocol without room for it: no idle time, nothing else lost)
            pass
        super()._release(key, protocol, *args, **kwargs)

    async def _wait_for_available_connection(self, key: Any, traces: Any) -> None:
        # called only when the pool is full; the whole wait, also when aiohttp queues it again
        tr = current_trace.get()
        if tr is None:
            return await super()._wait_for_available_connection(key, traces)
        _wait_begins(tr.t)
        queue, body = self.queue, tr.body
        if queue is None or body is None:
            await super()._wait_for_available_connection(key, traces)
        else:
            size = queue.enter(body)
            try:
                await super()._wait_for_available_connection(key, traces)
            finally:
                queue.leave(size)
        tr.t["queued_end"] = _now()

    async def _create_connection(self, req: Any, traces: Any, timeout: Any) -> Any:
        tr = current_trace.get()
        if tr is not None:
            tr.t["conn_start"] = _now()
            tr.reused = False
        proto = await super()._create_connection(req, traces, timeout)
        if tr is not None:
            tr.t["conn_end"] = _now()
        if self.on_open is not None:
            self.on_open(tr)
        return proto


class _TracedRequest(aiohttp.ClientRequest):
    """aiohttp's request, stamping `sent` when its body has been handed to the socket (the task
    that writes it runs in a copy of the sending task's context, so it sees `current_trace`).
    aiohttp does not raise a failed write: it sets the error on the connection's protocol and
    returns. Then nothing is stamped: the request failed sending, not waiting for the server."""

    async def write_bytes(self, writer: Any, conn: Any, *args: Any, **kwargs: Any) -> None:
        await super().write_bytes(writer, conn, *args, **kwargs)
        tr = current_trace.get()
        if tr is not None and "sent" not in tr.t:
            protocol = conn.protocol
            if protocol is None or protocol.exception() is None:
                tr.t["sent"] = _now()


# The methods _TracedConnector and _TracedRequest override, with the parameters they pass on.
_TRACE_HOOKS = {(aiohttp.TCPConnector, "connect"): ("req", "traces", "timeout"),
                (aiohttp.TCPConnector, "_wait_for_available_connection"): ("key", "traces"),
                (aiohttp.TCPConnector, "_create_connection"): ("req", "traces", "timeout"),
                (aiohttp.ClientRequest, "write_bytes"): ("writer", "conn")}  # (3.14 adds content_length)
_trace_hooks_checked = False  # checked once per process


def check_trace_hooks() -> None:
    """The connector and request methods the traced classes override are there, with the same
    leading parameters; else a UserError naming the installed aiohttp and what it lacks."""
    global _trace_hooks_checked
    if _trace_hooks_checked:
        return
    missing = []
    for (cls, name), params in _TRACE_HOOKS.items():
        fn = getattr(cls, name, None)
        # a coroutine function whose parameters passed on by name come first, in this order
        ok = (fn is not None and inspect.iscoroutinefunction(fn)
              and tuple(inspect.signature(fn).parameters)[1:1 + len(params)] == params)
        if not ok:
            missing.append(f"{cls.__name__}.{name}({', '.join(params)})")
    from aiohttp.client_proto import ResponseHandler

    if not callable(getattr(ResponseHandler, "exception", None)):  # where a failed body write is left
        missing.append("ResponseHandler.exception()")
    if missing:
        raise UserError(f"aiohttp {aiohttp.__version__}: missing or reshaped {', '.join(missing)}, which agentload "
                        f"stamps every request's phases with; expected {_aiohttp_requirement()} (the versions "
                        f"agentload was tested with)")
    _trace_hooks_checked = True


def _aiohttp_requirement() -> str:
    """The aiohttp range agentload's package metadata asks for (pyproject.toml's)."""
    from importlib.metadata import PackageNotFoundError, requires

    try:
        return next(r for r in requires("agentload") or () if r.replace(" ", "").startswith("aiohttp"))
    except (PackageNotFoundError, StopIteration):
        return "the aiohttp range pyproject.toml names"


def client_timeout(cfg: ClientConfig) -> aiohttp.ClientTimeout:
    return aiohttp.ClientTimeout(
        total=cfg.total_timeout_s,
        connect=cfg.pool_timeout_s,
        sock_connect=cfg.connect_timeout_s,
        sock_read=cfg.read_timeout_s,
    )


def request_headers(target: TargetConfig) -> dict[str, str]:
    """Static headers for every request. The API key is read from the environment here and
    lives only in the session's header map: never in the scenario, records or reports."""
    # A User-Agent of our own: it names the load generator in router logs, and aiohttp then adds
    # none (asking aiohttp to skip its own, with skip_auto_headers, costs a header-dict copy per
    # request). Accept-Encoding identity: a compressed stream costs both sides CPU and buys nothing
    # on the sizes of a chat answer (aiohttp would otherwise offer gzip/deflate); one that comes
    # anyway (a proxy that compresses whatever it is given) is decoded by aiohttp's parser
    # (auto_decompress), and one it cannot decode is named (`request.content_encoding_error`).
    h = {"Content-Type": "application/json", "Accept": "text/event-stream, application/json",
         "Accept-Encoding": "identity", "User-Agent": f"agentload/{__version__}"}
    h.update(target.headers)
    # Secrets come only from the environment (never the scenario, so never run.json or a worker's
    # command line); each value is remembered for redaction wherever agentload writes text. A
    # variable that is not set is an error, never a request sent without its key.
    env = env_secrets(target)
    missing = [n for n, v in env.items() if not v]
    if missing:
        raise UserError(f"target: environment variable {missing[0]} is not set (named by "
                        f"{secret_field(target, missing[0])}); expected the secret in it")
    two_lines = [n for n, v in env.items() if v and ("\r" in v or "\n" in v)]  # (a header that would start others)
    if two_lines:
        raise UserError(f"target: environment variable {two_lines[0]} (named by {secret_field(target, two_lines[0])}) "
                        f"holds a line break; expected a header value on one line")
    register_target(target)
    # the API's own headers (Messages: anthropic-version, the key as x-api-key), where the scenario's
    # headers do not set them already
    for name, value in apis.get(target.api).headers(env[target.api_key_env] if target.api_key_env else None).items():
        if name.lower() not in (k.lower() for k in target.headers):
            h[name] = value
    for name, var in target.headers_env.items():
        h[name] = env[var]  # type: ignore[assignment]
    return h


def tls_context(target: TargetConfig) -> ssl.SSLContext | bool:
    """What the pools verify an https endpoint's certificate with: the scenario's CA bundle
    (`tls_ca_file`), nothing (`tls_verify = false`), else aiohttp's default context (the system's
    CAs; SSL_CERT_FILE / SSL_CERT_DIR in the environment replace them)."""
    if not target.tls_verify:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx
    if target.tls_ca_file:
        try:
            return ssl.create_default_context(cafile=target.tls_ca_file)
        except (OSError, ssl.SSLError, ValueError) as e:
            raise UserError(f"target.tls_ca_file: expected a CA bundle file (PEM) that loads, got "
                            f"{target.tls_ca_file!r} ({getattr(e, 'reason', None) or e})") from None
    return True


class Transport:
    """Owns the client pool(s): one shared session, or one per agent."""

    def __init__(self, client: ClientConfig, target: TargetConfig, base_url: str):
        self.cfg = client
        self.url = api_url(base_url, target.api)
        self.ssl = tls_context(target) if base_url.lower().startswith("https://") else True
        self.headers = request_headers(target)
        self._shared: aiohttp.ClientSession | None = None
        self._per_agent: dict[int, aiohttp.ClientSession] = {}
        self.connections_opened = 0
        # one count for all the agents' pools (a canary's pool does not park: its bodies are bytes)
        self.queued_bodies = QueuedBodies(client.park_queued_bodies_mb * 1e6)
        self._gates: list[PoolGate] = []
        check_trace_hooks()  # once per process: an error if this aiohttp lacks what the stamps need
        check_read_path()  # once per process: one warning and readany() if aiohttp lacks a hook
        self.direct = check_direct_path()  # (the same: session.post instead)

    def _count_open(self, tr: Trace | None) -> None:
        if tr is None or tr.kind == "agent":  # canaries have their own pool, kept out of the counts
            self.connections_opened += 1

    def _connector(self, **kwargs: Any) -> _TracedConnector:
        kwargs["ssl"] = self.ssl
        connector = _TracedConnector(**kwargs)
        connector.on_open = self._count_open
        connector.queue = self.queued_bodies
        return connector

    def _session(self, connector: _TracedConnector, timeout: aiohttp.ClientTimeout) -> aiohttp.ClientSession:
        session = aiohttp.ClientSession(connector=connector, timeout=timeout, headers=self.headers,
                                        auto_decompress=True, request_class=_TracedRequest)
        if self.direct:  # requests to the target skip session.post's per-request layers (`direct`)
            connector.direct = DirectPost(session, self.url)
        return session

    def _new_session(self, force_close: bool | None = None, limit: int | None = None) -> aiohttp.ClientSession:
        c = self.cfg
        fc = c.force_close if force_close is None else force_close
        connector = self._connector(
            limit=c.limit if limit is None else limit,
            limit_per_host=c.limit_per_host,
            force_close=fc,
            # aiohttp rejects keepalive_timeout together with force_close.
            **({} if fc else {"keepalive_timeout": c.keepalive_timeout}),
            enable_cleanup_closed=False,
        )
        check_pool_hooks(connector)
        timeout = client_timeout(c)
        limit = c.limit if limit is None else limit
        if limit and c.aiohttp_waiters_max and c.session == "shared":  # (an agent's own pool: one request at a time)
            connector.gate = PoolGate(limit + c.aiohttp_waiters_max, connector, self.queued_bodies, timeout)
            self._gates.append(connector.gate)
        return self._session(connector, timeout)

    def session_for(self, agent: int) -> aiohttp.ClientSession:
        if self.cfg.session == "shared":
            if self._shared is None:
                self._shared = self._new_session()
            return self._shared
        s = self._per_agent.get(agent)
        if s is None:
            s = self._per_agent[agent] = self._new_session()
        return s

    async def close_agent(self, agent: int) -> None:
        s = self._per_agent.pop(agent, None)
        if s is not None:
            await s.close()

    def canary_session(self, timeout_s: float) -> aiohttp.ClientSession:
        """A separate pool that never reuses a connection: canaries must not queue behind agents.
        Its timeouts are the canary's own, so a hung server cannot hold a canary for long."""
        return self._session(self._connector(limit=0, force_close=True),
                             aiohttp.ClientTimeout(total=timeout_s, connect=timeout_s, sock_connect=timeout_s,
                                                   sock_read=timeout_s))

    def probe_session(self, keep_alive: bool) -> aiohttp.ClientSession:
        """A pool of the stall probes' own (`agentload.run.probes`), with the agents' headers and
        timeouts: a fresh connection per request, or (`keep_alive`) one connection kept and reused."""
        c = self.cfg
        connector = self._connector(limit=1, force_close=False, keepalive_timeout=c.keepalive_timeout,
                                    enable_cleanup_closed=False) if keep_alive else \
            self._connector(limit=0, force_close=True, enable_cleanup_closed=False)
        return self._session(connector, client_timeout(c))

    def idle_shared(self) -> aiohttp.ClientSession | None:
        """The agents' shared session while its pool holds an idle connection (one that has served
        requests: a request sent now reuses it), else None."""
        s = self._shared
        if s is None or s.connector is None or "idle" in (_pool_unknown or ()):
            return None
        try:
            return s if _pool_count(s.connector, "idle") > 0 else None
        except (AttributeError, TypeError):
            return None

    def _connectors(self) -> list[aiohttp.BaseConnector]:
        out = [s.connector for s in ([self._shared] if self._shared else []) if s.connector]
        out.extend(s.connector for s in self._per_agent.values() if s.connector)
        return out

    def gated_requests(self) -> int:
        """Requests that waited in agentload's queue in front of the pool, so far (`PoolGate`)."""
        return sum(g.waited for g in self._gates)

    def pool_state(self) -> dict[str, Any]:
        """Connections in use, idle, waiters queued and the limit, summed over the pools.

        Reads aiohttp's connector internals (`_acquired`, `_conns`, `_waiters`): there is
        no public API for them, and the pool's state is the evidence a verdict needs. A count
        this aiohttp cannot give is left out and named in `unknown` (never reported as 0).
        """
        conns = self._connectors()
        unknown = list(_pool_unknown or ())
        counts = {}
        for field in _POOL_HOOKS:
            if field in unknown:
                continue
            try:
                counts[field] = sum(_pool_count(c, field) for c in conns)
            except (AttributeError, TypeError):  # reshaped after the first check: unknown from now on
                unknown.append(field)
        out: dict[str, Any] = {"pools": len(conns), **counts,
                               "limit": self.cfg.limit * max(1, len(conns)) if self.cfg.limit else 0,
                               "opened": self.connections_opened}
        gated = sum(g.n_waiting for g in self._gates)
        if gated:  # agentload's own queue in front of aiohttp's: waiters too
            out["gated"] = gated
            if "waiters" in out:
                out["waiters"] += gated
        q = self.queued_bodies
        if q.parked:  # only once it happened: the common run's pool state stays as it was
            out["parked"] = q.parked
            out["queued_body_mb"] = round(q.queued_bytes / 1e6, 1)
        if unknown:
            out["unknown"] = unknown
        return out

    def __repr__(self) -> str:
        s = self.pool_state()
        return (f"<Transport {self.cfg.session} pools={s['pools']} in_use={s.get('in_use', '?')} "
                f"idle={s.get('idle', '?')} waiters={s.get('waiters', '?')} limit={self.cfg.limit} "
                f"opened={s['opened']}>")

    async def close(self) -> None:
        if self._shared is not None:
            await self._shared.close()
            self._shared = None
        for s in list(self._per_agent.values()):
            await s.close()
        self._per_agent.clear()
