"""The one step registry: a step name -> its one implementation, for the names a state
machine's operations declare (fsm.py), whatever the kind of resource.

Each kind fills its own table (`machines/steps.py`, `volumes/steps.py`) and checks it complete
when its module loads: every declared name implemented once, every implementation declared.
A step does its work, then logs itself complete (`progress.advance`, or `progress.skip`), and
returns the index of the next step to run.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Generic, TypeVar

from souk.worker.ops.progress import StepRun

H = TypeVar("H")
StepFn = Callable[[H, StepRun], Awaitable[int]]


class StepTable(Generic[H]):
    """Step name -> its one implementation, each handed the `H` that runs it (what steps use
    of the worker) and the step's `StepRun`."""

    def __init__(self, declared: Iterable[str]) -> None:
        self.declared = frozenset(declared)
        self._steps: dict[str, StepFn[H]] = {}

    def implements(self, name: str) -> Callable[[StepFn[H]], StepFn[H]]:
        def register(fn: StepFn[H]) -> StepFn[H]:
            if name not in self.declared:
                raise LookupError(f"step {name!r} is implemented but no operation declares it")
            if name in self._steps:
                raise LookupError(f"step {name!r} is implemented twice")
            self._steps[name] = fn
            return fn

        return register

    def check_complete(self) -> None:
        missing = self.declared - self._steps.keys()
        if missing:
            raise LookupError(f"steps declared without an implementation: {sorted(missing)}")

    def __getitem__(self, name: str) -> StepFn[H]:
        return self._steps[name]

    @property
    def implemented(self) -> frozenset[str]:
        return frozenset(self._steps)
