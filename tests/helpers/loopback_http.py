"""A loopback HTTP server answering every GET with what a test's ``respond(path)`` says
(status, body, with its Content-Length): the engine end of the one-shots' unit tests,
which run the real script (``python3 -c``) against it."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@contextmanager
def loopback_http(respond: Callable[[str], tuple[int, bytes]]) -> Iterator[int]:
    """Serve ``respond`` on 127.0.0.1 (a free port, yielded) until the block ends."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, body = respond(self.path)
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield httpd.server_address[1]
    finally:
        httpd.shutdown()
