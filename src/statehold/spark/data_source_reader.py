"""The ``format("statehold")`` classes PySpark 4 calls (`pyspark.sql.datasource`); what
they read is planned in `statehold.spark.data_source`. Only this module needs PySpark 4:
`statehold.spark.data_source.register_data_source` imports it after checking.

Spark creates the source in a Python process beside the driver, calls ``schema()`` there
(unless the read gave a schema), pickles the source, and later calls ``reader(schema)``
and ``partitions()`` and pickles the reader to the tasks: both carry only the plan, plain
data (URIs, storage options, key-group ranges as JSON), and each task opens the storage
itself.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from statehold.spark.data_source import NAME, DataSourceError, Plan, plan


class StateholdDataSource(DataSource):
    """``spark.read.format("statehold").load(path)`` (statehold.spark.data_source)."""

    _plan: Plan | None = None

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType | str:
        schema, self._plan = plan(self.options, None)
        return schema

    def reader(self, schema: StructType) -> DataSourceReader:
        planned = self._plan
        if planned is None:  # schema() was not called: the read gave its own schema
            _, planned = plan(self.options, schema)
        return StateholdReader(planned)


class StateholdReader(DataSourceReader):
    """Partition i reads part i of the plan (a key-group range, or the one view)."""

    def __init__(self, planned: Plan) -> None:
        self.plan = planned

    def partitions(self) -> Sequence[InputPartition]:
        return [InputPartition(i) for i in self.plan.partitions()]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        index = partition.value
        if not isinstance(index, int):
            raise DataSourceError(f"not a statehold partition: {index!r}")
        yield from self.plan.read(index)
