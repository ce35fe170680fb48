"""Analysis: pure functions over a run's data (records, samples, run.json).

`stats` (the one quantile rule), `verdict` (the rules and their kinds), `target_evidence` (what the
target's metrics said), `summary` (summary.json), `intervals` (windows of the interval log),
`compare` (the math of `agentload compare`). Imports the records layer only, never the run path or
the reports.
"""
