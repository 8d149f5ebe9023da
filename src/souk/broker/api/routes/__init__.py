"""The broker's route table: every route it serves, declared once, so the server, its
/openapi.json and its access checks cannot disagree. One entry per route, each naming its
handler in the module of its resource and the permission a token needs to call it: read, write
or deploy on the app it names (see docs/tokens.md), a fleet operation, or any valid token. The
entries are kept by resource, a module each, and served in this order."""

from __future__ import annotations

from souk.broker.api.routes import apps, cluster, machines, volumes
from souk.web import Route

ROUTES: list[Route] = [*apps.ROUTES, *machines.ROUTES, *cluster.ROUTES, *volumes.ROUTES]
