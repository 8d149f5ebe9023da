"""A part of the cluster on the catalog, from its node files (`souk certs issue --out DIR`): its
connection to the authenticated bus, the signer of the rows it owns, and the trust its replica
puts in the cluster CA. One key does both: it signs the part's rows and shows its certificate to
the bus. Both follow a renewal of the files without a restart, as the part's TLS listener does:
a certificate that outlived its successor on disk would stop the part's rows counting anywhere
once it expired."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding

from souk.catalog.bus import NatsBus
from souk.catalog.certs import bus_options
from souk.catalog.signing import Ed25519Signer
from souk.catalog.trust import CaTrust
from souk.node.periodic import every
from souk.pki import NodeFiles, PkiError, load_cas, load_cert, load_key

log = logging.getLogger("souk.catalog.node")

RELOAD_INTERVAL = 2.0  # seconds between two looks at the files

_Stamp = tuple[tuple[int, int, int], ...]


def _signer_of(files: NodeFiles) -> Ed25519Signer:
    cert, key = load_cert(files.cert), load_key(files.key)
    public = cert.public_key()
    if not isinstance(public, Ed25519PublicKey) or (
        public.public_bytes_raw() != key.public_key().public_bytes_raw()
    ):
        raise PkiError(f"{files.key} is not the key of {files.cert}")
    return Ed25519Signer(key.private_bytes_raw(), cert.public_bytes(Encoding.DER))


class NodeKey:
    """A node's key and certificate, from its files and reloaded once they change: a `Signer`
    of the rows it owns, and the certificate its bus connections show (`follow`).

    Only `refresh` looks at the files (at most every `interval` seconds), and `fingerprint`
    calls it: an owner reads the fingerprint before it signs, so what it signs next is signed by
    the key of the certificate it named. Files caught mid-change (a new key whose certificate is
    not written yet) leave the last good pair in use until the next look."""

    def __init__(
        self,
        files: NodeFiles,
        interval: float = RELOAD_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.files = files
        self.interval = interval
        self.clock = clock
        self._stamp = self._stat()
        self._signer = _signer_of(files)
        self._checked = clock()
        self._contexts: list[ssl.SSLContext] = []

    @property
    def certificate(self) -> bytes:
        return self._signer.certificate

    @property
    def fingerprint(self) -> str:
        self.refresh()
        return self._signer.fingerprint

    def sign(self, data: bytes) -> bytes:
        return self._signer.sign(data)

    def follow(self, context: ssl.SSLContext) -> None:
        """Loads renewed files into `context` too: a bus connection's, which shows the new
        certificate when it next connects."""
        self._contexts.append(context)

    def unfollow(self, context: ssl.SSLContext) -> None:
        if context in self._contexts:
            self._contexts.remove(context)

    def _stat(self) -> _Stamp | None:
        try:
            stats = [os.stat(p) for p in (self.files.cert, self.files.key)]
        except OSError:
            return None
        return tuple((s.st_mtime_ns, s.st_size, s.st_ino) for s in stats)

    def refresh(self) -> None:
        now = self.clock()
        if now - self._checked < self.interval:
            return
        self._checked = now
        stamp = self._stat()
        if stamp is None or stamp == self._stamp:
            return
        try:
            signer = _signer_of(self.files)
            for context in self._contexts:
                context.load_cert_chain(self.files.cert, self.files.key)
        except (OSError, ValueError) as exc:  # PkiError is a ValueError, ssl.SSLError an OSError
            log.warning("node files changed but cannot be loaded yet: %s", exc)
            return
        self._signer, self._stamp = signer, stamp
        log.info("catalog signer reloaded from %s", self.files.cert)


def ca_trust(files: NodeFiles) -> CaTrust:
    """A replica's trust: rows count only if signed by their owner's key, certified by the CA."""
    return CaTrust(load_cas(files.ca))


def connector(
    servers: str, name: str, files: NodeFiles | None = None, key: NodeKey | None = None
) -> Callable[[], Awaitable[NatsBus]]:
    """How this node connects to NATS (for `ConnectingBus`, or called at once): anonymously
    without `files`; with them, mutual TLS with the node's certificate (the server checked
    against the cluster CA), and replies in the inbox only this node may read. Given the node's
    `key`, renewed files are loaded into the connection's TLS context, so that a reconnect shows
    the current certificate (see `renewing`)."""
    if files is None:
        return lambda: NatsBus.connect(servers, name=name)
    options = bus_options(files)
    if key is not None:
        key.follow(options["tls"])
    return lambda: NatsBus.connect(servers, name=name, **options)


@contextlib.asynccontextmanager
async def renewing(key: NodeKey) -> AsyncIterator[NodeKey]:
    """Looks at the node's files every `key.interval` seconds, for a node whose key may sign
    nothing for a long while (a broker without the registry, a proxy): its bus connection must
    still show the renewed certificate when it reconnects."""
    task = asyncio.create_task(
        every(lambda: key.interval, partial(_refresh, key), what="reloading node files", log=log)
    )
    try:
        yield key
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _refresh(key: NodeKey) -> None:
    key.refresh()


@contextlib.asynccontextmanager
async def joined(servers: str, name: str, files: NodeFiles | None = None) -> AsyncIterator[NatsBus]:
    """NATS connected now as `connector` connects, following renewals, closed on exit."""
    async with contextlib.AsyncExitStack() as stack:
        key = None
        if files is not None:
            key = await stack.enter_async_context(renewing(NodeKey(files)))
        bus = await connector(servers, name, files, key)()
        stack.push_async_callback(bus.close)
        yield bus
