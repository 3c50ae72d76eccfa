"""Expired state leaves storage: after every key of a task expired (by TTL, or cleared by
the timers that closed it), a few checkpoints later the newest checkpoint's files in the
job directory are a small fraction of what they were while the keys lived. And RocksDB
keeps writing bloom filters after a restore (it dropped them when reopening a DB)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from statehold.backend import TaskStateBackend, task_range
from statehold.backend.rocks import RestoreSource
from statehold.backend.ttl import expire_and_compact
from statehold.format import layout
from statehold.format.metadata import read_metadata, referenced_keys
from statehold.processor.api import TimeMode
from statehold.processor.handle import StatefulProcessorHandle
from statehold.storage import Storage
from tests.support.paths import ROOT
from tests.support.task_backend import MAXP, OP, checkpoint, snap

STEP = 1_000  # ms of processing and event time per batch


def _newest_files(storage: Storage, cid: int) -> dict[str, int]:
    """The job directory's files that checkpoint `cid` references (listed, so the sizes
    are what storage holds), by key."""
    key = layout.checkpoint_metadata_key(cid)
    refs = referenced_keys(read_metadata(storage, key), key)
    listed = {f.key: f.size for f in storage.list("")}
    assert set(refs) <= set(listed), "a referenced file is missing"
    return {k: listed[k] for k in refs}


def _sst_bytes(files: dict[str, int]) -> int:
    return sum(size for k, size in files.items() if k.endswith(".sst"))


def _batch(b: TaskStateBackend, n: int, keys: int, with_ttl: bool) -> None:
    """Batches 1-3 write `keys` new users each (a profile, TTL'd or not, and a timer two
    batches on); every batch fires the due timers, which clear what has no TTL, then the
    task's end of batch runs (sweep, compaction decision)."""
    now = n * STEP
    h = StatefulProcessorHandle(b._require_kv(), b.key_groups, MAXP, TimeMode.EVENT_TIME,
                                now, now)
    profile = h.get_value_state("profile", ttl=2 * STEP if with_ttl else None)
    if n <= 3:
        for i in range(keys):
            h._bind(f"b{n}-user-{i}")
            profile.update({"page": os.urandom(60).hex(), "n": n})
            h.register_timer(now + 2 * STEP)
    for expiry, group, key in h.timers.due(now):
        h.timers.delete(group, key, expiry)
        if not with_ttl:
            h._bind(key, group)
            profile.clear()
    expire_and_compact(b._require_kv(), b._require_db(), b.key_groups, now)


@pytest.mark.parametrize("with_ttl", [True, False], ids=["ttl", "timers"])
def test_storage_shrinks_after_expiry(storage: Storage, tmp_path: Path, with_ttl: bool
                                      ) -> None:
    sources: list[RestoreSource] | None = None
    sizes: dict[int, int] = {}
    for n in range(1, 10):  # every batch a task of its own, restored as on Spark
        with TaskStateBackend.open(tmp_path / "local", OP, task_range(0, 1, MAXP), MAXP,
                                   sources) as b:
            _batch(b, n, 300, with_ttl)
            state = snap(b, storage, n)
            b.commit_local(n)
            if n == 9:
                assert list(b.items()) == []  # every key expired
        sources = checkpoint(storage, n, [state])
        sizes[n] = _sst_bytes(_newest_files(storage, n))
    live = sizes[3]  # 900 users, none expired yet
    assert live > 900 * 60  # their incompressible pages at least
    # every user expired by batch 6; three checkpoints later the newest holds (almost)
    # nothing of them: at most a tenth of the live state's bytes
    assert sizes[9] <= 0.1 * live, sizes
    assert max(sizes[n] for n in (7, 8, 9)) <= 0.1 * live, sizes


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


def test_ttl_churn_bench_runs_and_stays_within_goal(tmp_path: Path) -> None:
    """bench/ttl_churn.py end to end (tiny): with the task's compaction the newest
    checkpoint stays within 1.3x of the live state at every batch once users expire;
    with universal compaction alone it does not."""
    out = tmp_path / "churn.json"
    root = ROOT
    subprocess.run(
        [sys.executable, str(root / "bench" / "ttl_churn.py"), "--users", "60",
         "--batches", "10", "--policy", "none,garbage", "--out", str(out)],
        check=True, capture_output=True, timeout=600,
    )
    results = json.loads(out.read_text())
    assert results["garbage"]["summary"]["newest_over_live_max"] <= 1.3
    assert results["none"]["summary"]["newest_over_live_median"] > 2
    steps = results["garbage"]["steps"]
    assert all(s["live_bytes"] > 0 and s["newest_checkpoint_bytes"] > 0 for s in steps)


def test_max_garbage_must_be_a_fraction(tmp_path: Path) -> None:
    for bad in (0, -0.1, 1.5):
        with pytest.raises(ValueError, match="max_garbage"):
            TaskStateBackend.open(tmp_path, OP, task_range(0, 1, MAXP), MAXP,
                                  max_garbage=bad)
    with TaskStateBackend.open(tmp_path, OP, task_range(0, 1, MAXP), MAXP,
                               max_garbage=0.5) as b:
        assert b.max_garbage == 0.5
