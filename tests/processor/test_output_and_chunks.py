"""A task's input is converted once per Arrow batch and cut by key (`processor.chunks`);
its output frames are converted together (`processor.output`). Neither may change what
a processor sees or what it outputs: each key's rows are a frame of their own, indexed
from 0; each output frame is converted from its own dtypes, as it was when yielded."""

from __future__ import annotations

from collections.abc import Iterator

import pandas as pd
import pyarrow as pa
import pytest

from statehold.processor.api import TimeMode
from statehold.processor.chunks import Chunk, InputBatch
from statehold.processor.compat import whole
from statehold.processor.output import Output
from statehold.processor.runner import ProcessorSpec, filter_late

SCHEMA = pa.schema([("user", pa.string()), ("n", pa.int64())])


def test_a_keys_pandas_rows_are_a_frame_of_their_own() -> None:
    batch = InputBatch(pa.table({"user": ["a", "b", "b", "c"], "n": [1, 2, 3, 4]}))
    b = batch.chunk(1, 3).as_format("pandas")
    assert list(b.index) == [0, 1]
    assert b.to_dict("list") == {"user": ["b", "b"], "n": [2, 3]}
    b["n"] = b["n"] * 10  # the processor's own change of its frame
    b["extra"] = 1
    assert batch.chunk(3, 4).as_format("pandas").to_dict("list") == {"user": ["c"], "n": [4]}
    assert batch.chunk(1, 3).as_format("pandas").to_dict("list") == {
        "user": ["b", "b"], "n": [2, 3]
    }
    assert batch.chunk(0, 1).as_format("rows") == [{"user": "a", "n": 1}]
    assert batch.chunk(2, 4).table.to_pylist() == [{"user": "b", "n": 3}, {"user": "c", "n": 4}]


def test_a_key_over_two_batches_is_whole() -> None:
    first = InputBatch(pa.table({"user": ["a", "b"], "n": [1, 2]}))
    second = InputBatch(pa.table({"user": ["b", "c"], "n": [3, 4]}))
    parts = [first.chunk(1, 2), second.chunk(0, 1)]
    assert whole(parts, "pandas").to_dict("list") == {"user": ["b", "b"], "n": [2, 3]}
    assert whole(parts, "rows") == [{"user": "b", "n": 2}, {"user": "b", "n": 3}]
    assert whole([Chunk.of(pa.table({"n": [5]}))], "arrow").to_pylist() == [{"n": 5}]


def test_output_frames_are_converted_each_from_its_own_dtypes() -> None:
    """An int64 beyond 2**53 beside a float frame with a NaN: concatenated together, the
    int would be rounded through float64."""
    big = 2**60 + 1
    out = Output(SCHEMA)
    out.add(pd.DataFrame({"user": ["a"], "n": [big]}))
    out.add(pd.DataFrame({"user": ["b"], "n": [float("nan")]}))
    out.add(pd.DataFrame({"user": ["c"], "n": [big + 2]}))
    rows = [r for t in out.tables() for r in t.to_pylist()]
    assert rows == [{"user": "a", "n": big}, {"user": "b", "n": None},
                    {"user": "c", "n": big + 2}]


def test_a_frame_changed_after_it_was_yielded_is_output_as_yielded() -> None:
    def reuses_one_frame() -> Iterator[pd.DataFrame]:
        frame = pd.DataFrame({"user": ["x"], "n": [0]})
        for i in range(3):
            frame.loc[0, "n"] = i
            yield frame

    out = Output(SCHEMA)
    out.add(reuses_one_frame())
    assert [r["n"] for t in out.tables() for r in t.to_pylist()] == [0, 1, 2]


def test_output_keeps_the_order_of_frames_rows_and_tables() -> None:
    out = Output(SCHEMA, limit=4)
    emitted: list[pa.Table] = []
    pieces = [
        pd.DataFrame({"user": ["f1", "f2"], "n": [1, 2]}),
        [{"user": "r3", "n": 3}],
        pd.DataFrame({"n": [4], "user": ["f4"]}),  # other column order: another signature
        pa.table({"user": ["t5"], "n": [5]}),
        pd.DataFrame({"user": ["f6"], "n": [6]}),
        [("r7", 7)],
        pd.DataFrame({"user": [], "n": []}),  # empty: nothing
    ]
    for piece in pieces:
        emitted += out.stream(piece)
    emitted += out.drain()
    assert [r["n"] for t in emitted for r in t.to_pylist()] == [1, 2, 3, 4, 5, 6, 7]
    assert all(t.schema == SCHEMA for t in emitted)


@pytest.mark.parametrize("late_rows", ["drop", "process"])
def test_initial_state_rows_are_never_late(late_rows: str) -> None:
    """Filtered once per batch, the initial-state rows (exempt) are neither counted as
    late nor in the newest event time, whatever their event-time column holds."""
    spec = ProcessorSpec(None, TimeMode.EVENT_TIME, 0, watermark_ms=100,
                         event_time_column="t", late_rows=late_rows,  # type: ignore[arg-type]
                         string_key=True)
    table = pa.table({"t": [5, 50, 150, 999], "tag": ["init", "late", "ok", "init"]})
    exempt = pa.chunked_array([[True, False, False, True]])
    filtered = filter_late(table, spec, exempt)
    assert filtered.late_rows == 1 and filtered.max_event_ms == 150
    assert filtered.table is not None
    kept = ["init", "ok", "init"] if late_rows == "drop" else ["init", "late", "ok", "init"]
    assert filtered.table.column("tag").to_pylist() == kept
