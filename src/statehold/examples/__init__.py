"""Runnable example pipelines (``python -m statehold.examples.running_totals``)."""
