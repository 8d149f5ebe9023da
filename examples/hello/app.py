"""The example app: a tiny HTTP service that says which machine answered.

It binds the machine's private address (SOUK_PRIVATE_IP) so that several machines of one app can
share a host, and the port in PORT (default 8080).
"""

from __future__ import annotations

import json
import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Hello(BaseHTTPRequestHandler):
    # Keep-alive, so the proxy reuses its connections rather than opening one per request; and
    # no Nagle, or the body, written after the headers, waits for their delayed ACK (40 ms).
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def do_GET(self) -> None:
        body = json.dumps(
            {
                "hello": os.environ.get("GREETING", "world"),
                "machine": os.environ.get("SOUK_MACHINE_ID"),
                "region": os.environ.get("SOUK_REGION"),
                "path": self.path,
            }
        ).encode() + b"\n"
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        print(f"{self.address_string()} {format % args}", flush=True)


class Server(ThreadingHTTPServer):
    # socketserver's default backlog is 5: a burst of new connections beyond it (a proxy's
    # waiters let go at once when the machine starts) has its SYNs dropped, and the kernel
    # tries them again only a second later.
    request_queue_size = 128


def main() -> None:
    host = os.environ.get("SOUK_PRIVATE_IP", "127.0.0.1")
    port = int(os.environ.get("PORT", "8080"))
    server = Server((host, port), Hello)
    print(f"hello listening on http://{host}:{port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
