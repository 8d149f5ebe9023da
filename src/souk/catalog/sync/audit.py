"""Which live batches a replica checks, on a bus that vouches for who published them.

On the authenticated bus (`souk nats config`: a user per node certificate, and subject
permissions that let only owner X publish under X's subjects) a batch that arrives on its
owner's own subject was published by its owner, so a replica applies it without checking its
signature: that check was most of what a signed batch cost a replica (58 µs of 149, where a
plain one costs 73). The signature is still kept with the rows, so anything relayed later is
checked by its recipient. The bus is not simply trusted: a replica checks a random sample of
live batches (`rate`, `AUDIT_RATE` by default: about 4% of a plain batch's cost), and every
batch of an owner it holds nothing of yet, of a newer epoch (which would replace all the
owner's rows), or of an owner whose rows are suspect. A check that fails on such a bus means
the bus (or whoever runs it) forged it: counted, logged at error, and the owner's rows are
pulled again from the owner with every answer checked (`Puller.again`). On any other bus every
batch is checked."""

from __future__ import annotations

import logging
import random
import secrets
from collections.abc import Callable

from souk.catalog.bus import Bus, authenticated
from souk.catalog.owners import OwnerState
from souk.catalog.protocol import Batch
from souk.catalog.trust import Refused

log = logging.getLogger("souk.catalog.replica")
AUDIT_RATE = 0.05  # a check costs 58 µs, 0.05 of which is 4% of a plain batch's 73 µs


class Audit:
    def __init__(
        self,
        bus: Bus,
        rate: float,
        stats: dict[str, int],
        again: Callable[[str], None],
    ) -> None:
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"an audit rate is between 0 and 1, not {rate}")
        self.bus = bus
        self.rate = rate
        self.stats = stats
        self.again = again
        # seeded from the system's randomness: the bus must not be able to tell which of its
        # messages will be checked
        self._random = random.Random(secrets.token_bytes(32)).random

    def check(self, batch: Batch, st: OwnerState | None) -> bool:
        """Whether this live batch's signature is checked before it is applied."""
        if not authenticated(self.bus) or st is None or st.head == 0 or st.suspect:
            return True  # an owner of which nothing is held yet, or whose rows are suspect
        if batch.epoch > st.epoch:  # a newer epoch replaces every row of the owner's
            return True
        if self._random() < self.rate:
            self.stats["audited"] += 1
            return True
        return False

    def vouched(self) -> bool:
        """Whether a failed check is the bus's doing: on a bus that vouches for publishers."""
        return authenticated(self.bus)

    def failed(self, batch: Batch, exc: Refused) -> None:
        """A live batch on its owner's subject of an authenticated bus, not signed by its owner:
        the bus forged it, or let someone publish there. The owner's rows are suspect."""
        self.stats["audit_failures"] += 1
        log.error(
            "a batch of %s on its own subject failed its check (%s): the bus let it through;"
            " its rows are pulled again from the owner",
            batch.owner,
            exc,
        )
        self.again(batch.owner)
