"""One job directory, opened once: its storage, its HA store, its job id and checkpoint
lookup.

Every driver and tool reaches a job through `open_job`, so the HA store is resolved in
one place and never defaulted. The job directory records which HA store owns it
(``_job/owner.json``, written when the first driver creates the job): opening it with
another store is refused with an error that names the right one, and opening it with no
store named uses the recorded one. A job directory made before the record existed is
accepted when its store is evident (``_ha/`` holds the embedded store's documents) or
named explicitly; a driver then writes the record. Changing the store of an existing
job is one explicit operation, `change_ha_store` (``statehold set-ha``).

Checkpoint pointers (``chk-N``, ``savepoints/NAME``, a job directory meaning its newest
retained checkpoint) are resolved here too, and every `_metadata` is read through
`JobDirectory.read_document`, which verifies it and checks it is the document its
directory names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from statehold.errors import InvalidArgumentError, StateholdError
from statehold.format import layout, signed
from statehold.format.layout import Kind
from statehold.format.metadata import CheckpointMetadata, MetadataError, read_metadata
from statehold.ha.base import HAState, HAStore, HAStoreError
from statehold.ha.open import EMBEDDED, open_ha_store
from statehold.job.owner import (
    OWNER_FORMAT,
    OWNER_KEY,
    OWNER_VERSION,
    OwnerRecord,
    canonical_ha,
    same_ha,
    write_owner,
)
from statehold.storage import (
    AlreadyExistsError,
    LocalStorage,
    NotFoundError,
    Storage,
    open_storage,
)
from statehold.storage.base import StorageError, UnsafePathError

_CHK = re.compile(r"^chk-(\d+)$", re.ASCII)


class JobDirectoryError(StateholdError):
    """The location is not the job directory asked for (missing, not a job directory,
    another job's, or no such checkpoint); nothing was read or deleted beyond looking."""


class NotAJobDirectoryError(JobDirectoryError):
    """The location holds no ``_ha/``, no ``chk-*/``, no ``savepoints/`` and no owner."""


class HAStoreMismatchError(JobDirectoryError):
    """The job directory belongs to another HA store than the one named."""


def read_owner(storage: Storage) -> OwnerRecord | None:
    """The owner record, None if there is none; JobDirectoryError if it is damaged."""
    try:
        data = storage.read(OWNER_KEY)
    except NotFoundError:
        return None
    return signed.decode(
        data,
        OwnerRecord,
        where=f"{storage.uri.rstrip('/')}/{OWNER_KEY}",
        format_name=OWNER_FORMAT,
        version=OWNER_VERSION,
        what="job owner",
        error=JobDirectoryError,
    )


def _has_embedded_documents(storage: Storage) -> bool:
    return any(
        layout.parse(i.key).kind is Kind.HA and i.key.endswith(".json")
        for i in storage.list(layout.HA_DIR)
    )


@dataclass
class HolderDocuments:
    """The documents that hold files, as read: verified ones, and damaged ones (key ->
    (why, raw bytes or None if missing or unreadable))."""

    verified: dict[str, CheckpointMetadata] = field(default_factory=dict)
    damaged: dict[str, tuple[str, bytes | None]] = field(default_factory=dict)


@dataclass
class JobDirectory:
    """An opened job directory: where it is, which job, and its HA store (resolved once).

    Close it (or use it as a context manager) to release the HA store's connection."""

    storage: Storage
    job_id: str
    ha: HAStore
    #: Canonical URI of the HA store (``embedded`` or ``zookeeper://…``).
    ha_uri: str
    owner: OwnerRecord | None = None
    #: Close the HA store with the directory (False for a store the caller passed in).
    owns_ha: bool = True
    _closed: bool = field(default=False, repr=False)

    @property
    def uri(self) -> str:
        return self.storage.uri.rstrip("/")

    def __enter__(self) -> JobDirectory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            if self.owns_ha:
                self.ha.close()

    # -- the HA store ----------------------------------------------------------------
    def state(self) -> HAState:
        """The HA store's current state (HAStoreError, one line, if it cannot be read)."""
        return self.ha.read()

    def retained_keys(self) -> list[str]:
        return [p.metadata for p in self.state().retained]

    # -- checkpoint lookup -------------------------------------------------------------
    def metadata_key(self, ref: int | str | None = None) -> str:
        """The `_metadata` key of `ref`: a checkpoint id, ``chk-N``, ``savepoints/NAME``
        (with or without ``/_metadata``), or None for the newest retained checkpoint."""
        if ref is None:
            latest = self.state().latest
            if latest is None:
                require_job_directory(self.storage)
                raise JobDirectoryError(f"{self.uri}: the HA store lists no retained checkpoint")
            return latest.metadata
        if isinstance(ref, int):
            return layout.checkpoint_metadata_key(ref)
        ref = ref.strip("/")
        if ref.endswith("/" + layout.METADATA_NAME):
            ref = ref[: -len(layout.METADATA_NAME) - 1]
        m = _CHK.match(ref)
        if m:
            return layout.checkpoint_metadata_key(int(m[1]))
        parts = ref.split("/")
        if len(parts) == 2 and parts[0] == layout.SAVEPOINTS_DIR:
            try:
                return layout.savepoint_metadata_key(parts[1])
            except ValueError as e:
                raise InvalidArgumentError(str(e)) from e
        raise InvalidArgumentError(f"{ref!r} names neither chk-N nor savepoints/NAME")

    def read_document(self, metadata_key: str) -> CheckpointMetadata:
        """The verified `_metadata` at `metadata_key`, which must be the checkpoint or
        savepoint its directory names (MetadataError otherwise)."""
        info = layout.parse(metadata_key)
        if info.kind not in (Kind.CHECKPOINT_METADATA, Kind.SAVEPOINT_METADATA):
            raise InvalidArgumentError(f"{metadata_key} is not a checkpoint or savepoint")
        meta = read_metadata(self.storage, metadata_key)
        where = f"{self.uri}/{metadata_key}"
        if info.kind is Kind.CHECKPOINT_METADATA and (
            meta.kind != "checkpoint" or meta.checkpoint_id != info.checkpoint_id
        ):
            raise MetadataError(
                f"{where}: holds {meta.kind} {meta.checkpoint_id}, not the checkpoint its "
                "directory names"
            )
        if info.kind is Kind.SAVEPOINT_METADATA and meta.kind != "savepoint":
            raise MetadataError(f"{where}: holds a checkpoint, not a savepoint")
        return meta

    def holder_documents(self, state: HAState, *, skip: str | None = None) -> HolderDocuments:
        """The retained checkpoints' (as `state` names them) and the savepoints' documents,
        read and verified; one that cannot be verified is returned as damaged with its raw
        bytes, for the deletion policy to quarantine. `skip` leaves one document out."""
        read = HolderDocuments()
        for key in dict.fromkeys([p.metadata for p in state.retained] + self.savepoint_keys()):
            if key == skip:
                continue
            try:
                read.verified[key] = self.read_document(key)
            except MetadataError as e:
                try:
                    raw: bytes | None = self.storage.read(key)
                except NotFoundError:
                    raw = None
                read.damaged[key] = (" ".join(str(e).split()), raw)
        return read

    def savepoint_keys(self) -> list[str]:
        """Every ``savepoints/NAME/_metadata`` in the directory, sorted."""
        return sorted(
            i.key
            for i in self.storage.list(layout.SAVEPOINTS_DIR)
            if _kind_of(i.key) is Kind.SAVEPOINT_METADATA
        )


def _kind_of(key: str) -> Kind:
    try:
        return layout.parse(key).kind
    except UnsafePathError:
        return Kind.UNKNOWN


def require_job_directory(storage: Storage) -> None:
    """Refuse (NotAJobDirectoryError) a location that is not a statehold job directory,
    before anything reads or deletes there."""
    problem = storage.root_problem() if isinstance(storage, LocalStorage) else None
    if problem is not None:
        raise NotAJobDirectoryError(
            f"{storage.uri.rstrip('/')}: {problem} (a job directory is expected)"
        )
    try:
        for page in storage.list_pages():
            for info in page:
                kind = _kind_of(info.key)
                if kind in (
                    Kind.HA,
                    Kind.CHECKPOINT_METADATA,
                    Kind.CHECKPOINT_OTHER,
                    Kind.SAVEPOINT_METADATA,
                ) or info.key == OWNER_KEY:
                    return
    except StorageError as e:
        raise JobDirectoryError(f"{storage.uri}: cannot list: {e}") from e
    raise NotAJobDirectoryError(
        f"{storage.uri.rstrip('/')}: not a statehold job directory "
        "(no _job/owner.json, _ha/, chk-*/ or savepoints/)"
    )


def _job_id_of(storage: Storage) -> str:
    return storage.uri.rstrip("/").rsplit("/", 1)[-1]


def open_job(
    location: str | Storage,
    ha: str | HAStore | None = None,
    *,
    job_id: str | None = None,
    create: bool = False,
    **storage_options: Any,
) -> JobDirectory:
    """Open the job directory at `location` (a path, ``file://`` or ``s3://`` URI, or a
    Storage rooted at it).

    `ha` names the HA store (a URI, or an open HAStore for tests and embedding); None
    means the one the directory records. `create` (drivers only) makes a new job
    directory's owner record; tools never create one. The job id is the directory's
    name unless given. Raises HAStoreMismatchError if the directory records another
    store, NotAJobDirectoryError for a location that is no job directory (unless
    `create`)."""
    storage = (
        location if isinstance(location, Storage) else open_storage(location, **storage_options)
    )
    # A store given as an object names its URI if it has one (a test double may not).
    named = ha if isinstance(ha, str) else getattr(ha, "uri", None)
    named_uri = canonical_ha(named) if named is not None else None
    owner = read_owner(storage)
    if owner is not None:
        # A relocated directory may have another name; the record says which job it is.
        job_id = job_id or owner.job_id
        if owner.job_id != job_id:
            raise JobDirectoryError(
                f"{storage.uri.rstrip('/')} is the directory of job {owner.job_id!r}, "
                f"not {job_id!r}"
            )
        if named_uri is not None and not same_ha(owner.ha, named_uri):
            raise HAStoreMismatchError(
                f"{storage.uri.rstrip('/')} belongs to HA store {owner.ha}, not {named_uri}: "
                f"use --ha {owner.ha} (to move the job to another store: statehold set-ha)"
            )
        uri = owner.ha
    else:
        job_id = job_id or _job_id_of(storage)
        evident = _has_embedded_documents(storage)
        if not create and not evident:
            require_job_directory(storage)  # naming a store makes no directory a job's
        if evident and named_uri not in (None, EMBEDDED):
            raise HAStoreMismatchError(
                f"{storage.uri.rstrip('/')} keeps its HA state in _ha/ (embedded), not in "
                f"{named_uri}: use --ha embedded"
            )
        if named_uri is None and not evident and not isinstance(ha, HAStore):
            if not create:
                raise JobDirectoryError(
                    f"{storage.uri.rstrip('/')} does not record its HA store; name it with "
                    "--ha (embedded or zookeeper://host:port/path)"
                )
            if _has_checkpoints(storage):
                raise JobDirectoryError(
                    f"{storage.uri.rstrip('/')} has checkpoints but records no HA store; "
                    "name it (ha=...) so it is not mistaken for a new job"
                )
        uri = named_uri or EMBEDDED
        if create and (named_uri is not None or not isinstance(ha, HAStore)):
            # (a store object that names no URI, e.g. a test wrapper, records nothing)
            owner = _create_owner(storage, job_id, uri)
    assert job_id is not None
    store = ha if isinstance(ha, HAStore) else open_ha_store(uri, storage, job_id)
    return JobDirectory(storage, job_id, store, uri, owner, owns_ha=not isinstance(ha, HAStore))


def _has_checkpoints(storage: Storage) -> bool:
    return any(
        _kind_of(i.key) in (Kind.CHECKPOINT_METADATA, Kind.SAVEPOINT_METADATA)
        for i in storage.list()
    )


def _create_owner(storage: Storage, job_id: str, uri: str) -> OwnerRecord:
    try:
        return write_owner(storage, job_id, uri)
    except AlreadyExistsError:
        # Another driver created the job at the same moment: theirs must agree with ours.
        record = read_owner(storage)
        assert record is not None
        if record.job_id != job_id or not same_ha(record.ha, uri):
            raise HAStoreMismatchError(
                f"{storage.uri.rstrip('/')} was just created for HA store {record.ha}, "
                f"not {uri}"
            ) from None
        return record


def change_ha_store(job: JobDirectory, new_ha: str) -> HAState:
    """Move a stopped job to another HA store: claim a new epoch in the old store (so any
    driver still on it is fenced), give the new store that epoch and the retained
    pointers, then record the new store. Refused while an attempt runs."""
    from statehold.job.lease import read_lease

    new_uri = canonical_ha(new_ha)
    if same_ha(job.ha_uri, new_uri):
        raise InvalidArgumentError(f"{job.uri} already uses HA store {job.ha_uri}")
    current = job.state()
    lease = read_lease(job.storage, current.epoch)
    if lease is not None and lease.alive():
        raise JobDirectoryError(
            f"{job.uri}: an attempt (epoch {current.epoch}) is running; stop it first"
        )
    claimed = job.ha.claim_epoch()
    target = open_ha_store(new_uri, job.storage, job.job_id)
    try:
        seeded = target.seed(claimed.epoch, claimed.retained)
    finally:
        target.close()
    write_owner(job.storage, job.job_id, new_uri, replace=True)
    return seeded


__all__ = [
    "HAStoreError",
    "HAStoreMismatchError",
    "HolderDocuments",
    "JobDirectory",
    "JobDirectoryError",
    "NotAJobDirectoryError",
    "OWNER_KEY",
    "OwnerRecord",
    "canonical_ha",
    "change_ha_store",
    "open_job",
    "read_owner",
    "require_job_directory",
    "same_ha",
]
