"""TLS 1.3 contexts for mutual TLS inside the cluster, reloaded when a certificate is renewed on
disk, without a restart (`souk.web.tls.Reloader`).

A client reaching a given part names it: `server_hostname=<its name>` (aiohttp's request
parameter, or `asyncio.open_connection`'s), and the handshake fails unless the server's
certificate carries that name, which `souk certs issue` puts in as a DNS name."""

from __future__ import annotations

import ssl
from functools import partial

from souk.pki.files import NodeFiles
from souk.web.tls import RELOAD_INTERVAL, Reloader, switching


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


def reloading_client_context(files: NodeFiles, *, interval: float = RELOAD_INTERVAL) -> Reloader:
    """Call `.context()` for each new connection (as `ssl=` of an aiohttp request): it is the
    context of the certificate now on disk."""
    return Reloader(partial(client_context, files), (files.cert, files.key, files.ca), interval)
