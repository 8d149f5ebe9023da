"""Prometheus metrics, as every part serves them on `GET /metrics`.

Each part object (a worker's engine, a broker, a proxy, a catalog replica) holds its own
`Metrics`, with a registry of its own rather than prometheus_client's global one: several parts
run in one process in tests and in `souk dev`, and each must show only its own numbers.

Hot paths never look a label child up per call: each part binds the children it will touch up
front (`bind`), or through a `Bounded` cache whose hit path allocates nothing, and which caps the
distinct values a label may take (the rest count as "other"), so no label can grow with the
fleet. Numbers a part already keeps (queue lengths, rows held, counters of its own) are read at
scrape time by a collector instead, which costs the hot path nothing.

With `enabled=False` (benchmarks measure the cost of metrics this way) every bound child is
`OFF`, whose methods do nothing; scrape-time collectors still answer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from itertools import accumulate
from typing import Protocol

from aiohttp import web
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
)
from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector

from souk import heap

# The `_created` series (a timestamp per child) double what a scrape carries and say nothing
# souk's readers need.
disable_created_metrics()  # type: ignore[no-untyped-call]

METRICS_PATH = "/metrics"
CONTENT_TYPE = CONTENT_TYPE_LATEST

# Seconds: from a fraction of a millisecond (an in-memory decision, a group commit) to a cold
# start of a machine.
LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
OTHER = "other"


class Child(Protocol):
    """What a hot path holds: a bound counter, gauge or histogram child, or `OFF`."""

    def inc(self, amount: float = 1) -> None: ...


class Observer(Protocol):
    def observe(self, amount: float) -> None: ...


class Off:
    """A child that records nothing: metrics disabled."""

    def inc(self, amount: float = 1) -> None:
        pass

    def dec(self, amount: float = 1) -> None:
        pass

    def set(self, value: float) -> None:
        pass

    def observe(self, amount: float) -> None:
        pass


OFF = Off()


class Metrics:
    """One part's registry, and the switch that turns its hot-path metrics off."""

    def __init__(self, namespace: str, enabled: bool = True) -> None:
        self.namespace = namespace
        self.enabled = enabled
        self.registry = CollectorRegistry(auto_describe=True)
        self.collect(GcPauses(f"{namespace}_gc_pause_seconds"))

    def counter(self, name: str, doc: str, labels: Sequence[str] = ()) -> Counter:
        return Counter(name, doc, labels, namespace=self.namespace, registry=self.registry)

    def gauge(self, name: str, doc: str, labels: Sequence[str] = ()) -> Gauge:
        return Gauge(name, doc, labels, namespace=self.namespace, registry=self.registry)

    def histogram(
        self,
        name: str,
        doc: str,
        labels: Sequence[str] = (),
        buckets: Sequence[float] = LATENCY_BUCKETS,
    ) -> Histogram:
        return Histogram(
            name, doc, labels, namespace=self.namespace, registry=self.registry, buckets=buckets
        )

    def bind(self, metric: Counter | Gauge | Histogram, *values: str) -> Off:
        """The metric's child for these label values (its only child if it has no labels), or
        `OFF` when metrics are disabled. Typed as `Off`, the widest face of a child."""
        if not self.enabled:
            return OFF
        child = metric.labels(*values) if values else metric
        return child  # type: ignore[return-value]

    def collect(self, collector: Collector) -> None:
        """A collector read at scrape time."""
        self.registry.register(collector)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class GcPauses(Collector):
    """The process's garbage-collector pauses since its part settled (`heap.PAUSES`), by
    generation: what sets the tail of a part with a large heap."""

    def __init__(self, name: str) -> None:
        self.name = name

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(
            self.name,
            "Pauses of the process's garbage collector since its part was ready, by generation",
            labels=["generation"],
        )
        for generation in range(heap.GENERATIONS):
            counts = list(accumulate(heap.PAUSES.counts[generation]))
            bounds = [*(str(b) for b in heap.PAUSE_BUCKETS), "+Inf"]
            family.add_metric(
                [str(generation)],
                list(zip(bounds, counts, strict=True)),
                heap.PAUSES.sums[generation],
            )
        yield family


class Bounded:
    """Children of one metric keyed by one label whose values come from outside (a worker's
    refusal reason, an HTTP status): bound on first sight, at most `limit` of them; later values
    count under "other". `extra` label values are fixed for every child of this cache."""

    def __init__(
        self, metrics: Metrics, metric: Counter | Histogram, *extra: str, limit: int = 32
    ) -> None:
        self.metrics = metrics
        self.metric = metric
        self.extra = extra
        self.limit = limit
        self.children: dict[str, Off] = {}

    def __call__(self, value: str) -> Off:
        child = self.children.get(value)
        if child is None:
            if len(self.children) >= self.limit:
                value = OTHER
                child = self.children.get(value)
            if child is None:
                child = self.metrics.bind(self.metric, *self.extra, value)
                self.children[value] = child
        return child


def prebound(
    metrics: Metrics, metric: Counter | Gauge | Histogram, values: Iterable[str], *extra: str
) -> dict[str, Off]:
    """One child per known value of the metric's last label, bound now."""
    return {value: metrics.bind(metric, *extra, value) for value in values}


def serve_metrics(metrics: Metrics) -> Callable[[web.Request], Awaitable[web.Response]]:
    """An aiohttp handler answering the part's metrics in Prometheus' text format."""

    async def handler(_: web.Request) -> web.Response:
        response = web.Response(body=metrics.render())
        response.headers["Content-Type"] = CONTENT_TYPE
        return response

    return handler
