"""One run over many processes or machines: shards, clock alignment, records brought home.

shards.py  what every multi-shard run shares: the clock offset of a shard (by round trips, or by
           wall-clock anchors), records and samples moved onto the driver's clock, files read as
           they grow, the shards' run.json merged into one, shard folders merged into one run folder
           (`agentload merge`)
ray.py     `agentload run --ray ADDRESS`: each shard a Ray actor running the one-process run path
processes.py  `agentload run --workers N`: each shard a process of this machine running the one-process run path
"""
