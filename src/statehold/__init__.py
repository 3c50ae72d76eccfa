"""statehold: checkpoint storage that owns its files, for stateful PySpark pipelines."""

__version__ = "0.1.0"
