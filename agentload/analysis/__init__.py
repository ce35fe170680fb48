"""Analysis: pure functions over a run's data (records, samples, run.json).

`passes` (one pass over the records feeding every consumer), `stats` (the one quantile rule, and
the histograms consumers keep), `tallies` (small exact structures that replace lists of records),
`verdict` (the facts accumulator, the rules and their kinds), `target_evidence` (what the target's
metrics said), `router` (a fleet behind a router: the router section and `RouterFacts`, the
verdict's input about it), `summary` (summary.json), `intervals` (windows of the interval log),
`compare` (the math of `agentload compare`). Imports the records layer only, never the run path or the reports.
"""
