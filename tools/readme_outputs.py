"""Regenerate the outputs README.md quotes, so what it shows is what agentload prints today.

Every quoted output in README.md is a fenced block right after a marker line:

    <!-- output: agentload run long-context-hang --no-live | head -9 -->
    ```
    ...replaced by this script...
    ```

The command runs from the repository root (`run` and `compare` write into a fresh temporary
folder, whatever `--out` the marker shows); `| head -N` keeps the first N lines of stdout, `| tail -N`
the last N. Usage: `python tools/readme_outputs.py [--check]` (--check: exit 1 if README.md
would change, without writing; the outputs hold timings, so expect differences in figures).
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from agentload.atomic import write_atomic

REPO = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"^<!-- output: (?P<cmd>.+?) -->\n```\n(?P<body>.*?)```\n", re.M | re.S)


def run(cmd: str, tmp: Path, n: int) -> str:
    pipe = None
    if "|" in cmd:
        cmd, pipe = (s.strip() for s in cmd.split("|", 1))
    argv = shlex.split(cmd)
    if argv[0] != "agentload":
        raise SystemExit(f"README.md: only agentload commands are regenerated, not {cmd!r}")
    if argv[1] in ("run", "compare"):  # a fresh folder every time, whatever --out README shows
        if "--out" in argv:
            i = argv.index("--out")
            del argv[i:i + 2]
        argv += ["--out", str(tmp / f"out{n}")]
    p = subprocess.run([sys.executable, "-m", "agentload.cli", *argv[1:]], cwd=REPO, capture_output=True,
                       text=True, timeout=600)
    if p.returncode not in (0, 1):
        raise SystemExit(f"README.md: {cmd!r} exited {p.returncode}: {p.stderr.strip().splitlines()[-1:]}")
    lines = p.stdout.splitlines()
    if pipe:
        m = re.fullmatch(r"(head|tail) -(\d+)", pipe)
        if not m:
            raise SystemExit(f"README.md: only '| head -N' or '| tail -N' are understood, not {pipe!r}")
        k = int(m.group(2))
        lines = lines[:k] if m.group(1) == "head" else lines[-k:]
    while lines and not lines[-1].strip():
        lines.pop()
    return "\n".join(line.rstrip() for line in lines) + "\n"


def main() -> int:
    check = "--check" in sys.argv[1:]
    path = REPO / "README.md"
    text = path.read_text(encoding="utf-8")
    with tempfile.TemporaryDirectory(prefix="readme-outputs-") as tmp:
        parts, last = [], 0
        for n, m in enumerate(MARKER.finditer(text)):
            print(f"running: {m['cmd']}", file=sys.stderr)
            parts.append(text[last:m.start("body")])
            parts.append(run(m["cmd"], Path(tmp), n))
            last = m.end("body")
        parts.append(text[last:])
    new = "".join(parts)
    if check:
        return 0 if new == text else 1
    write_atomic(path, new.encode("utf-8"))
    print(f"README.md: {len(list(MARKER.finditer(text)))} output block(s) regenerated", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
