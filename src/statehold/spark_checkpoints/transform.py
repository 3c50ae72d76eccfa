"""Transform, delete and migrate one operator's state offline: a new location whose batch
N holds what a caller's function made of the operator's rows at N.

The operator's store is read one source partition at a time (`state_reader.read_store`:
Arrow record batches of its key columns then its value columns); each batch goes to the
caller's ``fn``, which returns the rows to keep, changed as it likes, in the new schema
(the old one unless a new key or value schema is given). Each row returned is written
again as Spark's UnsafeRows (`unsafe_row_writer`; RocksDB's with their encoding version
byte) and routed by Spark's hash of its NEW key (`repartition`'s routing: a key whose
type changed hashes differently) to its partition's snapshot: DEST is written by
`repartition.rewrite`, the one writing path, so everything else repartition promises
holds: DEST must be empty, the source is only read, the other operators' files are
copied as they are (or repartitioned, with `partitions`), ``commits/N`` is written last
and DEST is verified.

A schema change is written where Spark checks a restart against it: the store's
``state/OP/0/_metadata/schema`` (v2), the side that did not change kept as Spark wrote
it. Operators with one store only (aggregations, ``dropDuplicates``, session windows,
``flatMapGroupsWithState`` / ``applyInPandasWithState``), and one state variable of a
transformWithState operator (``state_var``: `tws_transform`, in the variable's own
schema, its other column families copied; its grouping keys are deleted from every
family by `tws_delete`); a stream-stream join (four stores whose rows must agree: its
keys are deleted by `key_delete`) is refused in one line, as are the locations
repartition refuses. A session window's RocksDB keys are written back in their
prefix-scan layout (`prefix_keys`).

Memory: one record batch and what ``fn`` keeps. Two rows ``fn`` gives the same key are
both written (the later one wins when Spark loads it): statehold does not check, as that
would need every key in memory.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import replace
from typing import Any

import pyarrow as pa
from pydantic import BaseModel

from statehold.progress import Progress
from statehold.spark_checkpoints.arrow_values import (
    TransformFn,
    empty_batch,
    returned,
    row_columns,
    to_values,
)
from statehold.spark_checkpoints.errors import SparkCheckpointError
from statehold.spark_checkpoints.layout import DEFAULT_STORE, StoreId
from statehold.spark_checkpoints.location import SparkCheckpoint
from statehold.spark_checkpoints.prefix_keys import PrefixKeys, prefix_keys
from statehold.spark_checkpoints.repartition import (
    Rewritten,
    StoreChange,
    StorePlan,
    operator_doc,
    rewrite,
)
from statehold.spark_checkpoints.scan import Scan
from statehold.spark_checkpoints.spark_types import (
    Struct,
    parse_struct,
    struct_from_arrow,
)
from statehold.spark_checkpoints.state_reader import read_store
from statehold.spark_checkpoints.state_schema import (
    KEY_COLUMNS,
    StateSchema,
    read_state_schema,
    read_state_schema_texts,
    state_schema_file,
    struct_json,
)
from statehold.spark_checkpoints.tws_state import TwsOperator, tws_operator
from statehold.spark_checkpoints.tws_transform import VariableRows, user_variables
from statehold.spark_checkpoints.unsafe_row_writer import encode_row
from statehold.storage import Storage

#: A new key or value schema: a pyarrow schema, Spark's StructType JSON (text or parsed),
#: or a PySpark ``StructType`` (anything with ``.json()``).
SchemaLike = Any


class TransformReport(BaseModel):
    """What a transform wrote, and from what."""

    source: str
    dest: str
    #: The batch a query started on `dest` has completed (it continues with batch + 1).
    batch: int
    operator: int
    #: Spark's name of the operator, or what its stores say it is.
    name: str
    store: str
    partitions_before: int
    partitions: int
    rows_read: int
    rows_written: int
    #: Rows per new partition (of the transformed store).
    per_partition: list[int]
    #: The key columns the written rows were routed by (their new types' hash).
    partitioning: list[str]
    #: A transformWithState operator's state variable transformed (its rows read and
    #: written; `per_partition` counts the store's records, every column family's).
    state_var: str | None = None
    key_schema_changed: bool
    value_schema_changed: bool
    #: The store's schemas in DEST, Spark's StructType JSON.
    key_schema: str
    value_schema: str
    files: int
    bytes: int
    verified: bool


def transform(
    checkpoint: SparkCheckpoint,
    dest: str | Storage,
    *,
    operator: int,
    fn: TransformFn,
    state_var: str | None = None,
    batch: int | None = None,
    key_schema: SchemaLike = None,
    value_schema: SchemaLike = None,
    partitions: int | None = None,
    progress: Progress | None = None,
    dest_options: Mapping[str, Any] | None = None,
) -> TransformReport:
    """Write at `dest` (empty or absent) a location whose batch `batch` (default: the
    newest restartable) holds `fn`'s rows of `operator`'s store, in `key_schema` and
    `value_schema` (default: the store's); of a transformWithState operator, `fn`'s rows
    of its state variable `state_var`, in its own schema. Every refusal comes before the
    first write."""
    found = checkpoint.scan()
    names = sorted({s.name for s in found.stores if s.operator == operator})
    if not names and operator not in found.operators:
        raise SparkCheckpointError(
            f"no operator {operator} in the location (its operators: "
            f"{', '.join(map(str, sorted(found.operators))) or 'none'}); nothing written")
    if len(names) != 1:
        raise SparkCheckpointError(
            f"operator {operator} has stores {', '.join(names) or 'none'}: a transform works "
            "on an operator with one store (not a stream-stream join yet); nothing written")
    tws = tws_operator(checkpoint, found, operator, names[0])
    if tws is not None:
        return _transform_variable(
            checkpoint, found, dest, tws, state_var=state_var, fn=fn, batch=batch,
            schemas=(key_schema, value_schema), partitions=partitions, progress=progress,
            dest_options=dest_options)
    if state_var is not None:
        raise SparkCheckpointError(
            f"operator {operator} is not transformWithState's: it has no state variable "
            f"{state_var!r}; nothing written")
    doc = operator_doc(checkpoint, found, operator,
                       batch if batch is not None else found.newest_committed or 0)
    info = (doc or {}).get("operatorInfo")
    name = info.get("operatorName") if isinstance(info, dict) else None
    if isinstance(name, str) and "transformwithstate" in name.lower():
        raise SparkCheckpointError(
            f"operator {operator} ({name}): transformWithState's state without a state "
            "schema v3 file to read its column families by; nothing written")
    store = names[0]
    schema_key = found.stores.get(StoreId(operator, 0, store))
    if schema_key is None or schema_key.schema is None:
        raise SparkCheckpointError(
            f"operator {operator} store {store}: no state schema file in partition 0; "
            "nothing written")
    data = checkpoint.read(schema_key.schema.key)
    texts = read_state_schema_texts(data, schema_key.schema.key)
    old = read_state_schema(data, schema_key.schema.key)
    new_key, key_text = _schema(key_schema, old.key, texts[0], "key_schema")
    new_value, value_text = _schema(value_schema, old.value, texts[1], "value_schema")
    new = StateSchema(new_key, new_value)
    changed = (key_text != texts[0], value_text != texts[1])
    counts = {"read": 0}
    prefixed = prefix_keys(checkpoint, found, StoreId(operator, 0, store), new_key)
    state = _Rows(checkpoint, found, operator, store, old, new, fn, counts, prefixed)
    state.probe()
    change = StoreChange(
        operator=operator, store=store, key=new_key, records=state.records,
        schema_file=state_schema_file(key_text, value_text) if any(changed) else None)
    done, name, written = _rewritten(checkpoint, dest, change, partitions=partitions,
                                     batch=batch, progress=progress,
                                     dest_options=dest_options)
    return TransformReport(
        source=checkpoint.uri, dest=done.dest, batch=done.batch, operator=operator,
        name=name, store=store, partitions_before=done.partitions_before,
        partitions=done.partitions, rows_read=counts["read"], rows_written=written.rows,
        per_partition=written.per_partition, partitioning=written.partitioning,
        key_schema_changed=changed[0], value_schema_changed=changed[1],
        key_schema=key_text, value_schema=value_text, files=len(done.written),
        bytes=sum(done.written.values()), verified=True,
    )


def _rewritten(
    checkpoint: SparkCheckpoint, dest: str | Storage, change: StoreChange, *,
    partitions: int | None, batch: int | None, progress: Progress | None,
    dest_options: Mapping[str, Any] | None,
) -> tuple[Rewritten, str, StorePlan]:
    """DEST written with the one changed store (`repartition.rewrite`): its report, the
    operator's name and the store's plan."""
    done = rewrite(checkpoint, dest, partitions=partitions, batch=batch, progress=progress,
                   dest_options=dest_options, changes=[change])
    [plan] = [p for p in done.operators if p.operator == change.operator]
    [written] = plan.stores
    return done, plan.name, written


def _transform_variable(
    checkpoint: SparkCheckpoint, found: Scan, dest: str | Storage, tws: TwsOperator, *,
    state_var: str | None, fn: TransformFn, batch: int | None,
    schemas: tuple[SchemaLike, SchemaLike], partitions: int | None,
    progress: Progress | None, dest_options: Mapping[str, Any] | None,
) -> TransformReport:
    """A transformWithState operator's state variable through `fn` (`tws_transform`),
    every other column family copied as it is."""
    op = tws.operator
    if state_var is None:
        raise SparkCheckpointError(
            f"operator {op} is transformWithState's: name a state variable (state_var): "
            f"{', '.join(user_variables(tws))}; nothing written")
    if any(s is not None for s in schemas):
        raise SparkCheckpointError(
            f"operator {op} state variable {state_var!r} keeps its schema: Spark's "
            "transformWithState evolves its state schemas itself; nothing written")
    rows = VariableRows(checkpoint, found, tws, state_var, fn)
    rows.probe()
    change = StoreChange(operator=op, store=tws.store, key=tws.grouping, records=rows.records)
    done, name, written = _rewritten(checkpoint, dest, change, partitions=partitions,
                                     batch=batch, progress=progress,
                                     dest_options=dest_options)
    return TransformReport(
        source=checkpoint.uri, dest=done.dest, batch=done.batch, operator=op,
        name=name, store=tws.store, partitions_before=done.partitions_before,
        partitions=done.partitions, rows_read=rows.read, rows_written=rows.written,
        per_partition=written.per_partition, partitioning=written.partitioning,
        state_var=state_var, key_schema_changed=False, value_schema_changed=False,
        key_schema=struct_json(rows.family.key), value_schema=struct_json(rows.family.value),
        files=len(done.written), bytes=sum(done.written.values()), verified=True,
    )


def _schema(given: SchemaLike, old: Struct, old_text: str, what: str) -> tuple[Struct, str]:
    """The new schema and its JSON text (the old text where it is the old schema). A
    pyarrow schema's fields keep the old nullability where name and type are the old
    field's (Arrow's default, nullable, would fail Spark's check of a non-null one)."""
    if given is None:
        return old, old_text
    if isinstance(given, pa.Schema):
        parsed = struct_from_arrow(given, what)
        olds = {f.name: f for f in old.fields}
        parsed = Struct(tuple(
            replace(f, nullable=olds[f.name].nullable)
            if f.name in olds and olds[f.name].type == f.type else f
            for f in parsed.fields))
    else:
        if hasattr(given, "json") and callable(given.json):
            given = given.json()
        try:
            doc = json.loads(given) if isinstance(given, str) else given
        except json.JSONDecodeError as e:
            raise SparkCheckpointError(f"{what}: not Spark's StructType JSON ({e})") from None
        parsed = parse_struct(doc, what)
    if parsed == old:
        return old, old_text
    return parsed, struct_json(parsed)


class _Rows:
    """A source partition's rows through ``fn``, encoded as the new schema says."""

    def __init__(self, checkpoint: SparkCheckpoint, found: Any, operator: int, store: str,
                 old: StateSchema, new: StateSchema, fn: TransformFn,
                 counts: dict[str, int], prefixed: PrefixKeys | None = None) -> None:
        self.checkpoint, self.found, self.old, self.new = checkpoint, found, old, new
        self.prefixed = prefixed
        self.operator, self.store, self.fn, self.counts = operator, store, fn, counts
        self.arrow = new.arrow()
        self.keys = len(new.key.fields)
        self.key_values = [to_values(f.type) for f in new.key.fields]
        self.value_values = [to_values(f.type) for f in new.value.fields]

    def probe(self) -> None:
        """`fn` of no rows, checked before anything is written: the columns and types it
        returns (checked again for every batch)."""
        list(returned(self.fn(empty_batch(self.old.arrow())), self.arrow,
                      self.new != self.old))

    def records(self, sid: StoreId, batch: int, versioned: bool
                ) -> Iterator[tuple[tuple[Any, ...], bytes, bytes]]:
        prefix = b"\x00" if versioned else b""
        where = f"operator {self.operator} store {self.store}"
        for got in read_store(self.checkpoint, self.found, sid, batch, schema=self.old):
            self.counts["read"] += got.num_rows
            for out in returned(self.fn(got), self.arrow, self.new != self.old):
                keys = row_columns(out, 0, self.keys, self.key_values)
                values = row_columns(out, self.keys, out.num_columns, self.value_values)
                for key, value in zip(keys, values, strict=True):
                    key_bytes = (self.prefixed.encode(key, f"{where}: a key") if self.prefixed
                                 else prefix + encode_row(key, self.new.key, f"{where}: a key"))
                    yield (key, key_bytes,
                           prefix + encode_row(value, self.new.value, f"{where}: a value"))


# -- delete keys ---------------------------------------------------------------------------
class DeleteReport(TransformReport):
    """What ``statehold state delete`` wrote: a transform that dropped the keys given."""

    keys_given: int
    #: Keys removed (each key given that the state held; one store: its rows removed).
    deleted: int
    #: Keys given that the state did not hold.
    not_found: int
    #: Rows removed, by store (a join's: each count entry and indexed value of a key).
    removed: dict[str, int] = {}
    #: A join's side whose stores lost the keys (None: both, or not a join).
    side: str | None = None


def delete_keys(
    checkpoint: SparkCheckpoint,
    dest: str | Storage,
    *,
    operator: int,
    keys: Iterable[Mapping[str, Any]],
    batch: int | None = None,
    progress: Progress | None = None,
    dest_options: Mapping[str, Any] | None = None,
) -> DeleteReport:
    """A transform keeping every row but those whose key is one of `keys` (each a mapping
    of every key column's name to its value, as JSON gives it: a timestamp as ISO 8601
    text or microseconds, a window as ``{"start": ..., "end": ...}``)."""
    found = checkpoint.scan()
    names = sorted({s.name for s in found.stores if s.operator == operator})
    store = names[0] if len(names) == 1 else DEFAULT_STORE
    try:
        from statehold.spark_checkpoints.state_reader import store_schema

        schema = store_schema(checkpoint, found, StoreId(operator, 0, store))
    except SparkCheckpointError:
        schema = None  # transform refuses it in its own words
    wanted: set[Any] = set()
    given = 0
    if schema is not None:
        wanted, given = key_set(keys, schema)
    found_keys: set[Any] = set()

    def drop(got: pa.RecordBatch) -> pa.RecordBatch:
        count = int(got.schema.metadata[KEY_COLUMNS])
        rows = frozen_rows(got, count)
        hits = [r in wanted for r in rows]
        found_keys.update(r for r, hit in zip(rows, hits, strict=True) if hit)
        return got.filter(pa.array([not h for h in hits], pa.bool_()))

    report = transform(checkpoint, dest, operator=operator, fn=drop, batch=batch,
                       progress=progress, dest_options=dest_options)
    deleted = report.rows_read - report.rows_written
    return DeleteReport(**report.model_dump(), keys_given=given, deleted=deleted,
                        not_found=len(wanted - found_keys), removed={store: deleted})


def key_set(keys: Iterable[Mapping[str, Any]], schema: StateSchema) -> tuple[set[Any], int]:
    """The keys as the reader's Arrow values would be (frozen, hashable), and how many
    were given."""
    table, given = _key_batch(keys, schema)
    return set(frozen_rows(table, table.num_columns)), given


def decoded_keys(keys: Iterable[Mapping[str, Any]], schema: StateSchema
                 ) -> tuple[set[Any], int]:
    """The keys as `unsafe_row.decode_row` gives a key's values (`freeze`d), and how many
    were given."""
    table, given = _key_batch(keys, schema)
    convert = [to_values(f.type) for f in schema.key.fields]
    return {freeze(r) for r in row_columns(table, 0, table.num_columns, convert)}, given


def _key_batch(keys: Iterable[Mapping[str, Any]], schema: StateSchema
               ) -> tuple[pa.RecordBatch, int]:
    """The keys as an Arrow batch of the key's columns; each refused in one line where it
    names other columns or a value its column's type cannot take."""
    arrow = schema.arrow()
    fields = [arrow.field(i) for i in range(len(schema.key.fields))]
    names = [f.name for f in fields]
    columns: list[list[Any]] = [[] for _ in fields]
    given = 0
    for i, key in enumerate(keys):
        if not isinstance(key, Mapping) or sorted(key) != sorted(names):
            shown = sorted(key) if isinstance(key, Mapping) else type(key).__name__
            raise SparkCheckpointError(
                f"key {i + 1}: {shown}, not the key's columns ({', '.join(names)})")
        for column, name in zip(columns, names, strict=True):
            column.append(key[name])
        given += 1
    arrays = []
    for f, values in zip(fields, columns, strict=True):
        try:
            arrays.append(_typed(values, f.type))
        except (pa.ArrowException, ValueError, TypeError, OverflowError) as e:
            detail = " ".join(str(e).split())[:200]
            raise SparkCheckpointError(
                f"a key's {f.name} is not a {f.type} ({detail})") from None
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields)), given


def _typed(values: list[Any], t: pa.DataType) -> pa.Array:
    """JSON values as an Arrow array of `t`: directly where they fit, else through the
    type JSON gave them (ISO text to a timestamp, a struct of text to one of times)."""
    try:
        return pa.array(values, type=t)
    except (pa.ArrowException, TypeError, ValueError):
        pass
    one = []
    for value in values:
        try:
            one.append(pa.array([value], type=t))
        except (pa.ArrowException, TypeError, ValueError):
            one.append(pa.array([value]).cast(t))
    return pa.concat_arrays(one)


def frozen_rows(batch: pa.RecordBatch, count: int) -> list[Any]:
    columns = [batch.column(i).to_pylist() for i in range(count)]
    return [freeze(row) for row in zip(*columns, strict=True)]


def freeze(value: Any) -> Any:
    """A key's values made hashable (lists and dicts as tuples)."""
    if isinstance(value, dict):
        return tuple((k, freeze(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v) for v in value)
    return value


__all__ = ["DeleteReport", "TransformFn", "TransformReport", "decoded_keys", "delete_keys",
           "freeze", "transform"]
