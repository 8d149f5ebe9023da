"""Why the worker refuses a request, in its own terms.

The engine and its parts raise these and never speak HTTP; `api.py` turns each kind into a status
in one table. `reason` is the machine-readable word a client sees, whatever the transport.
"""

from __future__ import annotations

from typing import Any, ClassVar


class WorkerError(Exception):
    reason: ClassVar[str] = "error"

    def __init__(self, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details


class NotFound(WorkerError):
    """No such machine here (or no lease on it)."""

    reason = "not_found"


class Conflict(WorkerError):
    """The request is well formed, but what the worker holds now forbids it."""

    reason = "conflict"


class InvalidState(Conflict):
    """The machine's projected state does not allow the operation."""

    reason = "invalid_state"


class AlreadyExists(Conflict):
    """A create named an id this worker already holds."""

    reason = "already_exists"


class LeaseHeld(Conflict):
    """Someone else holds the machine's lease: send its nonce, or wait for it to expire."""

    reason = "lease_held"


class Cordoned(Conflict):
    """The worker could take the machine, but refuses new ones until uncordoned."""

    reason = "cordoned"


class NoRoom(WorkerError):
    """The guest does not fit here: too big, the wrong cpus, or a kind of machine not run here."""

    reason = "insufficient_capacity"


class MetadataTooLarge(WorkerError):
    """A metadata patch that, merged with what the machine has, is over the limit."""

    reason = "metadata_too_large"


class StorageFault(WorkerError):
    """The data directory cannot take the write: nothing was recorded, and the request may be
    sent again once the cause is cleared."""

    reason = "storage_unavailable"


class StorageFull(StorageFault):
    """The data directory's file system is full; `details` says how much is free and needed."""

    reason = "insufficient_storage"


class TimedOut(WorkerError):
    """A command run in a machine (exec) ran past its timeout, and was killed."""

    reason = "timeout"


class InvalidImage(WorkerError):
    """An image reference that cannot be parsed."""

    reason = "invalid_image"


class ImageNotFound(NotFound):
    """The registry has no such image (or no such tag)."""

    reason = "image_not_found"


class RegistryUnavailable(WorkerError):
    """The image's registry could not be reached, or refused us."""

    reason = "registry_unavailable"


class NoImages(Conflict):
    """This worker runs no images (it needs root and runc): ask another."""

    reason = "images_unsupported"
