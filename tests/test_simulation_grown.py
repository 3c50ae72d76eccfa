"""The simulation's newer parts (tests/sim/zookeeper.py, list-after-write lag, concurrent
restores): a short sweep of the grown simulation finds no violation, a ZooKeeper seed
replays exactly, each planted bug of a new fault kind is found within its bound while the
unbroken code passes the same seeds, and the bugs these faults found stay fixed."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
from sim.quiet import quiet_logs  # noqa: F401 - autouse: the runs' log is silenced
from sim.world import PLANTS, grown, run_seed

from statehold.errors import StateholdError
from statehold.storage.base import FileInfo, Storage
from tests.support.fault_injection_storage import FaultyStorage

STEPS = 2500
#: Seeds within which each planted bug must be found (each is found at its first seed or
#: second today; the bound leaves room for the runs to change with the code).
BOUND = 8
#: The sweep's seeds (clean; new seeds are explored by `simulate.py --grown`).
SWEEP_SEEDS = range(2000, 2006)




def test_grown_sweep_finds_no_violation() -> None:
    """Both halves of the grown simulation: embedded HA (even seeds) and ZooKeeper with
    lagging followers and lagging listings (odd seeds), concurrent restores in both."""
    events: dict[str, int] = {}
    for seed in SWEEP_SEEDS:
        result, world = run_seed(seed, STEPS, **grown(seed))
        assert not result["violations"], (seed, result["violations"], world.minimal_trace())
        for k, v in result["events"].items():
            events[k] = events.get(k, 0) + v
    # The new faults were reached, not just configured.
    assert events.get("zk-session-expired", 0) + events.get("zk-session-closed", 0) > 0
    assert events.get("zk-connection-loss", 0) > 0
    assert events.get("restore-again", 0) > 0


def test_a_zookeeper_seed_replays_the_same_run() -> None:
    first, w1 = run_seed(3, 1200, **grown(3))
    second, w2 = run_seed(3, 1200, **grown(3))
    assert first == second
    assert list(w1.trace) == list(w2.trace)
    assert any(" zk " in line for line in w1.trace)


@pytest.mark.parametrize("name", sorted(PLANTS))
def test_planted_bug_is_found_and_the_unbroken_code_passes(name: str) -> None:
    _what, options, _patch = PLANTS[name]
    found = None
    for seed in range(BOUND):
        result, _world = run_seed(seed, STEPS, plant=name, **options)
        if result["violations"]:
            found = seed
            break
    assert found is not None, f"planted bug {name!r} not found within {BOUND} seeds"
    for seed in range(found + 1):
        result, world = run_seed(seed, STEPS, **options)
        assert not result["violations"], (name, seed, world.minimal_trace())


# -- bugs the new faults found: regression tests -------------------------------------------


class LaggingListing(FaultyStorage):
    """Listings that do not show the keys in `hidden` yet (a store whose listings lag
    behind its writes); every other call is the inner storage's."""

    def __init__(self, inner: Storage) -> None:
        super().__init__(inner)
        self.hidden: set[str] = set()

    def list_pages(self, prefix: str = "", page_size: int = 1000) -> Iterator[list[FileInfo]]:
        for page in super().list_pages(prefix, page_size):
            shown = [i for i in page if i.key not in self.hidden]
            if shown:
                yield shown


def _start(storage: Storage) -> object:
    from sim import model

    from statehold.checkpoint.coordinator import CheckpointCoordinator
    from statehold.cleanup.cleaner import SyncCleaner
    from statehold.ha.embedded import EmbeddedHAStore

    return CheckpointCoordinator.start(
        storage, EmbeddedHAStore(storage), job_id="j", max_parallelism=model.MAX_PARALLELISM,
        cleaner=lambda guard: SyncCleaner(storage, guard=guard),
        reconcile_in_background=False, renew_lease_in_background=False,
    )


def _checkpoint_1(coordinator: object, storage: Storage) -> None:
    from tests.test_simulation import _acknowledge_all

    coordinator.begin(1)  # type: ignore[attr-defined]
    _acknowledge_all(coordinator, storage, 1)
    coordinator.complete(1)  # type: ignore[attr-defined]


def _hide_savepoint_copies(storage: LaggingListing, name: str) -> Iterable[str]:
    return [i.key for i in storage.inner.list(f"savepoints/{name}")]


def test_list_lag_a_savepoint_is_not_refused_for_copies_a_listing_misses(
    tmp_path: Path,
) -> None:
    """List lag: a savepoint confirmed its copies from a listing of its directory, which
    on a lagging store misses the copies it has just made: every savepoint was refused.
    It now asks the storage per copy."""
    from statehold.checkpoint import job_end
    from statehold.storage.local import LocalStorage

    storage = LaggingListing(LocalStorage(tmp_path))
    coordinator = _start(storage)
    _checkpoint_1(coordinator, storage)
    real_copy = storage.copy

    def copy_unlisted(src: str, dst: str, **kw: object) -> None:
        real_copy(src, dst, **kw)  # type: ignore[arg-type]
        storage.hidden.add(dst)  # just made: not listed yet

    storage.copy = copy_unlisted  # type: ignore[method-assign]
    meta = coordinator.savepoint("sp1")  # type: ignore[attr-defined]
    assert storage.exists("savepoints/sp1/_metadata")
    assert job_end.copies_missing(storage, meta, "savepoints/sp1/_metadata", "sp1") == []
    coordinator.close()  # type: ignore[attr-defined]


def test_list_lag_the_job_end_keeps_the_savepoint_it_has_just_made(tmp_path: Path) -> None:
    """List lag (grown simulation, a ZooKeeper seed): the job end made its savepoint, then
    reconciled without any grace; its listing of ``savepoints/`` did not show the new
    `_metadata` yet, so the savepoint's copies looked like a killed savepoint's leftovers
    and were deleted. A leftover's savepoint is now looked up in the storage itself."""
    from statehold.format.metadata import read_metadata, referenced_keys
    from statehold.job.result import JobOutcome, RetentionPolicy
    from statehold.storage.local import LocalStorage

    storage = LaggingListing(LocalStorage(tmp_path))
    coordinator = _start(storage)
    _checkpoint_1(coordinator, storage)
    real_create = storage.create_if_absent

    def create_unlisted(key: str, data: bytes) -> None:
        real_create(key, data)
        if key.startswith("savepoints/"):
            storage.hidden.add(key)

    storage.create_if_absent = create_unlisted  # type: ignore[method-assign]
    coordinator.end(  # type: ignore[attr-defined]
        JobOutcome.FINISHED, RetentionPolicy.DELETE_ALL, savepoint="last", timeout=5.0
    )
    key = "savepoints/last/_metadata"
    named = referenced_keys(read_metadata(storage, key), key)
    assert named
    assert all(storage.exists(k) for k in named)


def test_concurrent_restores_a_fenced_run_never_overwrites_the_published_metadata(
    tmp_path: Path,
) -> None:
    """Concurrent restores (grown simulation): two runs of one restore into the same job;
    the second claimed a newer epoch, wrote ``chk-N/_metadata`` and published it; the
    first, fenced, took that document for an interrupted restore's leftover and
    overwrote it, so the published pointer named a document that was not there any more.
    The document is now replaced only if no newer epoch wrote it and nothing publishes it.
    Here the second run happens exactly inside the first one's window."""
    from statehold.checkpoint.restore import restore_into
    from statehold.format.metadata import RestoreMode, read_metadata
    from statehold.ha.embedded import EmbeddedHAStore
    from statehold.storage.local import LocalStorage

    source = LocalStorage(tmp_path / "src")
    coordinator = _start(source)
    _checkpoint_1(coordinator, source)
    coordinator.close()  # type: ignore[attr-defined]
    target = FaultyStorage(LocalStorage(tmp_path / "dst"))
    ha = EmbeddedHAStore(target)
    real_create = target.create_if_absent
    inner_run: list[bool] = []

    def create_after_the_other_run(key: str, data: bytes) -> None:
        if key == "chk-1/_metadata" and not inner_run:
            inner_run.append(True)  # the other run, start to end, in this run's window
            restore_into(source, "chk-1/_metadata", target, EmbeddedHAStore(target),
                         job_id="j", mode=RestoreMode.NO_CLAIM, threads=1)
        real_create(key, data)

    target.create_if_absent = create_after_the_other_run  # type: ignore[method-assign]
    with pytest.raises(StateholdError):
        restore_into(source, "chk-1/_metadata", target, ha, job_id="j",
                     mode=RestoreMode.NO_CLAIM, threads=1)
    assert inner_run
    published = ha.read().retained
    assert [p.checkpoint_id for p in published] == [1]
    assert read_metadata(target, "chk-1/_metadata").checksum == published[0].checksum


def test_seed_100314_a_doomed_retry_of_a_published_checkpoint_is_not_in_flight() -> None:
    """Seed 100314 of the grown soak (a bug of the model): an attempt's publish of
    checkpoint 2 landed but reported a failure, and the re-read that would have told
    failed too, so the attempt aborted 2 and tried it again; every retry is refused as
    published already, and a gc (whose live attempt is past 2, as the HA store says)
    took the retry's files. The invariant counted them as an in-flight checkpoint's;
    a retry of a published id can never complete, so it no longer does."""
    result, world = run_seed(100314, STEPS, **grown(100314))
    assert not result["violations"], world.minimal_trace()


def test_seed_102863_a_restore_run_again_into_a_job_claimed_since_changes_nothing() -> None:
    """Seed 102863 of the grown soak (a bug of the model): two runs of a claim restore
    into restored-1; the first finished, restored-1 was then claim-restored into
    restored-2, and the second run, retried, found restored-1 restored already (as it
    should) but the model then checked restored-1's moved files and made it the job
    again."""
    result, world = run_seed(102863, STEPS, **grown(102863))
    assert not result["violations"], world.minimal_trace()


def test_list_lag_a_forced_dispose_of_a_savepoint_leaves_no_document_naming_deleted_files(
    tmp_path: Path,
) -> None:
    """List lag (grown simulation, seed 102961): ``dispose savepoints/X --force`` planned
    from a listing that showed the savepoint's copies but not yet its `_metadata`, so it
    deleted the copies and left the document naming them. The document is now looked up
    by its key and deleted first, with its copies."""
    from statehold.format.metadata import read_metadata, referenced_keys
    from statehold.ha.embedded import EmbeddedHAStore
    from statehold.job.directory import open_job
    from statehold.job.locate import Target
    from statehold.storage.local import LocalStorage
    from statehold.tools.operations import dispose

    storage = LaggingListing(LocalStorage(tmp_path))
    coordinator = _start(storage)
    _checkpoint_1(coordinator, storage)
    coordinator.savepoint("x")  # type: ignore[attr-defined]
    coordinator.close()  # type: ignore[attr-defined]
    key = "savepoints/x/_metadata"
    copies = [k for k in referenced_keys(read_metadata(storage, key), key)
              if k.startswith("savepoints/x/")]
    assert copies
    storage.hidden.add(key)  # just written: not listed yet, its copies are
    with open_job(storage, EmbeddedHAStore(storage)) as job:
        report = dispose(Target(job, "savepoint", key), force=True)
    assert key in report.deleted
    assert not storage.exists(key)
    assert not any(storage.exists(k) for k in copies)
