#!/usr/bin/env bash
# Rebuild docs/report-long-context-hang.png (the report screenshot in README):
# runs scenarios/long-context-hang.toml against the embedded mock, renders report.html in
# headless Chromium (apt-get install chromium) and keeps the top of the page.
# Extra arguments go to `tools/screenshot_report.py` (see --help).
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 tools/screenshot_report.py "$@"
