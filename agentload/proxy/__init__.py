"""`agentload proxy`: a harness's own traffic, recorded with a run's phases and judged by its verdict."""
