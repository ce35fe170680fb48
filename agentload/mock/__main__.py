"""`python -m agentload.mock --host H --port P [--config-json JSON] [--set key=value ...] [--bind-retry-s S]`."""

from __future__ import annotations

import argparse
import sys

import orjson

from agentload.errors import UserError
from agentload.mock.serve import mock_config, parse_set_overrides, serve

__all__ = ["main", "parse_set_overrides", "serve"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m agentload.mock", description="agentload's mock OpenAI server")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    ap.add_argument("--config-json", default="{}", help="MockConfig.to_dict() as JSON")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--watch-stdin", action="store_true", help="exit when stdin reaches EOF (parent died)")
    ap.add_argument("--bind-retry-s", type=float, default=0.0, metavar="S",
                    help="if the port is in use, try again for up to S seconds (a restart on the same port)")
    args = ap.parse_args(argv)
    try:
        try:
            base = orjson.loads(args.config_json)
        except orjson.JSONDecodeError as exc:
            raise UserError(f"--config-json: not valid JSON: {exc}") from None
        if not isinstance(base, dict):
            raise UserError("--config-json: expected a JSON object")
        cfg = mock_config(args.overrides, base, "--config-json")
        # a port in use or a request log it cannot open: one line, not a traceback
        serve(cfg, args.host, args.port, ready_line=True, watch_stdin=args.watch_stdin,
              bind_retry_s=max(0.0, args.bind_retry_s))
    except UserError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
