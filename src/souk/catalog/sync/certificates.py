"""Owners' certificates, asked of the owners themselves when a message names one a replica does
not know. A certificate is self-proving (the CA signed it), so whoever hands it over needs no
trust."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable

from souk.catalog.bus import Bus
from souk.catalog.guard import Guard
from souk.catalog.protocol import cert_subject
from souk.catalog.sync.tasks import Tasks
from souk.catalog.trust import Refused

log = logging.getLogger("souk.catalog.replica")
CERT_RETRY = 1.0  # seconds between two requests for one owner's certificate


class Certificates:
    def __init__(
        self,
        bus: Bus,
        tasks: Tasks,
        timeout: float,
        guard: Callable[[], Guard],
        learnt: Callable[[str], None],
    ) -> None:
        """`guard`: the replica's (made after this, which it calls back); `learnt`: told the
        owner whose certificate arrived, to pull what its unknown signature held back."""
        self.bus = bus
        self.tasks = tasks
        self.timeout = timeout
        self.guard = guard
        self.learnt = learnt
        self._asked: dict[str, float] = {}
        self.hello_at = -CERT_RETRY

    def want(self, owner: str) -> None:
        """An owner signed with a certificate we do not know: ask it for it (not too often, and
        not right after our hello, which every owner answers with its certificate)."""
        now = time.monotonic()
        if now - self._asked.get(owner, -CERT_RETRY) < CERT_RETRY or not self.tasks.running:
            return
        if now - self.hello_at < CERT_RETRY:
            return
        self._asked[owner] = now
        self.tasks.spawn(self._fetch(owner))

    async def _fetch(self, owner: str) -> None:
        try:
            data = await self.bus.request(cert_subject(owner), b"{}", self.timeout)
            answer = json.loads(data)
            cert = str(answer["cert"])
        except (TimeoutError, ValueError, KeyError, TypeError) as exc:
            log.debug("no certificate from %s: %s", owner, exc)
            return
        try:
            self.guard().learn(cert)
        except Refused as exc:
            self.guard().refuse(exc, f"the certificate {owner!r} sent")
            return
        self.learnt(owner)
