"""`python -m agentload ...`: the same command line as the `agentload` script."""

from agentload.cli import app

app(prog_name="agentload")
