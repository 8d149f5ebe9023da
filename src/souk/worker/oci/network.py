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


async def _ip(*args: str, check: bool = True) -> str:
    ip = shutil.which("ip")
    if not ip:
        raise NetworkError("iproute2 (`ip`) is not installed")
    proc = await asyncio.create_subprocess_exec(
        ip, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await proc.communicate()
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
    await _ip("netns", "add", netns)
    await _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", netns)
    await _ip("-n", netns, "link", "set", "lo", "up")
    await _ip("-n", netns, "addr", "add", f"{address}/32", "dev", "eth0")
    await _ip("-n", netns, "link", "set", "eth0", "up")
    await _ip("-n", netns, "route", "add", GATEWAY, "dev", "eth0")
    await _ip("-n", netns, "route", "add", "default", "via", GATEWAY, "dev", "eth0")
    Path(f"/proc/sys/net/ipv4/conf/{veth}/proxy_arp").write_text("1")
    await _ip("addr", "add", f"{GATEWAY}/32", "dev", veth)  # answers the machine's ARP
    await _ip("link", "set", veth, "up")
    await _ip("route", "replace", f"{address}/32", "dev", veth)
    return path


async def teardown(machine_id: str) -> None:
    """Delete the namespace; its end of the veth pair, the host's end and the route go with it."""
    netns, veth = names(machine_id)
    await _ip("link", "del", veth, check=False)
    await _ip("netns", "del", netns, check=False)
