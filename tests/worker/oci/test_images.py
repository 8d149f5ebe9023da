"""Pulling into the image cache and preparing root filesystems, against a real registry."""

from __future__ import annotations

import asyncio
import gzip
import os
import shutil
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from souk.models.machine import InitConfig
from souk.worker.oci import images
from souk.worker.oci.images import ImageCache
from souk.worker.oci.manifest import OCI_LAYER_ZSTD, Platform, host_platform
from souk.worker.oci.registry import DigestMismatch, NotInRegistry, RegistryClient, sha256_digest
from souk.worker.oci.rootfs import is_mounted, overlay_supported
from souk.worker.oci.unpack import (
    GrowingFile,
    NotStreamable,
    UnsafeLayer,
    unpack_layer,
    unpack_stream,
)
from tests.support.images import ImageSpec, Layer, TarBuilder, layer, push_image, push_index
from tests.support.registry import Registry, push

Make = Callable[..., ImageCache]


def stored(cache: ImageCache) -> dict[str, list[str]]:
    root = cache.store.root
    return {
        sub: sorted(p.name for p in (root / sub).iterdir())
        for sub in ("blobs/sha256", "layers", "images", "tmp")
    }


async def test_pull_by_tag_then_by_digest(
    registry: Registry, client: RegistryClient, busybox_base: Layer, make_cache: Make
) -> None:
    spec = ImageSpec(
        [busybox_base],
        entrypoint=["/bin/sh", "-c"],
        cmd=["echo hi"],
        env=["PATH=/bin", "GREETING=hello"],
        workdir="/www",
        user="nobody",
        exposed_ports=["8080/tcp", "53/udp"],
    )
    pushed = await push(client, registry, "busybox:1", spec)
    cache = make_cache()

    image = await cache.pull(f"{registry.host}/busybox:1")
    assert image.digest == pushed.digest
    assert image.name == f"{registry.host}/busybox:1"
    assert image.config.argv(InitConfig()) == ["/bin/sh", "-c", "echo hi"]
    assert image.config.workdir == "/www" and image.config.user == "nobody"
    assert image.config.ports() == [8080]
    assert "GREETING=hello" in image.config.environment({})
    assert cache.downloads == 2  # config and the one layer

    by_digest = await cache.pull(f"{registry.host}/busybox@{pushed.digest}")
    assert by_digest.digest == pushed.digest
    assert cache.downloads == 2  # cached: nothing fetched again
    assert cache.has(pushed.digest) and cache.has(f"{registry.host}/busybox:1")
    [row] = cache.cached()
    assert row.digest == pushed.digest and row.size >= len(busybox_base.blob)

    fresh = make_cache("fresh")  # by digest into an empty cache
    again = await fresh.pull(f"{registry.host}/busybox@{pushed.digest}")
    assert again.layers == image.layers


async def test_a_pull_given_the_digest_its_tag_named_keeps_it_after_the_tag_moves(
    registry: Registry, client: RegistryClient, busybox_base: Layer, make_cache: Make
) -> None:
    first = await push(client, registry, "app:1", ImageSpec([busybox_base], cmd=["first"]))
    cache, name = make_cache(), f"{registry.host}/app:1"
    assert (await cache.pull(name)).digest == first.digest
    moved = await push(client, registry, "app:1", ImageSpec([busybox_base], cmd=["moved"]))
    asked = 0
    resolve = cache.client.resolve

    async def counted(*args: object, **kwargs: object) -> object:
        nonlocal asked
        asked += 1
        return await resolve(*args, **kwargs)  # type: ignore[arg-type]

    cache.client.resolve = counted  # type: ignore[assignment,method-assign]
    pinned = await cache.pull(name, digest=first.digest)
    assert pinned.digest == first.digest and pinned.name == name
    assert asked == 0  # from the cache: the registry was not asked what the tag names now
    assert [row.ref for row in cache.cached()] == [name]  # known by the machine's reference
    assert (await cache.pull(name)).digest == moved.digest and asked == 1
    fresh = make_cache("fresh")  # the pinned image not cached: fetched by its digest
    again = await fresh.pull(name, digest=first.digest)
    assert again.digest == first.digest and again.config.argv(InitConfig()) == ["first"]


async def test_a_tag_is_pinned_to_the_digest_it_names_now_and_a_pinned_image_is_found_by_it(
    registry: Registry, client: RegistryClient, busybox_base: Layer, make_cache: Make
) -> None:
    first = await push(client, registry, "app:1", ImageSpec([busybox_base], cmd=["first"]))
    cache, name = make_cache(), f"{registry.host}/app:1"
    assert await cache.resolve(name) == f"{name}@{first.digest}"
    assert not cache.has(f"{name}@{first.digest}")  # asking pulls nothing
    moved = await push(client, registry, "app:1", ImageSpec([busybox_base], cmd=["moved"]))
    pinned = await cache.resolve(name)
    assert pinned == f"{name}@{moved.digest}"
    assert await cache.resolve(pinned) == pinned  # pinned already: not asked again
    with pytest.raises(NotInRegistry):
        await cache.resolve(f"{registry.host}/app:2")
    await cache.pull(name)  # the tag, pulled: the pinned reference finds it by its digest
    assert cache.has(pinned) and not cache.has(f"{name}@{first.digest}")

    async def unasked(*_: object) -> None:
        raise AssertionError("the registry was asked")

    cache.client.resolve = unasked  # type: ignore[assignment,method-assign]
    image = await cache.pull(pinned)  # from the cache alone
    assert image.digest == moved.digest and image.config.argv(InitConfig()) == ["moved"]


async def test_rootfs_runs_busybox(
    registry: Registry,
    client: RegistryClient,
    busybox_base: Layer,
    make_cache: Make,
    tmp_path: Path,
) -> None:
    await push(client, registry, "busybox:1", ImageSpec([busybox_base]))
    cache = make_cache()
    image = await cache.pull(f"{registry.host}/busybox:1")
    machine = tmp_path / "machine-1"
    rootfs = await cache.prepare_rootfs(image, machine)
    assert await cache.prepare_rootfs(image, machine) == rootfs  # idempotent
    assert os.access(rootfs / "bin" / "busybox", os.X_OK)
    assert os.readlink(rootfs / "bin" / "sh") == "busybox"
    proc = await asyncio.create_subprocess_exec(
        "chroot",
        str(rootfs),
        "/bin/sh",
        "-c",
        "echo inside > /tmp/out; cat /etc/passwd",
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await proc.communicate()
    assert proc.returncode == 0 and out.startswith(b"root:x:0:0")
    # The machine's writes land in its own root filesystem, never in the shared layer.
    assert (rootfs / "tmp" / "out").read_text() == "inside\n"
    [diff] = image.layers
    assert not (cache.store.layer_path(diff) / "tmp" / "out").exists()

    await cache.release_rootfs(machine)
    assert not rootfs.exists() and not is_mounted(rootfs)


async def test_multi_platform_index(
    registry: Registry, client: RegistryClient, make_cache: Make
) -> None:
    here = host_platform()
    other = Platform("linux", "riscv64")
    mine = ImageSpec([layer(TarBuilder().file("arch", here.architecture.encode()).bytes())])
    theirs = ImageSpec([layer(TarBuilder().file("arch", b"riscv64").bytes())], platform=other)
    ref = registry.ref("multi:1")
    entries = [await push_image(client, ref, theirs), await push_image(client, ref, mine)]
    index = await push_index(client, ref, entries)

    cache = make_cache()
    image = await cache.pull(f"{registry.host}/multi@{index}")
    assert image.digest == entries[1].digest
    assert image.config.architecture == here.architecture
    [diff] = image.layers
    assert (cache.store.layer_path(diff) / "arch").read_text() == here.architecture
    theirs_layer = theirs.layers[0].descriptor.digest
    assert registry.blob_gets(theirs_layer) == []  # the other platform is never downloaded
    # Pinned as a deploy pins it: by the index, so that each worker picks its own platform.
    pinned = await cache.resolve(f"{registry.host}/multi:1")
    assert pinned == f"{registry.host}/multi:1@{index}"
    assert (await cache.pull(pinned)).digest == entries[1].digest


async def test_corrupt_blob_is_rejected_and_nothing_cached(
    registry: Registry, client: RegistryClient, make_cache: Make
) -> None:
    big = TarBuilder()
    for i in range(400):  # still downloading or unpacking when the small bad one fails
        big.file(f"a{i}", os.urandom(20_000))
    good = layer(big.bytes(), False)
    bad = layer(TarBuilder().file("b", b"b" * 1000).bytes())
    await push(client, registry, "corrupt:1", ImageSpec([good, bad]))
    registry.corrupt(bad.descriptor.digest)
    cache = make_cache()
    with pytest.raises(DigestMismatch):
        await cache.pull(f"{registry.host}/corrupt:1")
    assert stored(cache) == {"blobs/sha256": [], "layers": [], "images": [], "tmp": []}
    assert cache.cached() == []


async def test_gc_clears_what_an_abandoned_pull_left(make_cache: Make) -> None:
    cache = make_cache()
    digest = "sha256:" + "ab" * 32
    cache.store.tmp_path(digest).with_suffix(".partial").write_bytes(b"half")
    cache.store.busy[digest] += 1  # a pull working on it: kept
    await cache.gc()
    assert stored(cache)["tmp"] == [f"{'ab' * 32}.partial"]
    cache.store.busy[digest] -= 1
    await cache.gc()
    assert stored(cache)["tmp"] == []


@pytest.mark.parametrize(
    ("tar", "message"),
    [
        (TarBuilder().file("../escaped", b"x"), "'..'"),
        (TarBuilder().dir("d").file("d/../../escaped", b"x"), "'..'"),
        (TarBuilder().symlink("link", "/").file("link/escaped", b"x"), "symlink"),
        (TarBuilder().symlink("up", "../..").file("up/escaped", b"x"), "leaves the root"),
        (TarBuilder().symlink("etc", "/tmp/../../..").file("etc/x", b"x"), "leaves the root"),
        (TarBuilder().hardlink("passwd", "../../etc/passwd"), "'..'"),
        (TarBuilder().hardlink("passwd", "/etc/passwd"), "missing"),
        (TarBuilder().device("dev/mem", 1, 1), "device"),
    ],
)
async def test_unsafe_layers_are_rejected(
    registry: Registry,
    client: RegistryClient,
    make_cache: Make,
    tmp_path: Path,
    tar: TarBuilder,
    message: str,
) -> None:
    evil = layer(tar.bytes())
    await push(client, registry, "evil:1", ImageSpec([evil]))
    cache = make_cache("deep/down/cache")
    with pytest.raises(UnsafeLayer, match=message):
        await cache.pull(f"{registry.host}/evil:1")
    assert not list(tmp_path.rglob("escaped"))
    assert stored(cache) == {"blobs/sha256": [], "layers": [], "images": [], "tmp": []}


def whiteout_image() -> ImageSpec:
    base = (
        TarBuilder()
        .dir("a")
        .file("a/x", b"x")
        .file("a/y", b"y")
        .file("b", b"b")
        .dir("c")
        .file("c/old", b"old")
        .dir("d")
        .file("d/kept", b"kept")
        .file("link-target", b"shared")
        .hardlink("hard", "link-target")
    )
    top = TarBuilder().whiteout("a/x").whiteout("b").opaque("c").file("c/new", b"new")
    top.whiteout("d").dir("d").file("d/fresh", b"fresh")  # deleted, then made anew
    return ImageSpec([layer(base.bytes()), layer(top.bytes(), compress=False)])


def listing(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): "" if p.is_dir() else p.read_text()
        for p in sorted(root.rglob("*"))
    }


@pytest.mark.parametrize("overlay", [True, False], ids=["overlay", "copy"])
async def test_whiteouts_and_opaque_dirs(
    registry: Registry,
    client: RegistryClient,
    make_cache: Make,
    tmp_path: Path,
    overlay: bool,
) -> None:
    if overlay and not overlay_supported(tmp_path):
        pytest.skip("overlayfs is not available here")
    await push(client, registry, "wh:1", whiteout_image())
    cache = make_cache(overlay=overlay)
    image = await cache.pull(f"{registry.host}/wh:1")
    rootfs = await cache.prepare_rootfs(image, tmp_path / "m")
    assert listing(rootfs) == {
        "a": "",
        "a/y": "y",
        "c": "",
        "c/new": "new",
        "d": "",
        "d/fresh": "fresh",
        "hard": "shared",
        "link-target": "shared",
    }
    if not overlay:  # a private copy keeps the layer's hard links as hard links
        assert (rootfs / "hard").stat().st_ino == (rootfs / "link-target").stat().st_ino


async def test_concurrent_pulls_download_once(
    registry: Registry, client: RegistryClient, busybox_base: Layer, make_cache: Make
) -> None:
    pushed = await push(client, registry, "busybox:1", ImageSpec([busybox_base]))
    await push(client, registry, "busybox:also", ImageSpec([busybox_base]))
    cache = make_cache()
    name = f"{registry.host}/busybox:1"
    images = await asyncio.gather(
        cache.pull(name), cache.pull(name), cache.pull(f"{registry.host}/busybox:also")
    )
    assert {i.digest for i in images} == {pushed.digest}
    assert len(registry.blob_gets(busybox_base.descriptor.digest)) == 1
    manifests = [r for r in registry.requests() if r.path.endswith("/manifests/1")]
    assert [r.method for r in manifests if r.method == "GET"] == ["GET"]
    assert cache.downloads == 2


async def test_gc_keeps_images_in_use(
    registry: Registry, client: RegistryClient, make_cache: Make, tmp_path: Path
) -> None:
    # Uncompressed random layers: each image costs ~60 kB (its blob plus its unpacked file).
    specs = {
        tag: ImageSpec([layer(TarBuilder().file(tag, os.urandom(30_000)).bytes(), False)])
        for tag in ("a", "b", "c")
    }
    for tag, spec in specs.items():
        await push(client, registry, f"gc:{tag}", spec)
    cache = make_cache(budget=150_000)
    a = await cache.pull(f"{registry.host}/gc:a")
    rootfs = await cache.prepare_rootfs(a, tmp_path / "machine-a")
    b = await cache.pull(f"{registry.host}/gc:b")
    assert {r.digest for r in cache.cached()} == {a.digest, b.digest}

    c = await cache.pull(f"{registry.host}/gc:c")  # over budget: b goes, a is in use
    assert {r.digest for r in cache.cached()} == {a.digest, c.digest}
    assert (rootfs / "a").stat().st_size == 30_000
    assert not cache.store.blob_path(specs["b"].layers[0].descriptor.digest).exists()
    assert cache.store.usage() <= 150_000

    await cache.release_rootfs(tmp_path / "machine-a")
    assert await cache.gc(budget=100_000) == [a.digest]
    assert {r.digest for r in cache.cached()} == {c.digest}

    b_again = await cache.pull(f"{registry.host}/gc:b")  # evicted images pull again
    assert b_again.digest == b.digest


async def test_a_rootfs_of_another_image_is_made_again_and_one_of_the_same_kept(
    registry: Registry, client: RegistryClient, make_cache: Make, tmp_path: Path
) -> None:
    """A machine started again keeps what it wrote; one updated to another image gets that
    image's files, not the old ones under the new config, and the old image is free to go."""
    specs = {
        tag: ImageSpec([layer(TarBuilder().file(tag, tag.encode()).bytes(), False)])
        for tag in ("old", "new")
    }
    for tag, spec in specs.items():
        await push(client, registry, f"swap:{tag}", spec)
    cache, machine = make_cache(), tmp_path / "machine"
    old = await cache.pull(f"{registry.host}/swap:old")
    new = await cache.pull(f"{registry.host}/swap:new")
    rootfs = await cache.prepare_rootfs(old, machine)
    (rootfs / "written").write_text("by the machine")
    assert await cache.prepare_rootfs(old, machine) == rootfs  # started again: the same
    assert (rootfs / "written").exists() and (rootfs / "old").exists()
    assert cache.store.pinned() == {old.digest}
    assert await cache.prepare_rootfs(new, machine) == rootfs  # updated: made of `new`
    assert sorted(p.name for p in rootfs.iterdir()) == ["new"]
    assert cache.store.pinned() == {new.digest}
    await cache.release_rootfs(machine)


async def test_in_use_callback_protects_images(
    registry: Registry, client: RegistryClient, make_cache: Make
) -> None:
    spec = ImageSpec([layer(TarBuilder().file("x", os.urandom(10_000)).bytes(), False)])
    await push(client, registry, "used:1", spec)
    used: set[str] = set()
    cache = make_cache(budget=10**9, in_use=lambda: used)
    image = await cache.pull(f"{registry.host}/used:1")
    used.add(image.digest)
    assert await cache.gc(budget=0) == []
    used.clear()
    assert await cache.gc(budget=0) == [image.digest]
    assert stored(cache)["blobs/sha256"] == []


def tree(root: Path) -> dict[str, tuple[int, bytes | str | None]]:
    found: dict[str, tuple[int, bytes | str | None]] = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        if path.is_symlink():
            content: bytes | str | None = os.readlink(path)
        elif path.is_file():
            content = path.read_bytes()
        else:
            content = None
        found[str(path.relative_to(root))] = (st.st_mode, content)
    return found


def zstd(data: bytes) -> bytes:
    return subprocess.run(["zstd", "-q", "-c"], input=data, capture_output=True, check=True).stdout


async def test_layers_unpacked_as_they_download_match_their_files(
    registry: Registry,
    client: RegistryClient,
    make_cache: Make,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each layer is unpacked while it downloads (gzip and plain tar), or from its file once it
    is complete where it cannot be (zstd): the same tree either way."""
    big = TarBuilder().dir("d")
    for i in range(200):  # several chunks: the unpacking reads what has arrived, then waits
        big.file(f"d/f{i}", os.urandom(10_000))
    big.symlink("link", "d/f0")
    layers = [layer(big.bytes()), layer(TarBuilder().file("plain", b"p").bytes(), False)]
    if shutil.which("zstd"):
        raw = TarBuilder().file("z", b"zstd layer").bytes()
        layers.append(Layer(zstd(raw), sha256_digest(raw), OCI_LAYER_ZSTD))
    await push(client, registry, "streamed:1", ImageSpec(layers))
    cache = make_cache()
    from_files: list[Path] = []

    def unpack_file(blob: Path, dest: Path, overlay: bool) -> int:
        from_files.append(blob)
        return unpack_layer(blob, dest, overlay)

    monkeypatch.setattr(images, "unpack_layer", unpack_file)
    image = await cache.pull(f"{registry.host}/streamed:1")
    assert len(from_files) == len(layers) - 2  # the zstd one
    assert len(image.layers) == len(layers)
    for i, digest in enumerate(image.layers):
        again = tmp_path / f"again-{i}"
        unpack_layer(cache.store.blob_path(digest), again, cache.overlay)
        assert tree(cache.store.layer_path(digest)) == tree(again)
    assert stored(cache)["tmp"] == []


def test_a_growing_file_is_read_as_it_grows_and_fails_with_its_download(tmp_path: Path) -> None:
    data = gzip.compress(TarBuilder().file("a", b"x" * 300_000).bytes())
    partial = tmp_path / "blob.partial"
    growing = GrowingFile()
    result: list[int] = []
    reader = threading.Thread(
        target=lambda: result.append(unpack_stream(growing, tmp_path / "out", True))
    )
    with open(partial, "wb") as out:
        for start in range(0, len(data), 4096):
            out.write(data[start : start + 4096])
            out.flush()
            growing.grew(partial, min(start + 4096, len(data)))
            if start == 0:
                reader.start()
    growing.end()
    reader.join(10)
    assert result == [300_000]
    assert (tmp_path / "out" / "a").read_bytes() == b"x" * 300_000

    failed = GrowingFile()
    failed.grew(partial, 100)
    failed.end(DigestMismatch("bad"))
    with pytest.raises(NotStreamable):
        unpack_stream(failed, tmp_path / "failed", True)
    never = GrowingFile()
    never.end()
    with pytest.raises(NotStreamable):  # nothing came: unpacked from the file instead
        unpack_stream(never, tmp_path / "never", True)
