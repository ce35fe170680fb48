"""agentload: a load generator for LLM serving stacks that plays tool-calling agents."""

__version__ = "0.1.0"
