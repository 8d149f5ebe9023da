"""`heap.settle`: what a part holds once ready leaves the collector's walks, and nothing is freed
any later for it."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from souk import heap


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
