"""What every handler reaches through the app: the engine (as a broker's handlers reach their
`Broker`), so handlers live at module level, and who may call them."""

from __future__ import annotations

from aiohttp import web

from souk.models.api import NONCE_HEADER
from souk.pki import mtls_roles
from souk.worker.engine import Engine
from souk.worker.machines.admission import Fences

ENGINE = web.AppKey("engine", Engine)
FENCES = web.AppKey("fences", Fences)  # machines destroyed by a broker that lost their create

# Who may call a route over mutual TLS, by the role in the caller's certificate
# (docs/security.md). Brokers place and run machines; operators may do everything.
BROKERS = mtls_roles("broker", "operator")
M = "/v1/machines/{id}"
V = "/v1/volumes/{id}"


def engine_of(request: web.Request) -> Engine:
    return request.app[ENGINE]


def machine_id(request: web.Request) -> str:
    """The path's `{id}`: a machine's, or a volume's on volume routes."""
    return request.match_info["id"]


def nonce(request: web.Request) -> str | None:
    """The nonce of a lease the caller holds, if it sent one."""
    return request.headers.get(NONCE_HEADER)


def flag(request: web.Request, name: str) -> bool:
    return request.query.get(name, "") in ("1", "true")
