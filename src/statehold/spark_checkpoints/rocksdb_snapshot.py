"""A RocksDB store's snapshot, opened offline: the version's ``.zip`` (RocksDB's CURRENT,
MANIFEST, OPTIONS and write-ahead logs, and Spark's ``metadata`` listing the SST files)
and the SSTs it lists (kept once under the store's ``SSTs/`` by their DFS names, copied
back to their local names) rebuilt in a temporary directory, which rocksdict opens read
only; its rows are then iterated in key order, one at a time.

Every name is checked to be a plain file name before anything is written under it, and a
zip member larger than `MAX_MEMBER_BYTES` is refused. RocksDB's own errors (a file that
is not an SST, a MANIFEST naming a missing file) are refused in one line, and so is a
store with column families (transformWithState's), not read yet.
"""

from __future__ import annotations

import io
import shutil
import zipfile
from collections.abc import Generator
from pathlib import Path

from rocksdict import AccessType, Options, Rdict

from statehold.spark_checkpoints.errors import SparkCheckpointError
from statehold.spark_checkpoints.location import SparkCheckpoint
from statehold.spark_checkpoints.state_files import ZipMetadata, read_zip_metadata
from statehold.storage import StorageError
from statehold.storage.base import UnsafePathError, check_names

#: RocksDB's CURRENT, MANIFEST and OPTIONS are kilobytes; a write-ahead log in a zip is
#: at most a write buffer.
MAX_MEMBER_BYTES = 1 << 30


def rocksdb_rows(location: SparkCheckpoint, zip_key: str, store_prefix: str,
                 directory: Path, *, column_families: bool = False
                 ) -> Generator[tuple[bytes, bytes], None, None]:
    """Each (key, value) of the RocksDB the snapshot `zip_key` holds, rebuilt under
    `directory` (which must be empty, and is the caller's to remove). `column_families`:
    a transformWithState store's rows are given as they are stored (its column family's
    id first) rather than refused."""
    data = location.read(zip_key)
    meta = read_zip_metadata(data, zip_key)
    if (meta.model_extra or {}).get("columnFamilyMapping") and not column_families:
        raise SparkCheckpointError(
            f"{zip_key}: a store with column families (transformWithState) is not read yet")
    _unzip(data, zip_key, directory)
    listed = [(f"SSTs/{f.dfsSstFileName}", f.localFileName or _local(f.dfsSstFileName))
              for f in meta.sstFiles]
    listed += [(f"logs/{f.dfsLogFileName}", f.localFileName or _local(f.dfsLogFileName))
               for f in meta.logFiles]
    _check(zip_key, [local for _dfs, local in listed])
    for dfs, local in listed:
        try:
            location.storage.download_to_read(f"{store_prefix}/{dfs}", directory / local)
        except StorageError as e:
            raise SparkCheckpointError(f"{store_prefix}/{dfs}: cannot be read ({e})") from None
    try:
        db = Rdict(str(directory), options=_options(), access_type=AccessType.read_only())
    except Exception as e:  # rocksdict raises its own exceptions (RocksDB's status)
        raise SparkCheckpointError(f"{zip_key}: RocksDB cannot open it ({_line(e)})") from None
    try:
        items = db.items()
        while True:
            try:
                pair = next(items, None)
            except Exception as e:  # a damaged block met while iterating
                raise SparkCheckpointError(f"{zip_key}: RocksDB cannot read it ({_line(e)})") \
                    from None
            if pair is None:
                break
            key, value = pair
            if not isinstance(key, bytes) or not isinstance(value, bytes):
                raise SparkCheckpointError(f"{zip_key}: RocksDB gave a row that is not bytes")
            yield key, value
    finally:
        db.close()


def _options() -> Options:
    """Options under which RocksDB checks what Spark's RocksDB checks when it loads a
    version: every table file opened at open (``max_open_files`` -1), so each SST's size
    and unique id are compared with the MANIFEST's there ("Sst file size mismatch",
    "Mismatch in unique ID on table file"; `verify_sst_unique_id_in_manifest` is on by
    default in the RocksDB rocksdict bundles), paranoid checks on, and every block's
    checksum verified as it is iterated (ReadOptions' default)."""
    options = Options(raw_mode=True)
    options.set_paranoid_checks(True)
    options.set_max_open_files(-1)
    return options


def local_names(meta: ZipMetadata) -> dict[str, str]:
    """Each SST's and log's local name in RocksDB's directory -> its name under the store
    (``000013.sst`` -> ``SSTs/000013-<uuid>.sst``), to name the file RocksDB complains of."""
    out = {f.localFileName or _local(f.dfsSstFileName): f"SSTs/{f.dfsSstFileName}"
           for f in meta.sstFiles}
    out.update({f.localFileName or _local(f.dfsLogFileName): f"logs/{f.dfsLogFileName}"
                for f in meta.logFiles})
    return out


def _local(dfs_name: str) -> str:
    """``000030-<uuid>.sst`` was ``000030.sst`` in RocksDB's directory."""
    stem, _, ext = dfs_name.rpartition(".")
    return f"{stem.split('-', 1)[0]}.{ext}"


def _check(where: str, names: list[str]) -> None:
    try:
        check_names(names)
    except UnsafePathError as e:
        raise SparkCheckpointError(f"{where}: unsafe file name ({e})") from None


def _unzip(data: bytes, zip_key: str, directory: Path) -> None:
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            members = [i for i in archive.infolist() if i.filename != "metadata"]
            _check(zip_key, [i.filename for i in members])
            for info in members:
                if info.file_size > MAX_MEMBER_BYTES:
                    raise SparkCheckpointError(
                        f"{zip_key}: member {info.filename!r} is over {MAX_MEMBER_BYTES} bytes")
                with archive.open(info) as src, (directory / info.filename).open("wb") as dst:
                    shutil.copyfileobj(src, dst)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as e:
        raise SparkCheckpointError(f"{zip_key}: not a whole snapshot zip ({_line(e)})") from None


def _line(e: BaseException) -> str:
    return " ".join(str(e).split())[:300] or type(e).__name__
