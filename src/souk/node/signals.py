"""How a running part hears that it should stop: SIGINT (Ctrl-C) or SIGTERM, on its loop."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def on_signals(handler: Callable[[], None]) -> None:
    """Call `handler` on the running loop at each SIGINT or SIGTERM."""
    loop = asyncio.get_running_loop()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, handler)


async def until_signalled() -> None:
    """Return at the first SIGINT or SIGTERM: a part's serving ends there, in order."""
    stop = asyncio.Event()
    on_signals(stop.set)
    await stop.wait()
