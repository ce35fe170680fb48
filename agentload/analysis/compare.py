"""The math of `agentload compare`: a pure function over run folders.

`compare_dirs` rebuilds every number from each run's records.jsonl and run.json, refuses runs
whose workload fingerprints differ unless forced, and marks the best value per row. Rendering is
in agentload.report.compare_text and compare_html; running the variants in agentload.compare.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any, NoReturn

import orjson
from hdrh.histogram import HdrHistogram

from agentload.analysis.passes import one_pass
from agentload.analysis.stats import (
    SparseHistogram,
    fmt_ms,
    histogram_of,
    percentiles_ms,
)
from agentload.analysis.summary import SummaryPass, build_summary
from agentload.analysis.verdict import Facts, is_failed_reuse
from agentload.errors import UserError
from agentload.records import Record
from agentload.records.phases import COMPARE_CDF_PHASES, COMPARE_PHASES
from agentload.records.rundir import RunData, load_run

LEGEND_BEST = "* best value in its row (nothing is marked when every run has the same value)"


LEGEND_PHASES = ("phases: p50 / p99 in ms over every agent request (e2e: completed requests only); "
                 "pool_wait 0.00 = a slot was free at once")


LEGEND_STALE = ("stale-conn errors: a disconnect-class error (ServerDisconnectedError, ClientOSError, ...) on a "
                "reused keep-alive connection before response headers; aiohttp does not retry these POSTs")


LEGEND_REUSE = ("keep-alive reuse: requests sent on a reused connection / requests that got a connection; "
                "connections opened: new connections the agents' pool(s) made (fewer is better)")


LEGEND_FORCE_CLOSE = ("force_close=true: HTTP/1.1 with a fresh connection per request (no keep-alive reuse, "
                      "every request pays connect)")


LEGEND_ROUTER = ("router rows: cache hit rate = cached / prompt tokens of the requests that report cached tokens; "
                 "stickiness = consecutive rounds of a conversation sent to the backend of the round before; "
                 "first token = request sent -> first token, by round; fault N: seconds from the fault's start to the "
                 "router's last request to that backend (never: it kept routing there), and from the fault's end "
                 "to its first request there again (never: it did not use it again)")


COMPARE_VERSION = 1


PHASE_ROWS = COMPARE_PHASES  # the phase table's `compare` rows


FINGERPRINT_SECTIONS = ("agents", "conversation", "mock")


SETTING_SECTIONS = ("client", "stall")


is_stale_error = is_failed_reuse  # (the verdict's one definition, under the name compare's rows use)


def _phase(summary: dict[str, Any], phase: str, q: str) -> float | None:
    ph = (summary.get("phases") or {}).get(phase)
    return None if not ph else ph.get(f"{q}_ms")


class CompareTally:
    """The counts a comparison row needs beyond summary.json, from the same pass over the records."""

    def __init__(self) -> None:
        self.requests = self.completed = self.stalls = self.errors = 0
        self.connections_opened = 0

    def add(self, r: Record) -> None:
        if r.kind != "agent":
            return
        self.requests += 1
        self.completed += r.outcome == "ok"
        self.stalls += bool(r.stalled_phase)
        self.errors += r.outcome == "error"
        self.connections_opened += "conn_end" in r.t


def measure_run(data: RunData) -> tuple[dict[str, Any], dict[str, Any], dict[str, list[float]]]:
    """One pass over a run's records: its compare rows, its summary (verdict) and the quantiles
    of its CDF phases."""
    sp, tally = SummaryPass(data), CompareTally()
    one_pass(data, [sp, tally])
    summary = build_summary(data, sp)
    errors = Facts(data, sp.facts).errors  # the failed agent requests, in the requests' order
    agents_cfg = (data.meta.get("scenario") or {}).get("agents") or {}
    m: dict[str, Any] = {
        "verdict": summary["verdict"].get("kind"),
        "rounds_completed": summary["totals"].get("rounds_completed", 0),
        "rounds_planned": int(agents_cfg.get("count", 0)) * int(agents_cfg.get("rounds", 0)),
        "requests": tally.requests,
        "completed": tally.completed,
        "stalls": tally.stalls,
        "errors": tally.errors,
        "stale_errors": sum(1 for r in errors if is_stale_error(r)),
        "connections_opened": tally.connections_opened,
        "reuse_rate": summary["connections"]["reuse_rate"],
        "duration_s": summary["run"].get("duration_s"),
    }
    for p in PHASE_ROWS:
        m[f"{p}_p50_ms"] = _phase(summary, p, "p50")
        m[f"{p}_p99_ms"] = _phase(summary, p, "p99")
    m["error_classes"] = dict(Counter(r.error for r in errors).most_common())
    if summary.get("router"):
        m.update(router_metrics(summary["router"]))
    m.update(group_metrics(summary.get("groups") or {}))
    hists = sp.rounds.overall.hists  # every agent request's phases (e2e: completed ones)
    dist = {p: quantiles_of(hists[p]) for p in COMPARE_CDF_PHASES}
    return m, summary, dist


def _round_label(x: dict[str, Any]) -> str:
    if "round" in x:
        return str(x["round"])
    lo, hi = x["rounds"]
    return str(lo) if lo == hi else f"{lo}-{hi}"


def router_metrics(r: dict[str, Any]) -> dict[str, Any]:
    """A run's router rows (summary.json's `router`): cache hit rate, stickiness, time to first
    token by round (the same round bands as the run's tables), and per fault how soon the router
    stopped routing to the faulty backend and used it again."""
    m: dict[str, Any] = {"cache_hit_rate": r.get("cache_hit_rate"), "stickiness": (r.get("stickiness") or {}).get("share")}
    m["conversation_stickiness"] = (r.get("conversations") or {}).get("share")
    imb = r.get("imbalance") or {}
    m["imbalance"], m["imbalance_window_max"] = imb.get("overall"), imb.get("window_max")
    hop = (r.get("router_time") or {}).get("all") or {}
    m["router_time_p50_ms"], m["router_time_p99_ms"] = hop.get("p50_ms"), hop.get("p99_ms")
    for x in r.get("round_bands") or r.get("rounds") or []:
        label = _round_label(x)
        tt = x.get("time_to_first_token") or {}
        m[f"first_token_r{label}_p50_ms"] = tt.get("p50_ms")
        m[f"first_token_r{label}_p90_ms"] = tt.get("p90_ms")
    for f in r.get("faults") or []:
        if not f.get("applied"):
            continue
        n = f["number"]
        m[f"fault{n}_stopped_s"] = f.get("stopped_routing_after_s")
        again = f.get("used_again_after_s")
        m[f"fault{n}_used_again_s"] = again if again is not None or not f.get("ended_in_run") else "never"
        m[f"fault{n}_label"] = f"{f['fault']} {f['backend']}"
    return m


def group_metrics(groups: dict[str, Any]) -> dict[str, Any]:
    """A run's prefix-group rows (summary.json's `groups`): what each group's shared prefix got from
    the server's cache and its time to first token."""
    m: dict[str, Any] = {}
    for g, x in groups.items():
        m[f"group{g}_cache_hit_rate"] = x.get("cache_hit_rate")
        m[f"group{g}_ttft_p50_ms"], m[f"group{g}_ttft_p99_ms"] = x.get("ttft_p50_ms"), x.get("ttft_p99_ms")
    return m


def group_rows(variants: list[dict[str, Any]]) -> list[tuple[tuple[str, ...], str, str | None]]:
    """The prefix-group rows of a comparison, group by group, for the groups any run had."""
    groups = sorted({k.removeprefix("group").removesuffix("_cache_hit_rate") for v in variants
                     for k in v["metrics"] if k.startswith("group") and k.endswith("_cache_hit_rate")}, key=int)
    rows: list[tuple[tuple[str, ...], str, str | None]] = []
    for g in groups:
        rows.append(((f"group{g}_cache_hit_rate",), f"prefix group {g}: cache hit rate", "higher"))
        rows.append(((f"group{g}_ttft_p50_ms", f"group{g}_ttft_p99_ms"), f"prefix group {g}: ttft p50 / p99 ms", "lower"))
    return rows


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:.0f}%"


def routing_conclusions(variants: list[dict[str, Any]]) -> list[str]:
    """What a router engineer comparing policies asks first, in words: which run kept prefixes
    together (conversations on one backend, then cache hit rate) and which balanced load (the lowest
    imbalance), each with the others' figures beside it. Empty unless two runs have router rows."""
    ms = [(v["name"], v["metrics"]) for v in variants if v["metrics"].get("cache_hit_rate") is not None]
    if len(ms) < 2:
        return []

    def others(key: str, best: str, fmt: Any) -> str:
        return ", ".join(f"{n} {fmt(m.get(key))}" for n, m in ms if n != best)

    together = max(ms, key=lambda x: (round((x[1].get("conversation_stickiness") or 0) * 100),
                                      round((x[1].get("cache_hit_rate") or 0) * 100)))
    out = [f"kept prefixes together: {together[0]} (conversations on one backend "
           f"{_pct(together[1].get('conversation_stickiness'))}, cache hit rate {_pct(together[1]['cache_hit_rate'])}; "
           f"{others('cache_hit_rate', together[0], _pct)} hit rate)"]
    balanced = [x for x in ms if x[1].get("imbalance") is not None]
    if len(balanced) >= 2:
        best = min(balanced, key=lambda x: x[1]["imbalance"])
        def f2(v: float | None) -> str:
            return "-" if v is None else f"{v:.2f}"

        out.append(f"balanced load: {best[0]} (imbalance {f2(best[1]['imbalance'])}: the busiest backend's share x "
                   f"backends, 1.00 = even; {others('imbalance', best[0], f2)})")
    return out


def router_rows(variants: list[dict[str, Any]]) -> list[tuple[tuple[str, ...], str, str | None]]:
    """The router rows of a comparison: those of every run that has them, in the order they come."""
    ms = [v["metrics"] for v in variants]
    if not any("cache_hit_rate" in m for m in ms):
        return []
    rows: list[tuple[tuple[str, ...], str, str | None]] = [
        (("cache_hit_rate",), "cache hit rate", "higher"), (("stickiness",), "stickiness", "higher"),
        (("conversation_stickiness",), "conversations on one backend", "higher"),
        (("imbalance", "imbalance_window_max"), "load imbalance overall / worst window", "lower"),
        (("router_time_p50_ms", "router_time_p99_ms"), "router's own time p50 / p99 ms", "lower")]
    seen: list[str] = []
    for m in ms:
        for k in m:
            if k.startswith("first_token_r") and k.endswith("_p50_ms") and k not in seen:
                seen.append(k)
    for k in seen:
        label = k.removeprefix("first_token_r").removesuffix("_p50_ms")
        rows.append(((k, k.replace("_p50_ms", "_p90_ms")), f"first token round {label} p50 / p90 ms", "lower"))
    faults: list[tuple[int, str]] = []
    for m in ms:
        for k, v in m.items():
            if k.startswith("fault") and k.endswith("_label"):
                n = int(k.removeprefix("fault").removesuffix("_label"))
                if n not in [x for x, _ in faults]:
                    faults.append((n, v))
    for n, label in sorted(faults):
        rows.append(((f"fault{n}_stopped_s",), f"fault {n} {label}: stopped routing after s", "lower"))
        rows.append(((f"fault{n}_used_again_s",), f"fault {n} {label}: used again after s", "lower"))
    return rows


def router_view(summary: dict[str, Any]) -> dict[str, Any] | None:
    """What compare.html charts of a run's router section: cache hit rate and ttft by round."""
    r = summary.get("router")
    if not r:
        return None
    return {"rounds": [{"label": _round_label(x), "cache_hit_rate": x.get("cache_hit_rate"),
                        "first_token_p50_ms": (x.get("time_to_first_token") or {}).get("p50_ms"),
                        "first_token_p90_ms": (x.get("time_to_first_token") or {}).get("p90_ms")}
                       for x in r.get("round_bands") or r.get("rounds") or []]}


def run_metrics(data: RunData) -> tuple[dict[str, Any], dict[str, Any]]:
    """The compare rows of one run (every number from its records) and its summary (verdict)."""
    m, summary, _ = measure_run(data)
    return m, summary


def quantiles_of(h: "HdrHistogram | SparseHistogram", points: int = 101) -> list[float]:
    """`points` evenly spaced quantiles (0..100 %) of a histogram, in ms (for the CDF plot), by the
    same quantile rule as every table (agentload.analysis.stats)."""
    ps = [100.0 * i / (points - 1) for i in range(points)]
    got = percentiles_ms(h, ps)
    return [] if got is None else [got[p] for p in ps]


def quantiles_ms(values_ns: list[int], points: int = 101) -> list[float]:
    """`points` evenly spaced quantiles of a list of durations (ns), in ms."""
    return quantiles_of(histogram_of(values_ns), points)


def distributions(data: RunData) -> dict[str, list[float]]:
    """The quantiles of the CDF phases (a pass of its own; compare_dirs gets them from measure_run)."""
    return measure_run(data)[2]


# Rows of the table: (key(s), label, better). Phase rows hold two numbers (p50, p99).
ROWS: list[tuple[tuple[str, ...], str, str | None]] = [
    (("verdict",), "verdict", "healthy"),
    (("rounds_completed",), "completed rounds", "higher"),
    (("stalls",), "stalls", "lower"),
    (("errors",), "errors", "lower"),
    (("stale_errors",), "stale-conn errors", "lower"),
    *[((f"{p}_p50_ms", f"{p}_p99_ms"), f"{p} p50 / p99 ms", "lower") for p in PHASE_ROWS],
    (("connections_opened",), "connections opened", "lower"),
    (("reuse_rate",), "keep-alive reuse", "higher"),
    (("duration_s",), "duration s", "lower"),
]


def fmt_value(key: str, v: Any, metrics: dict[str, Any] | None = None) -> str:
    if v is None:
        return "-"
    if key.endswith("_ms"):
        return fmt_ms(v)
    if key in ("reuse_rate", "stickiness", "conversation_stickiness") or key.endswith("cache_hit_rate"):
        return f"{v * 100:.0f}%"
    if key.startswith("fault"):
        return v if isinstance(v, str) else f"{v:.1f}"
    if key == "duration_s":
        return f"{v:.1f}"
    if key == "rounds_completed" and metrics and metrics.get("rounds_planned"):
        return f"{v}/{metrics['rounds_planned']}"
    return str(v)


def _rank_key(key: str, v: Any) -> Any:
    """Values are compared as shown: 0.013 and 0.014 ms are the same 0.0."""
    if v is None:
        return None
    if key.endswith("_ms"):
        s = fmt_ms(v)
        return float(s[:-1]) * 1000 if s.endswith("s") else float(s)
    if key in ("reuse_rate", "stickiness", "conversation_stickiness") or key.endswith("cache_hit_rate"):
        return round(v * 100)
    if key.startswith("fault"):
        return float("inf") if isinstance(v, str) else round(v, 1)  # never: the worst there is
    if key == "duration_s":
        return round(v, 1)
    return v


def best_indices(key: str, better: str | None, values: list[Any]) -> list[int]:
    if better is None or len(values) < 2:
        return []
    if better == "healthy":
        good = [i for i, v in enumerate(values) if v == "healthy"]
        return good if 0 < len(good) < len(values) else []
    ranked = [(i, _rank_key(key, v)) for i, v in enumerate(values)]
    ranked = [(i, k) for i, k in ranked if k is not None]
    if not ranked:
        return []
    keys = {k for _, k in ranked}
    if len(keys) == 1 and len(ranked) == len(values):
        return []  # every run has the same value: nothing to prefer
    target = min(keys) if better == "lower" else max(keys)
    return [i for i, k in ranked if k == target]


def expand_targets(paths: list[Path]) -> tuple[list[Path], list[str] | None, Path | None]:
    """Run folders from the arguments. A comparison folder (one written by `compare`, holding
    compare.json or run subfolders) stands for its runs, in the order it recorded."""
    if len(paths) == 1 and not (paths[0] / "run.json").exists():
        base = paths[0]
        cj = base / "compare.json"
        if cj.exists():
            try:
                doc = orjson.loads(cj.read_bytes())
                runs = [base / v["dir"] for v in doc.get("variants", [])]
                names = [v["name"] for v in doc.get("variants", [])]
            except (orjson.JSONDecodeError, KeyError, TypeError) as e:
                raise UserError(f"{cj}: not a compare.json written by agentload ({e})") from e
            if runs and all((r / "run.json").exists() for r in runs):
                return runs, names, base
        subs = sorted((d for d in base.iterdir() if (d / "run.json").exists()), key=_started) if base.is_dir() else []
        if subs:
            return subs, [d.name for d in subs], base
        raise UserError(f"{base}: not a run folder (no run.json) nor a comparison folder (no run subfolders)")
    for p in paths:
        if not (p / "run.json").exists():
            raise UserError(f"{p}: not a run folder (expected run.json and records.jsonl written by `agentload run`)")
    return list(paths), None, None


def _started(d: Path) -> tuple[float, str]:
    try:
        return float(orjson.loads((d / "run.json").read_bytes()).get("t0_unix") or 0.0), d.name
    except (orjson.JSONDecodeError, OSError, ValueError):
        return 0.0, d.name


def fingerprint_of(meta: dict[str, Any]) -> str | None:
    fp = meta.get("fingerprint")
    if fp:
        return str(fp)
    return None  # every run.json agentload writes has one


def _flat(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, dict):
        return {prefix: d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}.{k}" if prefix else k
        if isinstance(v, dict) and v:
            out.update(_flat(v, key))
        else:
            out[key] = v
    return out


def settings_of(meta: dict[str, Any]) -> dict[str, Any]:
    """The settings a comparison may vary, flattened: client.*, stall.*, canary.*, target.endpoint, target.api."""
    sc = meta.get("scenario") or {}
    out: dict[str, Any] = {}
    for sec in (*SETTING_SECTIONS, "canary"):
        out.update(_flat(sc.get(sec) or {}, sec))
    out["target.endpoint"] = "embedded mock" if meta.get("embedded_mock") else meta.get("endpoint")
    out["target.api"] = meta.get("api") or (sc.get("target") or {}).get("api") or "chat"
    # a router soak (run.json has a fleet): the router's settings, the scenario's [router], else what
    # the fleet says
    fleet = meta.get("fleet")
    if isinstance(fleet, dict):
        out.update(_flat(sc.get("router") or {}, "router"))
        router = fleet.get("router")
        if isinstance(router, dict):
            out.setdefault("router.kind", router.get("kind"))
            out.setdefault("router.policy", router.get("policy"))
    return out


def workload_of(meta: dict[str, Any]) -> dict[str, Any]:
    sc = meta.get("scenario") or {}
    out: dict[str, Any] = {}
    for sec in FINGERPRINT_SECTIONS:
        out.update(_flat(sc.get(sec) or {}, sec))
    out["target.model"] = (sc.get("target") or {}).get("model")
    return out


def _differing(dicts: list[dict[str, Any]]) -> list[str]:
    keys: list[str] = []
    for d in dicts:
        for k in d:
            if k not in keys:
                keys.append(k)
    return [k for k in keys if len({orjson.dumps(d.get(k), option=orjson.OPT_SORT_KEYS) for d in dicts}) > 1]


def _show(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and v.is_integer():
        return f"{v:g}"
    return str(v)


def _refuse_mixed_workloads(paths: list[Path], datas: list[RunData], fps: list[str | None]) -> NoReturn:
    """Runs of different workloads (fingerprints) are not comparable: a UserError naming which
    runs have which fingerprint and the first settings that differ."""
    groups: dict[str | None, list[str]] = {}
    for p, fp in zip(paths, fps):
        groups.setdefault(fp, []).append(str(p))
    first = next(i for i, fp in enumerate(fps) if fp != fps[0])
    diff = _differing([workload_of(datas[0].meta), workload_of(datas[first].meta)])
    shown = ", ".join(diff[:4]) + (" ..." if len(diff) > 4 else "")
    raise UserError("runs have different workloads (fingerprint " +
                    "; ".join(f"{fp}: {', '.join(ps)}" for fp, ps in groups.items()) +
                    (f"; they differ in {shown}" if shown else "") +
                    "), so their numbers are not comparable; pass --force to compare anyway")


def _variant_names(paths: list[Path], settings: list[dict[str, Any]], varied: list[str],
                   names: list[str] | None) -> list[str]:
    """Each run's name: the given one, else the settings it varies (else its folder's name); a
    name that repeats gets #2, #3, ..."""
    if names is None:
        names = []
        for p, s in zip(paths, settings):
            label = ",".join(f"{k.rsplit('.', 1)[1]}={_show(s.get(k))}" for k in varied if not k.startswith("canary."))
            names.append(label or p.name)
    seen: Counter[str] = Counter()
    uniq = []
    for n in names:
        seen[n] += 1
        uniq.append(n if seen[n] == 1 else f"{n}#{seen[n]}")
    return uniq


def _variant(p: Path, data: RunData, name: str, s: dict[str, Any], fp: str | None, varied: list[str],
             base: Path | None) -> dict[str, Any]:
    """One run of the comparison: its settings, metrics, verdict (with the other findings), quantiles."""
    metrics, summary, quantiles = measure_run(data)
    v = summary["verdict"]
    rp = p.resolve()
    rel = str(rp.relative_to(base.resolve())) if base is not None and rp.is_relative_to(base.resolve()) else str(rp)
    return {
        "name": name, "dir": rel, "run": data.meta.get("run"), "fingerprint": fp,
        "varied": {k: s.get(k) for k in varied},
        "client": (data.meta.get("scenario") or {}).get("client", {}),
        "stall": (data.meta.get("scenario") or {}).get("stall", {}),
        "metrics": metrics,
        "verdict": {**{k: v.get(k) for k in ("kind", "phase", "first_round", "agents_affected", "summary",
                                             "evidence")},
                    # the other findings (ALSO): a variant whose pool was too small beside a hang says both
                    "secondary": [{"kind": x.get("kind"), "summary": x.get("summary")}
                                  for x in v.get("secondary") or []]},
        "cut_short": summary["run"].get("cut_short"),
        "warnings": summary.get("warnings", []),
        "quantiles_ms": quantiles,
        **({"router": router_view(summary)} if summary.get("router") else {}),
    }


def compare_dirs(paths: list[Path], *, force: bool = False, names: list[str] | None = None,
                 base: Path | None = None) -> dict[str, Any]:
    """The comparison of run folders (compare.json's content): a pure function of the folders."""
    paths = [Path(p) for p in paths]
    if len(paths) < 2:
        raise UserError("compare: needs two or more runs")
    datas = [load_run(p) for p in paths]
    fps = [fingerprint_of(d.meta) for d in datas]
    mismatch = len(set(fps)) > 1
    if mismatch and not force:
        _refuse_mixed_workloads(paths, datas, fps)
    settings = [settings_of(d.meta) for d in datas]
    varied = _differing(settings)
    names = _variant_names(paths, settings, varied, names)
    common = {k: v for k, v in settings[0].items() if k not in varied}
    variants = [_variant(p, data, name, s, fp, varied, base)
                for p, data, name, s, fp in zip(paths, datas, names, settings, fps)]
    rows = []
    routed = router_rows(variants)
    extra = routed + group_rows(variants)
    for keys, label, better in ROWS + extra:
        rows.append({"keys": list(keys), "label": label, "better": better,
                     "best": {k: [variants[i]["name"] for i in
                                  best_indices(k, better, [var["metrics"].get(k) for var in variants])]
                              for k in keys}})
    legend = [LEGEND_BEST, LEGEND_PHASES, LEGEND_STALE, LEGEND_REUSE]
    if any(var["client"].get("force_close") for var in variants):
        legend.append(LEGEND_FORCE_CLOSE)
    if routed:
        legend.append(LEGEND_ROUTER)
    sc0 = datas[0].meta.get("scenario") or {}
    agents = sc0.get("agents") or {}
    notes = []
    if mismatch:
        notes.append("the runs have different workload fingerprints (" + ", ".join(sorted({str(f) for f in fps})) +
                     "): compared anyway (--force); their numbers are not strictly comparable")
    for var in variants:
        if var["cut_short"]:
            notes.append(f"{var['name']}: the run was cut short; its numbers cover what it recorded")
    doc_extra = {"routing": routing} if (routing := routing_conclusions(variants)) else {}
    return {
        **doc_extra,
        "version": COMPARE_VERSION,
        "scenario": sc0.get("source"),
        "description": sc0.get("description", ""),
        "fingerprint": fps[0] if not mismatch else None,
        "fingerprints": fps,
        "forced": bool(mismatch and force),
        "workload": {"agents": agents.get("count"), "rounds": agents.get("rounds"), "seed": agents.get("seed")},
        "varied": varied,
        "common": common,
        "variants": variants,
        "rows": rows,
        "legend": legend,
        "notes": notes,
    }
