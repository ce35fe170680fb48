"""The router soak bench: a fleet of mock backends, the router under test in front of them, and
faults applied to backends on a schedule while agents run through the router.

config.py   the scenario's [fleet], [router] and [[schedule]] tables (checked like every section)
fleet.py    start the backends and the router on free loopback ports, wait until ready, stop them
schedule.py apply each scheduled fault at its time, write schedule.jsonl
"""
