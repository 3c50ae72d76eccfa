"""Stateful processors: Spark's ``transformWithStateInPandas`` API on statehold's
checkpoints (`StatefulJob.transform_with_state`).

    from statehold.processor import StatefulProcessor, StatefulProcessorHandle

    class Count(StatefulProcessor):
        def init(self, handle: StatefulProcessorHandle) -> None:
            self.count = handle.get_value_state("count", ttl=3_600_000)

        def handle_input_rows(self, key, rows, timer_values):
            n = (self.count.get() or 0) + len(rows)
            self.count.update(n)
            return [(key, n)]

A class written for Spark 4.x (camelCase ``handleInputRows``, ``getValueState``, ...)
runs unchanged; importing these names from here instead of ``pyspark.sql.streaming`` is
all that may change.
"""

from statehold.processor.api import (
    ExpiredTimerInfo,
    StatefulProcessor,
    TimeMode,
    TimerValues,
    TTLConfig,
)
from statehold.processor.handle import (
    ListStateVariable,
    MapStateVariable,
    StatefulProcessorHandle,
    ValueStateVariable,
)

#: Spark's names for the state variables.
ValueState = ValueStateVariable
ListState = ListStateVariable
MapState = MapStateVariable

__all__ = [
    "ExpiredTimerInfo",
    "ListState",
    "ListStateVariable",
    "MapState",
    "MapStateVariable",
    "StatefulProcessor",
    "StatefulProcessorHandle",
    "TTLConfig",
    "TimeMode",
    "TimerValues",
    "ValueState",
    "ValueStateVariable",
]
