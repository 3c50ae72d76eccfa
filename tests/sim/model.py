"""The simulated tasks' state and the reference model it must equal.

Batch b gives task i (key groups `RANGES[i]`) the value `delta(b, i)`; the state of task
i after checkpoint N is the sum over batches 1..N, whatever happened in between (aborts,
retries, restarts, restores), because batch b is a pure function of b. A task stores its
state incrementally: each checkpoint writes one new shared file with the sum of the
batches since its previous file (``{"lo": a, "hi": b, "sum": s}``, covering a+1..b), and
keeps referencing the older ones; now and then it compacts (one file covering 1..N). It
also writes one exclusive file, its manifest ``{"task": i, "checkpoint": N, "total": T}``.
`restored_state` reads a checkpoint back from the files alone, like a restore.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from statehold.format import layout
from statehold.format.layout import Scope
from statehold.format.metadata import (
    CheckpointMetadata,
    KeyGroupRange,
    KeyGroupState,
    StateFile,
    referenced_keys,
)
from tests.support.job_dir_contents import bytes_checksum

MAX_PARALLELISM = 8
RANGES = [KeyGroupRange(start=0, end=3), KeyGroupRange(start=4, end=7)]
OPERATOR = "agg"
JOB_ID = "sim-job"


def delta(b: int, i: int) -> int:
    return (b * 7919 + i * 104729) % 101 - 30


def reference(n: int, i: int) -> int:
    return sum(delta(b, i) for b in range(1, n + 1))


@dataclass(frozen=True)
class ChainFile:
    """One shared file of a task's chain: its job key, handle and what it covers."""

    key: str
    handle: StateFile
    lo: int
    hi: int


@dataclass(frozen=True)
class Chain:
    """A task's state as of checkpoint `at`: the shared files that hold it."""

    files: tuple[ChainFile, ...] = ()
    at: int = 0


def file_bytes(payload: dict[str, int]) -> bytes:
    return json.dumps(payload, sort_keys=True).encode()


def handle(data: bytes, scope: Scope) -> StateFile:
    return StateFile(path="x", scope=scope, size=len(data), checksum=bytes_checksum(data))


def key_group_state(
    checkpoint_id: int, i: int, chain: Chain, exclusive: tuple[str, StateFile]
) -> KeyGroupState:
    metadata_key = layout.checkpoint_metadata_key(checkpoint_id)
    files = [
        f.handle.model_copy(update={"path": layout.relativize(metadata_key, f.key)})
        for f in chain.files
    ]
    ex_key, ex = exclusive
    files.append(ex.model_copy(update={"path": layout.relativize(metadata_key, ex_key)}))
    return KeyGroupState(key_groups=RANGES[i], files=files)


def chain_of(metadata_key: str, meta: CheckpointMetadata, i: int, read: object) -> Chain:
    """The chain of task i in a checkpoint, from its shared files' contents (`read(key)`
    gives a file's bytes)."""
    files = []
    for op in meta.operators:
        for kg in op.ranges:
            if kg.key_groups != RANGES[i]:
                continue
            for f in kg.files:
                if f.scope is not Scope.SHARED:
                    continue
                key = layout.resolve(metadata_key, f.path)
                doc = json.loads(read(key))  # type: ignore[operator]
                files.append(ChainFile(key, f.model_copy(update={"path": "x"}), doc["lo"],
                                       doc["hi"]))
    files.sort(key=lambda f: f.lo)
    return Chain(tuple(files), meta.checkpoint_id)


def restored_state(
    metadata_key: str, meta: CheckpointMetadata, read: object
) -> dict[int, tuple[int, int]] | str:
    """Task -> (sum of its shared files, its manifest's total), or why it cannot be read
    back: a gap or overlap in a chain, a file whose checksum does not match."""
    out: dict[int, tuple[int, int]] = {}
    files = referenced_keys(meta, metadata_key)
    for key, f in files.items():
        data = read(key)  # type: ignore[operator]
        if bytes_checksum(data) != f.checksum:
            return f"{key}: checksum mismatch"
    for i in range(len(RANGES)):
        covered = 0
        total = 0
        manifest = None
        for op in meta.operators:
            for kg in op.ranges:
                if kg.key_groups != RANGES[i]:
                    continue
                shared = []
                for f in kg.files:
                    doc = json.loads(read(layout.resolve(metadata_key, f.path)))  # type: ignore[operator]
                    if f.scope is Scope.SHARED:
                        shared.append(doc)
                    else:
                        manifest = doc
                for doc in sorted(shared, key=lambda d: d["lo"]):
                    if doc["lo"] != covered:
                        return f"task {i}: chain gap/overlap at {covered} ({doc})"
                    covered, total = doc["hi"], total + doc["sum"]
        if covered != meta.checkpoint_id:
            return f"task {i}: chain covers 1..{covered}, not 1..{meta.checkpoint_id}"
        if manifest is None or manifest.get("checkpoint") != meta.checkpoint_id:
            return f"task {i}: manifest {manifest} is not checkpoint {meta.checkpoint_id}'s"
        out[i] = (total, manifest["total"])
    return out
