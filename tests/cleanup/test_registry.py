"""The shared-state registry: unit tests per rule, rebuild on local disk and S3, and a
stateful property test against an independent model of holders."""

from __future__ import annotations

import itertools
import shutil
import tempfile
from collections.abc import Mapping

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    precondition,
    rule,
)

from statehold.cleanup.discard import Discard
from statehold.cleanup.registry import CheckpointHolder, SavepointHolder, SharedStateRegistry
from statehold.format import layout
from statehold.format.layout import Scope
from statehold.format.metadata import (
    CheckpointMetadata,
    KeyGroupRange,
    KeyGroupState,
    MetadataError,
    OperatorState,
    StateFile,
    read_metadata,
)
from statehold.storage import LocalStorage, Storage, UnsafePathError
from tests.support.job_dir_contents import bytes_checksum, write_metadata

S, X, T = Scope.SHARED, Scope.EXCLUSIVE, Scope.TASKOWNED


def make_meta(
    metadata_key: str,
    checkpoint_id: int,
    files: Mapping[str, Scope],
    *,
    savepoint: str | None = None,
    external: tuple[str, ...] = (),
) -> CheckpointMetadata:
    state = [
        StateFile(
            path=layout.relativize(metadata_key, key),
            scope=scope,
            size=1,
            checksum=bytes_checksum(key.encode()),
        )
        for key, scope in sorted(files.items())
    ]
    state += [
        StateFile(path=uri, scope=S, size=1, checksum=bytes_checksum(b""), external=True)
        for uri in external
    ]
    return CheckpointMetadata(
        job_id="job",
        checkpoint_id=checkpoint_id,
        epoch=1,
        kind="savepoint" if savepoint else "checkpoint",
        savepoint_name=savepoint,
        max_parallelism=128,
        operators=[
            OperatorState(
                operator="op",
                ranges=[KeyGroupState(key_groups=KeyGroupRange(start=0, end=127), files=state)],
            )
        ],
    )


def release_savepoint(registry: SharedStateRegistry, name: str) -> Discard:
    """Savepoint `name` disposed of: its files nobody else references and its directory.
    (Dispose goes through the deletion policy, not the registry; the tests release
    savepoints here to check the registry's reference counting with them.)"""
    with registry._lock:
        files = registry._savepoints.pop(name, set())
        return registry._release(
            SavepointHolder(name),
            files,
            layout.savepoint_dir(name),
            layout.savepoint_metadata_key(name),
            f"savepoint {name} disposed",
        )


def files_of(
    registry: SharedStateRegistry, holder: CheckpointHolder | SavepointHolder
) -> frozenset[str]:
    """The keys one checkpoint or savepoint references (empty if unknown)."""
    return frozenset(
        key
        for key in registry.referenced()
        if (entry := registry.entry(key)) is not None and holder in entry.holders
    )


def write_checkpoint(storage: Storage, checkpoint_id: int, files: Mapping[str, Scope]) -> str:
    key = layout.checkpoint_metadata_key(checkpoint_id)
    write_metadata(storage, key, make_meta(key, checkpoint_id, files))
    return key


def write_savepoint(storage: Storage, name: str, files: Mapping[str, Scope]) -> str:
    key = layout.savepoint_metadata_key(name)
    write_metadata(storage, key, make_meta(key, 0, files, savepoint=name))
    return key


# -- unit tests ------------------------------------------------------------------------


def test_shared_file_reused_by_two_checkpoints_is_freed_by_the_last_release() -> None:
    r = SharedStateRegistry()
    a, b = layout.shared_key(1, 1), layout.shared_key(1, 2)
    r.register_checkpoint(1, {a: S})
    r.register_checkpoint(2, {a: S, b: S})
    d1 = r.release_checkpoint(1)
    assert d1.keys == ()
    assert d1.dirs == ("chk-1",)
    assert r.referenced() == {a, b}
    d2 = r.release_checkpoint(2)
    assert set(d2.keys) == {a, b}
    assert d2.dirs == ("chk-2",)
    assert r.referenced() == set()


def test_exclusive_files_are_freed_with_their_checkpoint() -> None:
    r = SharedStateRegistry()
    e3, e4 = layout.exclusive_key(1, 3), layout.exclusive_key(1, 4)
    r.register_checkpoint(3, {e3: X})
    r.register_checkpoint(4, {e4: X})
    assert r.release_checkpoint(3).keys == (e3,)
    assert r.referenced() == {e4}


def test_taskowned_files_are_never_discarded() -> None:
    r = SharedStateRegistry()
    own = "taskowned/rocks/000123.sst"
    in_shared = layout.shared_key(1, 1)
    mislabelled = "taskowned/e1-c1-abc"  # lives under taskowned/ though called SHARED
    r.register_checkpoint(1, {own: T, in_shared: T, mislabelled: S})
    entry = r.entry(mislabelled)
    assert entry is not None and entry.scope is T
    d = r.release_checkpoint(1)
    assert d.keys == ()
    assert d.dirs == ("chk-1",)
    assert r.referenced() == set()


def test_conflicting_scopes_keep_the_protective_one() -> None:
    r = SharedStateRegistry()
    k = layout.shared_key(1, 1)
    r.register_checkpoint(1, {k: S})
    r.register_checkpoint(2, {k: T})
    r.release_checkpoint(1)
    assert r.release_checkpoint(2).keys == ()


def test_pending_checkpoint_protects_reused_files_until_it_aborts() -> None:
    r = SharedStateRegistry()
    old, new, exc = layout.shared_key(1, 1), layout.shared_key(1, 2), layout.exclusive_key(1, 2)
    r.register_checkpoint(1, {old: S})
    r.register_checkpoint(2, {old: S, new: S, exc: X}, pending=True)
    assert r.checkpoints(pending=True) == [2]
    assert r.release_checkpoint(1).keys == ()  # subsumed while 2 is pending
    d = r.release_checkpoint(2)  # abort
    assert set(d.keys) == {old, new, exc}
    assert d.dirs == ("chk-2",)
    assert "aborted" in d.reason


def test_completed_checkpoint_keeps_reused_files() -> None:
    r = SharedStateRegistry()
    old, new = layout.shared_key(1, 1), layout.shared_key(1, 2)
    r.register_checkpoint(1, {old: S})
    r.register_checkpoint(2, {old: S, new: S}, pending=True)
    r.complete(2)
    r.complete(2)  # idempotent
    assert r.checkpoints(pending=False) == [1, 2]
    assert r.checkpoints(pending=True) == []
    assert r.release_checkpoint(1).keys == ()
    assert set(r.release_checkpoint(2).keys) == {old, new}


def test_savepoint_keeps_files_of_subsumed_checkpoints_until_disposed() -> None:
    r = SharedStateRegistry()
    sh, ex = layout.shared_key(1, 5), layout.exclusive_key(1, 5)
    own = "savepoints/sp-1/state-0"
    r.register_checkpoint(5, {sh: S, ex: X})
    r.register_savepoint("sp-1", {sh: S, ex: X, own: X})
    assert r.release_checkpoint(5) == Discard((), ("chk-5",), "checkpoint 5 released")
    assert r.referenced() == {sh, ex, own}
    entry = r.entry(sh)
    assert entry is not None and entry.holders == frozenset({SavepointHolder("sp-1")})
    d = release_savepoint(r, "sp-1")
    assert set(d.keys) == {sh, ex, own}
    assert d.dirs == ("savepoints/sp-1",)
    assert r.savepoints() == []
    assert r.referenced() == set()


def test_releasing_unknown_or_twice_returns_only_the_directory() -> None:
    r = SharedStateRegistry()
    k = layout.shared_key(1, 1)
    r.register_checkpoint(1, {k: S})
    r.register_checkpoint(2, {k: S})
    assert r.release_checkpoint(1).keys == ()
    again = r.release_checkpoint(1)
    assert again.keys == () and again.dirs == ("chk-1",)
    assert r.entry(k) is not None  # still held by 2
    assert r.release_checkpoint(99) == Discard((), ("chk-99",), "checkpoint 99 released")
    assert release_savepoint(r, "nope").keys == ()
    assert r.release_checkpoint(2).keys == (k,)
    assert r.release_checkpoint(2).keys == ()


def test_directory_holding_a_referenced_file_is_not_removed() -> None:
    r = SharedStateRegistry()
    inside = "chk-3/inline-state"
    r.register_checkpoint(3, {inside: X})
    r.register_savepoint("keep", {inside: X})
    d = r.release_checkpoint(3)
    assert d.dirs == ()
    assert d.keys == ("chk-3/_metadata",)
    assert release_savepoint(r, "keep").keys == (inside,)


def test_entry_tracks_creator_last_user_and_holders() -> None:
    r = SharedStateRegistry()
    named = layout.shared_key(4, 7)
    odd = "taskowned/sub/file"
    r.register_savepoint("sp", {odd: T})
    r.register_checkpoint(9, {named: S, odd: T}, pending=True)
    r.register_checkpoint(8, {named: S})
    e = r.entry(named)
    assert e is not None
    assert (e.key, e.scope, e.created_by, e.last_used_by) == (named, S, 7, 9)
    assert e.holders == frozenset({CheckpointHolder(8), CheckpointHolder(9)})
    o = r.entry(odd)
    assert o is not None
    assert o.created_by == 9  # first registering checkpoint (the savepoint has no id)
    assert o.holders == frozenset({SavepointHolder("sp"), CheckpointHolder(9)})
    assert r.entry("shared/unknown") is None
    assert files_of(r, CheckpointHolder(9)) == {named, odd}
    assert files_of(r, SavepointHolder("sp")) == {odd}
    assert files_of(r, CheckpointHolder(1)) == frozenset()


def test_incremental_registration_and_state_checks() -> None:
    r = SharedStateRegistry()
    a, b = layout.shared_key(1, 1), layout.exclusive_key(1, 1)
    r.register_checkpoint(1, {a: S}, pending=True)
    r.register_checkpoint(1, {b: X}, pending=True)  # another task reports later
    assert files_of(r, CheckpointHolder(1)) == {a, b}
    with pytest.raises(ValueError, match="pending"):
        r.register_checkpoint(1, {}, pending=False)
    with pytest.raises(KeyError):
        r.complete(2)
    with pytest.raises(ValueError):
        r.register_checkpoint(-1, {})
    with pytest.raises(ValueError):
        r.register_savepoint("../evil", {})


@pytest.mark.parametrize("bad", ["/etc/passwd", "../outside", "shared/../../x", ""])
def test_unsafe_keys_are_refused(bad: str) -> None:
    r = SharedStateRegistry()
    with pytest.raises(UnsafePathError):
        r.register_checkpoint(1, {bad: S})
    assert r.referenced() == set()
    assert r.checkpoints() == []


# -- rebuild on real storage -------------------------------------------------------------
def rebuild(storage: Storage, keys: list[str]) -> SharedStateRegistry:
    """What a restart does: the documents are read (and verified) by the caller, the
    registry only takes them."""
    return SharedStateRegistry.from_metadata((k, read_metadata(storage, k)) for k in keys)



def test_rebuild_from_metadata_on_storage(storage: Storage) -> None:
    sh1, sh2 = layout.shared_key(1, 1), layout.shared_key(1, 2)
    ex2, tk = layout.exclusive_key(1, 2), "taskowned/t0/db"
    keys = [
        write_checkpoint(storage, 1, {sh1: S}),
        write_checkpoint(storage, 2, {sh1: S, sh2: S, ex2: X, tk: T}),
        write_savepoint(storage, "before-upgrade", {sh1: S}),
    ]
    r = rebuild(storage, keys)
    assert r.checkpoints(pending=False) == [1, 2]
    assert r.savepoints() == ["before-upgrade"]
    assert r.referenced() == {sh1, sh2, ex2, tk}
    e = r.entry(sh1)
    assert e is not None
    assert e.holders == frozenset(
        {CheckpointHolder(1), CheckpointHolder(2), SavepointHolder("before-upgrade")}
    )
    assert (e.created_by, e.last_used_by) == (1, 2)
    assert r.release_checkpoint(1).keys == ()
    assert set(r.release_checkpoint(2).keys) == {sh2, ex2}
    assert release_savepoint(r, "before-upgrade").keys == (sh1,)


def test_rebuild_ignores_external_files(storage: Storage) -> None:
    key = layout.checkpoint_metadata_key(3)
    local = layout.shared_key(1, 3)
    meta = make_meta(key, 3, {local: S}, external=("s3://other/job/shared/e1-c1-x",))
    write_metadata(storage, key, meta)
    r = rebuild(storage, [key])
    assert r.referenced() == {local}


def test_rebuild_refuses_missing_damaged_or_misplaced_metadata(storage: Storage) -> None:
    with pytest.raises(MetadataError, match="missing"):
        rebuild(storage, [layout.checkpoint_metadata_key(1)])
    key = write_checkpoint(storage, 2, {layout.shared_key(1, 2): S})
    storage.write(key, storage.read(key).replace(b"shared/", b"shared/x"))
    with pytest.raises(MetadataError, match="checksum"):
        rebuild(storage, [key])
    wrong = layout.checkpoint_metadata_key(5)
    write_metadata(storage, wrong, make_meta(wrong, 4, {}))
    with pytest.raises(MetadataError, match="not the checkpoint"):
        rebuild(storage, [wrong])
    with pytest.raises(ValueError):  # a document is only taken under a `_metadata` key
        SharedStateRegistry.from_metadata([("_ha/pointer", read_metadata(storage, wrong))])


# -- stateful property test --------------------------------------------------------------


class RegistryMachine(RuleBasedStateMachine):
    """Random checkpoint/savepoint lifecycles, with restarts that rebuild the registry
    from `_metadata` written to real local storage, checked against a plain model."""

    pending_ids = Bundle("pending_ids")
    savepoint_names = Bundle("savepoint_names")

    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.mkdtemp(prefix="statehold-registry-")
        self.storage = LocalStorage(self.tmp)
        self.registry = SharedStateRegistry()
        self.epoch = 1
        self.next_id = itertools.count(1)
        self.names = itertools.count()
        self.retain = 1
        # the model: holder -> files
        self.retained: dict[int, dict[str, Scope]] = {}
        self.pending: dict[int, dict[str, Scope]] = {}
        self.live_savepoints: dict[str, dict[str, Scope]] = {}
        self.created: set[str] = set()  # every non-taskowned file ever referenced
        self.released: set[str] = set()
        self.released_dirs: set[str] = set()
        self.ended: set[int] = set()  # checkpoints subsumed or aborted

    def teardown(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)

    def held(self) -> set[str]:
        holders = [*self.retained.values(), *self.pending.values(), *self.live_savepoints.values()]
        return {k for files in holders for k in files}

    def apply(self, discard: Discard) -> None:
        live_dirs = {layout.checkpoint_dir(i) for i in [*self.retained, *self.pending]}
        live_dirs |= {layout.savepoint_dir(n) for n in self.live_savepoints}
        assert not set(discard.dirs) & live_dirs
        assert not any(k.startswith("taskowned/") for k in discard.keys)
        self.released |= set(discard.keys)
        self.released_dirs |= set(discard.dirs)

    @rule(retain=st.integers(1, 4))
    def set_retention(self, retain: int) -> None:
        self.retain = retain

    @rule(
        target=pending_ids,
        new_shared=st.integers(0, 3),
        exclusive=st.integers(0, 2),
        taskowned=st.booleans(),
        reuse=st.data(),
    )
    def begin(
        self, new_shared: int, exclusive: int, taskowned: bool, reuse: st.DataObject
    ) -> int:
        cid = next(self.next_id)
        files: dict[str, Scope] = {}
        files |= {layout.shared_key(self.epoch, cid, f"s{i}"): S for i in range(new_shared)}
        files |= {layout.exclusive_key(self.epoch, cid, f"x{i}"): X for i in range(exclusive)}
        if taskowned:
            files[f"taskowned/task-{cid % 3}/LOG"] = T
        candidates = sorted(
            {k for f in self.retained.values() for k, s in f.items() if s is S}
        )
        if candidates:
            files |= {k: S for k in reuse.draw(st.lists(st.sampled_from(candidates)))}
        self.registry.register_checkpoint(cid, files, pending=True)
        self.pending[cid] = files
        self.created |= {k for k, s in files.items() if s is not T}
        return cid

    @rule(cid=consumes(pending_ids))
    def complete(self, cid: int) -> None:
        if cid not in self.pending:
            return  # dropped by a restart
        files = self.pending.pop(cid)
        write_checkpoint(self.storage, cid, files)
        self.registry.complete(cid)
        self.retained[cid] = files
        for old in sorted(self.retained)[: -self.retain]:
            del self.retained[old]
            self.ended.add(old)
            self.apply(self.registry.release_checkpoint(old))

    @rule(cid=consumes(pending_ids))
    def abort(self, cid: int) -> None:
        if cid not in self.pending:
            return
        del self.pending[cid]
        self.ended.add(cid)
        self.apply(self.registry.release_checkpoint(cid))

    @precondition(lambda self: bool(self.retained))
    @rule(target=savepoint_names, data=st.data(), own_file=st.booleans())
    def take_savepoint(self, data: st.DataObject, own_file: bool) -> str:
        name = f"sp-{next(self.names)}"
        current = self.retained[max(self.retained)]
        chosen = (
            data.draw(st.lists(st.sampled_from(sorted(current)), unique=True)) if current else []
        )
        files = {k: current[k] for k in chosen}
        if own_file:
            files[f"{layout.savepoint_dir(name)}/state-0"] = X
        write_savepoint(self.storage, name, files)
        self.registry.register_savepoint(name, files)
        self.live_savepoints[name] = files
        self.created |= {k for k, s in files.items() if s is not T}
        return name

    @rule(name=consumes(savepoint_names))
    def dispose_savepoint(self, name: str) -> None:
        del self.live_savepoints[name]
        self.apply(release_savepoint(self.registry, name))

    @rule()
    def restart(self) -> None:
        """A crash: a new attempt rebuilds the registry from the retained checkpoints and
        savepoints; pending checkpoints of the old attempt are dead, and their files nobody
        else references are left to the reconcile (modelled as released here)."""
        keys = [layout.checkpoint_metadata_key(i) for i in sorted(self.retained)]
        keys += [layout.savepoint_metadata_key(n) for n in sorted(self.live_savepoints)]
        self.registry = rebuild(self.storage, keys)
        dead = {k for files in self.pending.values() for k in files}
        self.ended |= set(self.pending)
        self.pending.clear()
        self.epoch += 1
        self.released |= {k for k in dead - self.held() if not k.startswith("taskowned/")}

    @invariant()
    def nothing_referenced_was_released(self) -> None:
        assert not self.released & self.held()

    @invariant()
    def everything_unreferenced_was_released(self) -> None:
        assert self.created - self.held() <= self.released

    @invariant()
    def registry_agrees_with_model(self) -> None:
        assert self.registry.referenced() == self.held()
        assert self.registry.checkpoints(pending=True) == sorted(self.pending)
        assert self.registry.checkpoints(pending=False) == sorted(self.retained)
        assert self.registry.savepoints() == sorted(self.live_savepoints)
        for sp, files in self.live_savepoints.items():
            for key in files:
                entry = self.registry.entry(key)
                assert entry is not None and SavepointHolder(sp) in entry.holders

    @invariant()
    def every_ended_checkpoint_directory_was_released(self) -> None:
        # a checkpoint dropped by a restart before completing leaves its dir to reconcile
        released_ids = {
            int(d.removeprefix("chk-")) for d in self.released_dirs if d.startswith("chk-")
        }
        assert released_ids <= self.ended
        assert not released_ids & (set(self.retained) | set(self.pending))


TestRegistryMachine = RegistryMachine.TestCase
TestRegistryMachine.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def test_savepoint_outlives_subsumed_checkpoint_in_a_long_run(tmp_path: object) -> None:
    """Deterministic scenario: a savepoint shares a file with a checkpoint that is then
    subsumed many times over and survives a restart; it is freed only on dispose."""
    storage = LocalStorage(str(tmp_path))
    r = SharedStateRegistry()
    base = layout.shared_key(1, 1)
    r.register_checkpoint(1, {base: S})
    write_checkpoint(storage, 1, {base: S})
    r.register_savepoint("sp", {base: S})
    sp_key = write_savepoint(storage, "sp", {base: S})
    released: set[str] = set()
    for cid in range(2, 8):
        f = layout.shared_key(1, cid)
        r.register_checkpoint(cid, {f: S}, pending=True)
        r.complete(cid)
        write_checkpoint(storage, cid, {f: S})
        released |= set(r.release_checkpoint(cid - 1).keys)
    assert base not in released
    r = rebuild(storage, [layout.checkpoint_metadata_key(7), sp_key])
    assert r.entry(base) is not None
    assert release_savepoint(r, "sp").keys == (base,)
