"""Offers: asking workers whether a guest fits them now, and reading their answers.

An offer is the worker's own, fresh picture; the catalog's may be a few milliseconds old. The
worker decides whether it fits; the broker only names a refusal, by the same rule the worker
applies (`Candidate.misfit`), so the words match wherever the check ran.
"""

from __future__ import annotations

import asyncio
import contextlib

from souk.broker.errors import DECLINED
from souk.broker.placement.candidates import Candidate
from souk.catalog.bus import Bus, Message
from souk.clients.workers import WorkerCallError, WorkerClient
from souk.models.api import Refusal
from souk.models.capacity import Offer, OfferCall, OfferRequest, offers_subject
from souk.models.catalog import WorkerRow
from souk.models.guest import GuestConfig

OFFER_TIMEOUT = 0.5  # an offer slower than this is a worker we would not want anyway

Answer = Offer | BaseException


async def ask(
    client: WorkerClient,
    bus: Bus | None,
    rows: list[WorkerRow],
    req: OfferRequest,
    timeout: float,
) -> list[Answer]:
    """Each row's offer, or why there is none, in the order of `rows`: with a bus, one message
    that every named worker answers (scatter-gather); without, `POST /v1/offers` to each."""
    if bus is not None:
        return await gather(bus, rows, req, timeout)
    return await asyncio.gather(
        *(client.offer(r.id, r.address, req, timeout) for r in rows), return_exceptions=True
    )


async def gather(
    bus: Bus, rows: list[WorkerRow], req: OfferRequest, timeout: float
) -> list[Answer]:
    """One call on the region's subject; the named workers answer to one inbox."""
    if not rows:
        return []
    wanted = {r.id for r in rows}
    offers: dict[str, Offer] = {}
    done = asyncio.Event()

    async def on_offer(msg: Message) -> None:
        try:
            offer = Offer.model_validate_json(msg.data)
        except ValueError:
            return
        if offer.capacity.worker in wanted:
            offers[offer.capacity.worker] = offer
            if len(offers) == len(wanted):
                done.set()

    inbox = bus.new_inbox()
    sub = await bus.subscribe(inbox, on_offer)
    try:
        call = OfferCall(request=req, workers=sorted(wanted))
        await bus.publish(
            offers_subject(rows[0].region), call.model_dump_json().encode(), reply=inbox
        )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), timeout)
    finally:
        await sub.unsubscribe()
    late = WorkerCallError("", 0, "timeout", f"no offer within {timeout:.2f}s")
    return [offers.get(r.id, late) for r in rows]


def offered(
    rows: list[WorkerRow], answers: list[Answer], guest: GuestConfig, refusals: list[Refusal]
) -> list[Candidate]:
    """The candidates of the workers that offered, in order; a refusal for each other one."""
    cands = []
    for row, answer in zip(rows, answers, strict=True):
        if isinstance(answer, WorkerCallError):
            refusals.append(Refusal(worker=row.id, reason=f"no offer: {answer.message}"))
        elif isinstance(answer, BaseException):
            refusals.append(Refusal(worker=row.id, reason=f"no offer: {answer!r}"))
        else:
            cand = Candidate.from_capacity(answer.capacity, row.address, answer.image_cached)
            if answer.fits:
                cands.append(cand)
            else:
                cap = answer.capacity
                why = cand.misfit(guest, cap.cordoned, cap.draining)
                refusals.append(Refusal(worker=row.id, reason=why.reason if why else DECLINED))
    return cands
