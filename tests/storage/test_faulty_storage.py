"""The fault injector does what it is configured to do, on local disk and on S3."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from statehold.storage import DeleteError, Storage
from tests.support.fault_injection_storage import (
    FaultyStorage,
    InjectedFault,
    PermissionDeniedFault,
)

StorageFactory = Callable[[], Storage]


def _fill(storage: Storage, keys: list[str]) -> None:
    for k in keys:
        storage.write(k, k.encode())


def _keys(storage: Storage) -> set[str]:
    return {f.key for f in storage.list()}


def _failed_deletes(storage: Storage, seed: int, keys: list[str]) -> set[str]:
    _fill(storage, keys)
    faulty = FaultyStorage(storage, seed=seed, delete_fail_rate=0.5)
    with pytest.raises(DeleteError) as exc:
        faulty.delete_many(keys)
    failed = set(exc.value.failed)
    # exactly the named keys survived; all others were deleted
    assert _keys(storage) == failed
    assert faulty.injected["delete_many"] == len(failed)
    return failed


def test_seeded_failures_reproduce(storage_factory: StorageFactory) -> None:
    keys = [f"exclusive/e1-c1-{i:03d}" for i in range(40)]
    first = _failed_deletes(storage_factory(), 7, keys)
    again = _failed_deletes(storage_factory(), 7, keys)
    other = _failed_deletes(storage_factory(), 8, keys)
    assert first == again
    assert 0 < len(first) < len(keys)
    assert other != first


def test_delete_many_names_exactly_the_denied_keys(storage: Storage) -> None:
    keys = ["exclusive/a", "exclusive/bad", "shared/locked/x", "shared/locked/y", "shared/ok"]
    _fill(storage, keys + ["shared/keep"])
    faulty = FaultyStorage(storage)
    faulty.fail_permanently("exclusive/bad")
    faulty.fail_permanently("shared/locked/")  # a whole directory
    with pytest.raises(DeleteError) as exc:
        faulty.delete_many(keys)
    assert set(exc.value.failed) == {"exclusive/bad", "shared/locked/x", "shared/locked/y"}
    assert all(isinstance(e, PermissionDeniedFault) for e in exc.value.failed.values())
    assert _keys(storage) == {"exclusive/bad", "shared/locked/x", "shared/locked/y", "shared/keep"}

    # permanent means permanent: the same call fails the same way again
    with pytest.raises(DeleteError) as exc:
        faulty.delete_many(["exclusive/bad"])
    assert set(exc.value.failed) == {"exclusive/bad"}

    faulty.heal("exclusive/bad")
    with pytest.raises(DeleteError) as exc:
        faulty.delete_many(keys)  # missing keys are fine, the locked dir still fails
    assert set(exc.value.failed) == {"shared/locked/x", "shared/locked/y"}
    assert _keys(storage) == {"shared/locked/x", "shared/locked/y", "shared/keep"}
    with pytest.raises(DeleteError):
        faulty.delete_many(["shared/locked/x"])
    faulty.heal_all()
    faulty.delete_many(keys)
    assert _keys(storage) == {"shared/keep"}


def test_delete_prefix_keeps_denied_files_and_deletes_the_rest(storage: Storage) -> None:
    _fill(storage, ["chk-3/_metadata", "chk-3/a", "chk-3/sub/b", "chk-30/_metadata"])
    faulty = FaultyStorage(storage)
    faulty.fail_permanently("chk-3/sub/b")
    with pytest.raises(DeleteError) as exc:
        faulty.delete_prefix("chk-3/")
    assert set(exc.value.failed) == {"chk-3/sub/b"}
    assert _keys(storage) == {"chk-3/sub/b", "chk-30/_metadata"}
    faulty.heal("chk-3/sub/b")
    faulty.delete_prefix("chk-3")
    assert _keys(storage) == {"chk-30/_metadata"}


def test_rates_per_kind_and_counters(storage: Storage, tmp_path: Path) -> None:
    storage.write("shared/r", b"r")
    faulty = FaultyStorage(storage, write_fail_rate=1.0)
    with pytest.raises(InjectedFault):
        faulty.write("shared/w", b"w")
    with pytest.raises(InjectedFault):
        faulty.create_if_absent("shared/w", b"w")
    src = tmp_path / "src.bin"
    src.write_bytes(b"u")
    with pytest.raises(InjectedFault):
        faulty.upload(src, "shared/u")
    assert not storage.exists("shared/w") and not storage.exists("shared/u")
    # other kinds are unaffected
    assert faulty.read("shared/r") == b"r"
    assert _keys(faulty) == {"shared/r"}
    faulty.delete_many(["shared/r"])

    faulty.set_fail_rate("write", 0.0)
    faulty.set_fail_rate("read", 1.0)
    faulty.set_fail_rate("list", 1.0)
    faulty.write("shared/w", b"w")
    with pytest.raises(InjectedFault):
        faulty.read("shared/w")
    with pytest.raises(InjectedFault):
        faulty.stat("shared/w")
    with pytest.raises(InjectedFault):
        list(faulty.list())
    assert storage.read("shared/w") == b"w"

    calls, injected = faulty.calls, faulty.injected
    assert calls["write"] == 2 and injected["write"] == 1
    assert calls["create_if_absent"] == 1 and injected["create_if_absent"] == 1
    assert calls["read"] == 2 and injected["read"] == 1
    assert calls["list_pages"] == 2 and injected["list_pages"] == 1
    assert calls["delete_many"] == 1 and injected["delete_many"] == 0
    faulty.reset_counters()
    assert not faulty.calls


def test_permanent_rule_on_other_kinds(storage: Storage) -> None:
    storage.write("_ha/pointer", b"p")
    faulty = FaultyStorage(storage)
    faulty.fail_permanently("_ha", kinds=("read", "write"))
    with pytest.raises(PermissionDeniedFault):
        faulty.read("_ha/pointer")
    with pytest.raises(PermissionDeniedFault):
        faulty.write("_ha/other", b"x")
    faulty.write("shared/x", b"x")  # outside the rule
    faulty.delete_many(["_ha/pointer"])  # deletes are not denied by this rule
    assert _keys(storage) == {"shared/x"}


def test_child_shares_faults_and_counters(storage: Storage) -> None:
    storage.write("job/chk-1/_metadata", b"m")
    storage.write("job/chk-1/x", b"x")
    faulty = FaultyStorage(storage)
    faulty.fail_permanently("job/chk-1/_metadata")
    child = faulty.child("job").child("chk-1")
    assert isinstance(child, FaultyStorage)
    with pytest.raises(DeleteError) as exc:
        child.delete_many(["_metadata", "x"])
    assert set(exc.value.failed) == {"_metadata"}  # named relative to the child
    assert _keys(storage) == {"job/chk-1/_metadata"}
    assert faulty.calls["delete_many"] == 1  # counted on the shared counters
    faulty.heal("job/chk-1/_metadata")
    child.delete_many(["_metadata"])
    assert _keys(storage) == set()


def test_latency_and_hook(storage: Storage) -> None:
    slept: list[float] = []
    seen: list[tuple[str, str, str]] = []

    def hook(method: str, kind: str) -> None:
        seen.append((method, kind, threading.current_thread().name))

    faulty = FaultyStorage(
        storage, latency={"delete": 1.0, "write": 0.25}, hook=hook, sleep=slept.append
    )
    faulty.write("a", b"a")
    faulty.read("a")
    faulty.delete_many(["a"])
    assert slept == [0.25, 1.0]  # no latency configured for reads
    assert [(m, k) for m, k, _ in seen] == [
        ("write", "write"),
        ("read", "read"),
        ("delete_many", "delete"),
    ]
    assert not storage.exists("a")


def test_rejects_bad_configuration(storage: Storage) -> None:
    with pytest.raises(ValueError):
        FaultyStorage(storage, delete_fail_rate=1.5)
    with pytest.raises(ValueError):
        FaultyStorage(storage, latency={"nonsense": 1.0})  # type: ignore[dict-item]
    with pytest.raises(ValueError):
        FaultyStorage(storage).fail_permanently("x", kinds=())
