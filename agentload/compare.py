"""Compare HTTP client settings on the same seeded workload: `agentload compare`.

Two halves, joined only by run folders on disk:

- `run_variants` runs one scenario once per combination of `--vary` values (the cartesian
  product), one after the other, each into `OUT/<variant>/` through the same launch path as
  `agentload run` (embedded mock per run when the scenario has no endpoint). Every variant has
  the same seed: in `mode = "scripted"` every variant sends the same conversations; in
  `mode = "model"` the first request of each agent is the same, and later ones hold what the
  model answered (its tool-call ids and arguments), which differs from run to run.
- `compare_dirs` is a pure function over run folders: it rebuilds every number from
  records.jsonl (and run.json), refuses runs whose workload fingerprints differ unless forced,
  and marks the best value per row. `write_outputs` writes compare.json, compare.txt and the
  self-contained compare.html. Running the reporter again on the same folders gives the same
  bytes.
"""

from __future__ import annotations

import itertools
import re
import secrets
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from agentload.analysis.compare import SETTING_SECTIONS
from agentload.errors import UserError
from agentload.run.scenario import Scenario, load_scenario

# ---------------------------------------------------------------- --vary parsing and variants


def split_values(text: str) -> list[str]:
    """Split `20,100,0` on commas outside braces, brackets and quotes (values are TOML)."""
    out: list[str] = []
    depth = 0
    quote: str | None = None
    cur = ""
    for ch in text:
        if quote:
            cur += ch
            if ch == quote:
                quote = None
            continue
        if ch in "\"'":
            quote = ch
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
            continue
        cur += ch
    out.append(cur.strip())
    return out


def parse_vary(items: list[str]) -> list[tuple[str, list[str]]]:
    """`client.limit=20,100,0` -> [("client.limit", ["20", "100", "0"])], in the order given."""
    axes: list[tuple[str, list[str]]] = []
    seen: set[str] = set()
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or "." not in key or not text.strip():
            raise UserError(f"--vary {item!r}: expected section.key=value1,value2,... e.g. client.limit=20,100,0")
        values = split_values(text)
        if any(v == "" for v in values):
            raise UserError(f"--vary {item!r}: empty value in the list")
        if len(set(values)) != len(values):
            raise UserError(f"--vary {item!r}: a value is listed twice")
        if key in seen:
            raise UserError(f"--vary {key}: given twice; list every value in one --vary")
        seen.add(key)
        axes.append((key, values))
    return axes


def _short_keys(keys: list[str]) -> dict[str, str]:
    """The part after the section, unless two varied keys share it."""
    last = Counter(k.rsplit(".", 1)[1] for k in keys)
    return {k: (k.rsplit(".", 1)[1] if last[k.rsplit(".", 1)[1]] == 1 else k) for k in keys}


def _display(value_text: str) -> str:
    v = value_text.strip()
    if len(v) >= 2 and v[0] == v[-1] and v[0] in "\"'":
        v = v[1:-1]
    return v


def safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._,=+-]", "_", name)[:150] or "run"


@dataclass
class Variant:
    name: str  # e.g. "limit=20,force_close=false" (also the folder name, made file-safe)
    overrides: list[str]  # section.key=value strings applied after --set
    varied: dict[str, str]  # section.key -> value as typed
    scenario: Scenario | None = None

    @property
    def folder(self) -> str:
        return safe_name(self.name)


def plan_variants(scenario: str, axes: list[tuple[str, list[str]]], sets: list[str] | None = None,
                  force: bool = False) -> list[Variant]:
    """Every combination of the varied values, each loaded and validated before any traffic."""
    sets = list(sets or [])
    if not axes:
        raise UserError("compare: nothing to vary; give --vary section.key=v1,v2 (or two or more run folders)")
    set_keys = {s.partition("=")[0].strip() for s in sets}
    for key, _ in axes:
        if key in set_keys:
            raise UserError(f"--vary {key} and --set {key}: choose one")
    base = load_scenario(scenario, sets)
    short = _short_keys([k for k, _ in axes])
    variants: list[Variant] = []
    for combo in itertools.product(*(vals for _, vals in axes)):
        varied = {k: v for (k, _), v in zip(axes, combo)}
        name = ",".join(f"{short[k]}={_display(v)}" for k, v in varied.items())
        var = Variant(name, [f"{k}={v}" for k, v in varied.items()], varied)
        var.scenario = load_scenario(scenario, sets + var.overrides)
        variants.append(var)
    if len(variants) < 2:
        raise UserError("compare: --vary gives a single variant; list two or more values, e.g. client.limit=20,100")
    folders = Counter(v.folder for v in variants)
    if any(n > 1 for n in folders.values()):
        raise UserError("compare: two variants map to the same folder name: " +
                        ", ".join(f for f, n in folders.items() if n > 1))
    fp = base.workload_fingerprint()
    for var in variants:
        assert var.scenario is not None
        if var.scenario.workload_fingerprint() != fp and not force:
            keys = ", ".join(k for k in var.varied if k.split(".", 1)[0] not in SETTING_SECTIONS) or "a setting"
            raise UserError(f"--vary {keys}: changes the workload (what the agents send or what the mock does), "
                            f"so the runs would not be comparable; pass --force to vary it anyway")
    return variants


def default_compare_dir(scenario: Scenario, base: Path = Path("reports")) -> Path:
    name = Path(scenario.source.split(" ")[0]).name.removesuffix(".toml") or "run"
    return base / f"{time.strftime('%Y%m%d-%H%M%S')}-compare-{name}-{secrets.token_hex(2)}"


@dataclass
class CompareRun:
    out_dir: Path
    variants: list[Variant]
    done: list[Variant] = field(default_factory=list)
    interrupted: bool = False


def run_variants(variants: list[Variant], out_dir: Path, *, live: bool = False, install_signals: bool = True,
                 log: Callable[[str], None] = lambda m: print(m, file=sys.stderr)) -> CompareRun:
    """Run each variant, one after the other, into out_dir/<variant>/ (never into an existing run)."""
    from agentload.launch import run_to_dir

    out_dir = Path(out_dir)
    for var in variants:
        d = out_dir / var.folder
        if (d / "run.json").exists() or (d / "records.jsonl").exists():
            raise UserError(f"{d}: already holds a run; choose another --out (runs are never overwritten)")
    out_dir.mkdir(parents=True, exist_ok=True)
    res = CompareRun(out_dir, variants)
    for i, var in enumerate(variants, 1):
        assert var.scenario is not None
        log(f"agentload compare: variant {i}/{len(variants)} {var.name}")
        try:
            launched = run_to_dir(var.scenario, out_dir / var.folder, live=live, install_signals=install_signals,
                                  log=log)
        except KeyboardInterrupt:
            res.interrupted = True
            log("agentload compare: interrupted; comparing the runs that finished")
            break
        res.done.append(var)
        v = launched.summary.get("verdict", {})
        log(f"agentload compare: {var.name}: [{v.get('kind')}] {v.get('summary', '')}")
        if launched.outcome.interrupted:
            res.interrupted = True
            log("agentload compare: interrupted; the remaining variants were not run")
            break
    return res


# ---------------------------------------------------------------- metrics: a pure function of a run folder


# ---------------------------------------------------------------- comparing run folders


# ---------------------------------------------------------------- rendering


