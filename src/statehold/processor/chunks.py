"""A key's input rows as a slice of the Arrow batch they arrived in, converted to the
job's input format once per batch, not once per key.

pyarrow's ``to_pandas`` costs about 0.3 ms a call however few rows it converts, so a
batch of thousands of keys with a row or two each, converted key by key, spent half of a
task's time there (the sessions benchmark). Spark's ``transformWithStateInPandas`` also
converts each Arrow batch once and cuts it by key. A key's pandas.DataFrame is a shallow
copy of its rows of the batch's frame, indexed from 0 as a frame of its own would be.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa


class InputBatch:
    """One Arrow batch of input rows (user columns), with its conversions cached."""

    def __init__(self, table: pa.Table) -> None:
        self.table = table
        self.columns = frozenset(table.column_names)
        self._pandas: Any = None
        self._rows: list[dict[str, Any]] | None = None

    def chunk(self, start: int, stop: int) -> Chunk:
        return Chunk(self, start, stop)

    def pandas(self, start: int, stop: int) -> Any:
        import pandas as pd

        if self._pandas is None:
            self._pandas = self.table.to_pandas()
        frame = self._pandas.iloc[start:stop].copy(deep=False)
        frame.index = pd.RangeIndex(stop - start)
        return frame

    def rows(self, start: int, stop: int) -> list[dict[str, Any]]:
        if self._rows is None:
            self._rows = self.table.to_pylist()
        return self._rows[start:stop]


@dataclass(frozen=True)
class Chunk:
    """Rows ``start:stop`` of an input batch: all of one key's rows or some of them."""

    batch: InputBatch
    start: int
    stop: int

    @staticmethod
    def of(table: pa.Table) -> Chunk:
        """A table as one chunk of its own."""
        return Chunk(InputBatch(table), 0, table.num_rows)

    @property
    def num_rows(self) -> int:
        return self.stop - self.start

    @property
    def table(self) -> pa.Table:
        return self.batch.table.slice(self.start, self.num_rows)

    def as_format(self, input_format: str) -> Any:
        """The rows as the job's ``input_format`` gives them: a list of dicts, a
        pandas.DataFrame or a pyarrow.Table."""
        if input_format == "rows":
            return self.batch.rows(self.start, self.stop)
        if input_format == "pandas":
            return self.batch.pandas(self.start, self.stop)
        return self.table
