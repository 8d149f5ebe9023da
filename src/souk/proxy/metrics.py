"""A proxy's Prometheus metrics (docs/observability.md lists them): requests by status class,
the time machines take to answer, cold starts and autostops; its catalog replica's are added
by `souk.catalog.metrics`. The forwarder's own counters and the requests in flight are read at
scrape time."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from souk.web.metrics import Metrics, prebound

CLASSES = ("1xx", "2xx", "3xx", "4xx", "5xx")
OUTCOMES = ("ok", "failed")


class ProxyMetrics:
    def __init__(self, enabled: bool = True) -> None:
        m = self.metrics = Metrics("souk_proxy", enabled)
        requests = m.counter(
            "requests_total", "Requests for apps, by the status class answered", ("code",)
        )
        self.requests = prebound(m, requests, CLASSES)
        self.request_seconds = m.bind(
            m.histogram("request_seconds", "A request for an app, until its answer ended")
        )
        self.upstream_seconds = m.bind(
            m.histogram("upstream_seconds", "From sending a request to a machine to its headers")
        )
        starts = m.counter(
            "cold_starts_total", "Machines started to serve a request, by outcome", ("outcome",)
        )
        self.cold_starts = prebound(m, starts, OUTCOMES)
        self.cold_start_seconds = m.bind(
            m.histogram("cold_start_seconds", "From asking a start to the machine's port accepting")
        )
        stops = m.counter("autostops_total", "Idle machines stopped, by outcome", ("outcome",))
        self.autostops = prebound(m, stops, OUTCOMES)

    def answered(self, status: int, seconds: float) -> None:
        self.requests[CLASSES[min(max(status // 100, 1), 5) - 1]].inc()
        self.request_seconds.observe(seconds)

    def watch(self, stats: Mapping[str, int], inflight: Callable[[], int]) -> None:
        """The forwarder's counters (`Forwarder.stats`) and the requests in flight, at scrape."""
        self.metrics.collect(_Forwarding(stats, inflight))


class _Forwarding:
    def __init__(self, stats: Mapping[str, int], inflight: Callable[[], int]) -> None:
        self.stats = stats
        self.inflight = inflight

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        events = CounterMetricFamily(
            "souk_proxy_forward_events",
            "What happened while forwarding: retries, refused connections, no machines...",
            labels=["event"],
        )
        for event, count in sorted(self.stats.items()):
            if event != "requests":
                events.add_metric([event], count)
        yield events
        yield GaugeMetricFamily(
            "souk_proxy_inflight", "Requests being forwarded now", value=self.inflight()
        )
