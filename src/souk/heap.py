"""Python's cyclic garbage collector, set for a long-running part.

A part serving requests allocates thousands of short-lived objects per second (models, dicts,
futures) and holds a large heap that lives as long as it does (modules, pydantic's schemas, the
catalog's rows). At the interpreter's default thresholds the collector runs a young collection
every 700 allocations, and walks again whatever survived: in a broker placing at full speed
that was a third of its CPU per create (docs/benchmarks.md, "The floor under a create, and the
collector"). So: a young generation about thirty times larger, and what a part has built by the
time it is ready frozen out of the collector's walks. Nothing is freed later than reference
counting frees it; only objects in reference cycles wait a little longer for a collection.
"""

from __future__ import annotations

import gc

YOUNG = 20_000  # allocations between young collections (Python's default: 700)
OLDER = 10  # young collections per middle one, and middle per full one (the default)


def settle() -> None:
    """Called once a part is ready to serve: the thresholds set, and everything alive now left
    out of every later collection (`gc.freeze`); it is still freed as usual once nothing refers
    to it."""
    gc.set_threshold(YOUNG, OLDER, OLDER)
    gc.collect()
    gc.freeze()
