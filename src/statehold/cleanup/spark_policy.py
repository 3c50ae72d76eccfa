"""The deletion rule for Spark checkpoint locations: what statehold may delete there.

`check_rollback_deletable` is the rule for a rollback: it may delete only what a later
batch wrote and Spark would write again when it reruns from the rolled-back batch (the
offsets and commit logs, the sources' and a file sink's logs, state version files,
operator metadata v2 and schema v3 files), and their checksum companions. Never the
query's ``metadata``, a store's ``_metadata/schema``, SSTs or RocksDB logs (they are
shared between versions; gc decides about them), nor a name Spark does not write. Which
*batches* may go is the caller's decision (everything after the batch rolled back to);
this rule guarantees a rollback cannot delete a kind of file it has no business with,
whatever its planning got wrong.
"""

from __future__ import annotations

import re

from statehold.errors import StateholdError
from statehold.format.spark_layout import Kind, parse

#: Kinds a rollback removes (the batches after the one it rolls back to).
ROLLBACK_KINDS = {
    Kind.OFFSETS,
    Kind.COMMITS,
    Kind.SOURCE_LOG,
    Kind.ZIP,
    Kind.CHANGELOG,
    Kind.DELTA,
    Kind.HDFS_SNAPSHOT,
}
#: Operator metadata v2 and state schema v3 files, named by the batch that wrote them.
_BATCH_NAMED_OPERATOR_FILE = re.compile(
    r"^state/\d+/(_metadata/v2/\d+|_stateSchema/[^/]+/\d+_[0-9A-Za-z-]+)$"
)
#: A file sink's log, under the sink's output directory.
_SINK_LOG = re.compile(r"^_spark_metadata/\d+(\.compact)?$")


class DeletionRefusedError(StateholdError):
    """The deletion rule refuses to delete a key."""


def check_rollback_deletable(key: str) -> None:
    """Raise DeletionRefusedError unless a rollback may delete `key` (a key under the
    checkpoint location, or ``_spark_metadata/N`` under a file sink's directory)."""
    if not _rollback_kind(_subject(key)):
        raise DeletionRefusedError(f"{key}: a rollback never deletes this file")


def _subject(key: str) -> str:
    """The file a checksum companion belongs to (Hadoop's ``.NAME.crc``, Spark 4's
    ``NAME.crc`` beside state files, and the ``.crc`` of either), else the key itself."""
    head, _, leaf = key.rpartition("/")
    if leaf.startswith(".") and leaf.endswith(".crc"):
        leaf = leaf[1:-4]
    if leaf.endswith(".crc"):
        leaf = leaf[:-4]
    return f"{head}/{leaf}" if head else leaf


def _rollback_kind(key: str) -> bool:
    if _SINK_LOG.match(key) or _BATCH_NAMED_OPERATOR_FILE.match(key):
        return True
    return parse(key).kind in ROLLBACK_KINDS
