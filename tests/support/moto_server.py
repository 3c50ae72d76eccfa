"""The moto S3 server the tests start (conftest's `s3_server`)."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from moto.server import ThreadedMotoServer


class AtomicConditionalMotoServer(ThreadedMotoServer):
    """moto's threaded server with its conditional requests (``If-None-Match`` /
    ``If-Match``) made atomic, as S3 makes them: moto checks, then stores, so two concurrent
    create-if-absent puts of one key could both succeed (seen once, at load 15, in the HA
    store's concurrent-publishers contract test). Other requests run concurrently."""

    def _server_entry(self) -> None:
        from moto.server import DomainDispatcherApplication, create_backend_app
        from werkzeug.serving import make_server

        app = DomainDispatcherApplication(create_backend_app)
        lock = threading.Lock()

        def serialized(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
            if environ.get("HTTP_IF_NONE_MATCH") or environ.get("HTTP_IF_MATCH"):
                with lock:
                    return list(app(environ, start_response))
            response: Iterable[bytes] = app(environ, start_response)
            return response

        self._server = make_server(self._ip_address, self._port, serialized, True)
        self._server_ready_event.set()
        self._server.serve_forever()
