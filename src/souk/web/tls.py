"""TLS contexts picked up again once their files are renewed on disk, without a restart.

A public listener's TLS lives here too: the broker's Machines API and the proxy, which clients
reach with bearer tokens or none, so no client certificate is asked for. Its certificate (from a
public CA or the cluster's) is reloaded as the cluster's own mTLS ones are (`souk.pki.tls`,
which builds on the `Reloader` below)."""

from __future__ import annotations

import logging
import os
import ssl
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("souk.web.tls")

RELOAD_INTERVAL = 2.0  # seconds between two looks at the files' mtimes

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


@dataclass(frozen=True)
class ServerCert:
    """A certificate (its chain, PEM) and its key, as `--tls-cert` and `--tls-key` name them."""

    cert: Path
    key: Path

    def build(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.cert, self.key)
        return ctx

    def context(self) -> ssl.SSLContext:
        """The context to listen with: each handshake is handed the certificate now on disk
        (its files looked at no more than every couple of seconds)."""
        return switching(Reloader(self.build, (self.cert, self.key)))
