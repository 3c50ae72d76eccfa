"""Deprecated alias of `statehold.spark_checkpoints.layout` (removed in the next release).

`format/` sits below `spark_checkpoints/`, so this module imports nothing from there when
it is imported: each name is looked up on first use (the module's `__getattr__`). The
contracts in pyproject.toml ignore that one deferred import until the alias goes."""

from __future__ import annotations

import warnings
from typing import Any

#: What the old module exported; each name is the new module's, looked up on first use.
_NAMES = (
    "COMMITS_DIR",
    "DEFAULT_STORE",
    "OFFSETS_DIR",
    "QUERY_METADATA",
    "ROLLBACK_MARKER",
    "SOURCES_DIR",
    "STATE_DIR",
    "VERSION_FILES",
    "Kind",
    "Name",
    "StoreId",
    "crc_of",
    "is_decimal",
    "parse",
    "version_file",
)
__all__ = list(_NAMES)

warnings.warn(
    "statehold.format.spark_layout moved to statehold.spark_checkpoints.layout",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> Any:
    from statehold.spark_checkpoints import layout

    return getattr(layout, name)


def __dir__() -> list[str]:
    return sorted(_NAMES)
