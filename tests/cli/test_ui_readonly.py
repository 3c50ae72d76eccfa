"""`statehold ui` is read-only and local: a real `statehold ui` process on a small job
directory listens on 127.0.0.1 only, answers GET and HEAD of its page, refuses every
method that could change something (405, nothing read or written), serves the page only
to requests addressed to 127.0.0.1 or localhost (not to a page rebinding its own name to
127.0.0.1), serves no file of the job directory and shows the directory's text as text,
never as markup; the directory's tree is byte for byte the same afterwards."""

from __future__ import annotations

import hashlib
import http.client
import os
import socket
import sys
from html import escape
from pathlib import Path

import pytest

from statehold.cli.webview import make_server
from statehold.storage import open_storage
from tests.support.cli_process import statehold_ui
from tests.support.jobs import build_job

#: On Linux all of 127.0.0.0/8 is loopback: a server bound to every interface answers
#: there, one bound to 127.0.0.1 refuses it.
OTHER_LOOPBACK = "127.0.0.2"
WRITES = ["PUT", "POST", "DELETE", "PATCH"]


def tree(root: Path) -> dict[str, tuple[str, int, int, str]]:
    """Every entry below `root` (links not followed): kind, size, mtime and content hash."""
    found: dict[str, tuple[str, int, int, str]] = {}
    for top, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            path = Path(top, name)
            st = path.lstat()
            if path.is_symlink():
                found[str(path.relative_to(root))] = ("link", 0, st.st_mtime_ns,
                                                      os.readlink(path))
            elif path.is_dir():
                found[str(path.relative_to(root))] = ("dir", 0, st.st_mtime_ns, "")
            else:
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
                found[str(path.relative_to(root))] = ("file", st.st_size, st.st_mtime_ns,
                                                      digest)
    return found


def request(port: int, method: str, path: str, body: bytes | None = None,
            headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


def answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=30):
            return True
    except ConnectionRefusedError:
        return False


#: Markup in text the job directory holds (an aborted checkpoint's reason, in its history
#: record); the page shows it as text.
MARKUP = "<script>alert(1)</script><img src=x onerror=alert(2)>"


@pytest.fixture
def job_dir(tmp_path: Path) -> Path:
    """Checkpoints 1..3 (all retained), the savepoint "sp", a stale chk-99 and checkpoint
    4 aborted with markup for its reason."""
    root = tmp_path / "job"
    coord = build_job(open_storage(str(root)), checkpoints=3, savepoint_at=2).coord
    try:
        coord.begin(4)
        coord.abort(4, MARKUP)
    finally:
        coord.close()
    return root


def test_ui_answers_get_and_head_and_changes_nothing(job_dir: Path) -> None:
    before = tree(job_dir)
    data_file = next(k for k in before if k.startswith("shared/"))
    targets = ["/", "/index.html", "/chk-3/_metadata", "/_job/owner.json", f"/{data_file}",
               "/savepoints/sp"]
    with statehold_ui(str(job_dir)) as port:
        status, headers, page = request(port, "GET", "/")
        assert status == 200 and headers["Content-Type"].startswith("text/html")
        assert b"savepoints/sp" in page and b"chk-3" in page
        assert b"<script" not in page and b"<img" not in page
        assert escape(MARKUP).encode() in page
        status, headers, body = request(port, "HEAD", "/")
        assert (status, body) == (200, b"") and int(headers["Content-Length"]) > 0

        for method in WRITES:
            for path in targets:
                status, headers, body = request(port, method, path, body=b"{}")
                assert status == 405, (method, path, status)
                assert headers["Allow"] == "GET, HEAD" and body == b""
        status, _headers, _body = request(port, "PROPPATCH", "/")  # unknown to http.server
        assert status == 501

        # No file of the job directory is served, however it is named.
        for path in targets[2:] + ["/../job/_job/owner.json", "/%2e%2e/_job/owner.json"]:
            status, _headers, body = request(port, "GET", path)
            assert status == 404 and b'"job_id"' not in body, path

        # A request addressed to another name (a page rebinding its name to 127.0.0.1)
        # is refused; any port is fine (a forwarded one).
        for host, expected in [("attacker.example", 403), ("attacker.example:80", 403),
                               ("127.0.0.1.nip.io", 403), ("localhost:9000", 200),
                               ("[::1]:8765", 200)]:
            status, _headers, body = request(port, "GET", "/", headers={"Host": host})
            assert status == expected, host
            assert (b"savepoints/sp" in body) == (expected == 200), host

        if sys.platform == "linux":
            assert answers("127.0.0.1", port) and not answers(OTHER_LOOPBACK, port)
        # The page still shows the job as it was: nothing above was deleted.
        assert request(port, "GET", "/")[0] == 200
    assert tree(job_dir) == before


def test_ui_server_binds_127_0_0_1(job_dir: Path) -> None:
    server = make_server(str(job_dir), None, 0)
    try:
        assert server.socket.getsockname()[0] == "127.0.0.1"
    finally:
        server.server_close()
