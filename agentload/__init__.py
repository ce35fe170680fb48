"""agentload: a load generator for LLM serving stacks that plays tool-calling agents."""

__version__ = "0.3.0.dev0"  # the one place the version is written (pyproject.toml reads it); see CHANGELOG.md
