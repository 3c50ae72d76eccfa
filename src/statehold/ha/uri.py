"""``zookeeper://`` URIs, parsed without the ZooKeeper client: a job directory records its
HA store as a URI, and reading or comparing that record must not need kazoo (an optional
extra, ``statehold[zookeeper]``) on a machine that never connects."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from statehold.errors import InvalidArgumentError

URI_SCHEME = "zookeeper"
DEFAULT_ROOT = "/statehold"

_SEGMENT = re.compile(r"^[A-Za-z0-9_.-]+$")


def check_segment(name: str, what: str) -> str:
    """`name` if it is one safe znode path segment, else InvalidArgumentError."""
    if not _SEGMENT.match(name) or name in (".", ".."):
        raise InvalidArgumentError(f"invalid {what} {name!r}: use letters, digits, '_', '.', '-'")
    return name


def check_root(root: str) -> str:
    """`root` without a trailing slash if it is an absolute path of safe segments."""
    root = root.rstrip("/")
    if not root.startswith("/"):
        raise InvalidArgumentError(f"ZooKeeper root must be an absolute path, got {root!r}")
    for segment in root.split("/")[1:]:
        check_segment(segment, "ZooKeeper path segment")
    return root


def parse_uri(uri: str) -> tuple[str, str]:
    """`zookeeper://host:port[,host:port]/path` -> (kazoo hosts string, root path)."""
    parts = urlsplit(uri)
    if parts.scheme != URI_SCHEME:
        raise InvalidArgumentError(f"not a {URI_SCHEME}:// URI: {uri!r}")
    if not parts.netloc or "@" in parts.netloc:
        raise InvalidArgumentError(
            f"expected {URI_SCHEME}://host:port[,host:port]/path, got {uri!r}"
        )
    if parts.query or parts.fragment:
        raise InvalidArgumentError(f"query and fragment are not supported in {uri!r}")
    root = parts.path if parts.path not in ("", "/") else DEFAULT_ROOT
    return parts.netloc, check_root(root)


__all__ = ["DEFAULT_ROOT", "URI_SCHEME", "check_root", "check_segment", "parse_uri"]
