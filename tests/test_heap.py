"""`heap.settle`: what a part holds once ready leaves the collector's walks, nothing is freed any
later for it, and the collector's pauses from then on are on every part's `/metrics`."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from souk import heap
from souk.web.metrics import Metrics


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


@pytest.fixture
def restored() -> Iterator[None]:
    """The collector as it was again after the test: the suite's own process must not keep a
    frozen heap or `settle`'s thresholds."""
    thresholds = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)
        if heap.PAUSES.note in gc.callbacks:
            gc.callbacks.remove(heap.PAUSES.note)


def test_settle_raises_the_young_threshold_and_freezes_what_lives(restored: None) -> None:
    heap.settle()
    assert gc.get_threshold() == (heap.YOUNG, heap.OLDER, heap.OLDER)
    assert gc.get_freeze_count() > 0


def test_an_object_alive_at_settle_is_not_walked_but_is_still_freed(restored: None) -> None:
    held = Node()
    gone: list[bool] = []
    watch = weakref.ref(held, lambda _: gone.append(True))
    heap.settle()
    assert not any(o is held for o in gc.get_objects())  # frozen: no collection walks it
    del held
    assert gone == [True]  # reference counting frees it all the same
    assert watch() is None


def test_cycles_made_after_settle_are_still_collected(restored: None) -> None:
    heap.settle()
    a, b = Node(), Node()
    a.other, b.other = b, a
    watch = weakref.ref(a)
    del a, b
    assert watch() is not None  # a cycle: reference counting alone never frees it
    gc.collect()
    assert watch() is None


def pause_counts(metrics: Metrics) -> dict[str, float]:
    """generation -> collections counted, as a scrape reads them."""
    (family,) = [
        f
        for f in text_string_to_metric_families(metrics.render().decode())
        if f.name == f"{metrics.namespace}_gc_pause_seconds"
    ]
    return {s.labels["generation"]: s.value for s in family.samples if s.name.endswith("_count")}


def test_collections_after_settle_are_timed_on_every_parts_metrics(restored: None) -> None:
    broker, worker = Metrics("souk_broker"), Metrics("souk_worker")
    heap.settle()
    heap.settle()  # a second part of the same process: the collections are counted once
    assert gc.callbacks.count(heap.PAUSES.note) == 1
    before = pause_counts(broker)
    gc.collect(0)
    gc.collect(2)
    after = pause_counts(broker)
    assert after["0"] == before["0"] + 1 and after["2"] == before["2"] + 1
    assert after["1"] == before["1"]
    assert pause_counts(worker) == after  # the process's, whichever part is asked


def test_a_pause_is_counted_in_the_first_bucket_that_holds_it() -> None:
    clock = iter([0.0, 0.03, 1.0, 1.0005])
    pauses = heap.Pauses(clock=lambda: next(clock))
    for _ in range(2):
        pauses.note("start", {"generation": 1})
        pauses.note("stop", {"generation": 1})
    held = dict(zip(heap.PAUSE_BUCKETS, pauses.counts[1], strict=False))
    assert held[0.001] == 1 and held[0.05] == 1  # 0.5 ms, and 30 ms: above 25, within 50
    assert sum(pauses.counts[1]) == 2 and pauses.sums[1] == pytest.approx(0.0305)
