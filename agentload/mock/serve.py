"""Run the mock in the foreground until SIGTERM/SIGINT (the `agentload mock` command and the
subprocess started by MockProcess), and parse `--set key=value` overrides.

A port outside 0-65535 (the OS would take 70000 as 4464) or an address it cannot listen on (in
use, no such host) is a `UserError` naming the address, before or instead of serving. With
`bind_retry_s`, a port in use is tried again for that long first: a backend restarted on its
port may find the old process's socket not quite gone yet."""

from __future__ import annotations

import asyncio
import copy
import errno
import os
import signal
import sys
from typing import Any, Iterable, Mapping

from agentload.errors import ScenarioError, UserError
from agentload.mock.config import MockConfig
from agentload.validate import apply_sets, relabel

READY_PREFIX = "AGENTLOAD_MOCK_LISTENING"


def parse_set_overrides(items: Iterable[str], base: Mapping[str, Any] | None = None,
                        source: str = "--set") -> dict[str, Any]:
    """Apply `key=value` items onto a copy of `base` (a `[mock]` dict) and return it.

    The scenario's `--set` parser (agentload.validate.apply_sets): values are TOML values (`5`,
    `0.5`, `"x"`, `true`, `["a", "b"]`, `{after_tokens = 5, for_s = 2}`), anything TOML cannot
    parse is kept as a bare string; keys may carry a `mock.` prefix and may be dotted to reach
    into a table: `stall_mid_stream.after_tokens=5`.
    """
    return _apply(items, base, source)[0]


def mock_config(items: Iterable[str], base: Mapping[str, Any] | None = None, source: str = "--config-json",
                label: str = "--set") -> MockConfig:
    """`base` with the `key=value` items applied, checked: an error in a value an item wrote
    names `label`, any other names `source`."""
    raw, written = _apply(items, base, label)
    try:
        return MockConfig.from_dict(raw, source)
    except ScenarioError as e:
        raise relabel(e, written, label) from None


def _apply(items: Iterable[str], base: Mapping[str, Any] | None, source: str) -> tuple[dict[str, Any], list[str]]:
    root: dict[str, Any] = {"mock": copy.deepcopy(dict(base or {}))}
    written = apply_sets(root, items, form="key=value, e.g. error_rate=0.1", under="mock", source=source)
    return root["mock"], written


def serve(cfg: MockConfig, host: str = "127.0.0.1", port: int = 8000, ready_line: bool = True,
          *, watch_stdin: bool = False, bind_retry_s: float = 0.0) -> None:
    """Serve until SIGTERM or SIGINT (or, with watch_stdin, until stdin reaches EOF, i.e. the
    parent process is gone). Prints `AGENTLOAD_MOCK_LISTENING port=<n>` once it accepts connections."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise UserError(f"--port: expected a port 0-65535 (0 picks a free one), got {port}")
    coro = _serve(cfg, host, port, ready_line, watch_stdin, bind_retry_s)
    try:
        import uvloop
    except ImportError:
        asyncio.run(coro)
    else:
        uvloop.run(coro)


class _EOFWatch(asyncio.Protocol):
    def __init__(self, stop: asyncio.Event):
        self.stop = stop

    def eof_received(self) -> None:
        self.stop.set()

    def connection_lost(self, exc: BaseException | None) -> None:
        self.stop.set()


async def _serve(cfg: MockConfig, host: str, port: int, ready_line: bool, watch_stdin: bool,
                 bind_retry_s: float = 0.0) -> None:
    from agentload.mock.server import start_server  # aiohttp import only when serving

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    deadline = loop.time() + bind_retry_s
    try:
        while True:
            try:
                runner, bound = await start_server(cfg, host, port)
                break
            except OSError as e:
                if e.errno != errno.EADDRINUSE or port == 0 or loop.time() >= deadline or stop.is_set():
                    raise
                await asyncio.sleep(0.1)
    except OSError as e:  # in use, not an address of this host, no such host
        # uvloop's strerror is a sentence of its own; the errno's text is enough
        why = os.strerror(e.errno) if e.errno and e.errno > 0 else (e.strerror or str(e) or e.__class__.__name__)
        raise UserError(f"--host/--port: cannot listen on {host}:{port} ({why}); expected a free port "
                        f"on a local address (0 picks a free port)") from None
    try:
        if watch_stdin:
            await loop.connect_read_pipe(lambda: _EOFWatch(stop), sys.stdin)
        if ready_line:
            print(f"{READY_PREFIX} port={bound}", flush=True)
        await stop.wait()
    finally:
        await runner.cleanup()
