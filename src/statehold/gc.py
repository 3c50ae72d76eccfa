"""Deprecated alias of `statehold.cleanup.gc` (removed in the next release)."""

import warnings

from statehold.cleanup.gc import *  # noqa: F403
from statehold.cleanup.gc import (
    __all__,  # noqa: F401
    __getattr__,  # noqa: F401  (its deprecated names)
)

warnings.warn("statehold.gc moved to statehold.cleanup.gc", DeprecationWarning, stacklevel=2)
