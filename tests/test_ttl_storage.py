"""RocksDB keeps writing bloom filters after a restore (it dropped them when reopening a
DB)."""

from __future__ import annotations

import re
from pathlib import Path

from test_backend import MAXP, OP, checkpoint, snap

from statehold.backend import TaskStateBackend, task_range
from statehold.backend.rocks import RestoreSource
from statehold.storage import Storage


def _filter_entries(b: TaskStateBackend) -> tuple[int, int]:
    text = b._require_db().property_value("rocksdb.aggregated-table-properties") or ""
    entries = re.search(r"# entries=(\d+)", text)
    filtered = re.search(r"# entries for filter=(\d+)", text)
    assert entries and filtered
    return int(entries.group(1)), int(filtered.group(1))


def test_bloom_filters_survive_a_restore(storage: Storage, tmp_path: Path) -> None:
    sources: list[RestoreSource] | None = None
    for n in (1, 2, 3):
        with TaskStateBackend.open(tmp_path / "local", OP, task_range(0, 1, MAXP), MAXP,
                                   sources) as b:
            for i in range(200):
                b.value_state("v", f"k{n}-{i}").update(i)
            state = snap(b, storage, n)
            b.commit_local(n)
            entries, filtered = _filter_entries(b)
            assert entries == 200 * n and filtered == entries  # every SST has a filter
        sources = checkpoint(storage, n, [state])
