"""Leases: a machine's writers must present the nonce of the lease someone holds on it.

Taking, extending and releasing a lease are each one transaction on the machine's only writer,
so the check and the change can never be split by another request.
"""

from __future__ import annotations

import secrets
import time

from souk.models.api import NONCE_HEADER, Lease
from souk.worker.errors import LeaseHeld, NotFound
from souk.worker.state import queries
from souk.worker.state.queries import Db
from souk.worker.state.store import Tx


def check(db: Db, machine_id: str, nonce: str | None) -> None:
    """Refuse a write that does not carry the nonce of a held lease."""
    held = queries.lease(db, machine_id)
    if held is not None and held.nonce != nonce:
        raise LeaseHeld(
            f"machine {machine_id} is leased until {held.expires_at}; send its nonce in the"
            f" {NONCE_HEADER} header"
        )


def acquire(
    tx: Tx, machine_id: str, ttl: int, description: str, owner: str, nonce: str | None
) -> Lease:
    """A new lease, or the holder's own extended (same nonce)."""
    row = queries.existing_machine(tx, machine_id)
    held = queries.lease(tx, machine_id)
    if held is not None and held.nonce != nonce:
        raise LeaseHeld(f"machine {machine_id} is leased until {held.expires_at}")
    lease = Lease(
        nonce=held.nonce if held is not None else secrets.token_hex(8),
        expires_at=int(time.time() + ttl),
        owner=owner,
        description=description or (held.description if held else ""),
        version=row["instance_id"],
    )
    queries.put_lease(tx, machine_id, lease)
    tx.log(
        "machine",
        machine_id,
        "lease",
        "acquire",
        None,
        data={"owner": owner, "expires_at": lease.expires_at},
    )
    return lease


def release(tx: Tx, machine_id: str, nonce: str | None) -> None:
    queries.existing_machine(tx, machine_id)
    held = queries.lease(tx, machine_id)
    if held is None:
        raise NotFound(f"machine {machine_id} has no lease")
    if held.nonce != nonce:
        raise LeaseHeld(f"the {NONCE_HEADER} header does not match")
    queries.delete_lease(tx, machine_id)
    tx.log("machine", machine_id, "lease", "release", None)
