"""What a request costs in instructions and (simulated) cache misses, agentload against the raw loop.

    python -m bench.callgrind                        # burst rows at 8 and 64 streams (about 30 minutes)
    python -m bench.callgrind --rows burst:8 --no-cache-sim    # instructions only, faster
    python -m bench.callgrind --rows burst:8 --apis messages,responses --code /tmp/before   # + the same, other code

Timings on a shared 2-core VM move by 10-30% from one minute to the next, and this VM has no
hardware counters (`perf stat` says "not supported"). valgrind's callgrind counts the instructions a
process executes, the same count for the same work whatever else the machine does, and with
`--cache-sim` simulates its L1/last-level cache and branch predictor. Each client (the baseline of
`bench/run.py` and agentload's run, without its report) runs under callgrind twice on the same
server, for `R1` and `R2` rounds: the difference of the two counts is the cost of the requests the
longer run made more, in the steady state, without start-up, imports and teardown.

A run also does work by the clock, not by the request: agentload's watchdog, sampler and lag
probe run every second (0.6-0.7 M instructions a second with 8 or 64 agents), and under valgrind a
second holds far fewer requests than in a native run, so that work would be counted as the
requests'. Each client therefore also runs twice against a second server that waits `--idle-ms`
before its first token (1 and 2 rounds: a few requests and a long wait), and for every count the
two differences (main: N requests in W seconds; idle: n requests in w seconds) are solved for a
cost per request c and per second r (N c + W r, n c + w r): c is what the table shows, r the
`Ir/s` column. That takes an idle pair that is mostly waiting (its n requests, at the main pair's
pace, at most a third of its w seconds); where it is not, the row keeps the plain difference, shows
`-` for Ir/s and says so under the table.

Per request it prints: instructions (Ir), L1 instruction-cache misses (I1), L1 data-cache misses
(D1, reads and writes), last-level misses (LL), mispredicted branches (Bm), and kcachegrind's cycle
estimate CEst = Ir + 10 Bm + 10 L1 misses + 100 LL misses (a model, not a measurement: it says where
two clients that execute about as many instructions part ways). The agentload run's bodies grow round
after round; the baseline is given the mean body agentload sends in rounds R1+1..R2.

`--apis`: the rows of each API, as in `bench/run.py` (the raw loop reading that API's stream to its
terminal event against agentload with `target.api` set). `--code DIR`: also agentload with its package
imported from DIR (a git archive of another commit), on the same server: the A/B of a change.

Under valgrind a client runs some 50-100x slower while the server does not, so more of each answer
waits in the socket per read than in a native run: the counts are those of a busier client than the
same row of `bench/run.py`. Needs `valgrind` (Debian's package); without it, it says so and exits 2.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.harness import REPO, Server, bench_env, cpus, machine, pinned


def read_summary(path: Path) -> dict[str, int]:
    """The `events:` and `summary:` lines of a callgrind output file, as {event: count}."""
    names: list[str] = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("events:"):
            names = line.split()[1:]
        elif line.startswith("summary:") and names:
            return dict(zip(names, (int(v) for v in line.split()[1:])))
    raise ValueError(f"{path}: no events/summary lines (not a callgrind output file?)")


def per_request(short: dict[str, int], long: dict[str, int], requests: int) -> dict[str, float]:
    """The counts of the requests the longer run made more, per request, and the derived sums."""
    return _derived({k: (long[k] - short.get(k, 0)) / requests for k in long})


def split_clock(main: tuple[dict[str, int], dict[str, int], int, float],
                idle: tuple[dict[str, int], dict[str, int], int, float]) -> tuple[dict[str, float], dict[str, float]]:
    """Per-request and per-second counts from two pairs of runs, each (short, long, extra requests,
    extra seconds): for every event, D = requests x c + seconds x r in both pairs, solved for c and r."""
    (s1, l1, n1, w1), (s2, l2, n2, w2) = main, idle
    det = n1 * w2 - n2 * w1
    if det <= 0:
        raise ValueError(f"the idle pair must take longer per request than the main pair "
                         f"(main {n1} requests in {w1:.1f} s, idle {n2} in {w2:.1f} s): raise --idle-ms")
    c, r = {}, {}
    for k in l1:
        d1, d2 = l1[k] - s1.get(k, 0), l2.get(k, 0) - s2.get(k, 0)
        c[k] = (d1 * w2 - d2 * w1) / det
        r[k] = (n1 * d2 - n2 * d1) / det
    return _derived(c), r


def clock_separable(main: tuple[Any, Any, int, float], idle: tuple[Any, Any, int, float]) -> bool:
    """Can the idle pair tell the clock's share apart? Only if its requests, at the main pair's
    pace, take at most a third of its time: otherwise both pairs are mostly requests, and the noise
    of a few per cent in either count comes out as a per-second cost of any size or sign."""
    (_, _, n1, w1), (_, _, n2, w2) = main, idle
    return 3 * n2 * w1 <= n1 * w2


def _derived(d: dict[str, float]) -> dict[str, float]:
    if "I1mr" in d:
        d["D1"] = d["D1mr"] + d["D1mw"]
        d["LL"] = d["ILmr"] + d["DLmr"] + d["DLmw"]
        d["Bm"] = d["Bcm"] + d["Bim"]
        d["CEst"] = d["Ir"] + 10 * d["Bm"] + 10 * (d["I1mr"] + d["D1"]) + 100 * d["LL"]
    return d


def bare_agentload(url: str, conc: int, rounds: int, api: str = "chat") -> int:
    """agentload's run as bench/agentload_client.py makes it, minus reading the records back and
    the summary (their cost grows with the records, and would be counted as the requests').
    Returns the records written."""
    from agentload.run.executor import prepare
    from agentload.run.runner import InProcess
    from bench.agentload_client import bench_scenario

    sc = bench_scenario(url, conc, rounds, api_sets(api))
    with tempfile.TemporaryDirectory(prefix="agentload-callgrind-") as d:
        out = Path(d) / "run"
        asyncio.run(InProcess().run(prepare(sc, out, url, embedded_mock=False, install_signals=False)))
        with open(out / "records.jsonl", "rb") as f:
            return sum(1 for _ in f)


def api_sets(api: str) -> list[str]:
    """The scenario overrides of an API's agentload rows (none for chat)."""
    return [] if api == "chat" else [f'target.api="{api}"']


def _callgrind(cmd: list[str], out: Path, cpu: str | None, cache_sim: bool,
               timeout_s: float, code: Path | None = None) -> tuple[dict[str, int], float]:
    """The counts of one run under callgrind, and its wall-clock seconds."""
    import subprocess
    import time

    vg = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]
    if cache_sim:
        vg += ["--cache-sim=yes", "--branch-sim=yes"]
    t0 = time.perf_counter()
    p = subprocess.run(pinned(vg + cmd, cpu), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, env=bench_env(code), cwd=REPO, timeout=timeout_s, check=False)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} under callgrind failed ({p.returncode}): "
                           f"{p.stderr.decode(errors='replace')[-1500:]}")
    return read_summary(out), wall


def measure(mode: str, conc: int, r1: int, r2: int, cache_sim: bool, ttft_ms: float, chunks: int,
            interval_ms: float, idle_ms: float, notes: list[str], api: str = "chat",
            code: Path | None = None) -> dict[str, tuple[dict[str, float], dict[str, float]]]:
    """Both clients on one server (and on the idle one): {client: (per request, per second)};
    where the clock's share could not be told apart, a line in `notes`."""
    py = sys.executable
    srv_cpu, cli_cpu = cpus()
    from bench.agentload_client import mean_body_bytes

    body = mean_body_bytes(conc, r2, api_sets(api), first_round=r1 + 1)
    res: dict[str, tuple[dict[str, float], dict[str, float]]] = {}
    budget = 900 + 60 * r2 * conc * (ttft_ms + chunks * interval_ms) / 1000.0 + 4 * idle_ms / 1000.0
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="agentload-callgrind-"))
        plan = [(stack.enter_context(Server(srv_cpu, ttft_ms, chunks, interval_ms)), (r1, r2), "main")]
        if idle_ms > 0:
            plan.append((stack.enter_context(Server(srv_cpu, idle_ms, chunks, interval_ms)), (1, 2), "idle"))
        clients = ["baseline", "agentload"] + (["agentload (--code)"] if code is not None else [])
        for client in clients:
            pairs = []
            for server, (a, b), tag in plan:
                runs = []
                for rounds in (a, b):
                    if client == "baseline":
                        cmd = [py, "-m", "bench.baseline", "--url", server.url, "--concurrency", str(conc),
                               "--requests", str(rounds), "--body-bytes", str(body), "--api", api,
                               "--result", str(Path(tmp) / "result.json")]
                    else:
                        cmd = [py, "-m", "bench.callgrind", "--bare-agentload", server.url, str(conc), str(rounds),
                               api]
                    runs.append(_callgrind(cmd, Path(tmp) / f"{client.split()[-1].strip('(-)')}.{tag}.{rounds}.out",
                                           cli_cpu, cache_sim, budget, code if client.endswith("(--code)") else None))
                (short, w_short), (long, w_long) = runs
                pairs.append((short, long, conc * (b - a), w_long - w_short))
            if len(pairs) == 2 and clock_separable(pairs[0], pairs[1]):
                res[client] = split_clock(pairs[0], pairs[1])
            else:  # the clock's share stays in the per-request figure (Ir/s: "-")
                if len(pairs) == 2:
                    notes.append(f"{mode}{'' if api == 'chat' else ' ' + api} {conc} {client}: the idle pair ({pairs[1][2]} requests in "
                                 f"{pairs[1][3]:.0f} s) could not separate the per-second work from "
                                 f"{pairs[0][2]} requests in {pairs[0][3]:.0f} s; raise --idle-ms")
                short, long, n, _ = pairs[0]
                res[client] = (per_request(short, long, n), {})
    return res


def render(rows: list[tuple[str, int, str, dict[str, float], dict[str, float]]]) -> str:
    sim = "I1mr" in rows[0][3] if rows else False
    head = ["mode", "conc", "client", "Ir/req"] + (["I1/req", "D1/req", "LL/req", "Bm/req", "CEst/req"] if sim else []) \
        + ["Ir ratio"] + (["CEst ratio"] if sim else []) + ["Ir/s"]
    lines = [head]
    base: dict[tuple[str, int], dict[str, float]] = {}
    for mode, conc, client, d, per_s in rows:
        if client == "baseline":
            base[(mode, conc)] = d
        b = base.get((mode, conc))
        cells = [mode, str(conc), client, f"{d['Ir']:,.0f}"]
        if sim:
            cells += [f"{d[k]:,.0f}" for k in ("I1mr", "D1", "LL", "Bm", "CEst")]
        mine = b is not None and b is not d
        # baseline / client: above 1.0 the client does the request with less (as ratio/core in bench.run)
        cells.append(f"{b['Ir'] / d['Ir']:.2f}" if mine else "")
        if sim:
            cells.append(f"{b['CEst'] / d['CEst']:.2f}" if mine else "")
        cells.append(f"{per_s['Ir']:,.0f}" if per_s else "-")
        lines.append(cells)
    widths = [max(len(r[i]) for r in lines) for i in range(len(head))]
    out = []
    for k, r in enumerate(lines):
        out.append("  ".join(c.ljust(w) if i in (0, 2) else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
        if k == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--bare-agentload"]:  # the child: python -m bench.callgrind --bare-agentload URL CONC ROUNDS API
        url, conc, rounds = argv[1], int(argv[2]), int(argv[3])
        n = bare_agentload(url, conc, rounds, argv[4] if len(argv) > 4 else "chat")
        if n != conc * rounds:
            raise SystemExit(f"agentload wrote {n} records, expected {conc * rounds}")
        return 0
    ap = argparse.ArgumentParser(prog="python -m bench.callgrind", description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default="burst:8,burst:64",
                    help="comma-separated mode:concurrency (mode paced or burst), default %(default)s")
    ap.add_argument("--rounds", default="10,30", help="R1,R2: rounds of the short and the long run (%(default)s)")
    ap.add_argument("--no-cache-sim", action="store_true", help="instructions only (about twice as fast)")
    ap.add_argument("--apis", default="chat", help="the APIs of the rows, comma list of chat, messages, responses "
                                                   "(each API's rows: its raw loop and agentload with target.api set)")
    ap.add_argument("--code", type=Path, default=None,
                    help="also agentload with its package imported from this folder (e.g. a git archive of an "
                         "earlier commit: mkdir /tmp/before && git archive REV agentload | tar -x -C /tmp/before)")
    ap.add_argument("--ttft-ms", type=float, default=50.0)
    ap.add_argument("--chunks", type=int, default=32)
    ap.add_argument("--interval-ms", type=float, default=5.0, help="between chunks in the paced rows")
    ap.add_argument("--idle-ms", type=float, default=30000.0,
                    help="the idle server's time to the first token (%(default)s): the clock's share; "
                         "0: not measured (faster; per-second work then counts in the per-request figures)")
    a = ap.parse_args(argv)
    if shutil.which("valgrind") is None:
        print("bench.callgrind: valgrind is not installed (Debian: apt-get install valgrind)", file=sys.stderr)
        return 2
    try:
        r1, r2 = (int(x) for x in a.rounds.split(","))
        plan = [(m.strip(), int(c)) for m, c in (x.split(":") for x in a.rows.split(",") if x.strip())]
        apis = [x.strip() for x in a.apis.split(",") if x.strip()]
    except ValueError:
        print(f"bench.callgrind: --rounds R1,R2 (two whole numbers) and --rows mode:conc,... expected "
              f"(got --rounds {a.rounds!r}, --rows {a.rows!r})", file=sys.stderr)
        return 2
    if not 0 < r1 < r2 or any(m not in ("paced", "burst") or c < 1 for m, c in plan):
        print("bench.callgrind: need 0 < R1 < R2, modes paced or burst, concurrency >= 1", file=sys.stderr)
        return 2
    if not apis or any(x not in ("chat", "messages", "responses") for x in apis):
        print(f"bench.callgrind: --apis: a comma list of chat, messages, responses expected (got {a.apis!r})",
              file=sys.stderr)
        return 2
    print(f"machine: {machine()}")
    print(f"callgrind{' with cache and branch simulation' if not a.no_cache_sim else ''}; the counts of "
          f"{r1} and {r2} rounds" + (f", and of 1 and 2 rounds against a server that waits {a.idle_ms:g} ms, "
                                     f"split into per request (/req) and per second (/s)" if a.idle_ms > 0 else
                                     " (per request, the per-second work included: --idle-ms 0)"), flush=True)
    rows = []
    notes: list[str] = []
    for mode, conc in plan:
        for api in apis:
            row = mode if api == "chat" else f"{mode} {api}"
            try:
                res = measure(mode, conc, r1, r2, not a.no_cache_sim, a.ttft_ms, a.chunks,
                              a.interval_ms if mode == "paced" else 0.0, a.idle_ms, notes, api, a.code)
            except ValueError as e:
                print(f"bench.callgrind: {row} {conc}: {e}", file=sys.stderr)
                return 1
            rows += [(row, conc, client, per_req, per_s) for client, (per_req, per_s) in res.items()]
            print(f"  {row} {conc}: done", flush=True)
    print(render(rows))
    for line in notes:
        print("note: " + line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
