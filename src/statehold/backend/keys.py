"""Key groups and the RocksDB key encoding.

A key's key group is a stable 64-bit hash of its bytes (UTF-8 for a str), modulo the job's
max parallelism. Which hash is the job's `KeyHash`, recorded in every checkpoint:

- ``xxhash64`` (new jobs): Spark's ``xxhash64`` with its seed 42, read as a signed 64-bit
  integer, then ``pmod``. Spark SQL computes it too, so the JVM keys the rows of a string
  or integer key column (`statehold.spark.keying`) and they never pass through Python
  before the shuffle; the ``xxhash`` package computes the same here.
- ``blake2b-64`` (jobs written before it): BLAKE2b with an 8-byte digest, read as a
  big-endian unsigned integer, modulo. Spark has no BLAKE2b, so such a job keys in Python.

Both are identical in every process, on every platform and Python version (Python's own
``hash()`` is salted per process and must never decide where state lives).

RocksDB keys start with the key group as 2 bytes big-endian, so one task's contiguous
key-group range is one contiguous RocksDB key range: rescaling can delete or copy a range
without looking at individual keys. The full key is::

    key_group:2 | state name (UTF-8) | 0x00 | kind:1 | key type:1 | len(key):4 | key | suffix

``kind`` is the state primitive (value / list / map; upper case: the same with a TTL,
whose stored values start with their 8-byte expiry), ``key type`` says whether the user
key was a str or bytes, and ``suffix`` is the map entry's key (encoded by the map's key
codec) for maps and the element's 8-byte sequence number for lists (one entry per
element, so appending never rewrites a list).

The empty state name (refused for users) holds statehold's own entries per key group:
a key's timers (kind ``t``: the usual key part, then the 8-byte expiry; value empty),
the timers ordered by time (kind ``T``: ``expiry | key type | len | key``) and the TTL
index (kind ``X``: ``expiry | the expiring entry's full key``). Times are milliseconds,
stored as int64 + 2**63 big-endian, so byte order is time order.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from enum import Enum

import xxhash

from statehold.errors import InvalidArgumentError, StateholdError
from statehold.format.metadata import NEW_JOB_KEY_HASH, KeyGroupRange, KeyHash

#: The 2-byte key-group prefix could hold 65536 groups; like Flink we stop at 2**15.
MAX_MAX_PARALLELISM = 1 << 15

Key = str | bytes


class KeyTypeError(InvalidArgumentError, TypeError):
    """A state key that is neither str nor bytes."""


class StateKeyError(StateholdError, ValueError):
    """Stored bytes that are not a statehold state key (corrupt or foreign)."""


class StateKind(Enum):
    """The primitive a RocksDB entry belongs to (one byte in the key)."""

    VALUE = b"v"
    LIST = b"l"
    MAP = b"m"
    #: the same with a TTL: stored values start with their expiry (`encode_time`)
    VALUE_TTL = b"V"
    LIST_TTL = b"L"
    MAP_TTL = b"M"
    #: statehold's own entries under the empty state name (see the module docstring)
    TIMER = b"t"
    TIMER_INDEX = b"T"
    TTL_INDEX = b"X"

    @property
    def has_ttl(self) -> bool:
        return self in (StateKind.VALUE_TTL, StateKind.LIST_TTL, StateKind.MAP_TTL)

    @property
    def base(self) -> StateKind:
        """The primitive without its TTL flag."""
        return _BASE.get(self, self)

    def with_ttl(self, ttl: bool) -> StateKind:
        return _WITH_TTL[self] if ttl else self


_BASE = {
    StateKind.VALUE_TTL: StateKind.VALUE,
    StateKind.LIST_TTL: StateKind.LIST,
    StateKind.MAP_TTL: StateKind.MAP,
}
_WITH_TTL = {v: k for k, v in _BASE.items()}
#: Kinds whose entries are indexes, not a key's state (no user key right after the kind).
INDEX_KINDS = (StateKind.TIMER_INDEX, StateKind.TTL_INDEX)
#: Reserved for statehold's own entries; user state names must not start with it.
RESERVED_PREFIX = "__statehold"


_STR, _BYTES = b"s", b"b"


def check_max_parallelism(max_parallelism: int) -> int:
    if not 1 <= max_parallelism <= MAX_MAX_PARALLELISM:
        raise InvalidArgumentError(f"max parallelism must be in 1..{MAX_MAX_PARALLELISM}")
    return max_parallelism


def key_bytes(key: Key) -> bytes:
    """The bytes a key is hashed on: UTF-8 for str, as-is for bytes."""
    if isinstance(key, str):
        return key.encode("utf-8")
    if isinstance(key, bytes | bytearray | memoryview):
        return bytes(key)
    raise KeyTypeError(f"state keys must be str or bytes, not {type(key).__name__}")


#: The seed of Spark SQL's ``xxhash64``.
SPARK_XXHASH_SEED = 42
_SIGN = 1 << 63


def key_group_of(key: Key, max_parallelism: int, key_hash: KeyHash = NEW_JOB_KEY_HASH) -> int:
    """The key group of `key`: its bytes hashed by `key_hash`, modulo `max_parallelism`
    (module docstring)."""
    check_max_parallelism(max_parallelism)
    raw = key_bytes(key)
    if key_hash == KeyHash.XXHASH64:
        # Spark reads the hash as a signed long and takes pmod; Python's % is pmod.
        unsigned = xxhash.xxh64_intdigest(raw, SPARK_XXHASH_SEED)
        return (unsigned - (unsigned & _SIGN) * 2) % max_parallelism
    if key_hash == KeyHash.BLAKE2B:
        digest = hashlib.blake2b(raw, digest_size=8).digest()
        return int.from_bytes(digest, "big") % max_parallelism
    raise InvalidArgumentError(f"unknown key hash {key_hash!r}")


def task_range(task_index: int, parallelism: int, max_parallelism: int) -> KeyGroupRange:
    """The contiguous key groups task `task_index` of `parallelism` owns (Flink's split:
    ranges differ in size by at most one and cover 0..max_parallelism-1)."""
    _check_parallelism(parallelism, max_parallelism)
    if not 0 <= task_index < parallelism:
        raise InvalidArgumentError(f"task index {task_index} not in 0..{parallelism - 1}")
    start = (task_index * max_parallelism + parallelism - 1) // parallelism
    end = ((task_index + 1) * max_parallelism - 1) // parallelism
    return KeyGroupRange(start=start, end=end)


def all_ranges(parallelism: int, max_parallelism: int) -> list[KeyGroupRange]:
    return [task_range(i, parallelism, max_parallelism) for i in range(parallelism)]


def task_of(key_group: int, parallelism: int, max_parallelism: int) -> int:
    """The task index whose `task_range` contains `key_group`."""
    _check_parallelism(parallelism, max_parallelism)
    if not 0 <= key_group < max_parallelism:
        raise InvalidArgumentError(f"key group {key_group} not in 0..{max_parallelism - 1}")
    return key_group * parallelism // max_parallelism


def task_of_key(
    key: Key, parallelism: int, max_parallelism: int, key_hash: KeyHash = NEW_JOB_KEY_HASH
) -> int:
    return task_of(key_group_of(key, max_parallelism, key_hash), parallelism, max_parallelism)


def _check_parallelism(parallelism: int, max_parallelism: int) -> None:
    check_max_parallelism(max_parallelism)
    if not 1 <= parallelism <= max_parallelism:
        raise InvalidArgumentError(f"parallelism {parallelism} not in 1..{max_parallelism}")


# -- RocksDB key encoding ---------------------------------------------------------------


def group_prefix(key_group: int) -> bytes:
    return key_group.to_bytes(2, "big")


def range_bounds(key_groups: KeyGroupRange) -> tuple[bytes, bytes]:
    """[lower, upper) RocksDB key bounds holding exactly the key groups of the range."""
    return group_prefix(key_groups.start), group_prefix(key_groups.end + 1)


def check_state_name(name: str) -> str:
    if not name or "\x00" in name or name.startswith(RESERVED_PREFIX):
        raise InvalidArgumentError(
            f"bad state name {name!r}: must be non-empty, without NUL and not start with "
            f"{RESERVED_PREFIX!r}"
        )
    return name


def key_part(key: Key) -> bytes:
    """``key type | len | key``: a user key inside a RocksDB key."""
    raw = key_bytes(key)
    return b"".join((_STR if isinstance(key, str) else _BYTES, len(raw).to_bytes(4, "big"), raw))


@functools.lru_cache(maxsize=1024)
def _name_part(state_name: str) -> bytes:
    """A state name as it is stored, checked once per name, not once per key."""
    return check_state_name(state_name).encode("utf-8")


def entry_prefix(key_group: int, state_name: str, kind: StateKind, key: Key) -> bytes:
    """Everything before the suffix: one (state, key) pair's entries share this prefix."""
    name = b"" if kind is StateKind.TIMER else _name_part(state_name)
    return b"".join((group_prefix(key_group), name, b"\x00", kind.value, key_part(key)))


def index_prefix(key_group: int, kind: StateKind) -> bytes:
    """Where an index (`INDEX_KINDS`) of one key group starts."""
    return group_prefix(key_group) + b"\x00" + kind.value


_TIME_OFFSET = 1 << 63


def encode_time(ms: int) -> bytes:
    """A time in milliseconds as 8 bytes whose byte order is time order."""
    return (int(ms) + _TIME_OFFSET).to_bytes(8, "big")


def decode_time(data: bytes) -> int:
    return int.from_bytes(data[:8], "big") - _TIME_OFFSET


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
        if kind in INDEX_KINDS:
            return DecodedKey(int.from_bytes(raw[:2], "big"), name, kind, b"", raw[sep + 2 :])
        tag = raw[sep + 2 : sep + 3]
        n = int.from_bytes(raw[sep + 3 : sep + 7], "big")
        body = raw[sep + 7 : sep + 7 + n]
        if len(body) != n or tag not in (_STR, _BYTES):
            raise StateKeyError("truncated key")
        key: Key = body.decode("utf-8") if tag == _STR else body
    except (ValueError, UnicodeDecodeError) as e:
        raise StateKeyError(f"not a statehold state key: {raw[:40]!r}") from e
    return DecodedKey(int.from_bytes(raw[:2], "big"), name, kind, key, raw[sep + 7 + n :])


def decode_key_part(data: bytes) -> tuple[Key, bytes]:
    """Inverse of `key_part`: the user key and the bytes after it."""
    tag, n = data[:1], int.from_bytes(data[1:5], "big")
    body = data[5 : 5 + n]
    if len(body) != n or tag not in (_STR, _BYTES):
        raise StateKeyError(f"not a statehold key part: {data[:40]!r}")
    return (body.decode("utf-8") if tag == _STR else body), data[5 + n :]
