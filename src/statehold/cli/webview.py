"""``statehold ui``: the one web view (`statehold.web_page`) of a job directory or a Spark
checkpoint location served on 127.0.0.1 (GET and HEAD only), built afresh from the
location on every load; it changes nothing."""

from __future__ import annotations

import threading
from collections.abc import Callable
from html import escape
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from statehold.tools.locations import open_location

# -- serving ------------------------------------------------------------------------------
#: The names a request to the page may carry in its Host header.
LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "[::1]"})


def local_host(header: str | None) -> bool:
    """Whether a request's Host header (any port) names this machine's loopback. A web page
    that rebinds its own host name to 127.0.0.1 (DNS rebinding) sends that name, so a
    browser cannot read the page on behalf of another site; no header (HTTP/1.0) is fine."""
    if header is None:
        return True
    name = header.strip().lower()
    name = name[: name.index("]") + 1] if name.startswith("[") and "]" in name else (
        name.rsplit(":", 1)[0])
    return name in LOCAL_HOSTS


def make_server(uri: str, ha: str | None, port: int) -> ThreadingHTTPServer:
    """The server of a location's page (`page_server`), opened afresh on each load."""
    with open_location(uri, ha=ha):
        pass  # refuse an unknown location or a wrong HA store before serving anything

    def page() -> str:
        with open_location(uri, ha=ha) as location:
            return location.report().page

    return page_server(page, port)


def page_server(page: Callable[[], str], port: int) -> ThreadingHTTPServer:
    """An HTTP server on 127.0.0.1 (only: there is no option to listen elsewhere) whose
    ``/`` is `page()`, built afresh on each load; it answers GET and HEAD only, and only
    requests addressed to 127.0.0.1 or localhost (`local_host`)."""

    class Handler(BaseHTTPRequestHandler):
        """GET and HEAD of the page; every method that could change something is refused
        with 405 before anything is read, and methods http.server does not know get 501."""

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self._page(with_body=True)

        def do_HEAD(self) -> None:  # noqa: N802 - http.server's name
            self._page(with_body=False)

        def _refuse(self) -> None:
            self.send_response(405)
            self.send_header("Allow", "GET, HEAD")
            self.send_header("Content-Length", "0")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True

        do_POST = do_PUT = do_DELETE = do_PATCH = _refuse  # noqa: N815 - http.server's names

        def _page(self, with_body: bool) -> None:
            if not local_host(self.headers.get("Host")):
                self.send_error(403, "the page is served to 127.0.0.1 and localhost only")
                return
            if self.path not in ("/", "/index.html"):
                self.send_error(404)
                return
            try:
                body = page().encode()
                status = 200
            except Exception as e:  # shown, not fatal: the next load tries again
                body = f"<p>statehold: error: {escape(str(e))}</p>".encode()
                status = 500
            self.send_response(status)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if with_body:
                self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            return

    return ThreadingHTTPServer(("127.0.0.1", port), Handler)


def serve(
    server: ThreadingHTTPServer, location: str, announce: Callable[[str], None]
) -> None:
    """Serve until interrupted (Ctrl-C)."""
    announce(f"serving {location} on http://127.0.0.1:{server.server_address[1]}/")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        thread.join()
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        server.server_close()
