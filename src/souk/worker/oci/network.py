"""Each machine's own network namespace, joined to the host by a veth pair: the machine holds its
private address on eth0; the host routes that /32 to the veth and answers ARP for the machine's
gateway (each veth holds that link-local address), so no bridge or shared subnet is needed."""

from __future__ import annotations

import asyncio
import hashlib
import shutil
from pathlib import Path

GATEWAY = "169.254.1.1"  # what machines route through; answered by the host's proxy ARP
NETNS_DIR = Path("/var/run/netns")


class NetworkError(RuntimeError):
    pass


def names(machine_id: str) -> tuple[str, str]:
    """(namespace name, host-side veth name); interface names are at most 15 bytes."""
    short = hashlib.sha256(machine_id.encode()).hexdigest()[:10]
    return f"souk-{machine_id}", f"sk{short}"


def _conf(veth: str) -> Path:
    """The link's settings in this process's own network namespace (unlike /sys/class/net)."""
    return Path("/proc/sys/net/ipv4/conf") / veth


async def _ip(*args: str, batch: list[str] | None = None, check: bool = True) -> str:
    """One `ip` run; with `batch`, all those commands in that one process (`ip -batch -`): a
    machine's network is a dozen commands, and each process costs milliseconds."""
    ip = shutil.which("ip")
    if not ip:
        raise NetworkError("iproute2 (`ip`) is not installed")
    if batch is not None:
        args = (*args, "-batch", "-")
    proc = await asyncio.create_subprocess_exec(
        ip,
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    script = "".join(f"{line}\n" for line in batch or [])
    out, err = await proc.communicate(script.encode())
    if check and proc.returncode != 0:
        raise NetworkError(f"ip {' '.join(args)}: {err.decode().strip()}")
    return out.decode()


async def setup(machine_id: str, address: str) -> Path:
    """Create (or find complete) the machine's namespace; its path, for the runtime spec."""
    netns, veth = names(machine_id)
    path = NETNS_DIR / netns
    if path.exists():
        shown = await _ip("-n", netns, "addr", "show", "dev", "eth0", check=False)
        if f"inet {address}/32 " in shown:
            return path
    await teardown(machine_id)
    host = [
        f"netns add {netns}",
        f"link add {veth} type veth peer name eth0 netns {netns}",
        f"addr add {GATEWAY}/32 dev {veth}",  # answers the machine's ARP for its gateway
        f"link set {veth} up",
        f"route replace {address}/32 dev {veth}",
    ]
    await _ip(batch=host)
    (_conf(veth) / "proxy_arp").write_text("1")
    inside = [
        "link set lo up",
        f"addr add {address}/32 dev eth0",
        "link set eth0 up",
        f"route add {GATEWAY} dev eth0",
        f"route add default via {GATEWAY} dev eth0",
    ]
    await _ip("-n", netns, batch=inside)
    return path


async def teardown(machine_id: str) -> None:
    """Delete the namespace; its end of the veth pair, the host's end and the route go with it."""
    netns, veth = names(machine_id)
    if _conf(veth).exists():
        await _ip("link", "del", veth, check=False)
    if (NETNS_DIR / netns).exists():
        await _ip("netns", "del", netns, check=False)
