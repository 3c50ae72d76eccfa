"""A fault-injecting `Storage` wrapper, so tests can show that discards, the HA store and
uploads survive a storage that fails — transiently, permanently, or slowly.

Faults are drawn from one seeded `random.Random`, so a failing run reproduces with the
same seed (given the same sequence of calls). Permanent failures ("permission denied")
are rules on a file or directory path that stay until `heal()`. Every call is counted.

Operation kinds:
  * ``delete`` — delete_many (one draw per key), delete_prefix (one draw per call)
  * ``write``  — write, upload, create_if_absent, replace_if_version, and the destination
    side of copy/move
  * ``list``   — list_pages (one draw per listing)
  * ``read``   — read, read_versioned, stat, download, and the source side of copy/move
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

from statehold.storage.base import (
    DeleteError,
    FileInfo,
    Storage,
    StorageError,
    check_key,
    check_prefix,
)

OpKind = Literal["delete", "write", "list", "read"]
OP_KINDS: tuple[OpKind, ...] = get_args(OpKind)

#: Called as ``hook(method, kind)`` when a call reaches the wrapper, before any latency
#: or fault; tests use it to block a call or to observe which thread made it.
CallHook = Callable[[str, OpKind], None]


class InjectedFault(StorageError):
    """A failure made up by FaultyStorage (transient, or a permanent rule)."""


class PermissionDeniedFault(InjectedFault, PermissionError):
    """A permanent failure on a path, until healed."""


def _join(base: str, key: str) -> str:
    return f"{base}/{key}" if base and key else base or key


def _under(path: str, rule: str) -> bool:
    """Is `path` the file/directory `rule` or inside it?"""
    return path == rule or path.startswith(rule + "/") or rule == ""


@dataclass
class _Shared:
    """State shared by a FaultyStorage and all its children."""

    rates: dict[OpKind, float]
    latency: dict[OpKind, float]
    rng: random.Random
    sleep: Callable[[float], None]
    hook: CallHook | None
    lock: threading.Lock = field(default_factory=threading.Lock)
    rules: dict[str, frozenset[OpKind]] = field(default_factory=dict)
    calls: Counter[str] = field(default_factory=Counter)
    injected: Counter[str] = field(default_factory=Counter)


def _per_kind(value: float | Mapping[OpKind, float] | None, name: str) -> dict[OpKind, float]:
    if value is None:
        value = 0.0
    if isinstance(value, Mapping):
        unknown = set(value) - set(OP_KINDS)
        if unknown:
            raise ValueError(f"unknown operation kind(s) in {name}: {sorted(unknown)}")
        out = {k: float(value.get(k, 0.0)) for k in OP_KINDS}
    else:
        out = {k: float(value) for k in OP_KINDS}
    if any(v < 0 for v in out.values()):
        raise ValueError(f"{name} must be >= 0")
    return out


class FaultyStorage(Storage):
    """Wraps `inner`; injects faults per operation kind. For tests only.

    ``fail_rate`` (and the per-kind shortcuts ``delete_fail_rate`` etc., which override
    it) is the probability in [0, 1] that an operation fails with `InjectedFault` before
    reaching `inner`. ``latency`` (seconds, overall or per kind) is slept before each
    call. Children made by `child()` share the faults, rules, random generator and
    counters; rule paths are always relative to the outermost wrapper's root.
    """

    def __init__(
        self,
        inner: Storage,
        *,
        seed: int | None = 0,
        fail_rate: float | Mapping[OpKind, float] | None = None,
        delete_fail_rate: float | None = None,
        write_fail_rate: float | None = None,
        list_fail_rate: float | None = None,
        read_fail_rate: float | None = None,
        latency: float | Mapping[OpKind, float] | None = None,
        hook: CallHook | None = None,
        sleep: Callable[[float], None] = time.sleep,
        _shared: _Shared | None = None,
        _base: str = "",
    ) -> None:
        self.inner = inner
        self.uri = inner.uri
        self._base = _base
        if _shared is not None:
            self._s = _shared
            return
        rates = _per_kind(fail_rate, "fail_rate")
        for kind, rate in (
            ("delete", delete_fail_rate),
            ("write", write_fail_rate),
            ("list", list_fail_rate),
            ("read", read_fail_rate),
        ):
            if rate is not None:
                rates[kind] = float(rate)  # type: ignore[index]
        if any(not 0.0 <= r <= 1.0 for r in rates.values()):
            raise ValueError("failure rates must be in [0, 1]")
        self._s = _Shared(
            rates=rates,
            latency=_per_kind(latency, "latency"),
            rng=random.Random(seed),
            sleep=sleep,
            hook=hook,
        )

    def __repr__(self) -> str:
        return f"FaultyStorage({self.inner!r})"

    # -- configuration -------------------------------------------------------------------
    def set_fail_rate(self, kind: OpKind, rate: float) -> None:
        """Change one kind's transient failure rate (0 turns injection off)."""
        if kind not in OP_KINDS or not 0.0 <= rate <= 1.0:
            raise ValueError(f"bad kind or rate: {kind!r}, {rate!r}")
        with self._s.lock:
            self._s.rates[kind] = rate

    def set_latency(self, kind: OpKind, seconds: float) -> None:
        if kind not in OP_KINDS or seconds < 0:
            raise ValueError(f"bad kind or latency: {kind!r}, {seconds!r}")
        with self._s.lock:
            self._s.latency[kind] = seconds

    def fail_permanently(self, path: str, kinds: Iterable[OpKind] = ("delete",)) -> None:
        """Make every `kinds` operation on file `path`, or on anything inside directory
        `path`, fail until healed (like a permission denied). '' means the whole root."""
        path = check_prefix(path).rstrip("/")
        ks = frozenset(kinds)
        if not ks or not ks <= set(OP_KINDS):
            raise ValueError(f"bad kinds: {sorted(ks)}")
        with self._s.lock:
            self._s.rules[path] = ks

    def heal(self, path: str) -> None:
        """Remove the permanent-failure rule set on exactly `path` (no-op if none)."""
        with self._s.lock:
            self._s.rules.pop(path.rstrip("/"), None)

    def heal_all(self) -> None:
        """Remove every permanent-failure rule."""
        with self._s.lock:
            self._s.rules.clear()

    # -- counters ------------------------------------------------------------------------
    @property
    def calls(self) -> Counter[str]:
        """Calls received, by method name (snapshot; shared with children)."""
        with self._s.lock:
            return Counter(self._s.calls)

    @property
    def injected(self) -> Counter[str]:
        """Injected failures, by method name (delete_many counts failed keys)."""
        with self._s.lock:
            return Counter(self._s.injected)

    def reset_counters(self) -> None:
        with self._s.lock:
            self._s.calls.clear()
            self._s.injected.clear()

    # -- fault machinery -----------------------------------------------------------------
    def _enter(self, method: str, kind: OpKind) -> None:
        """Count the call, run the hook, sleep the latency."""
        with self._s.lock:
            self._s.calls[method] += 1
            delay = self._s.latency[kind]
            hook = self._s.hook
        if hook is not None:
            hook(method, kind)
        if delay > 0:
            self._s.sleep(delay)

    def _denied(self, key: str, kind: OpKind, *, either_way: bool = False) -> str | None:
        """The rule denying `kind` on `key` (full path), if any. `either_way` also
        matches rules inside `key` (for directory-wide operations)."""
        for rule, kinds in self._s.rules.items():
            if kind in kinds and (_under(key, rule) or (either_way and _under(rule, key))):
                return rule
        return None

    def _transient(self, kind: OpKind) -> bool:
        """Must hold the lock. One random draw."""
        rate = self._s.rates[kind]
        return rate > 0 and self._s.rng.random() < rate

    def _check(self, method: str, kind: OpKind, key: str, *, either_way: bool = False) -> None:
        """Raise an injected fault for a single-call operation on `key`, or pass."""
        full = _join(self._base, key)
        with self._s.lock:
            rule = self._denied(full, kind, either_way=either_way)
            transient = rule is None and self._transient(kind)
            if rule is not None or transient:
                self._s.injected[method] += 1
        if rule is not None:
            raise PermissionDeniedFault(f"injected: permission denied on {full!r} ({method})")
        if transient:
            raise InjectedFault(f"injected: transient {kind} failure on {full!r} ({method})")

    def _call(self, method: str, kind: OpKind, key: str, *, either_way: bool = False) -> None:
        self._enter(method, kind)
        self._check(method, kind, key, either_way=either_way)

    # -- Storage -------------------------------------------------------------------------
    def child(self, prefix: str) -> FaultyStorage:
        prefix = check_key(prefix.rstrip("/"))
        return FaultyStorage(
            self.inner.child(prefix), _shared=self._s, _base=_join(self._base, prefix)
        )

    def list_pages(self, prefix: str = "", page_size: int = 1000) -> Iterator[list[FileInfo]]:
        self._call("list_pages", "list", check_prefix(prefix).rstrip("/"))
        return self.inner.list_pages(prefix, page_size)

    def stat(self, key: str) -> FileInfo | None:
        self._call("stat", "read", check_key(key))
        return self.inner.stat(key)

    def read(self, key: str) -> bytes:
        self._call("read", "read", check_key(key))
        return self.inner.read(key)

    def download(self, key: str, local_path: Path) -> None:
        self._call("download", "read", check_key(key))
        self.inner.download(key, local_path)

    def write(self, key: str, data: bytes) -> None:
        self._call("write", "write", check_key(key))
        self.inner.write(key, data)

    def upload(self, local_path: Path, key: str) -> None:
        self._call("upload", "write", check_key(key))
        self.inner.upload(local_path, key)

    def create_if_absent(self, key: str, data: bytes) -> None:
        self._call("create_if_absent", "write", check_key(key))
        self.inner.create_if_absent(key, data)

    def read_versioned(self, key: str) -> tuple[bytes, str]:
        self._call("read_versioned", "read", check_key(key))
        return self.inner.read_versioned(key)

    def replace_if_version(self, key: str, version: str, data: bytes) -> None:
        self._call("replace_if_version", "write", check_key(key))
        self.inner.replace_if_version(key, version, data)

    def delete_many(self, keys: Iterable[str]) -> None:
        """Per key: a denied or unlucky key fails, every other key is deleted; then
        DeleteError names exactly the failed keys (like S3's bulk delete)."""
        keys = [check_key(k) for k in keys]
        self._enter("delete_many", "delete")
        failed: dict[str, BaseException] = {}
        with self._s.lock:
            for key in keys:
                full = _join(self._base, key)
                if self._denied(full, "delete") is not None:
                    failed[key] = PermissionDeniedFault(f"injected: permission denied: {full!r}")
                elif self._transient("delete"):
                    failed[key] = InjectedFault(f"injected: transient delete failure: {full!r}")
            self._s.injected["delete_many"] += len(failed)
        self._delete_all_but(keys, failed)

    def delete_prefix(self, prefix: str) -> int:
        """A transient fault fails the whole call. A denied path inside the prefix is
        kept while the rest is deleted, then DeleteError names the kept files."""
        prefix = check_prefix(prefix)
        bare = prefix.rstrip("/")
        self._enter("delete_prefix", "delete")
        full = _join(self._base, bare)
        with self._s.lock:
            partly_denied = self._denied(full, "delete", either_way=True) is not None
            transient = self._transient("delete")
            if transient:
                self._s.injected["delete_prefix"] += 1
        if transient:
            raise InjectedFault(f"injected: transient delete failure on {full!r}/ (delete_prefix)")
        if not partly_denied:
            return self.inner.delete_prefix(prefix)
        keys = [f.key for f in self.inner.list(bare + "/" if bare else "")]
        failed: dict[str, BaseException] = {}
        with self._s.lock:
            for key in keys:
                if self._denied(_join(self._base, key), "delete") is not None:
                    failed[key] = PermissionDeniedFault(f"injected: permission denied: {key!r}")
            self._s.injected["delete_prefix"] += len(failed)
        return len(self._delete_all_but(keys, failed))

    def _delete_all_but(self, keys: list[str], failed: dict[str, BaseException]) -> list[str]:
        """Delete the keys not in `failed` (like a real bulk delete that partly fails),
        then raise DeleteError naming every failed key. Returns the keys deleted."""
        rest = [k for k in keys if k not in failed]
        if rest:
            try:
                self.inner.delete_many(rest)
            except DeleteError as e:
                failed.update(e.failed)
        if failed:
            raise DeleteError(failed)
        return rest

    def _target(self, method: str, src: str, dst: str, target: Storage | None) -> Storage | None:
        """Check faults for both sides of a copy/move; unwrap a faulty target."""
        self._check(method, "read", check_key(src))
        if target is None:
            self._check(method, "write", check_key(dst))
            return None
        if isinstance(target, FaultyStorage):
            target._check(method, "write", check_key(dst))
            return target.inner
        return target

    def copy(self, src: str, dst: str, *, target: Storage | None = None) -> None:
        self._enter("copy", "write")
        self.inner.copy(src, dst, target=self._target("copy", src, dst, target))

    def move(self, src: str, dst: str, *, target: Storage | None = None) -> None:
        self._enter("move", "write")
        inner_target = self._target("move", src, dst, target)
        self._check("move", "delete", check_key(src))
        self.inner.move(src, dst, target=inner_target)
