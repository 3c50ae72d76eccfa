"""The streaming task's parts without Spark: keys cut from sorted Arrow batches and
carried across batch boundaries, chunks of at most `task_batch_rows`, unsorted input
refused, output emitted every `limit` rows, and the staging's key, key group and task
columns (hashed once per distinct key) equal to those of each row on its own."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pytest

from statehold.backend.keys import key_group_of, task_of
from statehold.format.metadata import KeyHash
from statehold.processor.compat import whole
from statehold.processor.output import Output
from statehold.spark.keying import KeyGroupStage
from statehold.spark.task import (
    KEY_COL,
    KG_COL,
    MARKER_KG,
    TASK_COL,
    MalformedInputError,
    RoutingError,
    UnsortedInputError,
    _Counts,
    _Keys,
    _segments,
    state_key,
)

MAX_PARALLELISM = 4


@dataclass
class Spec:
    task_batch_rows: int
    key_columns: tuple[str, ...] = ("k",)
    max_parallelism: int = MAX_PARALLELISM
    key_hash: KeyHash = KeyHash.XXHASH64


def group(key: str) -> int:
    return key_group_of(key, MAX_PARALLELISM, KeyHash.XXHASH64)


def batch(keys: list[str | None], start: int = 0, groups: list[int] | None = None
          ) -> pa.RecordBatch:
    """Rows of `keys` as the keying stage hands them on (marker rows for "")."""
    if groups is None:
        groups = [MARKER_KG if k == "" else group(k) if k is not None else 0 for k in keys]
    return pa.RecordBatch.from_pydict({
        "k": keys, "v": list(range(start, start + len(keys))), KEY_COL: keys,
        KG_COL: groups, TASK_COL: [0] * len(keys),
    })


def ordered(keys: list[str]) -> list[str]:
    """`keys` in the order a task receives them: by key group, then key."""
    return sorted(keys, key=lambda k: (group(k), k))


def test_keys_span_batches_in_chunks_and_markers_are_skipped() -> None:
    a, b, c = ordered(["a", "b", "c"])
    batches = [batch(["", a, a, b]), batch([b, b, b], 4), batch([c], 7)]
    counts = _Counts()
    got = {}
    for first, chunks in _Keys(_segments(iter(batches), 0, Spec(2), counts)):  # type: ignore[arg-type]
        parts = list(chunks)
        assert all(p.num_rows <= 2 for p in parts)
        assert all(KEY_COL not in p.table.column_names for p in parts)  # user columns
        got[first.key] = (len(parts), [r["v"] for r in whole(parts, "rows")])
    assert got == {a: (1, [1, 2]), b: (3, [3, 4, 5, 6]), c: (1, [7])}
    assert counts.rows_in == 7


def test_unread_rows_of_a_key_are_skipped() -> None:
    a, b = ordered(["a", "b"])
    keys = _Keys(_segments(iter([batch([a, a]), batch([a, b])]), 0,
                           Spec(1), _Counts()))  # type: ignore[arg-type]
    seen = [(first.key, next(chunks).table.column("v").to_pylist()) for first, chunks in keys]
    assert seen == [(a, [0]), (b, [1])]


def test_a_key_that_comes_back_is_refused() -> None:
    a, b = ordered(["a", "b"])
    batches = [batch([a, b]), batch([a])]
    with pytest.raises(UnsortedInputError, match=repr(a)):
        list(_Keys(_segments(iter(batches), 0, Spec(10), _Counts())))  # type: ignore[arg-type]


def test_a_key_keyed_to_another_group_is_refused() -> None:
    """What the task checks of the JVM's keying: each key's group is the job's hash."""
    wrong = (group("a") + 1) % MAX_PARALLELISM
    with pytest.raises(RoutingError, match=f"key 'a' came keyed to key group {wrong}"):
        list(_segments(iter([batch(["a"], groups=[wrong])]), 0, Spec(10),  # type: ignore[arg-type]
                       _Counts()))
    blake = key_group_of("a", MAX_PARALLELISM, KeyHash.BLAKE2B)
    assert list(_segments(iter([batch(["a"], groups=[blake])]), 0,
                          Spec(10, key_hash=KeyHash.BLAKE2B), _Counts()))  # type: ignore[arg-type]


def test_a_null_key_is_refused_with_its_row() -> None:
    """A null key column keyed on the JVM reaches the task as a null key."""
    with pytest.raises(MalformedInputError, match=r"null in key column 'k'.*\"v\": 1"):
        list(_segments(iter([batch(["a", None])]), 0, Spec(10), _Counts()))  # type: ignore[arg-type]


def test_output_is_emitted_every_limit_rows_in_order() -> None:
    schema = pa.schema([("n", pa.int64())])
    out = Output(schema, limit=3)
    emitted = list(out.stream({"n": i} for i in range(7)))
    emitted += list(out.drain())
    assert [t.num_rows for t in emitted] == [3, 3, 1]
    assert [r["n"] for t in emitted for r in t.to_pylist()] == list(range(7))


@pytest.mark.parametrize(
    ("columns", "data"),
    [
        (("k",), {"k": ["hot"] * 500 + ["a", "ß", "hot", "", "a"], "v": list(range(505))}),
        (("k",), {"k": [3, -1, 3, 2**40, 3], "v": [0, 1, 2, 3, 4]}),
        (("k",), {"k": [0.0, -0.0, 1.5, 0.0], "v": [0, 1, 2, 3]}),
        (("k",), {"k": [[1, 2], [1, 2], [3]], "v": [0, 1, 2]}),  # nested: row by row
        (("k", "j"), {"k": ["a", "a", "b"], "j": [1, 2, 1], "v": [0, 1, 2]}),
    ],
)
def test_staging_routes_each_row_as_on_its_own(
    columns: tuple[str, ...], data: dict[str, list[object]]
) -> None:
    stage = KeyGroupStage(columns, parallelism=3, max_parallelism=16,
                          key_hash=KeyHash.XXHASH64)
    (out,) = stage(iter([pa.RecordBatch.from_pydict(data)]))
    rows = list(zip(*(data[c] for c in columns), strict=True))
    keys = [state_key(r) for r in rows]
    groups = [key_group_of(k, 16, KeyHash.XXHASH64) for k in keys]
    assert out.column(KEY_COL).to_pylist() == keys
    assert out.column(KG_COL).to_pylist() == groups
    assert out.column(TASK_COL).to_pylist() == [task_of(g, 3, 16) for g in groups]
    assert out.column("v").to_pylist() == data["v"]
