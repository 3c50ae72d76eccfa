"""Deterministic simulation of the whole checkpoint lifecycle (issue 12): the real
statehold code under a seeded scheduler, simulated storage, clock and HA sessions.
Run it with ``python tests/simulate.py``; see docs/design.md, "Deterministic simulation".
`sim.spark` is its second world (issue 40): a Structured Streaming query's checkpoint
location beside statehold's Spark-location code (``--world spark``)."""
