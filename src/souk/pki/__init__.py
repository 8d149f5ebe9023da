"""The cluster's PKI: an Ed25519 CA, node certificates that carry a role and a name, mutual-TLS
contexts that reload renewed certificates, and role checks for HTTP routes."""

from souk.pki.access import ANYONE, mtls_roles, peer_identity, role_middleware
from souk.pki.files import (
    NodeFiles,
    init_ca,
    issue_files,
    load_cas,
    load_cert,
    load_key,
    save_cert,
    save_key,
)
from souk.pki.identity import ROLES, Identity, PkiError, identity_of
from souk.pki.issue import issue, new_ca, new_key, verify_issued_by, verify_issued_by_one_of
from souk.pki.tls import (
    client_context,
    reloading_client_context,
    reloading_server_context,
    server_context,
)
from souk.web.tls import Reloader, switching

__all__ = [
    "ANYONE",
    "ROLES",
    "Identity",
    "NodeFiles",
    "PkiError",
    "Reloader",
    "client_context",
    "identity_of",
    "init_ca",
    "issue",
    "issue_files",
    "load_cas",
    "load_cert",
    "load_key",
    "mtls_roles",
    "new_ca",
    "new_key",
    "peer_identity",
    "reloading_client_context",
    "reloading_server_context",
    "role_middleware",
    "save_cert",
    "save_key",
    "server_context",
    "switching",
    "verify_issued_by",
    "verify_issued_by_one_of",
]
