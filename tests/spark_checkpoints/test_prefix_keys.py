"""A session window's RocksDB key (`prefix_keys`), against the bytes Spark 4.3 wrote for
one (a run of the session window query of test_spark_repartition_live.py): decoded to its
columns, encoded back byte for byte, its prefix part what repartition hashes; a key whose
prefix length or version byte is wrong refused in one line."""

from __future__ import annotations

import pytest

from statehold.spark_checkpoints.errors import SparkCheckpointError
from statehold.spark_checkpoints.prefix_keys import PrefixKeys
from statehold.spark_checkpoints.spark_types import Atomic, Field, Struct

#: (key "k0", sessionStartTime 2023-11-14T22:17:21Z) as Spark's prefix-scan encoder wrote it.
SPARK_KEY = bytes.fromhex(
    "19000000" "00" "0000000000000000" "0200000010000000" "6b30000000000000"
    "00" "0000000000000000" "409e7b26240a0600")
KEY = Struct((Field("key", Atomic("string")), Field("sessionStartTime", Atomic("timestamp"))))
START = 1_700_000_241_000_000


def test_a_spark_key_decodes_and_encodes_back_byte_for_byte() -> None:
    layout = PrefixKeys(KEY, 1)
    assert layout.decoder("k")(SPARK_KEY) == ("k0", START)
    assert layout.encode(("k0", START), "k") == SPARK_KEY
    prefix, rest = layout.split(SPARK_KEY, "k")
    assert prefix == SPARK_KEY[4:29] and rest == SPARK_KEY[29:]
    assert layout.prefixes([SPARK_KEY], "k") == [prefix]


@pytest.mark.parametrize(("data", "message"), [
    (SPARK_KEY[:3], r"prefix length \(-1\)"),
    (b"\xff\x00\x00\x00" + SPARK_KEY[4:], r"prefix length \(255\)"),
    (SPARK_KEY[:4] + b"\x01" + SPARK_KEY[5:], "state encoding version 01"),
    (SPARK_KEY[:29] + b"\x02" + SPARK_KEY[30:], "state encoding version 02"),
])
def test_a_damaged_key_is_refused_in_one_line(data: bytes, message: str) -> None:
    with pytest.raises(SparkCheckpointError, match=message) as refused:
        PrefixKeys(KEY, 1).decoder("operator 0 partition 0 (a key)")(data)
    assert "\n" not in str(refused.value)
