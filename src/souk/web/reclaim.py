"""Memory a wave of closed connections leaves behind, handed back to the system.

A closed connection leaves its objects in reference cycles (a transport and its protocol, a
failed handshake's exception and its frames), which Python's collector frees at its next
collection: an idle part, its young generation raised (`souk.heap`), does not reach one for
hours. Collected, the memory goes back to glibc's heap, which keeps it: its many small free
blocks are given back to the system only by `malloc_trim`.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
from collections.abc import Callable

# How far the open connections must fall from their peak for a reclaim to be worth its
# pause (a full collection): a flood going, not the churn of ordinary clients.
RECLAIM_DROP = 64
RECLAIM_DELAY = 1.0  # seconds after the close that crossed the mark: a wave is one reclaim
RECLAIM_EVERY = 10.0  # seconds between two reclaims at least


def _trimmer() -> Callable[[], None]:
    """glibc's `malloc_trim(0)`: its free pages, wherever they are in the heap, back to the
    system. Nothing elsewhere (another C library frees as it goes, or keeps what it keeps)."""
    name = ctypes.util.find_library("c")
    lib = ctypes.CDLL(name) if name else None
    trim = getattr(lib, "malloc_trim", None)
    if trim is None:
        return lambda: None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int

    def run() -> None:
        trim(0)

    return run


malloc_trim = _trimmer()


class Reclaim:
    """Once a listener's open connections have fallen `RECLAIM_DROP` below their peak: a full
    collection, then `malloc_trim`. One per wave, `RECLAIM_DELAY` after the close that crossed
    the mark, and not more often than every `RECLAIM_EVERY` seconds."""

    def __init__(self) -> None:
        self.peak = 0
        self.runs = 0
        self._last = -RECLAIM_EVERY
        self._handle: asyncio.TimerHandle | None = None

    def watch(self, open_now: int) -> None:
        self.peak = max(self.peak, open_now)
        if self._handle is None and self.peak - open_now >= RECLAIM_DROP:
            loop = asyncio.get_running_loop()
            at = max(loop.time() + RECLAIM_DELAY, self._last + RECLAIM_EVERY)
            self._handle = loop.call_at(at, self.run, loop)

    def run(self, loop: asyncio.AbstractEventLoop) -> None:
        self._handle = None
        self._last = loop.time()
        self.peak = 0  # from here on, the peak of what is open now or later
        self.runs += 1
        gc.collect()
        malloc_trim()

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
