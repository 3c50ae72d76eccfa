"""Timers and TTL in the RocksDB task backend (no Spark): timers per key and by time,
carried through checkpoints and a rescale 2 -> 3 -> 1 together with TTL'd state; the TTL
sweep keeps storage bounded while keys churn (measured by listing the checkpoint's files
and counting RocksDB entries), where without it storage grows with every batch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from statehold.backend import TaskStateBackend, task_of_key, task_range
from statehold.backend.rocks import RestoreSource
from statehold.backend.state import TIMERS_NAME
from statehold.backend.timers import Timers
from statehold.backend.ttl import compact_if_garbage, sweep_expired
from statehold.processor.api import TimeMode
from statehold.processor.handle import StatefulProcessorHandle
from statehold.storage import Storage
from tests.support.task_backend import MAXP, OP, checkpoint, snap

TTL_MS = 5_000


def _handle(b: TaskStateBackend, now: int, mode: TimeMode = TimeMode.EVENT_TIME
            ) -> StatefulProcessorHandle:
    return StatefulProcessorHandle(b._require_kv(), b.key_groups, MAXP, mode, now, 0)


def _write(b: TaskStateBackend, keys: list[str], now: int) -> None:
    """Per key: a TTL'd value, list and map, a plain value, and two timers."""
    h = _handle(b, now)
    seen = h.get_value_state("seen", ttl=TTL_MS)
    log = h.get_list_state("log", ttl=TTL_MS)
    pages = h.get_map_state("pages", ttl=TTL_MS)
    total = h.get_value_state("total")
    for k in keys:
        h._bind(k)
        seen.update(now)
        log.append_list([1, 2])
        pages.update_value("home", now)
        total.update(len(k))
        h.register_timer(now + 1000)
        h.register_timer(now + 9000)


def _rescale(storage: Storage, tmp: Path, cid: int, sources: list[RestoreSource] | None,
             parallelism: int, work: Any) -> tuple[list[RestoreSource], dict[str, Any]]:
    """Every task of `parallelism` restores from `sources`, runs `work(backend)`, and
    snapshots checkpoint `cid`; returns its sources and the state read back."""
    states, seen = [], {}
    for task in range(parallelism):
        r = task_range(task, parallelism, MAXP)
        with TaskStateBackend.open(tmp / f"c{cid}-{task}", OP, r, MAXP, sources) as b:
            work(b, task)
            seen.update(dict(b.items()))
            states.append(snap(b, storage, cid))
    return checkpoint(storage, cid, states), seen


def test_timers_and_ttl_across_rescale(storage: Storage, tmp_path: Path) -> None:
    keys = [f"user-{i}" for i in range(60)]
    fired: list[tuple[int, str]] = []

    def first(b: TaskStateBackend, task: int) -> None:
        _write(b, [k for k in keys if task_of_key(k, 2, MAXP) == task], 10_000)

    sources, state = _rescale(storage, tmp_path, 1, None, 2, first)
    assert state["user-1"][TIMERS_NAME] == [11_000, 19_000]

    def fire(threshold: int, now: int) -> Any:
        def work(b: TaskStateBackend, task: int) -> None:
            h = _handle(b, now)
            for expiry, group, key in h.timers.due(threshold):
                h.timers.delete(group, key, expiry)
                fired.append((expiry, str(key)))
            sweep_expired(b._require_kv(), b.key_groups, now)
        return work

    # 3 tasks: the first timers of every key fire, each in the task now owning its key
    sources, state = _rescale(storage, tmp_path, 2, sources, 3, fire(12_000, 12_000))
    assert sorted(fired) == sorted((11_000, k) for k in keys)
    assert all(st[TIMERS_NAME] == [19_000] and st["seen"] == 10_000 for st in state.values())
    assert all(st["log"] == [1, 2] and st["pages"] == {"home": 10_000} for st in state.values())
    # 1 task at 15 s: the TTL'd state (written at 10 s, TTL 5 s) is gone, the rest stays
    fired.clear()
    sources, state = _rescale(storage, tmp_path, 3, sources, 1, fire(15_000, 15_000))
    assert fired == [] and set(state) == set(keys)
    assert all(st == {"total": len(k), TIMERS_NAME: [19_000]}
               for k, st in state.items())


def test_handle_timers_and_ttl_reads(tmp_path: Path) -> None:
    with TaskStateBackend.open(tmp_path, OP, task_range(0, 1, MAXP), MAXP) as b:
        _write(b, ["a"], 1_000)
        h = _handle(b, 5_999)
        h._bind("a")
        assert list(h.list_timers()) == [2_000, 10_000]
        h.delete_timer(2_000)
        assert list(h.list_timers()) == [10_000]
        assert Timers(b._require_kv(), b.key_groups).next_expiry() == 10_000
        seen = h.get_value_state("seen", ttl=TTL_MS)
        assert seen.get() == 1_000 and seen.exists()
        h.processing_time_ms = 6_000  # expiry = 1000 + 5000: expired at 6000
        assert seen.get() is None and not seen.exists()
        assert list(h.get_list_state("log", ttl=TTL_MS).get()) == []
        assert not h.get_map_state("pages", ttl=TTL_MS).exists()
        # a variable without TTL of the same name is another variable
        assert h.get_value_state("seen").get() is None
        h.delete_if_exists("total")  # for every key of the range
        assert h.get_value_state("total").get() is None and "total" not in b.state_names()
        none = _handle(b, 0, TimeMode.NONE)
        none._bind("a")
        with pytest.raises(ValueError, match="time_mode"):
            none.register_timer(5)


def _entries(b: TaskStateBackend) -> int:
    return sum(1 for _ in b._require_kv().range(b"", None))


def _churn(storage: Storage, tmp: Path, sweep: bool, batches: int = 40) -> list[tuple[int, int]]:
    """(state size, RocksDB entries) after each batch: 100 new keys per batch with TTL'd
    state (5 batches of TTL), none ever written again."""
    out = []
    with TaskStateBackend.open(tmp, OP, task_range(0, 1, MAXP), MAXP) as b:
        for n in range(1, batches + 1):
            now = n * 1000
            h = _handle(b, now, TimeMode.NONE)
            value = h.get_value_state("v", ttl=TTL_MS)
            items = h.get_list_state("l", ttl=TTL_MS)
            for i in range(100):
                h._bind(f"b{n}-k{i}")
                value.update({"payload": "x" * 200, "n": n})
                items.append_list([n, i])
            if sweep and sweep_expired(b._require_kv(), b.key_groups, now):
                compact_if_garbage(b._require_db())
            state = snap(b, storage, n)
            b.commit_local(n)
            out.append((int(state.info["state_size"]), _entries(b)))
    return out


def test_ttl_churn_keeps_storage_bounded(storage: Storage, tmp_path: Path) -> None:
    swept = _churn(storage, tmp_path / "swept", sweep=True)
    kept = _churn(storage, tmp_path / "kept", sweep=False)
    live = 100 * 5 * (3 + 3)  # keys alive within the TTL x (entries + TTL index entries)
    assert all(entries <= live for _size, entries in swept)
    assert kept[-1][1] == 40 * 100 * 6  # without the sweep nothing ever goes
    # from the first expiry on (batch 6) the checkpoint's files stay within 1.3x of the
    # smallest (a compacted live state); unswept, storage keeps growing
    sizes = [size for size, _ in swept[5:]]
    assert max(sizes) <= 1.3 * min(sizes)
    assert kept[-1][0] > 5 * swept[-1][0]
