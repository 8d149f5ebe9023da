"""`souk dev`'s images: an OCI registry on loopback, which its workers pull from and `souk deploy`
pushes a Dockerfile's build to, and a small base image for Dockerfiles, made from the host.

So a user's first hour can go from a Dockerfile to a running app with nothing but this host:
the registry is Debian's `docker-registry`, storing under the dev data dir; the base image,
`localhost/busybox` in buildah's own storage, is the host's static busybox (Debian's
`busybox-static`), for `FROM localhost/busybox` where no registry on the internet is reachable.
Each is skipped, with a line saying why, where its program is missing.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import shutil
import signal
import socket
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

from souk.commands import completed, ended

log = logging.getLogger("souk.dev")

REGISTRY_FILE = "oci-registry"  # in the dev data dir: HOST:PORT of its registry, for the CLI
BASE_IMAGE = "localhost/busybox"
READY_WITHIN = 10.0  # seconds for the registry to answer
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def registry_program() -> str | None:
    return shutil.which("docker-registry") or shutil.which("registry")


@contextlib.asynccontextmanager
async def image_registry(root: Path, host: str, port: int) -> AsyncIterator[str | None]:
    """A registry serving `root` on HOST:PORT (0: any free port) while the context is open; its
    address, or None where `docker-registry` is not installed."""
    program = registry_program()
    if program is None:
        log.warning("no image registry: docker-registry is not installed")
        yield None
        return
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    address = f"{host}:{_bindable(host, port)}"
    config = root / "config.yml"
    config.write_text(
        "version: 0.1\n"
        "log: {level: error, accesslog: {disabled: true}}\n"
        f"storage: {{filesystem: {{rootdirectory: {root / 'data'}}}, delete: {{enabled: true}}}}\n"
        f"http: {{addr: '{address}'}}\n"
    )
    with (root / "registry.log").open("ab") as out:
        proc = await asyncio.create_subprocess_exec(
            program,
            "serve",
            str(config),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,  # a Ctrl-C is souk dev's to handle, not the registry's
            preexec_fn=_die_with_parent,
        )
    try:
        await _until_ready(proc, address)
        yield address
    finally:
        await ended(proc)


async def _until_ready(proc: asyncio.subprocess.Process, address: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + READY_WITHIN
    while True:
        if proc.returncode is not None:
            raise RuntimeError(f"the image registry exited ({proc.returncode}); see its log")
        try:
            await asyncio.to_thread(urllib.request.urlopen, f"http://{address}/v2/", None, 1)
            return
        except urllib.error.HTTPError:
            return  # it answers
        except OSError:
            if loop.time() > deadline:
                raise RuntimeError(f"the image registry did not answer on {address}") from None
            await asyncio.sleep(0.05)


def _bindable(host: str, port: int) -> int:
    """`port` (0: any free one), found free: one in use is an `OSError` now, which `souk dev`
    refuses to start on, rather than a registry that exits while another one answers there."""
    with socket.socket() as s:
        s.bind((host, port))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:
    """In the registry's child before its exec: it ends with `souk dev`, however that ends
    (a second Ctrl-C exits at once, with no time to stop it)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


async def ensure_base_image() -> str | None:
    """`localhost/busybox` in buildah's storage, made once from the host's static busybox; its
    name, or None (with the reason logged) where buildah or busybox is missing."""
    buildah, busybox = shutil.which("buildah"), shutil.which("busybox")
    if buildah is None or busybox is None:
        log.warning("no base image for Dockerfiles: buildah or busybox is not installed")
        return None
    found = await _run(buildah, "images", "--quiet", BASE_IMAGE, check=False)
    if found.strip():
        return BASE_IMAGE
    container = (await _run(buildah, "from", "scratch")).strip()
    try:
        await _run(buildah, "copy", container, str(Path(busybox).resolve()), "/bin/busybox")
        await _run(buildah, "config", "--cmd", '["/bin/busybox", "sh"]', container)
        await _run(buildah, "commit", "--quiet", container, BASE_IMAGE)
    finally:
        await _run(buildah, "rm", container, check=False)
    return BASE_IMAGE


async def _run(*argv: str, check: bool = True) -> str:
    done = await completed(*argv, stdin=asyncio.subprocess.DEVNULL)
    if check and done.failed:
        why = done.err.decode(errors="replace")[-500:]
        raise RuntimeError(f"{' '.join(argv[:2])} failed: {why}")
    return done.out.decode()
