"""A tag pinned to the digest it names now: a deploy asks once and sends the pinned reference to
every machine of its release, so they all run one image and none asks the registry as it
starts (docs/oci.md)."""

from __future__ import annotations

from souk.models.api import PinnedImage
from souk.worker.drivers.base import Drivers
from souk.worker.errors import ImageNotFound, InvalidImage, NoImages, RegistryUnavailable
from souk.worker.oci.reference import ReferenceError
from souk.worker.oci.registry import NotInRegistry, RegistryError


async def pin(drivers: Drivers, name: str, image: str) -> PinnedImage:
    """`name`: this worker's, for the refusal of a worker that runs no images."""
    if drivers.images is None:
        raise NoImages(f"worker {name} does not run images (it needs root and runc)")
    try:
        pinned = await drivers.images.resolve(image)
    except ReferenceError as exc:
        raise InvalidImage(str(exc), {"image": image}) from None
    except NotInRegistry as exc:
        raise ImageNotFound(f"{image}: {exc}", {"image": image}) from None
    except RegistryError as exc:  # `Unreachable`: one answer whatever the cause (docs/oci.md)
        raise RegistryUnavailable(str(exc), {"image": image}) from None
    return PinnedImage(image=pinned, digest=pinned.rpartition("@")[2])
