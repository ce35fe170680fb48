"""Open report.html in headless Chromium over the DevTools protocol: do its charts render,
with no console errors? And take a screenshot of it.

A tiny DevTools client on aiohttp's websocket (already a dependency): launch Chromium with
`--remote-debugging-port=0`, read the port it picked from `DevToolsActivePort`, attach to the
page, navigate to the file, then poll the page until every plotly figure is drawn. Every wait
is bounded; the browser is always killed at the end. Loopback only.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import os
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-extensions", "--disable-default-apps", "--mute-audio", "--hide-scrollbars")

# Counts plotly figures and how many are drawn; body[data-figures] says how many to expect.
_PROBE_JS = """(() => {
  const plots = Array.from(document.querySelectorAll('.js-plotly-plot'));
  const drawn = plots.filter(p => p._fullLayout && p.querySelector('svg.main-svg') && p.data);
  return JSON.stringify({
    expected: parseInt(document.body ? (document.body.dataset.figures || '-1') : '-1', 10),
    plots: plots.length,
    drawn: drawn.length,
    traces: drawn.map(p => p.data.length),
    ids: drawn.map(p => p.id),
    plotly: typeof window.Plotly === 'object' ? window.Plotly.version : null,
    height: Math.ceil(document.documentElement.scrollHeight),
    width: Math.ceil(document.documentElement.scrollWidth),
  });
})()"""


def find_chromium() -> str | None:
    env = os.environ.get("AGENTLOAD_CHROMIUM")
    if env:
        return env if shutil.which(env) or Path(env).exists() else None
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


@dataclass
class PageCheck:
    """What the browser saw: figures expected and drawn, console errors, uncaught exceptions."""

    url: str
    expected: int = -1
    plots: int = 0
    drawn: int = 0
    traces: list[int] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    plotly_version: str | None = None
    console_errors: list[str] = field(default_factory=list)
    exceptions: list[str] = field(default_factory=list)
    external_requests: list[str] = field(default_factory=list)  # anything not file:, data: or blob:
    height: int = 0
    width: int = 0
    screenshot: bytes | None = None

    @property
    def ok(self) -> bool:
        return (self.expected > 0 and self.drawn == self.expected == self.plots
                and not self.console_errors and not self.exceptions and not self.external_requests)

    def problems(self) -> list[str]:
        out = []
        if self.expected <= 0:
            out.append("the page does not say how many figures it has (body[data-figures])")
        if self.drawn != self.expected or self.plots != self.expected:
            out.append(f"{self.drawn} of {self.expected} figures drawn ({self.plots} plot divs)")
        out += [f"console: {m}" for m in self.console_errors]
        out += [f"exception: {m}" for m in self.exceptions]
        out += [f"network request (the page must work offline): {u}" for u in self.external_requests]
        return out


class DevTools:
    """One websocket to one page target; `call` sends a command and waits for its answer."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse):
        self.ws = ws
        self.ids = itertools.count(1)
        self.pending: dict[int, asyncio.Future] = {}
        self.events: list[dict[str, Any]] = []
        self.event_seen = asyncio.Event()
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for msg in self.ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                continue
            data = msg.json()
            if "id" in data:
                fut = self.pending.pop(data["id"], None)
                if fut is not None and not fut.done():
                    fut.set_result(data)
            else:
                self.events.append(data)
                self.event_seen.set()
        for fut in self.pending.values():
            if not fut.done():
                fut.set_exception(ConnectionError("DevTools websocket closed"))

    async def call(self, method: str, timeout: float = 10.0, **params: Any) -> dict[str, Any]:
        i = next(self.ids)
        fut = asyncio.get_running_loop().create_future()
        self.pending[i] = fut
        await self.ws.send_json({"id": i, "method": method, "params": params})
        reply = await asyncio.wait_for(fut, timeout)
        if "error" in reply:
            raise RuntimeError(f"DevTools {method}: {reply['error']}")
        return reply.get("result", {})

    async def wait_event(self, method: str, timeout: float) -> bool:
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            if any(e.get("method") == method for e in self.events):
                return True
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                return False
            self.event_seen.clear()
            try:
                await asyncio.wait_for(self.event_seen.wait(), left)
            except TimeoutError:
                return False

    async def close(self) -> None:
        await self.ws.close()
        self.reader.cancel()
        await asyncio.gather(self.reader, return_exceptions=True)


def _console_text(ev: dict[str, Any]) -> str:
    p = ev.get("params", {})
    if ev["method"] == "Runtime.consoleAPICalled":
        return " ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", []))
    if ev["method"] == "Log.entryAdded":
        e = p.get("entry", {})
        return f"{e.get('source')}: {e.get('text')} {e.get('url', '')}".strip()
    d = p.get("exceptionDetails", {})
    return (d.get("exception", {}) or {}).get("description") or d.get("text", "")


async def _launch(chromium: str, profile: str, width: int, height: int, timeout: float) -> tuple[subprocess.Popen, int]:
    args = [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--remote-debugging-address=127.0.0.1",
            "--remote-debugging-port=0", f"--window-size={width},{height}", "about:blank"]
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=open(os.path.join(profile, "chromium.log"), "wb"), start_new_session=True)
    port_file = Path(profile) / "DevToolsActivePort"
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        if proc.poll() is not None:
            log = Path(profile, "chromium.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"chromium exited with status {proc.returncode}: {log}")
        if port_file.exists():
            lines = port_file.read_text().split()
            if lines and lines[0].isdigit():
                return proc, int(lines[0])
        await asyncio.sleep(0.05)
    _kill(proc)
    raise TimeoutError(f"chromium did not open its DevTools port within {timeout:g} s")


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=5)


async def check_page(html_path: Path, *, chromium: str | None = None, width: int = 1400, height: int = 1000,
                     timeout: float = 30.0, screenshot: bool = False, screenshot_height: int | None = None,
                     screenshot_top: int = 0) -> PageCheck:
    """Load the file in headless Chromium; wait (bounded) until its figures are drawn."""
    chromium = chromium or find_chromium()
    if not chromium:
        raise FileNotFoundError("chromium not found (apt-get install chromium, or set AGENTLOAD_CHROMIUM)")
    url = Path(html_path).resolve().as_uri()
    result = PageCheck(url)
    with tempfile.TemporaryDirectory(prefix="agentload-chromium-") as profile:
        proc, port = await _launch(chromium, profile, width, height, timeout)
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as http:
                targets = []
                for _ in range(100):  # the first page target can take a moment to appear
                    async with http.get(f"http://127.0.0.1:{port}/json/list") as resp:
                        targets = [t for t in await resp.json() if t.get("type") == "page"]
                    if targets:
                        break
                    await asyncio.sleep(0.05)
                if not targets:
                    raise RuntimeError("chromium has no page target")
                ws = await http.ws_connect(targets[0]["webSocketDebuggerUrl"], max_msg_size=0,
                                           timeout=aiohttp.ClientWSTimeout(ws_close=5.0))
                dt = DevTools(ws)
                try:
                    await _inspect(dt, url, result, width, height, timeout, screenshot, screenshot_height,
                                   screenshot_top)
                finally:
                    try:
                        await asyncio.wait_for(dt.call("Browser.close", timeout=5.0), 5.0)
                    except Exception:
                        pass
                    await dt.close()
        finally:
            _kill(proc)
    return result


async def _inspect(dt: DevTools, url: str, result: PageCheck, width: int, height: int, timeout: float,
                   screenshot: bool, screenshot_height: int | None, screenshot_top: int) -> None:
    import json

    for domain in ("Runtime", "Log", "Page", "Network"):
        await dt.call(f"{domain}.enable")
    await dt.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1,
                  mobile=False)
    await dt.call("Page.navigate", url=url)
    if not await dt.wait_event("Page.loadEventFired", timeout):
        raise TimeoutError(f"{url} did not finish loading within {timeout:g} s")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    probe: dict[str, Any] = {}
    while True:
        r = await dt.call("Runtime.evaluate", expression=_PROBE_JS, returnByValue=True)
        probe = json.loads(r.get("result", {}).get("value") or "{}")
        if probe.get("expected", -1) > 0 and probe.get("drawn") == probe.get("expected"):
            break
        if loop.time() >= deadline:
            break
        await asyncio.sleep(0.1)
    # Give late errors (a failed redraw after layout) a moment to arrive: one more round trip.
    await dt.call("Runtime.evaluate", expression="new Promise(r => requestAnimationFrame(() => r(1)))",
                  awaitPromise=True)
    result.expected = probe.get("expected", -1)
    result.plots = probe.get("plots", 0)
    result.drawn = probe.get("drawn", 0)
    result.traces = probe.get("traces", [])
    result.ids = probe.get("ids", [])
    result.plotly_version = probe.get("plotly")
    result.height = probe.get("height", 0)
    result.width = probe.get("width", 0)
    for ev in dt.events:
        m = ev.get("method")
        if m == "Runtime.exceptionThrown":
            result.exceptions.append(_console_text(ev))
        elif m == "Runtime.consoleAPICalled" and ev["params"].get("type") in ("error", "assert"):
            result.console_errors.append(_console_text(ev))
        elif m == "Log.entryAdded" and ev["params"].get("entry", {}).get("level") == "error":
            result.console_errors.append(_console_text(ev))
        elif m == "Network.requestWillBeSent":
            req_url = ev["params"].get("request", {}).get("url", "")
            if not req_url.startswith(("file:", "data:", "blob:", "about:")):
                result.external_requests.append(req_url)
    if screenshot:
        full = result.height or height
        top = max(0, min(screenshot_top, full - 1))
        h = min(full - top, screenshot_height or full)
        await dt.call("Emulation.setDeviceMetricsOverride", width=width, height=full, deviceScaleFactor=1,
                      mobile=False)
        await dt.call("Runtime.evaluate", expression="new Promise(r => setTimeout(() => "
                      "requestAnimationFrame(() => r(1)), 300))", awaitPromise=True)
        shot = await dt.call("Page.captureScreenshot", timeout=timeout, format="png",
                             clip={"x": 0, "y": top, "width": width, "height": h, "scale": 1},
                             captureBeyondViewport=True)
        result.screenshot = base64.b64decode(shot["data"])


def check_page_sync(html_path: Path, **kw: Any) -> PageCheck:
    return asyncio.run(check_page(html_path, **kw))
