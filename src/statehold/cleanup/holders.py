"""Who holds files now: the retained checkpoints' and savepoints' documents as the
deletion policy sees them, and what the damaged ones still protect.

The job directory reads the documents (`JobDirectory.holder_documents`); this module reads
no storage itself: it turns what was read into `Holders`, salvaging what a damaged
document's text still names, and builds the shared-state registry from them (as Flink's
registry is built from checkpoints already loaded).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from statehold.cleanup.registry import SharedStateRegistry
from statehold.format import layout
from statehold.format.metadata import CheckpointMetadata, newer_version, referenced_keys
from statehold.ha.base import HAState
from statehold.job.directory import JobDirectory

_PATH_FIELD = re.compile(rb'"path"\s*:\s*("(?:[^"\\]|\\.)*")')


def salvage(data: bytes, metadata_key: str) -> set[str] | None:
    """The data files a damaged document still names (resolved against its key, allowed
    by the layout): every file path if it is still JSON, else every ``"path"`` its text
    holds; None if not one can be read, so nothing it may name is known."""
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        doc = None
    if isinstance(doc, dict):
        paths = [
            f.get("path")
            for op in _dicts(doc.get("operators"))
            for kg in _dicts(op.get("ranges"))
            for f in _dicts(kg.get("files"))
        ]
    else:
        paths = []
        for m in _PATH_FIELD.finditer(data):
            try:
                paths.append(json.loads(m[1]))
            except ValueError:
                continue
        if not paths:
            return None
    found: set[str] = set()
    for path in paths:
        if not isinstance(path, str):
            continue
        try:
            found.add(layout.check_data_key(metadata_key, layout.resolve(metadata_key, path)))
        except (TypeError, ValueError):
            continue
    return found


def _dicts(value: object) -> list[dict[str, object]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


@dataclass
class Holders:
    """Who holds files now: the verified documents of the retained checkpoints and
    savepoints, and the quarantined ones (key -> why), with what they protect."""

    documents: dict[str, CheckpointMetadata] = field(default_factory=dict)
    quarantined: dict[str, str] = field(default_factory=dict)
    #: Data files the quarantined documents' text names.
    salvaged: set[str] = field(default_factory=set)
    #: A quarantined document no path could be read from: spare every data file.
    spare_all_data: bool = False
    #: Quarantined documents of a newer format version (key -> the version they declare):
    #: what they name is unknown here, so every data file is spared and dispose refuses.
    newer: dict[str, int] = field(default_factory=dict)

    def registry(self) -> SharedStateRegistry:
        """The shared-state registry of these holders; what quarantined documents name
        is held too, so subsume and abort spare it."""
        registry = SharedStateRegistry.from_metadata(self.documents.items())
        for key in self.quarantined:
            registry.register_quarantined(key, self.salvaged)
        return registry

    def referenced(self) -> set[str]:
        """Every key a holder needs, its `_metadata` included."""
        keys = set(self.documents) | set(self.quarantined) | self.salvaged
        for key, meta in self.documents.items():
            keys.update(referenced_keys(meta, key))
        return keys

    def quarantined_dirs(self) -> tuple[str, ...]:
        return tuple(k.rsplit("/", 1)[0] + "/" for k in self.quarantined)


def load_holders(
    documents: Mapping[str, CheckpointMetadata],
    damaged: Mapping[str, tuple[str, bytes | None]],
) -> Holders:
    """Holders from verified documents and damaged ones (key -> (why, raw bytes or None
    if missing or unreadable))."""
    holders = Holders(documents=dict(documents))
    for key, (why, raw) in damaged.items():
        holders.quarantined[key] = why
        version = newer_version(raw) if raw is not None else None
        if version is not None:
            holders.newer[key] = version
        found = salvage(raw, key) if raw is not None and version is None else None
        if found is None:
            holders.spare_all_data = True
        else:
            holders.salvaged |= found
    return holders


def read_holders(job: JobDirectory, state: HAState, *, skip: str | None = None) -> Holders:
    """The holders of `job` now: the retained checkpoints (as `state` names them) and the
    savepoints, each document read and verified by the job directory; one that cannot be
    verified is quarantined, not fatal. `skip` leaves one document out (what dispose
    removes)."""
    read = job.holder_documents(state, skip=skip)
    return load_holders(read.verified, read.damaged)


__all__ = ["Holders", "load_holders", "read_holders", "salvage"]
