"""The HA store (completed checkpoint store): small pointers to the retained checkpoints
and the job's current epoch. Never file lists — those live in each `_metadata`.

Fencing: every attempt claims a new, strictly higher epoch. `publish` is a
compare-and-set that fails with FencedError once a later attempt has claimed the job, so
a paused old driver can neither complete a checkpoint nor (through `check_epoch`) discard
anything.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass, field

from statehold.errors import StateholdError


class FencedError(StateholdError):
    """This attempt's epoch is no longer the job's current epoch: another attempt took
    over. The fenced attempt must stop writing and must delete nothing."""


class HAStoreError(StateholdError):
    """The HA store is unreadable or unreachable."""


@dataclass(frozen=True, slots=True)
class CheckpointPointer:
    """Where one retained checkpoint's metadata is: a key relative to the job directory."""

    checkpoint_id: int
    metadata: str
    epoch: int
    #: The `_metadata` document's own checksum, so a restore notices if the file the
    #: pointer names was replaced after it was published.
    checksum: str = ""


@dataclass(frozen=True, slots=True)
class HAState:
    #: The job's current epoch (0 before any attempt claimed it).
    epoch: int
    #: Retained completed checkpoints, oldest first.
    retained: tuple[CheckpointPointer, ...] = ()
    #: Opaque version the backend uses for compare-and-set.
    version: int = field(default=0, compare=False)

    @property
    def latest(self) -> CheckpointPointer | None:
        return self.retained[-1] if self.retained else None


class HAStore(abc.ABC):
    @abc.abstractmethod
    def read(self) -> HAState:
        """The current state (epoch 0 and nothing retained for a new job)."""

    @abc.abstractmethod
    def claim_epoch(self) -> HAState:
        """Start a new attempt: atomically set epoch = current + 1 (keeping the retained
        pointers) and return the new state. Every later call of an older epoch fails."""

    @abc.abstractmethod
    def publish(self, epoch: int, retained: Sequence[CheckpointPointer]) -> HAState:
        """Replace the retained pointers, only if `epoch` is still current; else raise
        FencedError and change nothing."""

    def seed(self, epoch: int, retained: Sequence[CheckpointPointer]) -> HAState:
        """Give a store that was never used its first state: `epoch` and `retained`.
        HAStoreError if it holds any state already (a seed never overwrites). For moving
        a job from one store to another and for exported job directories."""
        raise HAStoreError(f"{type(self).__name__} cannot be seeded")

    def check_epoch(self, epoch: int) -> None:
        """Raise FencedError unless `epoch` is current (called before discards)."""
        current = self.read().epoch
        if current != epoch:
            raise FencedError(f"epoch {epoch} is fenced: the job's current epoch is {current}")

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""
