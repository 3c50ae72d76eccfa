"""The embedded HA store: the job's epoch and retained-checkpoint pointers, kept on the
checkpoint storage itself under ``<job>/_ha/``, so the default setup needs no server.

It needs only one atomic primitive, `Storage.create_if_absent`, which local disk (hard
link) and S3 (conditional PUT, ``If-None-Match: *``) both have; no ETag compare-and-set.

Format
    The state is a chain of small, immutable pointer documents
    ``_ha/<seq, 20 digits>.json``. Each holds its ``seq``, the job's ``epoch``, the
    retained checkpoint pointers (id, metadata key, epoch — never file lists), a random
    ``nonce`` and the ``parent`` nonce of the document it was built on. JSON with a format
    name, version and SHA-256 of its own, like `_metadata`; a reader refuses what it
    cannot verify (HAStoreError naming the file). The *current* state is the document
    with the highest seq.

Writing
    `claim_epoch` and `publish` read the latest document (seq s) and create seq s+1 with
    `create_if_absent`. Whoever creates s+1 first wins; the loser re-reads and retries —
    `publish` raises FencedError as soon as the latest document carries another epoch.

Why a create alone is not enough (the zombie)
    Old documents are garbage-collected (all but the newest `keep`). A paused old
    attempt ("zombie") that read seq s long ago may wake after s+1 was collected; its
    create of s+1 then *succeeds*, though s+1 is far below the current head. So every
    successful create is CONFIRMED by listing ``_ha/`` again:

    * ours is the highest seq → it was the current state at that moment: success;
    * seq+1 exists and its ``parent`` is our nonce → someone read ours as the current
      state, so it was: success (a later claim fences us on our next call);
    * otherwise ours was never the head. If the head carries another epoch, `publish`
      raises FencedError (`claim_epoch` just retries higher); if it carries ours (a
      concurrent publisher of our own attempt), we retry on top of the head.

    This is sound because the head document is never deleted (GC only removes seqs
    below a head it has seen, and the head only grows), so a stale document is never
    the highest: no reader ever uses it and nobody builds on it. It is deleted by the
    next garbage collection.

Garbage collection
    After a confirmed write the writer deletes every document with seq <= head - keep
    (stale zombie documents included), best effort. Keeping a few (default 10) rather
    than one lets concurrent writers still prove "somebody built on mine" and readers
    still find the head they listed; it bounds ``_ha/`` to about `keep` documents.
    These are superseded pointer documents, not checkpoint data, so deleting them is
    harmless even for a writer fenced a moment later.
"""

from __future__ import annotations

import contextlib
import random
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, field_validator

from statehold import clock
from statehold.errors import InvalidArgumentError
from statehold.format import signed
from statehold.format.layout import HA_DIR
from statehold.ha.base import CheckpointPointer, FencedError, HAState, HAStore, HAStoreError
from statehold.storage.base import (
    AlreadyExistsError,
    NotFoundError,
    Storage,
    StorageError,
    UnsafePathError,
    check_key,
)

FORMAT_NAME: Final = "statehold.ha-pointer"
#: Bump on any change a reader of the previous version would misread.
FORMAT_VERSION = 1
#: Pointer documents kept by garbage collection (the newest ones, by seq).
DEFAULT_KEEP = 10
#: Give up (HAStoreError) after this many lost races in one call.
MAX_ATTEMPTS = 200

_SEQ_DIGITS = 20
_DOC_KEY = re.compile(rf"^{re.escape(HA_DIR)}/(?P<seq>\d{{{_SEQ_DIGITS}}})\.json$", re.ASCII)


def pointer_key(seq: int) -> str:
    """The job-directory key of pointer document `seq`."""
    if seq < 0:
        raise InvalidArgumentError("seq must be non-negative")
    return f"{HA_DIR}/{seq:0{_SEQ_DIGITS}d}.json"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PointerModel(_Model):
    """One retained checkpoint: its id, its `_metadata` key (relative to the job dir)
    and the epoch that completed it. Nothing else — never file lists."""

    checkpoint_id: signed.Id
    metadata: signed.Name
    epoch: signed.Id
    #: The `_metadata` document's own checksum ("" if unknown).
    checksum: str = Field(default="", pattern=r"^(sha256:[0-9a-f]{64})?$")

    @field_validator("metadata")
    @classmethod
    def _safe(cls, v: str) -> str:
        try:
            return check_key(v)
        except UnsafePathError as e:
            raise InvalidArgumentError(str(e)) from e


class PointerDocument(_Model):
    """One link of the chain in ``_ha/``."""

    format: Literal["statehold.ha-pointer"] = FORMAT_NAME
    version: signed.Version = FORMAT_VERSION
    seq: Annotated[int, Strict(), Field(ge=1, le=signed.MAX_ID)]
    epoch: signed.Id
    #: Random id of this document; the next document names it as its `parent`.
    nonce: str = Field(pattern=r"^[0-9a-f]{32}$")
    parent: str | None = Field(default=None, pattern=r"^[0-9a-f]{32}$")
    written_at: signed.Timestamp = Field(default_factory=clock.now)
    retained: signed.Items[PointerModel] = Field(default_factory=list)
    #: SHA-256 of the canonical document without this field; set by `encode_document`.
    checksum: str = ""

    def state(self) -> HAState:
        return HAState(
            epoch=self.epoch,
            retained=tuple(
                CheckpointPointer(p.checkpoint_id, p.metadata, p.epoch, p.checksum)
                for p in self.retained
            ),
            version=self.seq,
        )


def encode_document(doc: PointerDocument) -> bytes:
    return signed.encode(doc)


def decode_document(data: bytes, where: str, seq: int | None = None) -> PointerDocument:
    """Parse and verify; HAStoreError naming `where` and the problem (one line). A
    pointer document is small: anything over `signed.MAX_SMALL_DOCUMENT_BYTES` is refused
    unparsed."""
    doc = signed.decode(
        data,
        PointerDocument,
        where=where,
        format_name=FORMAT_NAME,
        version=FORMAT_VERSION,
        what="HA pointer",
        error=HAStoreError,
        max_bytes=signed.MAX_SMALL_DOCUMENT_BYTES,
    )
    if seq is not None and doc.seq != seq:
        raise HAStoreError(f"{where}: holds seq {doc.seq}, its name says {seq}")
    return doc


@dataclass(frozen=True, slots=True)
class _Head:
    """The latest document, or the empty state of a new job (seq 0, epoch 0)."""

    seq: int
    epoch: int
    nonce: str | None
    doc: PointerDocument | None

    def state(self) -> HAState:
        return self.doc.state() if self.doc else HAState(epoch=0, retained=(), version=0)


_EMPTY = _Head(0, 0, None, None)


class EmbeddedHAStore(HAStore):
    """HA state in ``<job>/_ha/`` on the job's own storage (see the module docstring).

    Holds no mutable state: one instance may be used from several threads, and any
    number of instances (processes, drivers) may share one job directory.
    """

    def __init__(self, job_storage: Storage, *, keep: int = DEFAULT_KEEP) -> None:
        if keep < 2:
            raise InvalidArgumentError("keep must be at least 2")
        self.storage = job_storage
        self.keep = keep

    #: The URI `open_ha_store` takes for this store.
    uri: Final = "embedded"

    def __repr__(self) -> str:
        return f"EmbeddedHAStore({self.storage.uri.rstrip('/')}/{HA_DIR})"

    # -- reading ---------------------------------------------------------------------
    def _where(self, key: str) -> str:
        return f"{self.storage.uri.rstrip('/')}/{key}"

    def _list_seqs(self) -> list[int]:
        try:
            infos = list(self.storage.list(HA_DIR + "/"))
        except StorageError as e:
            raise HAStoreError(f"{self._where(HA_DIR)}: cannot list: {e}") from e
        seqs = []
        for info in infos:
            m = _DOC_KEY.match(info.key)
            if m:  # anything else (e.g. an interrupted write's temp file) is not ours
                seqs.append(int(m["seq"]))
        return sorted(seqs)

    def _read_doc(self, seq: int) -> PointerDocument | None:
        """Document `seq`, or None if it is gone (garbage-collected)."""
        key = pointer_key(seq)
        try:
            data = self.storage.read(key)
        except NotFoundError:
            return None
        except StorageError as e:
            raise HAStoreError(f"{self._where(key)}: cannot read: {e}") from e
        return decode_document(data, self._where(key), seq)

    def _head(self, seqs: list[int] | None = None) -> _Head:
        for _ in range(MAX_ATTEMPTS):
            seqs = seqs if seqs is not None else self._list_seqs()
            if not seqs:
                return _EMPTY
            doc = self._read_doc(seqs[-1])
            if doc is not None:
                return _Head(doc.seq, doc.epoch, doc.nonce, doc)
            seqs = None  # collected between list and read: the head moved on, list again
        raise HAStoreError(f"{self._where(HA_DIR)}: the head keeps moving; giving up")

    def read(self) -> HAState:
        return self._head().state()

    # -- writing ---------------------------------------------------------------------
    def _create(
        self, head: _Head, epoch: int, retained: Sequence[CheckpointPointer]
    ) -> PointerDocument | None:
        """Create document head.seq + 1; None if someone else created it first."""
        doc = PointerDocument(
            seq=head.seq + 1,
            epoch=epoch,
            nonce=uuid.uuid4().hex,
            parent=head.nonce,
            retained=[
                PointerModel(
                    checkpoint_id=p.checkpoint_id,
                    metadata=p.metadata,
                    epoch=p.epoch,
                    checksum=p.checksum,
                )
                for p in retained
            ],
        )
        key = pointer_key(doc.seq)
        try:
            self.storage.create_if_absent(key, encode_document(doc))
        except AlreadyExistsError:
            return None
        except StorageError as e:
            raise HAStoreError(f"{self._where(key)}: cannot write: {e}") from e
        return doc

    def _confirm(self, mine: PointerDocument) -> tuple[bool, list[int]]:
        """Was `mine` ever the head? Returns (confirmed, listing) — see module docstring."""
        seqs = self._list_seqs()
        if not seqs or seqs[-1] <= mine.seq:
            return True, seqs
        if mine.seq + 1 in seqs:
            nxt = self._read_doc(mine.seq + 1)
            if nxt is not None and nxt.parent == mine.nonce:
                return True, seqs
        return False, seqs

    def _collect(self, seqs: list[int], mine: int) -> None:
        """Best-effort GC of documents far below the head (never the head itself)."""
        head = max(seqs[-1] if seqs else 0, mine)
        old = [pointer_key(s) for s in seqs if s <= head - self.keep]
        if old:
            with contextlib.suppress(StorageError):  # the next write's collection retries
                self.storage.delete_many(old)

    @staticmethod
    def _backoff(attempt: int) -> None:
        clock.sleep(random.uniform(0, min(0.05, 0.001 * 2 ** min(attempt, 6))))

    def claim_epoch(self) -> HAState:
        for attempt in range(MAX_ATTEMPTS):
            head = self._head()
            retained = head.doc.state().retained if head.doc else ()
            mine = self._create(head, head.epoch + 1, retained)
            if mine is None:
                self._backoff(attempt)
                continue
            ok, seqs = self._confirm(mine)
            if ok:
                self._collect(seqs, mine.seq)
                return mine.state()
            # A stale create (our seq had been collected): our epoch may be taken; retry.
        raise HAStoreError(f"{self._where(HA_DIR)}: could not claim an epoch (contention)")

    def seed(self, epoch: int, retained: Sequence[CheckpointPointer]) -> HAState:
        if epoch < 1:
            raise InvalidArgumentError(f"cannot seed epoch {epoch}: epochs start at 1")
        if self._list_seqs():
            raise HAStoreError(f"{self._where(HA_DIR)}: already holds HA state; not seeded")
        mine = self._create(_EMPTY, epoch, retained)
        if mine is None:
            raise HAStoreError(f"{self._where(HA_DIR)}: written meanwhile; not seeded")
        return mine.state()

    def publish(self, epoch: int, retained: Sequence[CheckpointPointer]) -> HAState:
        if epoch < 1:
            raise InvalidArgumentError(f"epoch {epoch} was never claimed; call claim_epoch first")
        for attempt in range(MAX_ATTEMPTS):
            head = self._head()
            if head.epoch != epoch:
                raise FencedError(
                    f"epoch {epoch} is fenced: the job's current epoch is {head.epoch} "
                    f"({self._where(pointer_key(head.seq))})"
                )
            mine = self._create(head, epoch, retained)
            if mine is None:
                self._backoff(attempt)
                continue  # the next _head() fences us if the winner has another epoch
            ok, seqs = self._confirm(mine)
            if ok:
                self._collect(seqs, mine.seq)
                return mine.state()
            # Never the head: the loop re-reads it and raises FencedError if another
            # epoch owns the job, else (a writer of our own epoch) publishes on top.
        raise HAStoreError(f"{self._where(HA_DIR)}: could not publish (contention)")
