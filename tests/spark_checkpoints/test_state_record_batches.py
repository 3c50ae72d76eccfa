"""`state_records`' parser, which cuts the records whole in a block from it in place and
joins only a record that runs past a block's end: every record comes back as written,
one by one and in batches, whatever the blocks' and the chunks' sizes (a record, its
sizes and the end marker split anywhere), and a stream cut short or with data after its
end is refused in one line."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from statehold.spark_checkpoints.errors import SparkCheckpointError
from statehold.spark_checkpoints.state_files import decompressed
from statehold.spark_checkpoints.state_records import (
    changelog_batches,
    record_batches,
    records,
)
from tests.support.spark_locations.handmade_files import lineage_header, lz4_stream
from tests.support.spark_locations.handmade_files import records as written

_PAIRS = st.lists(st.tuples(st.binary(max_size=40),
                            st.one_of(st.none(), st.binary(max_size=3000))), max_size=60)


def _chunked(data: bytes, size: int) -> list[bytes]:
    return [data[at : at + size] for at in range(0, len(data), size)]


@settings(max_examples=150, deadline=None)
@given(pairs=_PAIRS, block=st.integers(1, 5000), chunk=st.integers(1, 9000))
def test_every_record_back_as_written_whatever_the_blocks(
        pairs: list[tuple[bytes, bytes | None]], block: int, chunk: int) -> None:
    stream = lz4_stream(written(pairs), block=block)

    def blocks() -> object:
        return decompressed(iter(_chunked(stream, chunk)), "x.delta")

    batched = [(k, v) for keys, values in record_batches(blocks(), "x.delta",  # type: ignore[arg-type]
                                                         deletes=True)
               for k, v in zip(keys, values, strict=True)]
    assert batched == pairs
    assert list(records(blocks(), "x.delta", deletes=True)) == pairs  # type: ignore[arg-type]


def test_a_changelog_with_a_header_gives_its_records_in_batches() -> None:
    pairs = [(b"k%05d" % i, b"v" * (i % 1500)) for i in range(3000)]
    stream = lz4_stream(written(pairs, header=lineage_header([(4, "6b0c6fd4")])), block=4096)
    batches = list(changelog_batches(decompressed(iter([stream]), "5.changelog"),
                                     "5.changelog"))
    assert len(batches) > 1
    assert [(k, v) for keys, values in batches
            for k, v in zip(keys, values, strict=True)] == pairs


@pytest.mark.parametrize(("cut", "message"), [
    (lambda data: data[:-4], "cut short"),  # no end marker
    (lambda data: data[:-9], "cut short"),  # a record's value cut
    (lambda data: data + b"\x00", "data after the end of the records"),
    (lambda data: b"\xff\xff\xff\xfe" + data[4:], "record 0 has a key of size -2"),
])
def test_a_damaged_stream_is_refused_in_one_line(cut: object, message: str) -> None:
    data = written([(b"key", b"value" * 100), (b"k2", None), (b"k3", b"v")])
    data = cut(data)  # type: ignore[operator]
    with pytest.raises(SparkCheckpointError) as refused:
        for _batch in record_batches(decompressed(iter([lz4_stream(data, block=64)]), "d"),
                                     "d", deletes=True):
            pass
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_a_delete_in_a_snapshot_is_refused() -> None:
    data = lz4_stream(written([(b"key", b"value"), (b"k2", None)]), block=7)
    with pytest.raises(SparkCheckpointError, match="record 1 has a value of size -1"):
        list(records(decompressed(iter([data]), "1.snapshot"), "1.snapshot", deletes=False))
