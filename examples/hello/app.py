"""The example app: a tiny HTTP service that says which machine answered.

It binds the machine's private address (SOUK_PRIVATE_IP: its IPv6 address on the app's private
network, or a loopback one where machines share the host's network), where the proxy and the
app's other machines reach it, and the port in PORT (default 8080).
"""

from __future__ import annotations

import json
import os
import socket
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from socketserver import TCPServer


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

    def __init__(self, address: tuple[str, int], handler: type[Hello]) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, handler)

    def server_bind(self) -> None:
        """As HTTPServer's, without its reverse lookup of the address (a DNS query at start)."""
        TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]


def main() -> None:
    host = os.environ.get("SOUK_PRIVATE_IP", "127.0.0.1")
    port = int(os.environ.get("PORT", "8080"))
    server = Server((host, port), Hello)
    shown = f"[{host}]" if ":" in host else host
    print(f"hello listening on http://{shown}:{port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
