"""Peer tools beside agentload on the same bench server: `python -m bench.run --peers` (never in CI).

    python -m bench.run --install-peers     # once: a venv per peer under ~/.cache/agentload-bench/
    python -m bench.run --peers             # the main table, then the side-by-side table
    python -m bench.run --peers-only        # the side-by-side table alone

The peers, pinned versions, each in its own virtual environment (`--install-peers` makes them
from PyPI by name; the project's environment is never touched):

    aiperf 0.13.0           chat, streaming, synthetic prompts, `--concurrency`
    guidellm 0.8.1          chat, streaming, synthetic_text, the `concurrent` profile
    inference-perf 0.7.0    the legacy completions API, streaming (its synthetic prompt generator
                            offers no chat; the bench server answers /v1/completions in that
                            shape), the `concurrent` load type, one worker per client CPU;
                            needs Python >= 3.12, found on PATH or under pyenv
    locust 2.47.0           bench/locustfile.py: FastHttpUser, streamed chat completions, every
                            event parsed, closed loop (no wait time), `-u` users

The three LLM tools need a Hugging Face tokenizer; bench/tokenizer.py builds a small one offline
(with the `tokenizers` library of a peer's venv, trained on the Shakespeare text AIPerf and
inference-perf ship) into ~/.cache/agentload-bench/ (AGENTLOAD_BENCH_CACHE moves that folder), and
each tool gets that folder as its tokenizer path. Their synthetic prompts are sized to the mean
request body of the baseline and agentload rows. guidellm and inference-perf run with
HF_HUB_OFFLINE=1; aiperf without it (with it, aiperf 0.13 takes a local folder for a hub id and
fails), and loads an absolute tokenizer path from disk without asking the hub.

How a client is measured (the peers, and agentload and the baseline again, the same way):
- the bench server counts (GET /bench/stats, reset before each client): requests, completed
  streams, streams in progress, the most in progress at once, and the integral of that;
- the harness polls it every 0.05 s and, at the same instants, reads the CPU time (user + system,
  with the reaped children's) of the client's whole process tree from /proc/<pid>/stat;
- the active window runs from the first poll that sees a request to the first poll that sees
  the last completion: completions, CPU and the mean number of streams in progress are taken
  over that window only, so start-up (imports, tokenizer, prompt generation, worker processes)
  and the report at the end are not counted. The CPU outside the window is shown apart;
- a client whose most streams in progress at once stayed below the requested concurrency is
  flagged in the table.

Every client is pinned to the client CPU (like the main table), the harness to the server's CPU;
everything runs on 127.0.0.1 with bounded counts (concurrency x --rounds requests) and time, and
every process tree is killed at the end (its own process group).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from bench.harness import REPO, Server, pinned, took, tree_cpu

CACHE = Path(os.environ.get("AGENTLOAD_BENCH_CACHE") or Path.home() / ".cache" / "agentload-bench")
POLL_S = 0.05
NOT_INSTALLED = "not installed (python -m bench.run --install-peers)"


@dataclass(frozen=True)
class Peer:
    name: str
    spec: str  # what pip installs
    exe: str  # the command in the venv's bin/
    min_python: tuple[int, int] = (3, 10)
    tokenizer: bool = True  # needs the bench tokenizer


PEERS = [
    Peer("aiperf", "aiperf==0.13.0", "aiperf"),
    Peer("guidellm", "guidellm==0.8.1", "guidellm"),
    Peer("inference-perf", "inference-perf==0.7.0", "inference-perf", min_python=(3, 12)),
    Peer("locust", "locust==2.47.0", "locust", tokenizer=False),
]


def venv(peer: Peer) -> Path:
    return CACHE / peer.name


def _marker(peer: Peer) -> Path:
    return venv(peer) / "agentload-bench-installed"


def installed(peer: Peer) -> bool:
    m = _marker(peer)
    return (venv(peer) / "bin" / peer.exe).exists() and m.exists() and m.read_text().strip() == peer.spec


# ---------------------------------------------------------------- install

def _python_version(exe: str) -> tuple[int, int] | None:
    try:
        out = subprocess.run([exe, "-c", "import sys; print(*sys.version_info[:2])"], capture_output=True,
                             text=True, timeout=30, check=False)
        major, minor = out.stdout.split()
        return int(major), int(minor)
    except (OSError, ValueError, subprocess.SubprocessError):
        return None


def find_python(minimum: tuple[int, int]) -> str | None:
    """The oldest interpreter of at least `minimum` (below 3.14): this one if it is, else
    pythonX.Y on PATH, else one of pyenv's versions."""
    cands: list[str] = [sys.executable]
    for minor in range(minimum[1], 14):
        w = shutil.which(f"python{minimum[0]}.{minor}")
        if w:
            cands.append(w)
    root = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    if root.is_dir():
        found = [d for d in root.iterdir() if re.fullmatch(r"\d+\.\d+\.\d+", d.name) and (d / "bin" / "python3").exists()]
        for d in sorted(found, key=lambda d: tuple(int(x) for x in d.name.split("."))):
            cands.append(str(d / "bin" / "python3"))
    for exe in cands:
        v = _python_version(exe)
        if v is not None and minimum <= v < (3, 14):
            return exe
    return None


def install(names: list[str] | None = None) -> dict[str, str]:
    """Make (or update) each peer's venv; returns name -> 'ok' or why not."""
    CACHE.mkdir(parents=True, exist_ok=True)
    out: dict[str, str] = {}
    for peer in PEERS:
        if names and peer.name not in names:
            continue
        if installed(peer):
            print(f"install-peers: {peer.name}: {peer.spec} already in {venv(peer)}", flush=True)
            out[peer.name] = "ok"
            continue
        fresh = not (venv(peer) / "bin" / "pip").exists()
        py = find_python(peer.min_python) if fresh else str(venv(peer) / "bin" / "python")
        if py is None:
            out[peer.name] = f"needs Python >= {'.'.join(map(str, peer.min_python))}, none found"
            print(f"install-peers: {peer.name}: {out[peer.name]}", flush=True)
            continue
        log = CACHE / f"{peer.name}.install.log"
        print(f"install-peers: {peer.name}: {peer.spec} into {venv(peer)} (with {py}; log {log}) ...", flush=True)
        t0 = time.monotonic()
        with open(log, "wb") as f:
            steps = []
            if fresh:
                steps.append([py, "-m", "venv", str(venv(peer))])
            steps.append([str(venv(peer) / "bin" / "pip"), "install", "--disable-pip-version-check", peer.spec])
            code = 0
            for cmd in steps:
                try:
                    code = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=1800, check=False).returncode
                except subprocess.TimeoutExpired:
                    code = -1
                if code != 0:
                    break
        if code == 0 and (venv(peer) / "bin" / peer.exe).exists():
            _marker(peer).write_text(peer.spec + "\n")
            out[peer.name] = "ok"
            print(f"install-peers: {peer.name}: done in {time.monotonic() - t0:.0f} s", flush=True)
        else:
            tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["?"]
            out[peer.name] = f"install failed ({tail[0][:160]}; see {log})"
            print(f"install-peers: {peer.name}: {out[peer.name]}", flush=True)
    return out


# ---------------------------------------------------------------- tokenizer

def corpora() -> list[Path]:
    """The text files the installed peers draw synthetic prompts from (AIPerf's and inference-perf's
    Shakespeare), one of each content: the bench tokenizer's training text."""
    out: dict[str, Path] = {}
    for peer in PEERS:
        if peer.tokenizer and installed(peer):
            for path in sorted(venv(peer).glob("lib/python3*/site-packages/*/**/shakespeare.txt")):
                out.setdefault(hashlib.sha256(path.read_bytes()).hexdigest(), path)
    return list(out.values())


def tokenizer_dir() -> Path:
    """The bench tokenizer folder, built on first use with the `tokenizers` library of this
    interpreter or of an installed peer's venv."""
    from bench.tokenizer import fingerprint

    corpus = corpora()
    out = CACHE / f"tokenizer-{fingerprint(corpus)}"
    if (out / "tokenizer.json").exists() and (out / "tokenizer_config.json").exists():
        return out
    pythons = [sys.executable] + [str(venv(p) / "bin" / "python") for p in PEERS if p.tokenizer and installed(p)]
    for py in pythons:
        if subprocess.run([py, "-c", "import tokenizers"], capture_output=True, timeout=60, check=False).returncode != 0:
            continue
        CACHE.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix="tokenizer-", dir=CACHE))
        cmd = [py, "-m", "bench.tokenizer", "--out", str(tmp)]
        for path in corpus:
            cmd += ["--corpus", str(path)]
        p = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)),
                           timeout=300, check=False)
        if p.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            raise RuntimeError(f"bench tokenizer build failed: {p.stderr[-1000:]}")
        try:
            tmp.rename(out)
        except OSError:  # built meanwhile by another run
            shutil.rmtree(tmp, ignore_errors=True)
        return out
    raise RuntimeError("no Python with the `tokenizers` library to build the bench tokenizer "
                       "(python -m bench.run --install-peers installs the peers, which bring it)")


# ---------------------------------------------------------------- commands

@dataclass
class Job:
    """One client run: its command, environment additions and where its output goes."""

    name: str
    cmd: list[str]
    env: dict[str, str] = field(default_factory=dict)
    note: str = ""
    offline: bool = True  # HF_HUB_OFFLINE=1 and the like


BYTES_PER_TOKEN = 4.5  # of the peers' synthetic prompts with the bench tokenizer (their bodies land within 10%)


def prompt_tokens(body_bytes: int) -> int:
    """Synthetic prompt tokens for about `body_bytes` of request, like the baseline's and agentload's
    (the table's `body KB` column shows what each client sent)."""
    return max(16, int((body_bytes - 200) / BYTES_PER_TOKEN))


def peer_job(peer: Peer, base: str, conc: int, requests: int, body_bytes: int, chunks: int, tokenizer: Path | None,
             out: Path, client_cpus: int) -> Job:
    bin_ = venv(peer) / "bin"
    tok = str(tokenizer) if tokenizer else ""
    isl = prompt_tokens(body_bytes)
    if peer.name == "aiperf":
        return Job(peer.name, [str(bin_ / "aiperf"), "profile", "--model", "bench", "--tokenizer", tok, "--url", base,
                               "--endpoint-type", "chat", "--streaming", "--concurrency", str(conc),
                               "--request-count", str(requests), "--isl", str(isl), "--osl", str(chunks),
                               "--artifact-dir", str(out / "aiperf"), "--ui", "none", "--no-server-metrics",
                               "--no-gpu-telemetry"],
                   # aiperf 0.13 with HF_HUB_OFFLINE set looks a local tokenizer folder up in the hub's cache
                   # as if it were a hub id, and fails; without it an absolute path is loaded from disk
                   # (no hub query: aiperf treats an absolute path as local)
                   offline=False)
    if peer.name == "guidellm":
        return Job(peer.name, [str(bin_ / "guidellm"), "run",
                               "--backend", f"kind=openai_http,target={base},model=bench,request_format=/v1/chat/completions",
                               "--profile", f"kind=concurrent,streams={conc}",
                               "--constraint", f"kind=max_requests,count={requests}",
                               "--tokenizer", f"kind=huggingface_auto,model={tok}",
                               "--data", f"kind=synthetic_text,prompt_tokens={isl},output_tokens={chunks}",
                               "--output", f"kind=json,path={out / 'guidellm.json'}",
                               "--disable-console-interactive"])
    if peer.name == "inference-perf":
        cfg = out / "inference-perf.yml"
        cfg.write_text(f"""api:
  type: completion
  streaming: true
data:
  type: synthetic
  input_distribution: {{min: {isl}, max: {isl}, mean: {isl}, std_dev: 0, type: fixed}}
  output_distribution: {{min: {chunks}, max: {chunks}, mean: {chunks}, std_dev: 0, type: fixed}}
load:
  type: concurrent
  stages:
  - num_requests: {requests}
    concurrency_level: {conc}
  num_workers: {client_cpus}
server:
  type: vllm
  model_name: bench
  base_url: {base}
  ignore_eos: true
tokenizer:
  pretrained_model_name_or_path: {tok}
storage:
  local_storage:
    path: {out / 'inference-perf'}
""")
        return Job(peer.name, [str(bin_ / "inference-perf"), "-c", str(cfg)], note="completions API")
    if peer.name == "locust":
        return Job(peer.name, [str(bin_ / "locust"), "-f", str(REPO / "bench" / "locustfile.py"), "--headless",
                               "-u", str(conc), "-r", str(max(conc, 1000)), "-H", base, "--only-summary",
                               "--loglevel", "WARNING", "--run-time", "900s", "--stop-timeout", "5"],
                   env={"BENCH_REQUESTS": str(requests), "BENCH_BODY_BYTES": str(body_bytes)})
    raise ValueError(peer.name)


def own_jobs(url: str, conc: int, rounds: int, body_bytes: int, out: Path) -> list[Job]:
    """agentload and the baseline, measured the same way as the peers."""
    common = ["--url", url, "--concurrency", str(conc), "--requests", str(rounds)]
    return [Job("baseline", [sys.executable, "-m", "bench.baseline", *common, "--body-bytes", str(body_bytes),
                             "--parse", "json", "--result", str(out / "baseline.json")]),
            Job("agentload", [sys.executable, "-m", "bench.agentload_client", *common,
                              "--result", str(out / "agentload.json")])]


# ---------------------------------------------------------------- measuring

def _stats(base: str, path: str = "/bench/stats") -> dict[str, int]:
    from agentload.process import http_get

    status, body = http_get(base + path, timeout_s=5.0)
    if status != 200:
        raise RuntimeError(f"bench server {path}: {status}")
    return orjson.loads(body)


@dataclass
class Measured:
    name: str
    mode: str
    conc: int
    requests: int  # asked for
    exit: int | None = None
    timed_out: bool = False
    sent: int = 0  # requests the server received, whole run
    completed: int = 0  # streams the server finished, whole run
    aborted: int = 0
    window_s: float = 0.0
    window_completed: int = 0
    window_cpu_s: float = 0.0
    total_cpu_s: float = 0.0
    wall_s: float = 0.0
    max_active: int = 0
    mean_active: float = 0.0
    body_bytes: float = 0.0
    note: str = ""
    error: str = ""
    log: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and self.window_completed > 0 and self.window_cpu_s > 0

    @property
    def rps(self) -> float:
        return self.window_completed / self.window_s if self.window_s > 0 else 0.0

    @property
    def rps_core(self) -> float:
        return self.window_completed / self.window_cpu_s if self.window_cpu_s > 0 else 0.0

    @property
    def cpu(self) -> float:
        return self.window_cpu_s / self.window_s if self.window_s > 0 else 0.0

    @property
    def reached(self) -> bool:
        return self.max_active >= self.conc

    def as_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d.update(req_s=self.rps, req_s_per_core=self.rps_core, cpu=self.cpu, reached_concurrency=self.reached)
        return d


def measure(job: Job, mode: str, conc: int, requests: int, base: str, cpu: str | None, out: Path,
            timeout_s: float, rep: int = 1) -> Measured:
    from agentload.process import ChildProcess

    m = Measured(job.name, mode, conc, requests, note=job.note)
    _stats(base, "/bench/reset")
    log = out / f"{job.name}-{mode}-{conc}-{rep}.log"
    m.log = str(log)
    hf = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV") + hf}
    if job.offline:
        env.update(dict.fromkeys(hf, "1"))
    env.update(NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost", PYTHONUNBUFFERED="1", **job.env)
    if job.cmd[0] == sys.executable:  # ours: the project on the path
        env["PYTHONPATH"] = str(REPO)
    samples: list[tuple[float, dict[str, int], float]] = []
    t0 = time.monotonic()
    with open(log, "wb") as f:
        child = ChildProcess.start(pinned(job.cmd, cpu), name=job.name, env=env, cwd=str(out), stdout=f,
                                   stderr=subprocess.STDOUT, die_with_parent=True)
        try:
            while True:
                done = child.poll() is not None
                c = tree_cpu(child.pid)
                st = _stats(base)
                samples.append((st["now_ns"] / 1e9, st, c))
                if done:
                    break
                if time.monotonic() - t0 > timeout_s:
                    m.timed_out = True
                    break
                time.sleep(POLL_S)
            m.exit = child.poll()
        finally:
            child.stop(grace_s=5)
    m.wall_s = time.monotonic() - t0
    last = samples[-1][1]
    m.completed, m.aborted, m.max_active = last["completed"], last["aborted"], last["max_active"]
    m.sent = last["requests"]
    m.body_bytes = last["body_bytes"] / max(last["requests"], 1)
    m.total_cpu_s = max(s[2] for s in samples)
    start = next((i for i, s in enumerate(samples) if s[1]["requests"] > 0), None)
    end = next((i for i, s in enumerate(samples) if s[1]["completed"] == last["completed"]), None)
    if m.timed_out:
        m.error = f"timed out after {timeout_s:.0f} s"
    elif m.exit not in (0, None):
        m.error = f"exited {m.exit}"
    if start is None or end is None or last["completed"] == 0:
        m.error = m.error or "sent no request"
        return m
    if end <= start:  # everything between two polls: too short to measure
        m.error = m.error or f"run shorter than one poll ({POLL_S} s): use more --rounds"
        return m
    (ta, sa, ca), (tb, sb, cb) = samples[start], samples[end]
    m.window_s = tb - ta
    m.window_completed = sb["completed"] - sa["completed"]
    m.window_cpu_s = cb - ca
    m.mean_active = (sb["busy_ns"] - sa["busy_ns"]) / 1e9 / m.window_s if m.window_s > 0 else 0.0
    short = (f"sent {m.sent} of {requests} requests" if m.sent < requests
             else f"{m.completed} of {m.sent} completed" if m.completed < m.sent else "")
    if not m.error and short:
        m.note = ", ".join(x for x in (m.note, short) if x)
    return m


def _median(runs: list[Measured]) -> Measured:
    good = [r for r in runs if r.ok]
    if not good:
        return runs[-1]
    good.sort(key=lambda r: r.rps_core)
    return good[(len(good) - 1) // 2]


# ---------------------------------------------------------------- the table

def render(rows: list[Measured | tuple[str, str, int, str]]) -> str:
    head = ("mode", "conc", "client", "req/s", "CPU %", "req/s/core", "agentload x", "streams max/mean",
            "body KB", "CPU outside s", "note")
    lines = [head]
    ours: dict[tuple[str, int], Measured] = {}
    for r in rows:
        if isinstance(r, Measured) and r.name == "agentload" and r.ok:
            ours[(r.mode, r.conc)] = r
    for r in rows:
        if not isinstance(r, Measured):
            mode, name, conc, why = r
            lines.append((mode, str(conc), name, "-", "-", "-", "-", "-", "-", "-", why))
            continue
        if not r.ok:
            lines.append((r.mode, str(r.conc), r.name, "-", "-", "-", "-", "-", "-", "-",
                          f"failed: {r.error or 'no completion counted'} (log {r.log})"))
            continue
        a = ours.get((r.mode, r.conc))
        ratio = f"{a.rps_core / r.rps_core:.1f}" if (a is not None and a is not r) else ""
        notes = [] if r.reached else [f"DID NOT REACH {r.conc} STREAMS (max {r.max_active})"]
        if r.error:
            notes.append(r.error)
        if r.note:
            notes.append(r.note)
        lines.append((r.mode, str(r.conc), r.name, f"{r.rps:,.0f}", f"{100 * r.cpu:.0f}", f"{r.rps_core:,.0f}", ratio,
                      f"{r.max_active} / {r.mean_active:.1f}", f"{r.body_bytes / 1000:.1f}",
                      f"{max(0.0, r.total_cpu_s - r.window_cpu_s):.1f}", "; ".join(notes)))
    widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
    out = []
    for k, row in enumerate(lines):
        out.append("  ".join(c.ljust(w) if i in (0, 2, 10) else c.rjust(w)
                             for i, (c, w) in enumerate(zip(row, widths))).rstrip())
        if k == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def run_peers(a: Any, srv_cpu: str | None, cli_cpu: str | None) -> list[dict[str, Any]]:
    from bench.agentload_client import mean_body_bytes

    t_start = time.monotonic()
    concs = [int(c) for c in str(a.peer_conc).split(",") if c.strip()]
    modes = [("paced", a.interval_ms), ("burst", 0.0)]
    missing = {p.name: NOT_INSTALLED for p in PEERS if not installed(p)}
    ready = [p for p in PEERS if p.name not in missing]
    tok: Path | None = None
    if any(p.tokenizer for p in ready):
        try:
            tok = tokenizer_dir()
        except RuntimeError as e:
            for p in ready:
                if p.tokenizer:
                    missing[p.name] = f"no tokenizer: {e}"
            ready = [p for p in ready if p.name not in missing]
    out = Path(tempfile.mkdtemp(prefix="agentload-peers-"))
    client_cpus = len(cli_cpu.split(",")) if cli_cpu else (os.cpu_count() or 1)
    print(f"\npeers: {', '.join(p.name + ' ' + p.spec.split('==')[1] for p in ready) or 'none installed'}"
          + (f"; not run: {', '.join(missing)}" if missing else "")
          + f"; tokenizer {tok or '-'}; logs and outputs in {out}", flush=True)
    print(f"peers: each client alone on the client CPU, {a.rounds} requests per stream, measured in its active "
          f"window (completions counted by the server, CPU of its process tree over the same window), "
          f"{'median of ' + str(a.peer_reps) + ' runs by req/s/core' if a.peer_reps > 1 else 'one run each'}",
          flush=True)
    harness_cpu = None
    if srv_cpu is not None and hasattr(os, "sched_setaffinity"):  # the polling harness off the client's core
        harness_cpu = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {int(c) for c in srv_cpu.split(",")})
    rows: list[Measured | tuple[str, str, int, str]] = []
    try:
        for conc in concs:
            requests = conc * a.rounds
            body = mean_body_bytes(conc, a.rounds, [])
            for mode, interval in modes:
                with Server(srv_cpu, a.ttft_ms, a.chunks, interval) as srv:
                    base = srv.url.removesuffix("/v1")
                    mdir = out / f"{mode}-{conc}"
                    mdir.mkdir()
                    jobs = own_jobs(srv.url, conc, a.rounds, body, mdir)
                    jobs += [peer_job(p, base, conc, requests, body, a.chunks, tok, mdir, client_cpus) for p in ready]
                    runs: dict[str, list[Measured]] = {j.name: [] for j in jobs}
                    # fast ones: within seconds; a slow peer at 15x the CPU: still bounded
                    timeout_s = 300 + requests / 20
                    for rep in range(a.peer_reps):  # alternate, so drift on a shared machine hits all alike
                        for job in jobs:
                            m = measure(job, mode, conc, requests, base, cli_cpu, mdir, timeout_s, rep + 1)
                            runs[job.name].append(m)
                            print(render([m]).splitlines()[-1]
                                  + (f"   (run {rep + 1} of {a.peer_reps})" if a.peer_reps > 1 else ""), flush=True)
                    for job in jobs:
                        rows.append(_median(runs[job.name]))
                    for name, why in missing.items():
                        rows.append((mode, name, conc, why))
    finally:
        if harness_cpu is not None:
            os.sched_setaffinity(0, harness_cpu)
    spent = time.monotonic() - t_start
    print()
    print(render(rows))
    print(f"peers: took {took(spent)}; 'agentload x' = agentload's req/s/core / the row's; streams = the most "
          f"in progress at once at the server / the mean over the window; CPU outside = the client's CPU seconds "
          f"before and after its active window (start-up, report)", flush=True)
    return [r.as_dict() if isinstance(r, Measured) else {"mode": r[0], "client": r[1], "concurrency": r[2],
                                                         "skipped": r[3]} for r in rows]


if __name__ == "__main__":
    sys.exit("run it through: python -m bench.run --peers (or --install-peers)")
