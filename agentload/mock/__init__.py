"""The mock OpenAI-compatible server: latency model and fault injection (see server.py)."""

from agentload.mock.config import MockConfig, StallMidStream
from agentload.mock.process import MockProcess
from agentload.mock.serve import parse_set_overrides, serve

__all__ = ["MockConfig", "StallMidStream", "MockProcess", "parse_set_overrides", "serve"]
