"""A streaming source of the test's own (a Python data source, Spark 4) that stops a
driver between a file source's log write and the offsets write, so a test can kill it
there: the window in which Spark's ``FileStreamSource`` has written ``sources/0/K`` and
``offsets/N`` is not yet written.

A query reads ``file_source.union(pause_source)``: each trigger Spark asks the file source
for its newest offset (which writes its log entry when it found files), then this source.
Its ``latestOffset`` pauses once the file ``arm`` exists and the file source's log
(``log``: ``<checkpoint>/sources/0``) holds an entry written after ``arm``: it writes
``mark`` and sleeps until killed. It never has rows, so a query over the union writes
what the file source alone gives; unarmed (no ``arm`` file) it never pauses, so the
runs before and after the kill use the same plan (Spark refuses a restart whose number
of sources changed).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

NAME = "statehold_pause"
SCHEMA = "key STRING, value BIGINT, ts BIGINT"


class PauseSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema: Any) -> DataSourceStreamReader:  # noqa: N802 - Spark's name
        return PauseReader(dict(self.options))


class PauseReader(DataSourceStreamReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.arm, self.log, self.mark = options["arm"], options["log"], options["mark"]

    def initialOffset(self) -> dict[str, int]:  # noqa: N802
        return {"n": 0}

    def latestOffset(self) -> dict[str, int]:  # noqa: N802
        if self._armed():
            with open(self.mark, "w") as f:
                f.write(f"{os.getpid()}\n")
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline:
                time.sleep(0.2)
            raise RuntimeError("paused in latestOffset and nobody killed the driver")
        return {"n": 0}

    def _armed(self) -> bool:
        try:
            armed_at = os.stat(self.arm).st_mtime_ns
            entries = [e for e in os.scandir(self.log) if e.name.isdigit()]
        except FileNotFoundError:
            return False
        return any(e.stat().st_mtime_ns > armed_at for e in entries)

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        return []

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        return iter(())


def pause_stream(session: Any, checkpoint: str, arm: str, mark: str) -> Any:
    """The streaming DataFrame of this source, registered in `session`."""
    session.dataSource.register(PauseSource)
    return (
        session.readStream.format(NAME)
        .option("arm", arm)
        .option("log", os.path.join(checkpoint, "sources", "0"))
        .option("mark", mark)
        .load()
    )
