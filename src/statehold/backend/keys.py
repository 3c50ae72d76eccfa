"""Key groups and the RocksDB key encoding.

A key's key group is ``blake2b(utf8(key), digest_size=8)`` read as a big-endian unsigned
integer, modulo the job's max parallelism. BLAKE2b comes from hashlib, so it is identical in
every process, on every platform and Python version (Python's own ``hash()`` is salted per
process and must never decide where state lives).

RocksDB keys start with the key group as 2 bytes big-endian, so one task's contiguous
key-group range is one contiguous RocksDB key range: rescaling can delete or copy a range
without looking at individual keys. The full key is::

    key_group:2 | state name (UTF-8) | 0x00 | kind:1 | key type:1 | len(key):4 | key | suffix

``kind`` is the state primitive (value / list / map), ``key type`` says whether the user
key was a str or bytes, and ``suffix`` is the map entry's key (canonical JSON) for maps.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from enum import Enum

from statehold.metadata import KeyGroupRange

#: The 2-byte key-group prefix could hold 65536 groups; like Flink we stop at 2**15.
MAX_MAX_PARALLELISM = 1 << 15

Key = str | bytes


class StateKind(Enum):
    """The primitive a RocksDB entry belongs to (one byte in the key)."""

    VALUE = b"v"
    LIST = b"l"
    MAP = b"m"


_STR, _BYTES = b"s", b"b"


def check_max_parallelism(max_parallelism: int) -> int:
    if not 1 <= max_parallelism <= MAX_MAX_PARALLELISM:
        raise ValueError(f"max parallelism must be in 1..{MAX_MAX_PARALLELISM}")
    return max_parallelism


def key_bytes(key: Key) -> bytes:
    """The bytes a key is hashed on: UTF-8 for str, as-is for bytes."""
    if isinstance(key, str):
        return key.encode("utf-8")
    if isinstance(key, bytes | bytearray | memoryview):
        return bytes(key)
    raise TypeError(f"state keys must be str or bytes, not {type(key).__name__}")


def key_group_of(key: Key, max_parallelism: int) -> int:
    """The key group of `key` (stable BLAKE2b-64 hash of its UTF-8/raw bytes)."""
    check_max_parallelism(max_parallelism)
    digest = hashlib.blake2b(key_bytes(key), digest_size=8).digest()
    return int.from_bytes(digest, "big") % max_parallelism


def task_range(task_index: int, parallelism: int, max_parallelism: int) -> KeyGroupRange:
    """The contiguous key groups task `task_index` of `parallelism` owns (Flink's split:
    ranges differ in size by at most one and cover 0..max_parallelism-1)."""
    _check_parallelism(parallelism, max_parallelism)
    if not 0 <= task_index < parallelism:
        raise ValueError(f"task index {task_index} not in 0..{parallelism - 1}")
    start = (task_index * max_parallelism + parallelism - 1) // parallelism
    end = ((task_index + 1) * max_parallelism - 1) // parallelism
    return KeyGroupRange(start=start, end=end)


def all_ranges(parallelism: int, max_parallelism: int) -> list[KeyGroupRange]:
    return [task_range(i, parallelism, max_parallelism) for i in range(parallelism)]


def task_of(key_group: int, parallelism: int, max_parallelism: int) -> int:
    """The task index whose `task_range` contains `key_group`."""
    _check_parallelism(parallelism, max_parallelism)
    if not 0 <= key_group < max_parallelism:
        raise ValueError(f"key group {key_group} not in 0..{max_parallelism - 1}")
    return key_group * parallelism // max_parallelism


def task_of_key(key: Key, parallelism: int, max_parallelism: int) -> int:
    return task_of(key_group_of(key, max_parallelism), parallelism, max_parallelism)


def _check_parallelism(parallelism: int, max_parallelism: int) -> None:
    check_max_parallelism(max_parallelism)
    if not 1 <= parallelism <= max_parallelism:
        raise ValueError(f"parallelism {parallelism} not in 1..{max_parallelism}")


# -- RocksDB key encoding ---------------------------------------------------------------


def group_prefix(key_group: int) -> bytes:
    return key_group.to_bytes(2, "big")


def range_bounds(key_groups: KeyGroupRange) -> tuple[bytes, bytes]:
    """[lower, upper) RocksDB key bounds holding exactly the key groups of the range."""
    return group_prefix(key_groups.start), group_prefix(key_groups.end + 1)


def check_state_name(name: str) -> str:
    if not name or "\x00" in name:
        raise ValueError(f"bad state name {name!r}: must be non-empty and without NUL")
    return name


def entry_prefix(key_group: int, state_name: str, kind: StateKind, key: Key) -> bytes:
    """Everything before the suffix: one (state, key) pair's entries share this prefix."""
    raw = key_bytes(key)
    return b"".join(
        (
            group_prefix(key_group),
            check_state_name(state_name).encode("utf-8"),
            b"\x00",
            kind.value,
            _STR if isinstance(key, str) else _BYTES,
            len(raw).to_bytes(4, "big"),
            raw,
        )
    )


@dataclass(frozen=True, slots=True)
class DecodedKey:
    key_group: int
    state_name: str
    kind: StateKind
    key: Key
    suffix: bytes


def decode_key(raw: bytes) -> DecodedKey:
    """Inverse of `entry_prefix` + suffix; ValueError for anything not in this format."""
    try:
        sep = raw.index(b"\x00", 2)
        name = raw[2:sep].decode("utf-8")
        kind = StateKind(raw[sep + 1 : sep + 2])
        tag = raw[sep + 2 : sep + 3]
        n = int.from_bytes(raw[sep + 3 : sep + 7], "big")
        body = raw[sep + 7 : sep + 7 + n]
        if len(body) != n or tag not in (_STR, _BYTES):
            raise ValueError("truncated key")
        key: Key = body.decode("utf-8") if tag == _STR else body
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"not a statehold state key: {raw[:40]!r}") from e
    return DecodedKey(int.from_bytes(raw[:2], "big"), name, kind, key, raw[sep + 7 + n :])
