"""A batch of flat keys hashed at once (`columnar_hash.partitions_of`) goes to the
partitions `spark_hash.partition_of` gives each key alone, which test_spark_repartition*
prove against where Spark itself put every fixture key: Hypothesis keys of every hashed
type, nulls, NaN and -0.0, strings of every length around a word, after RocksDB's version
byte; and keys it must not take as they are come back as None."""

from __future__ import annotations

import math
import struct

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from statehold.spark_checkpoints.columnar_hash import partitions_of
from statehold.spark_checkpoints.spark_hash import partition_of
from statehold.spark_checkpoints.spark_types import Atomic, Decimal, Field, Struct
from statehold.spark_checkpoints.unsafe_row import decode_row
from tests.spark_checkpoints.test_columnar_rows import _schemas, _value
from tests.support.spark_locations.unsafe_rows import encode_row


def _one_by_one(rows: list[bytes], schema: Struct, columns: tuple[int, ...], partitions: int,
                skip: int) -> list[int]:
    types = [schema.fields[i].type for i in columns]
    out = []
    for row in rows:
        values = decode_row(row[skip:], schema, "k")
        out.append(partition_of([values[i] for i in columns], types, partitions))
    return out


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), schema=_schemas(5), skip=st.sampled_from([0, 1]),
       partitions=st.sampled_from([1, 2, 5, 7, 200]))
def test_a_batch_goes_where_each_key_alone_goes(data: st.DataObject, schema: Struct, skip: int,
                                                partitions: int) -> None:
    values = data.draw(st.lists(st.tuples(*[_value(f.type) for f in schema.fields]),
                                min_size=1, max_size=30))
    columns = tuple(data.draw(st.lists(st.sampled_from(range(len(schema.fields))),
                                       min_size=1, max_size=len(schema.fields), unique=True)))
    rows = [b"\x00" * skip + encode_row(v, schema) for v in values]
    got = partitions_of(rows, schema, columns, partitions, skip)
    assert got is not None
    assert got.tolist() == _one_by_one(rows, schema, columns, partitions, skip)


def test_floats_strings_and_every_tail_length() -> None:
    schema = Struct((Field("f", Atomic("float")), Field("d", Atomic("double")),
                     Field("s", Atomic("string")), Field("b", Atomic("byte"))))
    values = [(f, d, "x" * n + "é", b) for n in range(9)
              for f, d, b in [(-0.0, -0.0, -128), (math.nan, math.nan, 127), (1.5, -2.5, -1),
                              (None, None, None)]]
    rows = [encode_row(v, schema) for v in values]
    for columns in [(0,), (1,), (2,), (3,), (2, 0, 3, 1)]:
        got = partitions_of(rows, schema, columns, 200, 0)
        assert got is not None
        assert got.tolist() == _one_by_one(rows, schema, columns, 200, 0), columns


def test_keys_not_taken_as_they_are_come_back_as_none() -> None:
    schema = Struct((Field("n", Atomic("long")), Field("s", Atomic("string"))))
    good = encode_row((1, "abcdef"), schema)
    outside = good[:16] + struct.pack("<q", 1000 << 32 | 4) + good[24:]
    assert partitions_of([good], schema, (0, 1), 5, 0) is not None
    assert partitions_of([good, outside], schema, (0, 1), 5, 0) is None
    assert partitions_of([good, good[:20]], schema, (0,), 5, 0) is None
    assert partitions_of([b"\x01" + good], schema, (0,), 5, 1) is None
    assert partitions_of([encode_row((1, "y" * 5000), schema)], schema, (1,), 5, 0) is None
    decimals = Struct((Field("d", Decimal(10, 2)),))
    assert partitions_of([encode_row((None,), decimals)], decimals, (0,), 5, 0) is None
