"""Deterministic simulation of the whole checkpoint lifecycle (issue 12): the real
statehold code under a seeded scheduler, simulated storage, clock and HA sessions.
Run it with ``python tests/simulate.py``; see docs/design.md, "Deterministic simulation"."""
