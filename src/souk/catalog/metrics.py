"""A catalog replica's Prometheus metrics, for every part that holds one (broker, proxy,
`souk catalog serve`).

Owners can be ten thousand workers, so nothing is labelled by owner: how far behind the replica
is, per owner, is shown as a distribution (a gauge histogram of the rows each owner announced
that are not applied yet, and one of the seconds since each was last heard). The replica's own
counters (`Replica.stats`) and what it holds are read at scrape time; only the time to apply a
batch is observed as it happens.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

from prometheus_client import Histogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeHistogramMetricFamily,
    GaugeMetricFamily,
)
from prometheus_client.metrics_core import Metric

from souk.catalog.replica import Replica
from souk.web.metrics import LATENCY_BUCKETS, Metrics

LAG_BUCKETS = (0, 1, 2, 5, 10, 50, 100, 1000)  # rows announced and not applied yet
SILENCE_BUCKETS = (0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0, 300.0)  # seconds
# Replica.stats keys shown as counters, and what each counts.
COUNTERS = {
    "applied": "Rows applied",
    "stale_rows": "Rows received that were not newer than the held ones",
    "quarantined": "Rows quarantined (invalid, or not their owner's to write)",
    "pulls": "Pulls of missed rows from their owners",
    "pull_failures": "Pulls that got no usable answer",
    "audited": "Live batches an authenticated bus vouched for whose signature was checked anyway",
    "audit_failures": "Live batches on their owner's subject of an authenticated bus not signed by"
    " their owner: the bus let a forgery through",
    "repulled": "Owners whose rows were pulled again in full after a failed audit",
}


def watch_replica(metrics: Metrics, replica: Replica) -> None:
    """Register the replica's metrics in `metrics` (as `souk_catalog_*` in every part), and time its
    batches while `metrics` is enabled."""
    applied = Histogram(
        "souk_catalog_apply_seconds",
        "Time to apply one batch, pull reply or snapshot chunk",
        registry=metrics.registry,
        buckets=LATENCY_BUCKETS,
    )
    if metrics.enabled:
        replica.on_apply = applied.observe
    metrics.collect(_ReplicaCollector(replica, "souk_catalog"))


def _buckets(values: Sequence[float], bounds: Sequence[float]) -> list[tuple[str, float]]:
    out = [(str(b), float(sum(1 for v in values if v <= b))) for b in bounds]
    return [*out, ("+Inf", float(len(values)))]


class _ReplicaCollector:
    def __init__(self, replica: Replica, prefix: str) -> None:
        self.replica = replica
        self.prefix = prefix

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        r, p = self.replica, self.prefix
        owners = r.owners
        now = time.monotonic()
        lags = [max(0, st.seen - st.head) for st in owners.values()]
        silences = [now - st.heard for st in owners.values() if st.heard]
        reachable = sum(1 for o in owners if r.reachable(o))
        count = GaugeMetricFamily(f"{p}_owners", "Owners the replica follows", labels=["state"])
        count.add_metric(["reachable"], reachable)
        count.add_metric(["unreachable"], len(owners) - reachable)
        yield count
        yield GaugeHistogramMetricFamily(
            f"{p}_lag_rows",
            "Owners by rows announced and not applied yet (0: caught up)",
            buckets=_buckets(lags, LAG_BUCKETS),
            gsum_value=float(sum(lags)),
        )
        yield GaugeHistogramMetricFamily(
            f"{p}_silence_seconds",
            "Owners by seconds since the replica last heard from them",
            buckets=_buckets(silences, SILENCE_BUCKETS),
            gsum_value=float(sum(silences)),
        )
        yield GaugeMetricFamily(
            f"{p}_max_lag_rows", "The largest lag of any owner", value=max(lags, default=0)
        )
        yield GaugeMetricFamily(
            f"{p}_quarantined_rows",
            "Rows held in quarantine now",
            value=r.store.quarantine_count(),
        )
        for key, doc in COUNTERS.items():
            yield CounterMetricFamily(f"{p}_{key}", doc, value=r.stats.get(key, 0))
        state = getattr(r.bus, "state", "connected")  # a bus with no state is a live one
        yield GaugeMetricFamily(
            f"{p}_bus_connected", "1 while the bus is connected", value=int(state == "connected")
        )
