"""What the stall probes (agentload.run.probes) reproduced of a server stall: the stalled request's
own body and a short prompt, on a fresh and on a reused connection (and behind a router, on which
backend): whether the hang follows the content, the connection, the backend, or nobody is answered."""

from __future__ import annotations

from collections import Counter

from agentload.analysis.stats import fmt_dur as _dur
from agentload.analysis.verdict.facts import Facts
from agentload.records import Record, phase_ns

MAX_WAVE_LINES = 5  # probed waves the evidence lists
_NOT_ANSWERED = ("hung", "failed")
_PROBE_ORDER = (("probe_body_fresh", "its own body on a fresh connection", False),
                ("probe_short_fresh", "a short prompt on a fresh connection", False),
                ("probe_short_reused", "a short prompt on a reused connection", True),
                ("probe_body_reused", "its own body on a reused connection", True))


def _probe_state(r: Record | None, reused: bool) -> str | None:
    """answered | hung | failed | cut, or None: not sent, or not on the kind of connection it was
    meant for (a pooled connection the server had closed: the factor did not change)."""
    if r is None or (r.reused is not None and r.reused is not reused):
        return None
    if r.stalled_phase:
        return "hung"
    if r.outcome == "ok":
        return "answered"
    return "cut" if r.outcome == "cut_short" else "failed"


def _probe_cause(p: dict[str, Record]) -> str | None:
    """What one wave's probes reproduced: content | connection | nobody | either | both |
    not_reproduced, or None (inconclusive: cut short by the run's end, or not sent)."""
    b = _probe_state(p.get("probe_body_fresh"), False)
    r = _probe_state(p.get("probe_short_reused"), True)
    s = _probe_state(p.get("probe_short_fresh"), False)
    br = _probe_state(p.get("probe_body_reused"), True)
    if s in _NOT_ANSWERED and (b in _NOT_ANSWERED or r in _NOT_ANSWERED or b is None):
        return "nobody"  # a short prompt on a fresh connection did not get through either
    if b in _NOT_ANSWERED and r in _NOT_ANSWERED:
        return "either" if s == "answered" else "nobody"
    if b in _NOT_ANSWERED and (r == "answered" or s == "answered"):
        return "content"
    if b == "answered" and r in _NOT_ANSWERED:
        return "connection"
    if b == "answered" and r == "answered":
        return "both" if br in _NOT_ANSWERED else "not_reproduced"
    return None


_CAUSE = {  # the headline's clause for what the probes reproduced
    "content": "the hang follows the request's content (size or state): its own body {hung} on a fresh connection "
               "too, a short prompt on a reused one answered (probes)",
    "connection": "the hang follows the connection, not the prompt: a short prompt on a reused keep-alive "
                  "connection {hung}, the stalled request's own body on a fresh one answered (keep-alive handling "
                  "in the server or in between; probes)",
    "nobody": "the server is not answering anyone: a short prompt on a fresh connection {hung} too (probes)",
    "either": "each factor alone {hangs}: the stalled request's own body on a fresh connection and a short prompt "
              "on a reused connection both {hung}, while a short prompt on a fresh connection answered (probes)",
    "both": "the hang needs both the content and a reused connection: the stalled request's own body {hung} on a "
            "reused connection only (on a fresh one it answered, as did a short prompt on a reused one; probes)",
    "not_reproduced": "the probes did not reproduce it: the stalled request's own body on a fresh connection and a "
                      "short prompt on a reused connection both answered (it needs the agent's own connection and "
                      "content, or was transient)",
}
_CAUSE_SHORT = {"content": "it follows the content", "connection": "it follows the connection",
                "nobody": "no one is answered", "either": "each factor alone reproduces it",
                "both": "it needs both factors", "not_reproduced": "not reproduced",
                "backend": "it follows the backend"}
_KEEPS_THRESHOLD = {"content", "either", "both", "not_reproduced"}  # the others contradict a size threshold


def _probe_line(what: str, r: Record | None, state: str | None, backends: bool, backend: str | None = None,
                elsewhere: bool = False) -> str | None:
    if r is None:
        return None
    if state is None:
        text = f"{what}: went out on a {'reused' if r.reused else 'new'} connection instead, so it tells nothing"
    elif state == "answered":
        text = f"{what} answered in {_dur((phase_ns(r.t, 'e2e') or 0) / 1e6)}"
    elif state == "hung":
        text = f"{what} hung (no progress in {r.stalled_phase} for stall.after_s)"
    elif state == "failed":
        text = f"{what} failed ({r.error})"
    else:
        text = f"{what} was cut short by the run's end"
    backend = backend or r.backend
    text += f" (backend {backend})" if backends and backend else ""
    return text + (", not where the stalled requests went: it compares backends" if elsewhere else "")


def probe_reading(f: Facts, st: list[Record], thr: int | None,
                  slow: bool) -> tuple[str | None, bool, list[str]]:
    """What the stall probes (agentload.run.probes) say of the stall `st`: the headline's clause
    (None: no probe was conclusive), whether a size threshold may still lead it, and the evidence.
    Waves disagreeing: the cause most waves reproduced, ties to the earliest."""
    waves: dict[int, dict[str, Record]] = {}
    for r in f.acc.probes:
        waves.setdefault(r.call, {}).setdefault(r.kind, r)
    ev: list[str] = []
    causes: list[str] = []
    fleet = f.backends_known  # which backend served each
    # Behind a router the backend is a third factor: a probe answered by a backend none of the stalled
    # requests went to compared backends, not the connection or the content
    where: dict[int, str | None] = {}
    stalled_on: set[str] = set()
    if fleet and waves:
        where = f.backends_of(f.acc.probes)
        stalled_on = {b for r in st if (b := f.attribution.get(id(r), (None, None))[0]) is not None}
    backend_text = ""
    for wave, p in sorted(waves.items())[:MAX_WAVE_LINES]:
        elsewhere = {k: where.get(id(r)) for k, r in p.items() if stalled_on and _probe_state(r, k.endswith("_reused"))
                     == "answered" and where.get(id(r)) not in stalled_on and where.get(id(r)) is not None}
        body_hung = [k for k in ("probe_body_fresh", "probe_body_reused")
                     if k in p and _probe_state(p[k], k.endswith("_reused")) in _NOT_ANSWERED]
        body_elsewhere = [k for k in ("probe_body_fresh", "probe_body_reused") if k in elsewhere]
        cause: str | None
        if body_elsewhere and body_hung:
            cause = "backend"
            if not backend_text:
                bad = where.get(id(p[body_hung[0]])) or "/".join(sorted(stalled_on))
                backend_text = (f"the hang follows the backend, not the content or the connection: the stalled "
                                f"request's own body answered on {elsewhere[body_elsewhere[0]]} and {{hung}} on {bad}, "
                                f"where the stalled requests went (probes)")
        else:
            cause = _probe_cause({k: r for k, r in p.items() if k not in elsewhere})
        any_r = next(iter(p.values()))
        body = p.get("probe_body_fresh") or p.get("probe_body_reused")
        parts = [x for x in (_probe_line(what, p.get(kind), _probe_state(p.get(kind), reused), fleet,
                                         where.get(id(p.get(kind))), kind in elsewhere)
                             for kind, what, reused in _PROBE_ORDER) if x]
        ev.append(f"probes of stall wave {wave} (agent {any_r.agent}'s round {any_r.round} request"
                  + (f", {body.prompt_tokens:,} prompt tokens" if body is not None else "") + "): "
                  + "; ".join(parts) + " -> " + (_CAUSE_SHORT[cause] if cause else "inconclusive"))
        if cause:
            causes.append(cause)
    if len(waves) > MAX_WAVE_LINES:
        ev.append(f"... {len(waves) - MAX_WAVE_LINES} more probed wave(s)")
    if causes:
        counts = Counter(causes)
        lead = max(counts, key=lambda c: (counts[c], -causes.index(c)))
        clause = (backend_text if lead == "backend" else _CAUSE[lead]).format(
            hung="stalled" if slow else "hung", hangs="stalls" if slow else "hangs")
        if len(counts) > 1:
            ev.append("the probed waves disagree: " + ", ".join(f"{_CAUSE_SHORT[c]} x{n}" for c, n in counts.most_common())
                      + f"; the headline takes the most common ({_CAUSE_SHORT[lead]})")
        return clause, lead in _KEEPS_THRESHOLD, ev
    # no conclusive probe: the cause rests on correlation; say which factors go together
    on = (f.scenario.get("stall") or {}).get("probes")
    why = ("probes are off ([stall] probes = false)" if on is False else
           "no probe was conclusive" if waves else
           "no probe ran during the stall" if on else "this run has no probes (recorded before agentload sent them)")
    reused = sum(1 for r in st if r.reused)
    if thr is not None and reused == len(st):
        ev.append(f"{why}: the cause rests on correlation, and prompt size and connection reuse are confounded: "
                  f"every stalled request was at or above {thr:,} prompt tokens and went out on a reused keep-alive "
                  f"connection; the stalled body on a fresh connection would tell them apart")
    elif thr is not None:
        ev.append(f"{why}: the cause rests on correlation (prompt size; {len(st) - reused} stalled request(s) "
                  f"went out on new connections, so connection reuse is not needed)")
    elif reused == len(st):
        ev.append(f"{why}: the cause rests on correlation, and the agents' content and connection reuse are "
                  f"confounded: every stalled request went out on a reused keep-alive connection")
    else:
        ev.append(f"{why}: the cause rests on correlation")
    return None, True, ev

