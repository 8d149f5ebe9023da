"""Machine leases (Fly's `fly-machine-lease-nonce`), held in the broker's memory for now.

A lease's check-and-set is only atomic where a single writer decides: the worker that holds the
machine. Until workers keep leases, this table is correct for one broker (`souk dev`, a single
broker in front of a cluster) and docs/api.md says so; its interface is what the worker-side
version will keep.
"""

from __future__ import annotations

import secrets
import time

from souk.models.api import Lease
from souk.web import ApiError

NONCE_HEADER = "fly-machine-lease-nonce"


class Leases:
    def __init__(self) -> None:
        self._held: dict[str, Lease] = {}

    def current(self, machine_id: str) -> Lease | None:
        lease = self._held.get(machine_id)
        if lease is not None and lease.expires_at <= time.time():
            del self._held[machine_id]
            return None
        return lease

    def acquire(
        self,
        machine_id: str,
        ttl: int,
        description: str,
        owner: str,
        version: str,
        nonce: str | None,
    ) -> Lease:
        """New lease, or refresh of the caller's own (same nonce); 409 while another is held."""
        held = self.current(machine_id)
        if held is not None and held.nonce != nonce:
            raise ApiError(
                409, "lease_held", f"machine {machine_id} has a lease until {held.expires_at}"
            )
        lease = Lease(
            nonce=held.nonce if held is not None else secrets.token_hex(8),
            expires_at=int(time.time() + ttl),
            owner=owner,
            description=description or (held.description if held else ""),
            version=version,
        )
        self._held[machine_id] = lease
        return lease

    def release(self, machine_id: str, nonce: str | None) -> None:
        held = self.current(machine_id)
        if held is None:
            raise ApiError(404, "not_found", f"machine {machine_id} has no lease")
        if held.nonce != nonce:
            raise ApiError(409, "lease_held", f"the {NONCE_HEADER} header does not match")
        del self._held[machine_id]

    def check(self, machine_id: str, nonce: str | None) -> None:
        """Writers must present the nonce of a held lease."""
        held = self.current(machine_id)
        if held is not None and held.nonce != nonce:
            raise ApiError(
                409,
                "lease_held",
                f"machine {machine_id} is leased until {held.expires_at}; send its nonce in"
                f" the {NONCE_HEADER} header",
            )
