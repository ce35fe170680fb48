"""Optional rows for peer tools, where installed: `python -m bench.run --peers` (never in CI).

Each peer runs on the same bench server and the same CPU as the clients, for about the same
number of requests (concurrency x rounds of the burst and paced rows at 64), and its process
CPU time (user + system, from rusage of the child) gives requests/s per core like the other
rows. Their own latency figures are in their output folders under the log directory printed;
they do not read the server's send stamp, so no timing-error column for them.

Both need a tokenizer for their synthetic prompts and this machine has no model hub: point
BENCH_TOKENIZER at a local Hugging Face tokenizer folder (one with tokenizer.json), e.g. one
copied from a machine that has it. Without it the peers are skipped.

    pip install guidellm aiperf        # where the registry and disk allow; not a dependency
    BENCH_TOKENIZER=/path/to/tokenizer python -m bench.run --peers
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any


def _commands(url: str, conc: int, requests: int, tokenizer: str, out: str) -> dict[str, list[str]]:
    base = url.removesuffix("/v1")
    return {
        "guidellm": ["guidellm", "benchmark", "--target", base, "--model", "bench", "--processor", tokenizer,
                     "--rate-type", "concurrent", "--rate", str(conc), "--max-requests", str(requests),
                     "--data", "prompt_tokens=500,output_tokens=32", "--output-path", os.path.join(out, "guidellm.json")],
        "aiperf": ["aiperf", "profile", "--model", "bench", "--tokenizer", tokenizer, "--url", base,
                   "--endpoint-type", "chat", "--streaming", "--concurrency", str(conc), "--request-count", str(requests),
                   "--synthetic-input-tokens-mean", "500", "--output-tokens-mean", "32",
                   "--artifact-dir", os.path.join(out, "aiperf")],
    }


def run_peers(a: Any, srv_cpu: str | None, cli_cpu: str | None) -> list[dict[str, Any]]:
    from bench.run import Server, _pinned

    tokenizer = os.environ.get("BENCH_TOKENIZER")
    found = [name for name in ("guidellm", "aiperf") if shutil.which(name)]
    if not found:
        print("\npeers: none of guidellm, aiperf is installed; skipped")
        return []
    if not tokenizer or not os.path.isdir(tokenizer):
        print(f"\npeers: {', '.join(found)} installed, but BENCH_TOKENIZER is not a local tokenizer folder; skipped")
        return []
    out = tempfile.mkdtemp(prefix="agentload-peers-")
    print(f"\npeers ({', '.join(found)}); their logs and outputs in {out}")
    rows = []
    conc, requests = 64, 64 * a.rounds
    for mode, interval in (("paced", a.interval_ms), ("burst", 0.0)):
        with Server(srv_cpu, a.ttft_ms, a.chunks, interval) as srv:
            for name, cmd in _commands(srv.url, conc, requests, tokenizer, out).items():
                if name not in found:
                    continue
                r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
                t0 = time.perf_counter()
                with open(os.path.join(out, f"{name}-{mode}.log"), "wb") as log:
                    p = subprocess.run(_pinned(cmd, cli_cpu), stdout=log, stderr=subprocess.STDOUT,
                                       env=dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1"),
                                       timeout=1800)
                wall = time.perf_counter() - t0
                r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
                row = {"client": name, "mode": mode, "concurrency": conc, "requests": requests, "exit": p.returncode,
                       "wall_s": wall, "cpu_s": cpu, "req_s_per_core_incl_startup": requests / max(cpu, 1e-9)}
                rows.append(row)
                print(f"{mode:5s}  {conc:4d}  {name:10s}  exit {p.returncode}  {wall:.1f} s wall  {cpu:.1f} s CPU  "
                      f"{row['req_s_per_core_incl_startup']:,.0f} req/s/core (start-up included)", flush=True)
    return rows


if __name__ == "__main__":
    sys.exit("run it through: python -m bench.run --peers")
