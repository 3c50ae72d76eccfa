"""Deprecated alias of `statehold.job.directory` (removed in the next release)."""

import warnings

from statehold.job.directory import *  # noqa: F403
from statehold.job.directory import __all__  # noqa: F401

warnings.warn(
    "statehold.jobdir moved to statehold.job.directory", DeprecationWarning, stacklevel=2
)
