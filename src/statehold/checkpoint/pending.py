"""A begun, not yet completed checkpoint: the tasks' reports so far, and the check that
they cover every key group once before a ``_metadata`` names them."""

from __future__ import annotations

from dataclasses import dataclass, field

from statehold.errors import CheckpointError
from statehold.format.metadata import KeyGroupState, OperatorState


@dataclass
class PendingCheckpoint:
    checkpoint_id: int
    started_at: float
    acks: dict[str, list[KeyGroupState]] = field(default_factory=dict)
    #: complete() got as far as writing ``chk-N/_metadata``.
    metadata_written: bool = False

    def operators(self, max_parallelism: int) -> list[OperatorState]:
        """Each operator's reported ranges in key-group order; CheckpointError unless they
        cover 0..max_parallelism-1 exactly once."""
        operators = [
            OperatorState(
                operator=name, ranges=sorted(states, key=lambda s: s.key_groups.start)
            )
            for name, states in sorted(self.acks.items())
        ]
        for op in operators:
            _check_coverage(op, max_parallelism)
        return operators


def _check_coverage(op: OperatorState, max_parallelism: int) -> None:
    expected = 0
    for kg in op.ranges:
        if kg.key_groups.start != expected:
            raise CheckpointError(
                f"operator {op.operator!r}: key groups {expected}..{kg.key_groups.start - 1} "
                "missing or reported twice"
            )
        expected = kg.key_groups.end + 1
    if expected != max_parallelism:
        raise CheckpointError(
            f"operator {op.operator!r}: key groups {expected}..{max_parallelism - 1} missing"
        )
