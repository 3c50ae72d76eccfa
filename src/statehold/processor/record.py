"""The schema record of a stateful processor's operator: what its state variables and key
columns are declared as now, checked against what the restored checkpoint recorded.

As Spark does before a `transformWithStateInPandas` query starts, the driver calls the
processor's ``init`` once on a handle that only records declarations (on a shallow copy,
so the processor shipped to the tasks carries nothing of it). A change a restore cannot
read (`statehold.state.schema.check_compatible`, `check_same_key`) is refused there,
before any task touches the state. The record written with each checkpoint is the
restored one with the declared variables laid over it: a variable the processor stopped
declaring keeps its recorded schema, so declaring it again later is checked against what
is still stored.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from typing import Any

from pyspark.sql.types import StructType

from statehold.format.metadata import KeyGroupRange, OperatorSchemas, VariableSchema
from statehold.state.schema import SchemaEvolutionError, check_compatible, check_same_key


class _NoState:
    """The recording handle's store: declaring a variable never reads or writes."""

    def get(self, key: bytes) -> bytes | None:
        raise AssertionError("a declaration does not read state")

    def put(self, key: bytes, value: bytes) -> None:
        raise AssertionError("a declaration does not write state")

    def delete(self, key: bytes) -> None:
        raise AssertionError("a declaration does not delete state")

    def scan(self, prefix: bytes) -> Any:
        raise AssertionError("a declaration does not scan state")

    def last(self, prefix: bytes) -> bytes | None:
        raise AssertionError("a declaration does not scan state")


def key_schema_json(schema: StructType, keys: Sequence[str]) -> str:
    """Spark's type JSON of the grouping key columns (a struct, in key order)."""
    return StructType([schema[k] for k in keys]).json()


def declared(processor: Any, input_format: str, key_json: str | None) -> OperatorSchemas:
    """What `processor.init` declares: each variable's kind and schemas."""
    from statehold.processor.api import TimeMode
    from statehold.processor.compat import ProcessorCalls
    from statehold.processor.handle import StatefulProcessorHandle

    handle = StatefulProcessorHandle(
        _NoState(), KeyGroupRange(start=0, end=0), 1, TimeMode.NONE, 0, 0
    )
    ProcessorCalls(copy.copy(processor), input_format).init(handle)
    variables = {}
    for name, (kind, record) in handle.declared.items():
        schemas = [None] if record is None else json.loads(record)
        if kind == "map":
            key, value = (schemas + [None, None])[:2] if record is not None else (None, None)
            variables[name] = VariableSchema(kind=kind, value=value, map_key=key)
        else:
            variables[name] = VariableSchema(kind=kind, value=schemas[-1])
    return OperatorSchemas(key=key_json, variables=variables)


def for_batch(
    job: Any, df: Any, processor: Any, keys: Sequence[str], input_format: str
) -> dict[str, OperatorSchemas]:
    """The `state_schemas` the job's next checkpoint records (every operator's), after
    checking what `processor` declares against the newest checkpoint's record."""
    latest = job.coordinator.latest()
    recorded = None if latest is None else latest[1].state_schemas
    now = declared(processor, input_format, key_schema_json(df.schema, keys))
    previous = None if recorded is None else recorded.get(job.operator)
    return {**(recorded or {}), job.operator: checked(job.operator, previous, now)}


def checked(
    operator: str, recorded: OperatorSchemas | None, now: OperatorSchemas
) -> OperatorSchemas:
    """The record to write from now on; raises `SchemaEvolutionError` (naming the variable
    or operator and both types) if state stored under `recorded` cannot be read as `now`.
    Without a record (a checkpoint from before typed state) nothing can be checked."""
    if recorded is None:
        return now
    check_same_key(operator, recorded.key, now.key)
    for name, var in now.variables.items():
        old = recorded.variables.get(name)
        if old is None:
            continue
        if old.kind != var.kind:
            raise SchemaEvolutionError(
                f"state variable {name!r}: recorded as {old.kind} state, declared as {var.kind}"
            )
        check_compatible(name, old.value, var.value)
        if var.kind == "map":
            check_compatible(f"{name} (map key)", old.map_key, var.map_key)
    merged = {**recorded.variables, **now.variables}
    return OperatorSchemas(key=now.key or recorded.key, variables=merged)
