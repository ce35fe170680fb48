"""Reports: pure functions over a run folder (run.json, records.jsonl, samples.jsonl)."""
