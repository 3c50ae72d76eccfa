"""transformWithState's key and value layouts (statehold.spark_checkpoints.tws_state) on
rows built here with Spark's encodings, for what the committed fixture's families do not
hold: a range key of several types (a negative double's bits flipped, a null's marker,
a range key with no other field), list values with and without merge operator version
1's delimiter, and where a map state's TTL family keeps the grouping key
(``elementKey.key``); typed changelogs replayed. A list's and a map's rows transformed
(`tws_transform`) are written back in those layouts (a list's row counter with them) and
read back as the function returned them; a TTL'd variable and Spark's own families are
refused. Spark itself writes list, map and TTL families in
test_spark_repartition_live.py (RichState), where each is read against Spark's readers,
repartitioned and restarted on."""

from __future__ import annotations

import struct
from pathlib import Path

import pyarrow.compute as pc
import pytest

from statehold.spark_checkpoints.errors import SparkCheckpointError
from statehold.spark_checkpoints.layout import StoreId
from statehold.spark_checkpoints.location import SparkCheckpoint
from statehold.spark_checkpoints.spark_types import Atomic, Field, Struct
from statehold.spark_checkpoints.stores import Needs
from statehold.spark_checkpoints.tws_records import tws_records
from statehold.spark_checkpoints.tws_state import Family, TwsOperator, family_prefix
from statehold.spark_checkpoints.tws_transform import VariableRows, variable_family
from statehold.spark_checkpoints.unsafe_row_writer import encode_row
from statehold.storage.local import LocalStorage
from tests.support.spark_locations.handmade_files import lz4_stream, utf

GROUPING = (Field("key", Atomic("string")),)
BINARY = Atomic("binary")


def versioned(values: tuple[object, ...], schema: Struct) -> bytes:
    return b"\x00" + encode_row(values, schema, "test")


def range_key(fid: int, ordering: list[bytes], rest: bytes | None) -> bytes:
    head = versioned(tuple(ordering), Struct(tuple(Field(f"o{i}", BINARY)
                                                   for i in range(len(ordering)))))
    return family_prefix(fid) + struct.pack("<i", len(head)) + head + (rest or b"")


def test_a_range_key_of_several_types_decodes_in_the_schemas_order() -> None:
    key = Struct((Field("d", Atomic("double")), Field("g", Struct(GROUPING)),
                  Field("n", Atomic("long")), Field("i", Atomic("integer"))))
    family = Family("f", key, Struct(()), "range", ordering=(0, 2, 3)).located(GROUPING, "f")
    flipped = struct.unpack(">Q", struct.pack(">d", -2.5))[0] ^ ((1 << 64) - 1)
    raw = range_key(7, [b"\x00" + struct.pack(">Q", flipped), b"\x02" + bytes(8),
                        b"\x01" + struct.pack(">i", 41)],
                    versioned((("k9",),), Struct((Field("g", Struct(GROUPING)),))))
    decoded = family.key_decoder("f")(raw)
    assert decoded == (-2.5, ("k9",), None, 41)
    assert family.path == (1,) and family.grouping(decoded) == ("k9",)
    with pytest.raises(SparkCheckpointError, match="ordering marker 0x05"):
        family.key_decoder("f")(range_key(7, [b"\x05" + bytes(8), b"\x02" + bytes(8),
                                              b"\x01" + bytes(4)], None))


def test_a_map_states_ttl_family_keeps_the_grouping_key_in_its_element_key() -> None:
    element = Struct((Field("key", Struct(GROUPING)),
                      Field("userKey", Struct((Field("k", Atomic("string")),)))))
    key = Struct((Field("expirationMs", Atomic("long")), Field("elementKey", element)))
    family = Family("$ttl_mm", key, Struct(()), "range", ordering=(0,)).located(GROUPING, "t")
    rest = versioned(((("k3",), ("b1",)),), Struct((Field("elementKey", element),)))
    decoded = family.key_decoder("t")(range_key(11, [b"\x01" + struct.pack(">q", 5)], rest))
    assert decoded == (5, (("k3",), ("b1",)))
    assert family.path == (1, 0) and family.grouping(decoded) == ("k3",)
    with pytest.raises(SparkCheckpointError, match="no grouping key"):
        Family("x", Struct((Field("expirationMs", Atomic("long")),
                            Field("other", Struct((Field("z", Atomic("long")),))))),
               Struct(()), "range", ordering=(0,)).located(GROUPING, "x")


@pytest.mark.parametrize("delimiter", [0, 1])
def test_a_list_states_values_each_with_its_size(delimiter: int) -> None:
    value = Struct((Field("v", Atomic("long")),))
    family = Family("items", Struct(GROUPING), value, "none", multiple=True)
    elements = [versioned((n,), value) for n in (3, -1, 7)]
    raw = (b"," * delimiter).join(struct.pack("<i", len(e)) + e for e in elements)
    assert family.values_decoder("items")(raw) == [(3,), (-1,), (7,)]
    with pytest.raises(SparkCheckpointError, match="list element"):
        family.values_decoder("items")(struct.pack("<i", 99) + elements[0])


def _record(op: int, key: bytes, value: bytes | None) -> bytes:
    size = -1 if value is None else len(value)
    return (bytes([op]) + struct.pack(">i", len(key)) + key + struct.pack(">i", size)
            + (value or b""))


def test_typed_changelogs_replayed_put_delete_merge_and_range_delete(tmp_path: Path) -> None:
    """A version from changelogs alone: a merge appends to the key's value with the
    delimiter (to nothing after a delete), a delete drops the key, a range delete every
    key in [first, end) written before it; the records come in key order."""
    store = StoreId(0, 0, "default")
    files = {
        1: [_record(0x01, b"\x02\x00a", b"A1"), _record(0x01, b"\x02\x00b", b"B"),
            _record(0x01, b"\x03\x00c", b"C"), _record(0x01, b"\x03\x00e", b"E")],
        2: [_record(0x11, b"\x02\x00a", b"A2"), _record(0x10, b"\x02\x00b", None),
            _record(0x11, b"\x02\x00b", b"B2"), _record(0x20, b"\x03\x00", b"\x03\x00d"),
            _record(0x11, b"\x02\x00d", b"D")],
    }
    for version, records in files.items():
        path = tmp_path / store.prefix / f"{version}.changelog"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(lz4_stream(utf("v2") + b"".join(records) + b"\x00", block=64))
    needs = Needs(store, 2, "changelogs", 0,
                  {f"{store.prefix}/{v}.changelog": None for v in files})
    location = SparkCheckpoint(LocalStorage(tmp_path))
    assert list(tws_records(location, store, needs, 1)) == [
        (b"\x02\x00a", b"A1,A2"), (b"\x02\x00b", b"B2"), (b"\x02\x00d", b"D"),
        (b"\x03\x00e", b"E")]
    assert dict(tws_records(location, store, needs, 0))[b"\x02\x00a"] == b"A1A2"


def _operator(*families: Family, delimiter: int = 1) -> TwsOperator:
    """An operator of `families` (ids in their order), the grouping key `GROUPING`."""
    located = {f.name: f.located(GROUPING, f.name) for f in families}
    return TwsOperator(0, "default", located, {n: i for i, n in enumerate(located)},
                       [n for n in located if not n.startswith("$")], delimiter, "schema", {})


LONG = Atomic("long")
ITEMS = Family("items", Struct(GROUPING), Struct((Field("v", LONG),)), "none", multiple=True)
COUNTER = Family("$rowCounter_items", Struct(GROUPING), Struct((Field("count", LONG),)), "none")
MAP = Family("m", Struct((Field("key", Struct(GROUPING)),
                          Field("userKey", Struct((Field("k", Atomic("string")),))))),
             Struct((Field("n", LONG),)), "prefix", prefix=1)


@pytest.mark.parametrize("delimiter", [0, 1])
def test_a_lists_elements_kept_are_written_back_with_their_row_count(delimiter: int) -> None:
    """A list state transformed (`tws_transform`): the elements ``fn`` keeps of a key
    are one record, each element its size and row, joined by the merge operator's
    delimiter, read back as ``fn`` returned them; its row counter says how many; a key
    whose elements all go has neither."""
    tws = _operator(ITEMS, COUNTER, MAP, delimiter=delimiter)
    rows = VariableRows(None, None, tws, "items",  # type: ignore[arg-type]
                        lambda b: b.filter(pc.and_(pc.not_equal(b.column("v"), -1),
                                                   pc.not_equal(b.column("key"), "k2"))))
    written = list(rows.rewritten([("k1", 3), ("k1", -1), ("k1", 7), ("k2", 5)],
                                  StoreId(0, 0, "default"), family_prefix(0),
                                  family_prefix(1)))
    [(_, key, value), (_, counter_key, count)] = written
    elements = [versioned((n,), ITEMS.value) for n in (3, 7)]
    assert value == (b"," * delimiter).join(struct.pack("<i", len(e)) + e for e in elements)
    assert tws.families["items"].rows_decoder("items")(key, value) == [("k1", 3), ("k1", 7)]
    assert counter_key == family_prefix(1) + key[2:]
    assert tws.families[COUNTER.name].rows_decoder("c")(counter_key, count) == [("k1", 2)]
    assert (rows.read, rows.written) == (4, 2)


def test_a_maps_entries_are_written_back_in_its_prefix_layout() -> None:
    tws = _operator(ITEMS, MAP)
    rows = VariableRows(None, None, tws, "m",  # type: ignore[arg-type]
                        lambda b: b.set_column(2, "n", pc.multiply(b.column("n"), 10)))
    given = [(("k1",), ("a",), 1), (("k1",), ("b",), 2), (("k4",), ("a",), 3)]
    written = list(rows.rewritten(given, StoreId(0, 0, "default"), family_prefix(1), None))
    decode = tws.families["m"].rows_decoder("m")
    assert [row for _, k, v in written for row in decode(k, v)] == [
        (g, u, n * 10) for g, u, n in given]
    assert all(k[:2] == family_prefix(1) for _, k, _v in written)


def test_a_ttld_variable_and_sparks_own_families_are_refused() -> None:
    ttl = Family("$ttl_items", Struct((Field("expirationMs", LONG),
                                       Field("elementKey", Struct(GROUPING)))),
                 Struct(()), "range", ordering=(0,))
    with pytest.raises(SparkCheckpointError, match=r"has a TTL: its TTL index \(\$ttl_items\)"):
        variable_family(_operator(ITEMS, ttl), "items")
    with pytest.raises(SparkCheckpointError, match=r"own column family .*\(items, m\)"):
        variable_family(_operator(ITEMS, COUNTER, MAP), "$rowCounter_items")
    assert variable_family(_operator(ITEMS, COUNTER), "items").name == "items"
