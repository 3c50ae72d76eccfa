"""What both worlds' deletion rules share, at the bottom of `cleanup/`: the `Verdict` a
rule gives a listed file, and `DeletionRule`, what a rule tells the one guarded batch
deleter (`bulk_delete.BulkDeleter`) so that it deletes only what the rule allows and
only while the rule's re-check holds. The job directory's rule is
`cleanup.policy.JobDirectoryRule`; a Spark location's is
`spark_checkpoints.policy.SparkGcRule` (handed in: `cleanup/` never imports it)."""

from __future__ import annotations

from enum import StrEnum
from typing import Protocol

from statehold.errors import StateholdError


class Verdict(StrEnum):
    REFERENCED = "referenced"
    KEPT = "kept"
    FOREIGN = "foreign"
    PROTECTED = "protected"
    DELETABLE = "deletable"


class DeletionInterrupted(StateholdError):
    """A rule's re-check found the location no longer as its listing saw it: the deleter
    stops (as it does on the job's `FencedError`), deleting nothing more."""


class DeletionRule(Protocol):
    """One world's rule as the deleter asks it, for the files of one directory at a time.
    In this order, for every batch: `check_names` when the batch is handed over,
    `recheck` and `unchanged` just before its delete (again before each retry)."""

    def check_names(self, directory: str, names: list[str]) -> list[str]:
        """The last line below every decision: `names`, each one the rule may delete, or
        raise (`UnsafePathError`) before anything of the batch is queued."""
        ...

    def recheck(self) -> None:
        """The outside writer's re-check after its listing: raise `DeletionInterrupted`
        (or the job's `FencedError`) to stop every delete; any other error fails the
        batch (retried as the deleter's attempts allow)."""
        ...

    def unchanged(self, directory: str, names: list[str]) -> list[str]:
        """Of `names`, those still as the listing judged them: the others are kept."""
        ...


__all__ = ["DeletionInterrupted", "DeletionRule", "Verdict"]
