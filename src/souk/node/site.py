"""How every part serves its HTTP app: souk's runner (JSON errors from the first byte, no access
log) on a bounded listener (`souk.web.listener`), plain or TLS."""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import AsyncIterator

from aiohttp import web

from souk.web import runner as web_runner
from souk.web.listener import DEFAULT_LIMITS, BoundedSite, Limits


@contextlib.asynccontextmanager
async def served(
    app: web.Application,
    host: str,
    port: int,
    *,
    ssl_context: ssl.SSLContext | None = None,
    limits: Limits = DEFAULT_LIMITS,
) -> AsyncIterator[str]:
    """`app` listening until the block ends; yields its base URL, with the port it got (port 0
    asks for a free one)."""
    runner = web_runner(app)
    await runner.setup()
    try:
        await BoundedSite(runner, host, port, ssl_context=ssl_context, limits=limits).start()
        scheme = "https" if ssl_context is not None else "http"
        yield f"{scheme}://{host}:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()
