"""A release's image, pinned: the tag souk.toml names is asked about once, and every machine of
the release gets `registry/name:tag@sha256:...`. So a rollout runs one image everywhere however
the tag moves meanwhile, a tag pushed again makes the next deploy update the machines (their
config changed), a rollback runs the image its release ran, and no new machine asks the
registry as it starts."""

from __future__ import annotations

from souk.cli.deploy.config import AppConfig
from souk.cli.deploy.errors import DeployError
from souk.cli.deploy.progress import Progress
from souk.cli.deploy.releases import AppRecord
from souk.clients.machines import MachinesApiError, MachinesClient
from souk.models.api import IMAGE_FAULTS


def is_pinned(image: str) -> bool:
    return "@" in image


async def pin(
    api: MachinesClient, cfg: AppConfig, known: AppRecord, progress: Progress
) -> str | None:
    """The image this release runs: souk.toml's, with the digest its tag names now, asked of a
    worker of the app's first region. When no worker can ask the registry, the current release's
    digest for the same reference is kept (with a warning); with none, the deploy stops."""
    image = cfg.image
    if image is None or is_pinned(image):
        return image
    region = min(cfg.regions) if cfg.regions else None
    try:
        pinned = await api.pin_image(cfg.app, image, region)
    except MachinesApiError as exc:
        if exc.http_status in IMAGE_FAULTS:
            raise DeployError(f"image {image}: {exc}") from None
        kept = _current_pin(known, image)
        if kept is None:
            raise DeployError(f"could not learn which image {image} names: {exc}") from None
        progress.warn(f"could not learn which image {image} names ({exc}): keeping {kept}")
        return kept
    progress.step(f"image {image} is {pinned.digest[:19]}", image=pinned.image)
    return pinned.image


def _current_pin(known: AppRecord, image: str) -> str | None:
    """The pinned image of the current release, if its souk.toml named the same `image`."""
    record = known.current_release()
    if record is None or record.config.get("image") != image or not record.image:
        return None
    return record.image if is_pinned(record.image) else None
