"""The internal protocol version on a server's requests and answers (`souk.models.wire.PROTOCOL`):
a caller more than one version away is refused before any handler reads its body, with a reason
that says which part to upgrade, instead of a validation error about a field it does not know."""

from __future__ import annotations

from aiohttp import web

from souk.models.wire import PROTOCOL, PROTOCOL_HEADER, protocol_accepted
from souk.web.errors import Handler, json_error


def peer_protocol(announced: str | None) -> int | None:
    """The version a peer announced: 0 when it sent none (a release from before versions),
    None when what it sent is no version."""
    if announced is None:
        return 0
    try:
        return int(announced)
    except ValueError:
        return None


@web.middleware
async def protocol_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    announced = request.headers.get(PROTOCOL_HEADER)
    version = peer_protocol(announced)
    if version is None or not protocol_accepted(version):
        response: web.StreamResponse = json_error(
            400,
            "protocol_unsupported",
            f"this souk speaks protocol {PROTOCOL} and understands {PROTOCOL - 1} to "
            f"{PROTOCOL + 1}; the caller sent {announced!r}: upgrade the older part first",
            {"protocol": PROTOCOL},
        )
    else:
        response = await handler(request)
    if not response.prepared:  # a stream's headers are already sent
        response.headers[PROTOCOL_HEADER] = str(PROTOCOL)
    return response
