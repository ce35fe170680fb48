"""Screenshot of a run's report.html in headless Chromium (the picture in README).

    python tools/screenshot_report.py                    # runs scenarios/long-context-hang.toml
    python tools/screenshot_report.py --run-dir RUN_DIR  # an existing run folder instead
    tools/screenshot_report.sh                               # the same, from the repo root

Runs the scenario against the embedded mock, rebuilds the report, loads it in Chromium, checks
that every chart rendered without a console error, and writes the top of the page (verdict,
settings, timeline) as a PNG.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

DEFAULT_SCENARIO = "scenarios/long-context-hang.toml"
DEFAULT_OUT = "docs/report-long-context-hang.png"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tools/screenshot_report.py", description=__doc__.split("\n")[0])
    ap.add_argument("--scenario", default=DEFAULT_SCENARIO, help=f"scenario to run (default {DEFAULT_SCENARIO})")
    ap.add_argument("--set", dest="sets", action="append", default=[], help="override, as for `agentload run`")
    ap.add_argument("--run-dir", type=Path, help="use this run folder instead of running the scenario")
    ap.add_argument("--out", type=Path, default=Path(DEFAULT_OUT), help=f"PNG to write (default {DEFAULT_OUT})")
    ap.add_argument("--width", type=int, default=1400)
    ap.add_argument("--height", type=int, default=2300, help="pixels from the top of the page to keep")
    ap.add_argument("--timeout", type=float, default=60.0)
    args = ap.parse_args(argv)

    from agentload.errors import UserError
    from agentload.report.build import write_reports
    from devtools import check_page_sync, find_chromium

    chromium = find_chromium()
    if chromium is None:
        print("screenshot: chromium not found (apt-get install chromium)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="agentload-shot-") as tmp:
        run_dir = args.run_dir
        try:
            if run_dir is None:
                from agentload.launch import run_to_dir
                from agentload.run.scenario import load_scenario

                run_dir = Path(tmp) / Path(args.scenario).stem
                run_to_dir(load_scenario(args.scenario, args.sets), run_dir, live=False)
            write_reports(run_dir)
        except UserError as e:
            print(f"screenshot: {e}", file=sys.stderr)
            return 2
        res = check_page_sync(run_dir / "report.html", chromium=chromium, width=args.width, height=1000,
                              timeout=args.timeout, screenshot=True, screenshot_height=args.height)
        if not res.ok:
            print("screenshot: the report did not render cleanly:\n  " + "\n  ".join(res.problems()),
                  file=sys.stderr)
            return 1
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_bytes(res.screenshot or b"")
    print(f"screenshot: {args.out} ({len(res.screenshot or b'') // 1024} KiB, {res.drawn} charts rendered, "
          f"no console errors)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
