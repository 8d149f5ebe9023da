"""A worker's Prometheus metrics (docs/observability.md lists them).

Operations and steps are counted and timed by the runner, with a child bound up front for every
operation and step it is given (those `ops/fsm.py` declares: the engine hands them over, as the
runner that counts them stands above this module); the op log's group commits are timed by the
store's writer thread. Capacity and machines per state are read from the database at scrape
time, so placing and running machines pays nothing for them. No label names a machine.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from souk.models.capacity import Capacity
from souk.web.metrics import SIZE_BUCKETS, Metrics, Off, prebound

OUTCOMES = ("done", "failed")


class WorkerMetrics:
    def __init__(self, operations: Mapping[str, Iterable[str]], enabled: bool = True) -> None:
        """`operations`: each operation's name and the names of its steps."""
        m = self.metrics = Metrics("souk_worker", enabled)
        ops = m.counter(
            "operations_total",
            "Operations run to their end, by type and outcome",
            ("op", "outcome"),
        )
        steps = m.histogram("step_seconds", "Time each step of an operation took", ("op", "step"))
        # op -> outcome -> child, op -> step -> child: no allocation on the hot path.
        self.operations: dict[str, dict[str, Off]] = {
            name: prebound(m, ops, OUTCOMES, name) for name in operations
        }
        self.steps: dict[str, dict[str, Off]] = {
            name: prebound(m, steps, dict.fromkeys(step_names), name)
            for name, step_names in operations.items()
        }
        self.commit_seconds = m.bind(
            m.histogram(
                "oplog_commit_seconds",
                "A group commit of the op log: from BEGIN to a durable COMMIT",
            )
        )
        self.group_size = m.bind(
            m.histogram(
                "oplog_group_size", "Writes committed together in one group", buckets=SIZE_BUCKETS
            )
        )
        self.restarts = m.bind(
            m.counter("restarts_total", "Restarts the restart policy queued after an exit")
        )

    def step(self, op: str, step: str, seconds: float) -> None:
        self.steps[op][step].observe(seconds)

    def batch(self, size: int, seconds: float) -> None:
        """Called by the store's writer thread after each group commit."""
        self.group_size.observe(size)
        self.commit_seconds.observe(seconds)

    def watch(self, capacity: Callable[[], Capacity], states: Callable[[], dict[str, int]]) -> None:
        """Read capacity and machines per state at each scrape."""
        self.metrics.collect(_Fleet(capacity, states))


class _Fleet:
    """Capacity and machines per state, as the database holds them at scrape time."""

    def __init__(
        self, capacity: Callable[[], Capacity], states: Callable[[], dict[str, int]]
    ) -> None:
        self.capacity = capacity
        self.states = states

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        cap = self.capacity()
        total = GaugeMetricFamily(
            "souk_worker_capacity_total", "What the worker offers machines", labels=["resource"]
        )
        reserved = GaugeMetricFamily(
            "souk_worker_capacity_reserved", "What its machines reserve", labels=["resource"]
        )
        for resource in ("cpus", "memory_mb"):
            total.add_metric([resource], getattr(cap.total, resource))
            reserved.add_metric([resource], getattr(cap.reserved, resource))
        yield total
        yield reserved
        kinds = GaugeMetricFamily(
            "souk_worker_cpu_kind", "CPU kinds the worker offers (1 each)", labels=["cpu_kind"]
        )
        for kind in cap.cpu_kinds:
            kinds.add_metric([kind], 1)
        yield kinds
        yield GaugeMetricFamily(
            "souk_worker_cordoned", "1 while the worker is cordoned", value=int(cap.cordoned)
        )
        machines = GaugeMetricFamily(
            "souk_worker_machines", "Machines on this worker, by state", labels=["state"]
        )
        for state, count in sorted(self.states().items()):
            machines.add_metric([state], count)
        yield machines
