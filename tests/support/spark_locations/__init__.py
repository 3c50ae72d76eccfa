"""Helpers for the tests of Spark's own checkpoint locations (statehold.spark_checkpoints):
the real queries that write them, the committed fixtures they wrote, files made by hand,
trees on disk to compare, and processes paused where a test kills them."""
