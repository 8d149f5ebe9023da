"""Python's cyclic garbage collector, set for a long-running part.

A part serving requests allocates thousands of short-lived objects per second (models, dicts,
futures) and holds a large heap that lives as long as it does (modules, pydantic's schemas, the
catalog's rows). At the interpreter's default thresholds the collector runs a young collection
every 700 allocations, and walks again whatever survived, a heap it can never free: CPU spent on
every request for nothing (docs/benchmarks.md, "The floor under a create, and the collector").
So: a young generation about thirty times larger, and what a part has built by the time it is
ready frozen out of the collector's walks. Nothing is freed later than reference
counting frees it; only objects in reference cycles wait a little longer for a collection.
"""

from __future__ import annotations

import bisect
import gc
import time
from collections.abc import Callable
from typing import Any

YOUNG = 20_000  # allocations between young collections (Python's default: 700)
OLDER = 10  # young collections per middle one, and middle per full one (the default)
GENERATIONS = 3
# Seconds: from a quiet part's young collection to one that walks every row a replica replaced
# since it froze them (docs/benchmarks.md, "Catalog at 10,000 owners").
PAUSE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


class Pauses:
    """The collector's pauses in this process since a part settled, by generation: a
    Prometheus histogram's counts (`PAUSE_BUCKETS`, then +Inf) and sums, read at scrape time.
    They are the process's, so every part of one process shows the same."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.counts = [[0] * (len(PAUSE_BUCKETS) + 1) for _ in range(GENERATIONS)]
        self.sums = [0.0] * GENERATIONS
        self._clock = clock
        self._began = 0.0

    def note(self, phase: str, info: dict[str, Any]) -> None:
        """A `gc.callbacks` entry: called at each collection's start and stop."""
        if phase == "start":
            self._began = self._clock()
            return
        took = self._clock() - self._began
        generation = info["generation"]
        self.sums[generation] += took
        self.counts[generation][bisect.bisect_left(PAUSE_BUCKETS, took)] += 1


PAUSES = Pauses()


def settle() -> None:
    """Called once a part is ready to serve: the thresholds set, and everything alive now left
    out of every later collection (`gc.freeze`); it is still freed as usual once nothing refers
    to it. The collections that follow are timed (`PAUSES`)."""
    gc.set_threshold(YOUNG, OLDER, OLDER)
    gc.collect()
    gc.freeze()
    if PAUSES.note not in gc.callbacks:
        gc.callbacks.append(PAUSES.note)
