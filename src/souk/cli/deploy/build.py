"""`[build]`: the app's image built from its Dockerfile at each deploy, as `fly deploy` does in a
directory with one. buildah builds it (no daemon, Debian's package; `--isolation chroot`, so
it needs no user namespaces of its own), pushes it to `[build].image` under a tag of its own,
and the deploy runs it by the digest the push reports: pinned, as every image release is
(`images.py`), so a rollback runs exactly this build. The local copy is removed once pushed."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from souk.cli.client import dev_file
from souk.cli.deploy.config import AppConfig, BuildSection
from souk.cli.deploy.errors import DeployError
from souk.cli.deploy.progress import Progress
from souk.dev_images import REGISTRY_FILE

OUTPUT_LINES = 15  # of a failed build's output, in its error


def tag_of(repository: str, now: datetime | None = None) -> str:
    """A tag of its own per build (the time, to the second): a tag pushed again would move
    under machines of an earlier release."""
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
    return f"{repository}:deploy-{stamp}"


def repository_of(cfg: AppConfig, build: BuildSection) -> tuple[str, bool]:
    """Where a build is pushed, and whether over TLS: `[build].image`, or else the registry of
    the `souk dev` this directory is below (plain http on loopback), as `<registry>/<app>`."""
    if build.image is not None:
        return build.image, build.tls_verify
    registry = dev_file(REGISTRY_FILE)
    if registry is None:
        raise DeployError(
            '[build] names no image: add image = "REGISTRY/NAME" (the repository each build is'
            " pushed to), or deploy from below a `souk dev` that runs an image registry"
        )
    return f"{registry}/{cfg.app}", False


async def build_and_push(cfg: AppConfig, progress: Progress) -> AppConfig:
    """`cfg` with its [build] replaced by the image it built, pushed and pinned."""
    assert cfg.build is not None
    build = cfg.build
    buildah = shutil.which("buildah")
    if buildah is None:
        raise DeployError("[build] needs buildah (apt-get install buildah), which is not installed")
    repository, tls_verify = repository_of(cfg, build)
    tag = tag_of(repository)
    began = time.monotonic()
    await _run(
        [buildah, "bud", "--isolation", "chroot", "-f", build.dockerfile, "-t", tag, build.context],
        "build",
    )
    progress.step(f"built {tag} in {time.monotonic() - began:.1f}s", image=tag)
    try:
        with tempfile.TemporaryDirectory(prefix="souk-build-") as scratch:
            digest_file = Path(scratch) / "digest"
            push = [buildah, "push", "--digestfile", str(digest_file)]
            push += [f"--tls-verify={'true' if tls_verify else 'false'}"]
            await _run([*push, tag, f"docker://{tag}"], "push")
            digest = digest_file.read_text().strip()
    finally:
        await _run([buildah, "rmi", tag], "remove the local copy", check=False)
    pinned = f"{tag}@{digest}"
    progress.step(f"pushed {tag} ({digest[:19]})", image=pinned)
    return cfg.model_copy(update={"image": pinned, "build": None})


async def _run(argv: list[str], what: str, check: bool = True) -> None:
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await proc.communicate()
    if proc.returncode != 0 and check:
        lines = output.decode(errors="replace").rstrip().splitlines()[-OUTPUT_LINES:]
        raise DeployError(
            f"could not {what} the image (buildah exit {proc.returncode}):\n  "
            + "\n  ".join(lines),
            output=lines,
        )
