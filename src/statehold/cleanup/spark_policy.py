"""Deprecated alias of `statehold.spark_checkpoints.policy` (removed in the next release).

`cleanup/` does not import `spark_checkpoints/` (which imports `cleanup.policy` for
`Verdict`), so this module imports nothing from there when it is imported: each name is
looked up on first use (the module's `__getattr__`). The contracts in pyproject.toml
ignore that one deferred import until the alias goes."""

from __future__ import annotations

import warnings
from typing import Any

#: What the old module exported; each name is the new module's, looked up on first use.
_NAMES = (
    "DELETABLE_KINDS",
    "KEPT_KINDS",
    "ROLLBACK_KINDS",
    "SPARK_GC_GRACE_SECONDS",
    "DeletionRefusedError",
    "SparkView",
    "check_deletable",
    "check_deletable_names",
    "check_rollback_deletable",
    "judge",
    "judge_names",
    "shared_dir_store",
)
__all__ = list(_NAMES)

warnings.warn(
    "statehold.cleanup.spark_policy moved to statehold.spark_checkpoints.policy",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> Any:
    from statehold.spark_checkpoints import policy

    return getattr(policy, name)


def __dir__() -> list[str]:
    return sorted(_NAMES)
