"""A public listener's TLS: the broker's Machines API and the proxy, which clients reach with
bearer tokens or none, so no client certificate is asked for. Its certificate (from a public CA
or the cluster's) is picked up again once renewed on disk, as the cluster's own are."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

from souk.pki import Reloader, switching


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
