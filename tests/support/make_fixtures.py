"""The format upgrade fixtures: small job directories written by the current format,
committed under ``tests/fixtures/<name>/`` so every later version is tested against what
this one wrote (tests/format/test_upgrade_fixtures.py).

Run by hand when the on-disk format changes (a new fixture folder; never rewrite an old
one)::

    python -m tests.support.make_fixtures            # tests/fixtures/v<metadata version>-<yyyy-mm>/
    python -m tests.support.make_fixtures NAME       # tests/fixtures/NAME/

Each fixture is a stopped job written by the real coordinator with simulated tasks
(tests.support.simulated_tasks): two retained checkpoints (the newest records state
schemas and event time, so `_metadata` of both versions is present), a savepoint, an
aborted checkpoint, their history records, the embedded HA store (``_ha/``) and the owner
record (``_job/owner.json``). Beside the job directory, ``fixture.json`` records what the
writing version saw: the formats, the retained checkpoints, the savepoints and every file.
"""

from __future__ import annotations

import json
import random
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from statehold.checkpoint.coordinator import CheckpointCoordinator
from statehold.cleanup.cleaner import Guard, SyncCleaner
from statehold.format import layout
from statehold.format import metadata as metadata_format
from statehold.format.metadata import EventTime, OperatorSchemas, VariableSchema
from statehold.ha import embedded
from statehold.job import history, owner
from statehold.storage import LocalStorage, Storage
from tests.support.simulated_tasks import (
    MAX_PARALLELISM,
    RANGES,
    SimulatedTask,
    referenced_by_retained,
    run_checkpoint,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
JOB_DIR = "job"
MANIFEST = "fixture.json"
JOB_ID = "fixture-job"
RETAIN = 2
SAVEPOINT = "sp-1"
OPERATOR = "agg"
SCHEMAS = {
    OPERATOR: OperatorSchemas(
        key='{"type":"struct","fields":[{"name":"k","type":"string","nullable":true,'
        '"metadata":{}}]}',
        variables={"total": VariableSchema(kind="value", value='"long"')},
    )
}


def sync_cleaner(storage: Storage) -> Any:
    """A cleaner factory: deletes in the caller's thread, fenced by the attempt's guard."""

    def make(guard: Guard) -> SyncCleaner:
        return SyncCleaner(storage, guard)

    return make


def start(storage: Storage) -> CheckpointCoordinator:
    """An attempt of the fixture job: embedded HA store (recorded by the owner record),
    synchronous deletes, no background threads."""
    return CheckpointCoordinator.start(
        storage,
        job_id=JOB_ID,
        max_parallelism=MAX_PARALLELISM,
        retain=RETAIN,
        cleaner=sync_cleaner(storage),
        reconcile_in_background=False,
        renew_lease_in_background=False,
    )


def tasks_of(storage: Storage, coord: CheckpointCoordinator, seed: int) -> list[SimulatedTask]:
    rng = random.Random(seed)
    return [SimulatedTask(storage, r, rng).restore(coord) for r in RANGES]


def write_job(root: Path) -> dict[str, Any]:
    """Write the fixture job under `root` and return its manifest."""
    storage = LocalStorage(root)
    coord = start(storage)
    tasks = tasks_of(storage, coord, seed=2026)
    run_checkpoint(coord, tasks, 1)
    run_checkpoint(coord, tasks, 2)
    coord.savepoint(SAVEPOINT)
    # The newest checkpoint records state schemas and time: `_metadata` version 2.
    coord.begin(3)
    for task in tasks:
        coord.acknowledge(3, OPERATOR, task.snapshot(coord.epoch, 3))
    coord.complete(
        3,
        {"batch_id": 3},
        event_time=EventTime(time_mode="eventtime", watermark_ms=1_700_000_000_000),
        state_schemas=SCHEMAS,
    )
    # An aborted checkpoint: an "aborted" history record, its uploads discarded.
    coord.begin(4)
    coord.acknowledge(4, OPERATOR, tasks[0].snapshot(coord.epoch, 4))
    coord.abort(4, "a task failed")
    coord.close()
    retained = [key for key, _ in coord.retained()]
    savepoint_key = layout.savepoint_metadata_key(SAVEPOINT)
    saved = metadata_format.read_metadata(storage, savepoint_key)
    referenced = referenced_by_retained(storage, coord) | {savepoint_key}
    referenced |= set(metadata_format.referenced_keys(saved, savepoint_key))
    return {
        "written_by": "tests/support/make_fixtures.py",
        "formats": {
            metadata_format.FORMAT_NAME: metadata_format.FORMAT_VERSION,
            embedded.FORMAT_NAME: embedded.FORMAT_VERSION,
            owner.OWNER_FORMAT: owner.OWNER_VERSION,
            history.FORMAT: history.VERSION,
        },
        "job_id": JOB_ID,
        "epoch": coord.epoch,
        "max_parallelism": MAX_PARALLELISM,
        "retain": RETAIN,
        "retained": retained,
        "savepoints": [savepoint_key],
        "referenced": sorted(referenced),
        "files": {info.key: info.size for info in sorted(storage.list(), key=lambda i: i.key)},
    }


def default_name() -> str:
    return f"v{metadata_format.FORMAT_VERSION}-{time.strftime('%Y-%m', time.gmtime())}"


def make(name: str, fixtures: Path = FIXTURES) -> Path:
    """Write fixture `name` (refusing to overwrite one: committed fixtures never change)."""
    out = fixtures / name
    if out.exists():
        raise SystemExit(f"{out} exists: committed fixtures are never rewritten")
    tmp = fixtures / f".{name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    manifest = write_job(tmp / JOB_DIR)
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    tmp.rename(out)
    return out


if __name__ == "__main__":
    print(make(sys.argv[1] if len(sys.argv) > 1 else default_name()))
