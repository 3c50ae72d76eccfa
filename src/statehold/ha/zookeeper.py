"""The ZooKeeper HA store, for clusters that already run ZooKeeper.

One znode per job, `<root>/<job_id>`, holds a small JSON document: format, version, the
job's epoch and the retained checkpoint pointers. Every change is a compare-and-set on the
znode's version, so two drivers can never both win: a claim bumps the epoch, and a
publish of an older epoch then fails with FencedError.

Every operation is a real round trip to the ensemble (after a `sync`, so a follower
cannot answer from a stale view). While the client is disconnected nothing succeeds:
calls wait at most `timeout` seconds for the connection to come back and then raise
HAStoreError — the driver stops writing until it can re-establish its epoch. Deadlines
are read from `statehold.clock`, so the deterministic simulation drives this very code
against its simulated ZooKeeper (a kazoo-like client given as `client`).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any, Literal

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    BadVersionError,
    ConnectionLoss,
    KazooException,
    NodeExistsError,
    NoNodeError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.retry import KazooRetry
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from statehold import clock
from statehold.errors import InvalidArgumentError
from statehold.format import signed
from statehold.ha.base import CheckpointPointer, FencedError, HAState, HAStore, HAStoreError
from statehold.ha.uri import DEFAULT_ROOT, URI_SCHEME, parse_uri
from statehold.ha.uri import check_root as _check_root
from statehold.ha.uri import check_segment as _check_segment
from statehold.storage.base import UnsafePathError, check_key

FORMAT_NAME = "statehold.ha"
#: Bump on any change a reader of the previous version would misread.
FORMAT_VERSION = 1
#: How long opening a store waits for its first connection (seconds): an unreachable
#: ensemble is reported in one line after this, whatever the per-call `timeout`.
CONNECT_TIMEOUT = 5.0


#: Requests that change nothing: resent after a lost connection (within the deadline).
_RESENDABLE = frozenset({"sync", "read"})


class _Resend(HAStoreError):
    """A read lost its connection: wait for the client to reconnect and send it again
    (control flow inside `_call`, never raised out of it)."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class _Pointer(_Model):
    checkpoint_id: signed.Id
    metadata: signed.Name
    epoch: signed.Id
    checksum: str = Field(default="", pattern=r"^(sha256:[0-9a-f]{64})?$")


class _Document(_Model):
    format: Literal["statehold.ha"]
    version: signed.Version
    epoch: signed.Id
    retained: signed.Items[_Pointer]


def _check_pointer(pointer: CheckpointPointer) -> CheckpointPointer:
    if pointer.checkpoint_id < 0 or pointer.epoch < 0:
        raise InvalidArgumentError(f"negative checkpoint id or epoch in {pointer}")
    try:
        check_key(pointer.metadata)
    except UnsafePathError as exc:
        raise InvalidArgumentError(f"unsafe metadata key in {pointer}: {exc}") from exc
    return pointer


def encode(epoch: int, retained: Sequence[CheckpointPointer]) -> bytes:
    """The znode's data: compact, key-sorted JSON."""
    document = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "epoch": epoch,
        "retained": [
            {
                "checkpoint_id": p.checkpoint_id,
                "metadata": p.metadata,
                "epoch": p.epoch,
                "checksum": p.checksum,
            }
            for p in retained
        ],
    }
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


def decode(data: bytes, version: int, where: str) -> HAState:
    """Parse and validate a znode's data; HAStoreError names `where` and the problem on
    one line. Bounded like every statehold document (see `signed`): at most
    `signed.MAX_SMALL_DOCUMENT_BYTES`, `signed.MAX_DEPTH` levels, bounded numbers."""
    raw = signed.load_json(
        data,
        where=f"HA state at {where}",
        error=HAStoreError,
        max_bytes=signed.MAX_SMALL_DOCUMENT_BYTES,
        invalid="not JSON",
    )
    newer = (
        isinstance(raw, dict)
        and raw.get("format") == FORMAT_NAME
        and isinstance(raw.get("version"), int)
        and FORMAT_VERSION < raw["version"] <= signed.MAX_ID
    )
    if newer:
        raise HAStoreError(
            f"HA state at {where} has format version {raw['version']}, newer than "
            f"this statehold understands ({FORMAT_VERSION}); upgrade statehold"
        )
    try:
        document = _Document.model_validate(raw)
        if document.version != FORMAT_VERSION:
            raise InvalidArgumentError(f"unsupported format version {document.version}")
        retained = tuple(
            _check_pointer(CheckpointPointer(p.checkpoint_id, p.metadata, p.epoch, p.checksum))
            for p in document.retained
        )
    except ValidationError as exc:
        raise HAStoreError(f"HA state at {where} is invalid: {signed.explain(exc)}") from exc
    except ValueError as exc:
        raise HAStoreError(f"HA state at {where} is invalid: {signed.one_line(str(exc))}") from exc
    return HAState(epoch=document.epoch, retained=retained, version=version)


class _ConnectAttemptLog(logging.Filter):
    """The log of one client, held back while it makes its first connection.

    kazoo logs every refused or timed-out attempt as a warning (eleven lines before an
    unreachable ensemble's error); the error line says the same once. Only the last
    warning's text is kept, for that line. Afterwards records pass to ``kazoo.client``'s
    handlers as usual (a connection lost later is worth a log line)."""

    def __init__(self) -> None:
        super().__init__()
        self.quiet = True
        self.last = ""
        # Not registered with `logging`: one per client, dropped with it.
        self.logger = logging.Logger("kazoo.client")
        self.logger.parent = logging.getLogger("kazoo.client")
        self.logger.addFilter(self)

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.quiet:
            return True
        message = record.getMessage()
        # (the retry policy's final word, logged when `start` gives up, says no more)
        if record.levelno >= logging.WARNING and not message.startswith("Failed connecting"):
            self.last = message.removeprefix("Connection dropped: ")
        return False


class ZooKeeperHAStore(HAStore):
    """The HA state of one job in ZooKeeper, fenced by compare-and-set on the znode."""

    def __init__(
        self,
        hosts: str,
        root: str,
        job_id: str,
        *,
        timeout: float = 10.0,
        connect_timeout: float | None = None,
        client: KazooClient | None = None,
    ) -> None:
        """Connect to `hosts` (kazoo connect string) unless a started `client` is given
        (then the caller owns it). `timeout` bounds every call, including the wait for a
        lost connection to come back; `connect_timeout` (default: `timeout`, at most
        `CONNECT_TIMEOUT`) bounds the first connection, after which an unreachable
        ensemble is one HAStoreError line (the client's own log lines
        of the attempt are held back: their last warning becomes part of that line)."""
        self.hosts = hosts
        self.root = _check_root(root)
        self.job_id = _check_segment(job_id, "job id")
        self.path = f"{self.root}/{self.job_id}"
        self.timeout = timeout
        self._connected = threading.Event()
        self._owns_client = client is None
        if client is None:
            if connect_timeout is None:
                connect_timeout = min(timeout, CONNECT_TIMEOUT)
            attempt = _ConnectAttemptLog()
            client = KazooClient(
                hosts=hosts,
                timeout=max(timeout, 4.0),
                connection_retry=KazooRetry(max_tries=-1, delay=0.1, backoff=2, max_delay=2.0),
                logger=attempt.logger,
            )
            try:
                client.start(timeout=connect_timeout)
            except KazooTimeoutError as exc:
                client.close()
                last = f" (last attempt: {attempt.last})" if attempt.last else ""
                raise HAStoreError(
                    f"cannot connect to ZooKeeper at {hosts}: no connection within "
                    f"{connect_timeout:g} s{last}; check that the ensemble runs and is "
                    "reachable from here, and the host:port list of the zookeeper:// URI"
                ) from exc
            finally:
                attempt.quiet = False
        self._client: Any = client
        self._closed = False
        client.add_listener(self._on_state)
        if client.connected:
            self._connected.set()

    @classmethod
    def from_uri(
        cls,
        uri: str,
        job_id: str,
        *,
        timeout: float = 10.0,
        connect_timeout: float | None = None,
    ) -> ZooKeeperHAStore:
        """Open `zookeeper://host:port[,host:port]/path` for `job_id`."""
        hosts, root = parse_uri(uri)
        return cls(hosts, root, job_id, timeout=timeout, connect_timeout=connect_timeout)

    @property
    def uri(self) -> str:
        """The URI `from_uri` accepts for this store (without the job id)."""
        return f"{URI_SCHEME}://{self.hosts}{self.root}"

    # -- connection -------------------------------------------------------------------

    def _on_state(self, state: str) -> None:
        # Called on kazoo's thread: only flip the flag, never block here.
        if state == KazooState.CONNECTED:
            self._connected.set()
        else:
            self._connected.clear()

    def _call(self, deadline: float, start: Callable[[], Any], what: str) -> Any:
        """Run one async kazoo request once connected, bounded by `deadline`. A sync or
        a read that lost its connection is sent again once the client has reconnected
        (it changes nothing); a write's outcome is unknown, so it is never resent here."""
        while True:
            if self._closed:
                raise HAStoreError(f"HA store for {self.path} is closed")
            if not self._connected.wait(max(0.0, deadline - clock.monotonic())):
                raise HAStoreError(
                    f"not connected to ZooKeeper ({what} {self.path}); no HA change is "
                    f"possible until the connection is re-established"
                )
            try:
                return self._call_once(deadline, start, what)
            except _Resend:
                clock.sleep(0.05)  # the listener clears `_connected` while kazoo reconnects
                continue

    def _call_once(self, deadline: float, start: Callable[[], Any], what: str) -> Any:
        try:
            return start().get(timeout=max(0.001, deadline - clock.monotonic()))
        except (NoNodeError, NodeExistsError, BadVersionError):
            raise
        except ConnectionLoss as exc:
            if what in _RESENDABLE and clock.monotonic() < deadline:
                raise _Resend(f"{what} {self.path}: connection lost") from exc
            raise HAStoreError(
                f"ZooKeeper {what} {self.path} failed (connection lost); "
                f"for a write the outcome is unknown: re-read before acting"
            ) from exc
        except (KazooException, KazooTimeoutError) as exc:
            raise HAStoreError(
                f"ZooKeeper {what} {self.path} failed ({type(exc).__name__}: {exc}); "
                f"for a write the outcome is unknown: re-read before acting"
            ) from exc

    def _get(self, deadline: float) -> HAState:
        """A fresh read: `sync` first so a lagging follower cannot serve old data."""
        self._call(deadline, lambda: self._client.sync_async(self.path), "sync")
        try:
            data, stat = self._call(deadline, lambda: self._client.get_async(self.path), "read")
        except NoNodeError:
            return HAState(epoch=0, retained=(), version=-1)
        return decode(data, stat.version, f"zookeeper:{self.path}")

    def _write(self, deadline: float, current: HAState, data: bytes) -> int | None:
        """Compare-and-set: the new znode version, or None if someone else wrote first."""
        try:
            if current.version < 0:
                self._call(
                    deadline,
                    lambda: self._client.create_async(self.path, data, makepath=True),
                    "create",
                )
                return 0
            stat = self._call(
                deadline,
                lambda: self._client.set_async(self.path, data, version=current.version),
                "write",
            )
        except (NodeExistsError, BadVersionError, NoNodeError):
            return None
        version: int = stat.version
        return version

    # -- HAStore ----------------------------------------------------------------------

    def read(self) -> HAState:
        return self._get(clock.monotonic() + self.timeout)

    def claim_epoch(self) -> HAState:
        deadline = clock.monotonic() + self.timeout
        while True:
            current = self._get(deadline)
            epoch = current.epoch + 1
            version = self._write(deadline, current, encode(epoch, current.retained))
            if version is not None:
                return HAState(epoch=epoch, retained=current.retained, version=version)
            if clock.monotonic() > deadline:
                raise HAStoreError(f"could not claim an epoch for {self.path}: too much contention")

    def publish(self, epoch: int, retained: Sequence[CheckpointPointer]) -> HAState:
        pointers = tuple(_check_pointer(p) for p in retained)
        data = encode(epoch, pointers)
        deadline = clock.monotonic() + self.timeout
        while True:
            current = self._get(deadline)
            if current.epoch != epoch:
                raise FencedError(
                    f"epoch {epoch} is fenced: the job's current epoch is {current.epoch}"
                )
            version = self._write(deadline, current, data)
            if version is not None:
                return HAState(epoch=epoch, retained=pointers, version=version)
            # Someone wrote in between: re-read and decide again (fenced if they claimed).
            if clock.monotonic() > deadline:
                raise HAStoreError(f"could not publish to {self.path}: too much contention")

    def seed(self, epoch: int, retained: Sequence[CheckpointPointer]) -> HAState:
        pointers = tuple(_check_pointer(p) for p in retained)
        deadline = clock.monotonic() + self.timeout
        current = self._get(deadline)
        if current.version >= 0:
            raise HAStoreError(f"zookeeper:{self.path} already holds HA state; not seeded")
        version = self._write(deadline, current, encode(epoch, pointers))
        if version is None:
            raise HAStoreError(f"zookeeper:{self.path} was written meanwhile; not seeded")
        return HAState(epoch=epoch, retained=pointers, version=version)

    def check_epoch(self, epoch: int) -> None:
        """Raise FencedError unless `epoch` is current, from a synced read (never cached)."""
        current = self.read().epoch
        if current != epoch:
            raise FencedError(f"epoch {epoch} is fenced: the job's current epoch is {current}")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._client.remove_listener(self._on_state)
        if self._owns_client:
            self._client.stop()
            self._client.close()


__all__ = [
    "CONNECT_TIMEOUT",
    "DEFAULT_ROOT",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "URI_SCHEME",
    "ZooKeeperHAStore",
    "decode",
    "encode",
    "parse_uri",
]
