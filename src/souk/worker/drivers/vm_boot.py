"""What a guest boots: the host's kernel package (Debian's cloud kernel, under /boot), and an
initramfs the worker builds itself once, cached by its content: the guest init (`souk-init`,
`init/`) as /init and the kernel's virtio modules (the cloud kernel builds them as modules),
listed in the order they load.

And which accelerator runs guests here: KVM where /dev/kvm boots a probe guest (a kernel that
panics at once for want of a root, and reboots: qemu exits), TCG (emulation) where qemu is
installed but KVM does not run a Linux guest (nested KVM often does not), none without qemu."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Accel = Literal["kvm", "tcg", "none"]
INIT_NAME = "souk-init"
QEMU = "qemu-system-x86_64"
# What the guest needs to reach its disks, its network and its channel; their dependencies are
# read from modules.dep.
MODULES = ("virtio_pci", "virtio_mmio", "virtio_blk", "virtio_net", "virtio_console")
PROBE_SECONDS = 8.0


class BootError(RuntimeError):
    pass


@dataclass(frozen=True)
class Kernel:
    image: Path  # vmlinuz
    modules: Path  # /lib/modules/<release>
    release: str


def find_kernel(boot: Path = Path("/boot"), lib: Path = Path("/lib/modules")) -> Kernel | None:
    """The newest kernel under /boot with its modules, a cloud kernel first."""
    found = []
    for image in boot.glob("vmlinuz-*"):
        release = image.name.removeprefix("vmlinuz-")
        if (lib / release / "modules.dep").exists():
            found.append(Kernel(image, lib / release, release))
    found.sort(key=lambda k: ("cloud" in k.release, _version(k.release)))
    return found[-1] if found else None


def _version(release: str) -> tuple[int, ...]:
    parts = release.split("-")[0].split(".")
    return tuple(int(p) for p in parts if p.isdigit())


def find_init() -> Path | None:
    """souk-init beside the interpreter (where scripts/setup.sh builds it), else in PATH."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    found = shutil.which(INIT_NAME, path=path)
    return Path(found) if found else None


def module_order(kernel: Kernel, wanted: tuple[str, ...] = MODULES) -> list[Path]:
    """The module files to load, each after what it depends on (built-in ones are absent)."""
    deps: dict[str, list[str]] = {}
    for line in (kernel.modules / "modules.dep").read_text().splitlines():
        name, _, needs = line.partition(":")
        deps[name] = needs.split()
    by_name = {Path(p).name.split(".ko")[0].replace("-", "_"): p for p in deps}
    order: list[str] = []

    def visit(path: str) -> None:
        if path in order:
            return
        for need in deps.get(path, []):
            visit(need)
        order.append(path)

    for name in wanted:
        if name in by_name:
            visit(by_name[name])
    return [kernel.modules / p for p in order]


def _newc(entries: list[tuple[str, int, bytes]]) -> bytes:
    """A cpio archive in the kernel's `newc` format: (name, mode, data) each."""
    out = bytearray()
    for ino, (name, mode, data) in enumerate([*entries, ("TRAILER!!!", 0, b"")], start=1):
        encoded = name.encode() + b"\0"
        fields = (ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(encoded), 0)
        out += b"070701" + b"".join(b"%08X" % f for f in fields) + encoded
        out += b"\0" * (-len(out) % 4) + data
        out += b"\0" * (-len(out) % 4)
    return bytes(out)


def build_initramfs(kernel: Kernel, init: Path, cache: Path) -> Path:
    """The initramfs for `kernel` with `init`, made once per content (a changed init or kernel
    makes another); written whole before it is named."""
    modules = module_order(kernel)
    parts = [("init", 0o100755, init.read_bytes())]
    parts += [("modules", 0o40755, b"")]
    parts += [(f"modules/{m.name}", 0o100644, m.read_bytes()) for m in modules]
    order = "".join(f"{m.name}\n" for m in modules).encode()
    parts += [("modules/order", 0o100644, order)]
    for directory in ("dev", "proc", "sys", "newroot"):
        parts.append((directory, 0o40755, b""))
    digest = hashlib.sha256()
    for name, mode, data in parts:
        digest.update(b"%s\0%o\0%d\0" % (name.encode(), mode, len(data)) + data)
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / f"initramfs-{digest.hexdigest()[:16]}.cpio"
    if not path.exists():
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(_newc(parts))
        tmp.chmod(0o644)
        os.replace(tmp, path)
    return path


def probe_accel(kernel: Kernel | None = None) -> Accel:
    """kvm, tcg or none, for this host (see the module's docstring)."""
    qemu = shutil.which(QEMU)
    kernel = kernel or find_kernel()
    if qemu is None or kernel is None:
        return "none"
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return "tcg"
    argv = [qemu, "-accel", "kvm", "-M", "microvm", "-cpu", "host", "-m", "128", "-nodefaults"]
    argv += ["-display", "none", "-no-reboot", "-kernel", str(kernel.image)]
    argv += ["-append", "console=ttyS0 panic=-1 rdinit=/none root=/dev/none"]
    try:
        done = subprocess.run(argv, capture_output=True, timeout=PROBE_SECONDS, check=False)
    except subprocess.TimeoutExpired:
        return "tcg"  # KVM here does not run a Linux guest to its end
    return "kvm" if done.returncode == 0 else "tcg"
