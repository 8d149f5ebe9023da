"""TLS 1.3 contexts for mutual TLS inside the cluster, and their reloading when a certificate is
renewed on disk, without a restart.

A client reaching a given part names it: `server_hostname=<its name>` (aiohttp's request
parameter, or `asyncio.open_connection`'s), and the handshake fails unless the server's
certificate carries that name, which `souk certs issue` puts in as a DNS name."""

from __future__ import annotations

import logging
import os
import ssl
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

from souk.pki.files import NodeFiles

log = logging.getLogger("souk.pki")

RELOAD_INTERVAL = 2.0  # seconds between two looks at the files' mtimes


def _base(protocol: int, files: NodeFiles) -> ssl.SSLContext:
    ctx = ssl.SSLContext(protocol)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.verify_flags |= ssl.VERIFY_X509_STRICT
    ctx.load_verify_locations(cafile=files.ca)
    ctx.load_cert_chain(files.cert, files.key)
    return ctx


def server_context(files: NodeFiles, *, require_client_cert: bool = True) -> ssl.SSLContext:
    """Clients must show a certificate from the cluster CA. With `require_client_cert=False` a
    client may show none (and the role middleware answers 401 where one is needed), but one that
    shows a certificate the CA did not issue, or an expired one, still fails the handshake."""
    ctx = _base(ssl.PROTOCOL_TLS_SERVER, files)
    ctx.verify_mode = ssl.CERT_REQUIRED if require_client_cert else ssl.CERT_OPTIONAL
    # No session tickets: every connection shows and verifies a certificate again.
    ctx.num_tickets = 0
    return ctx


def client_context(files: NodeFiles) -> ssl.SSLContext:
    """Verifies the server against the cluster CA and the name given as `server_hostname`."""
    return _base(ssl.PROTOCOL_TLS_CLIENT, files)  # check_hostname and CERT_REQUIRED by default


_Stamp = tuple[tuple[int, int, int], ...]


class Reloader:
    """Holds the context built from `paths` and builds it again once they change on disk. It looks
    at their mtimes at most every `interval` seconds; a rebuild that fails (say a new key whose
    certificate is not written yet) keeps the last good context and is tried again later."""

    def __init__(
        self,
        build: Callable[[], ssl.SSLContext],
        paths: Sequence[Path],
        interval: float = RELOAD_INTERVAL,
    ) -> None:
        self._build = build
        self._paths = tuple(paths)
        self._interval = interval
        self._stamp = self._stat()
        self._context = build()
        self._checked = time.monotonic()

    def _stat(self) -> _Stamp | None:
        try:
            stats = [os.stat(p) for p in self._paths]
        except OSError:
            return None
        return tuple((s.st_mtime_ns, s.st_size, s.st_ino) for s in stats)

    def context(self) -> ssl.SSLContext:
        now = time.monotonic()
        if now - self._checked < self._interval:
            return self._context
        self._checked = now
        stamp = self._stat()
        if stamp is None or stamp == self._stamp:
            return self._context
        try:
            self._context = self._build()
        except (OSError, ssl.SSLError) as exc:
            log.warning("certificate files changed but cannot be loaded yet: %s", exc)
            return self._context
        self._stamp = stamp
        log.info("certificate reloaded from %s", self._paths[0])
        return self._context


def reloading_server_context(
    files: NodeFiles, *, require_client_cert: bool = True, interval: float = RELOAD_INTERVAL
) -> ssl.SSLContext:
    """A server context to listen with that, at each handshake, hands the connection over to the
    context built from the files as they are now (checked at most every `interval` seconds)."""
    reloader = Reloader(
        partial(server_context, files, require_client_cert=require_client_cert),
        (files.cert, files.key, files.ca),
        interval,
    )
    return switching(reloader)


def switching(reloader: Reloader) -> ssl.SSLContext:
    """A context to listen with that hands each new connection, at its ClientHello (with or
    without a server name in it), over to the reloader's context of the moment."""
    front = reloader.context()

    def switch(conn: ssl.SSLObject, _server_name: str | None, _ctx: ssl.SSLContext) -> None:
        current = reloader.context()
        if conn.context is not current:
            conn.context = current

    front.sni_callback = switch
    return front


def reloading_client_context(files: NodeFiles, *, interval: float = RELOAD_INTERVAL) -> Reloader:
    """Call `.context()` for each new connection (as `ssl=` of an aiohttp request): it is the
    context of the certificate now on disk."""
    return Reloader(partial(client_context, files), (files.cert, files.key, files.ca), interval)
