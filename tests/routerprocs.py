"""Start vllm-router (PyPI `vllm-router`, a Rust router; not vLLM's production-stack router) on
loopback in front of mock backends, for tests/test_vllm_router.py.

Started on free ports and waited for (GET /readiness: `healthy_workers`) by
`agentload.process.start_listening`. The `vllm-router` console script is a Python launcher that
runs the Rust router in a child process (`vllm::router`): `stop()` kills the whole process group,
so both go (PR_SET_PDEATHSIG covers only the launcher).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from agentload.process import Listening, start_listening
from serverprocs import Server
from smgproc import RouterProcess, executable

READY_TIMEOUT_S = 45.0


def skip_reason(name: str, install: str) -> str | None:
    """Why a router test may skip here: only when the router is missing AND `CI` is unset (in CI
    a missing router is a failure: .ci/run installs it)."""
    if executable(name) is not None:
        return None
    if os.environ.get("CI"):
        return None  # the fixture then fails loudly
    return f"`{name}` is missing ({install}; .ci/run installs it)"


class VllmRouterProcess(RouterProcess):
    NAME = "vllm-router"

    @classmethod
    def command(cls, exe: str, port: int, prom: int, worker_urls: list[str], extra: list[str]) -> list[str]:
        return [exe, "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *worker_urls,
                "--policy", "round_robin", "--prometheus-host", "127.0.0.1", "--prometheus-port", str(prom),
                "--worker-startup-check-interval", "1", "--log-level", "warning", *extra]


# ---------------------------------------------------------------- LiteLLM's proxy

# LiteLLM's proxy lives in a venv of its own (`litellm[proxy]` would change ~50 packages of the main
# environment); .ci/run creates it. Pinned: the package list names a compromised 1.107.0.
LITELLM_VERSION = "1.108.7"
LITELLM_VENV = Path(os.environ.get("AGENTLOAD_LITELLM_VENV") or Path.home() / ".cache" / "agentload-routers" / "litellm")
LITELLM_READY_TIMEOUT_S = 120.0  # ~8 s here on 2 cores; importing the proxy is slow on a busy machine


def litellm_executable() -> str | None:
    exe = LITELLM_VENV / "bin" / "litellm"
    return str(exe) if exe.is_file() and os.access(exe, os.X_OK) else None


def litellm_skip_reason() -> str | None:
    """Skip only when the venv is missing AND `CI` is unset (.ci/run creates it: in CI it must be there)."""
    if litellm_executable() is not None or os.environ.get("CI"):
        return None
    return (f"LiteLLM's proxy is missing ({LITELLM_VENV}/bin/litellm: python3 -m venv {LITELLM_VENV} && "
            f"{LITELLM_VENV}/bin/pip install 'litellm[proxy]=={LITELLM_VERSION}' 'prometheus-client==0.26.0'; "
            f".ci/run does it)")


class LiteLLMProcess(Server):
    """`litellm --config FILE --host 127.0.0.1 --port P`: one model name (`model`) with one
    deployment per backend (`openai/<model>` at `<backend>/v1`), a master key, and
    `callbacks: ["prometheus"]` (without it /metrics is 404). /metrics answers 401 without the key
    and 307 -> /metrics/ with it; `metrics_url` is /metrics/ itself. Ready when /health/readiness
    answers 200."""

    def __init__(self, started: Listening, config_path: Path, master_key: str):
        super().__init__(started)
        self.config_path = config_path
        self.master_key = master_key

    @property
    def metrics_url(self) -> str:
        return self.base + "/metrics/"

    @staticmethod
    def config(backends: list[str], model: str, master_key: str, params: dict[str, Any] | None = None,
               router_settings: dict[str, Any] | None = None, models: list[str] | None = None) -> dict[str, Any]:
        """The proxy's config (YAML; JSON is YAML): one deployment per backend, of `model` (or of
        `models[i]` for backend i). `params` go into every deployment's litellm_params (e.g.
        {"timeout": 3, "stream_timeout": 3})."""
        names = models or [model] * len(backends)
        return {
            "model_list": [{"model_name": name,
                            "litellm_params": {"model": f"openai/{name}", "api_base": b.rstrip("/") + "/v1",
                                               "api_key": "none", **(params or {})}}
                           for b, name in zip(backends, names, strict=True)],
            "litellm_settings": {"callbacks": ["prometheus"]},
            "router_settings": {"num_retries": 0, **(router_settings or {})},
            "general_settings": {"master_key": master_key},
        }

    @classmethod
    def start(cls, backends: list[str], workdir: Path, master_key: str, model: str = "mock-model",
              params: dict[str, Any] | None = None, router_settings: dict[str, Any] | None = None,
              models: list[str] | None = None, ready_timeout_s: float = LITELLM_READY_TIMEOUT_S
              ) -> "LiteLLMProcess":
        exe = litellm_executable()
        if exe is None:
            raise FileNotFoundError(f"LiteLLM's proxy not found at {LITELLM_VENV}/bin/litellm (.ci/run installs it)")
        workdir.mkdir(parents=True, exist_ok=True)
        config_path = workdir / "litellm.yaml"
        config_path.write_text(json.dumps(cls.config(backends, model, master_key, params, router_settings, models),
                                          indent=1))
        # the model cost map from the package, not fetched from the internet (3 failed tries: ~10 s)
        env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_TELEMETRY": "False",
               "NO_PROXY": "127.0.0.1,localhost"}
        started = start_listening(
            lambda ports: [exe, "--config", str(config_path), "--host", "127.0.0.1", "--port", str(ports[0])],
            lambda ports: [f"http://127.0.0.1:{ports[0]}/health/readiness"], name="litellm",
            log_path=workdir / "litellm.log", timeout_s=ready_timeout_s, env=env, cwd=workdir)
        return cls(started, config_path, master_key)

    def get(self, path: str, key: bool = True, timeout_s: float = 5.0) -> tuple[int, bytes]:
        """GET on the proxy, with the master key as bearer token unless `key` is False."""
        import urllib.error
        import urllib.request

        req = urllib.request.Request(self.base + path,
                                     headers={"Authorization": f"Bearer {self.master_key}"} if key else {})
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(req, timeout=timeout_s) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()
