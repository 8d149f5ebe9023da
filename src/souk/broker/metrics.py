"""A broker's Prometheus metrics (docs/observability.md lists them): placement, offers, and the
refusals it answers; its catalog replica's are added by `souk.catalog.metrics`.

Every child a create touches is bound when the broker starts, one per strategy; refusal
reasons are sentences (`souk.models.fit`), so they are counted by kind (`refusal_kind`), a
short fixed list.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import get_args

from aiohttp import web
from aiohttp.typedefs import Middleware

from souk.broker.errors import DECLINED
from souk.models.api import Refusal, Strategy
from souk.web import ApiError
from souk.web.errors import Handler
from souk.web.metrics import Bounded, Metrics, prebound

STRATEGIES = tuple(s for s in get_args(Strategy) if s != "auto")  # as resolved
REFUSAL_KINDS = (
    "cordoned",
    "draining",
    "cpu_kind",
    "room",
    "declined",
    "no_offer",
    "unreachable",
    "other",
)


def refusal_kind(reason: str) -> str:
    """A refusal's sentence, as one of `REFUSAL_KINDS`: the words `models.fit.misfit`, the offer
    stage and the worker's own refusals use."""
    if reason in ("cordoned", "draining", "unreachable"):
        return reason
    if reason.startswith("not enough room"):
        return "room"
    if reason.startswith("no ") and reason.endswith(" cpus"):
        return "cpu_kind"
    if reason == DECLINED:
        return "declined"
    if reason.startswith("no offer"):
        return "no_offer"
    return "other"


class BrokerMetrics:
    def __init__(self, enabled: bool = True) -> None:
        m = self.metrics = Metrics("souk_broker", enabled)
        decision = m.histogram(
            "placement_decision_seconds",
            "From a create's start to a ranked list of workers to reserve on",
            ("strategy",),
        )
        create = m.histogram(
            "placement_seconds",
            "A create's placement end to end: to a reserved machine or a 412",
            ("outcome", "strategy"),
        )
        asked = m.counter("offers_asked_total", "Workers asked for an offer", ("strategy",))
        answered = m.counter("offers_answered_total", "Offers received", ("strategy",))
        refused = m.counter(
            "offers_refused_total", "Workers that offered no room, by reason", ("reason",)
        )
        no_capacity = m.counter(
            "no_capacity_refusals_total",
            "Each worker's refusal in the creates answered 412, by reason",
            ("reason",),
        )
        batched = m.histogram(
            "reservation_creates",
            "Creates each reservation request to a worker carried (1: sent alone; more: a batch of"
            " those that waited for the worker's lane)",
            buckets=(1, 2, 4, 8, 16, 32, 64),
        )
        fallbacks = m.counter(
            "reservation_bus_fallbacks_total",
            "Reservation requests sent over HTTP because the worker did not answer on the bus"
            " (--reserve-over-bus)",
        )
        errors = m.counter(
            "http_errors_total", "Error answers, by status and reason", ("status", "reason")
        )
        self.decision = prebound(m, decision, STRATEGIES)
        self.placed = prebound(m, create, STRATEGIES, "placed")  # strategy -> child, per outcome
        self.not_placed = prebound(m, create, STRATEGIES, "no_capacity")
        self.reservation_creates = m.bind(batched)
        self.bus_fallbacks = m.bind(fallbacks)
        self.asked = prebound(m, asked, STRATEGIES)
        self.answered = prebound(m, answered, STRATEGIES)
        self.offer_refusals = prebound(m, refused, REFUSAL_KINDS)
        self.no_capacity = prebound(m, no_capacity, REFUSAL_KINDS)
        self._errors: dict[int, Bounded] = {}
        self._error_metric = errors

    def offers(self, strategy: str, asked: int, answered: int, refusals: list[Refusal]) -> None:
        """One round of offers: how many were asked and answered, and why the rest said no."""
        self.asked[strategy].inc(asked)
        self.answered[strategy].inc(answered)
        for refusal in refusals:
            self.offer_refusals[refusal_kind(refusal.reason)].inc()

    def refused(self, strategy: str, seconds: float, reasons: Iterable[str]) -> None:
        """A create that no worker took (a 412), with each worker's reason."""
        self.not_placed[strategy].observe(seconds)
        for kind, n in Counter(map(refusal_kind, reasons)).items():
            self.no_capacity[kind].inc(n)

    def error(self, status: int, reason: str) -> None:
        by_reason = self._errors.get(status)
        if by_reason is None:
            if len(self._errors) >= 32:  # statuses are few; never let them grow
                return
            by_reason = self._errors[status] = Bounded(
                self.metrics, self._error_metric, str(status)
            )
        by_reason(reason).inc()

    def middleware(self) -> Middleware:
        """Counts the error answers handlers raise, by status and reason (412s by why)."""

        @web.middleware
        async def count_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
            try:
                return await handler(request)
            except ApiError as exc:
                self.error(exc.http_status, exc.reason)
                raise

        return count_errors
