"""A machine's processes as Fly's `ps` shows them, read from /proc: command line, working
directory, CPU times, resident memory, and the sockets each listens on."""

from __future__ import annotations

import os
from pathlib import Path

from souk.models.machine_ops import ListenSocket, ProcessStat

PROC = Path("/proc")
_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")
_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's st column
SORT_KEYS = ("pid", "cpu", "rss", "rtime", "stime", "command")


def _uptime() -> float:
    return float((PROC / "uptime").read_text().split()[0])


def _socket_inodes(pid: int) -> set[str]:
    found: set[str] = set()
    try:
        entries = os.listdir(PROC / str(pid) / "fd")
    except OSError:
        return found
    for fd in entries:
        try:
            target = os.readlink(PROC / str(pid) / "fd" / fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            found.add(target[8:-1])
    return found


def _address(hex_addr: str) -> str:
    """/proc/net/tcp's `0100007F:1F90` as `127.0.0.1:8080` (IPv6 as its hex groups)."""
    host, port = hex_addr.split(":")
    if len(host) == 8:
        ip = ".".join(str(b) for b in reversed(bytes.fromhex(host)))
    else:
        words = [bytes.fromhex(host[i : i + 8])[::-1].hex() for i in range(0, 32, 8)]
        ip = "[" + ":".join(w[j : j + 4] for w in words for j in (0, 4)) + "]"
    return f"{ip}:{int(port, 16)}"


def _listening(pid: int) -> dict[str, ListenSocket]:
    """Listening sockets in the process's network namespace, by inode."""
    out: dict[str, ListenSocket] = {}
    for table, proto in (("tcp", "tcp"), ("tcp6", "tcp"), ("udp", "udp"), ("udp6", "udp")):
        try:
            lines = (PROC / str(pid) / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if len(cols) < 10 or (proto == "tcp" and cols[3] != _LISTEN):
                continue
            if proto == "udp" and cols[2].split(":")[0].strip("0") != "":
                continue  # a connected UDP socket, not a listening one
            out[cols[9]] = ListenSocket(proto=proto, address=_address(cols[1]))
    return out


def stat(pid: int) -> ProcessStat | None:
    """One process, or None if it is gone."""
    base = PROC / str(pid)
    try:
        raw = (base / "stat").read_text()
        cmdline = (base / "cmdline").read_bytes()
        rss_pages = int((base / "statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        return None
    utime, stime, started = int(fields[11]), int(fields[12]), int(fields[19])
    try:
        directory = os.readlink(base / "cwd")
    except OSError:
        directory = ""
    command = cmdline.replace(b"\0", b" ").decode(errors="replace").strip()
    if not command:
        command = "[" + raw[raw.index("(") + 1 : raw.rindex(")")] + "]"
    ran = max(_uptime() - started / _TICKS, 1 / _TICKS)
    cpu = int(100 * (utime + stime) / _TICKS / ran)
    sockets = _socket_inodes(pid)
    listening = [s for inode, s in _listening(pid).items() if inode in sockets] if sockets else []
    return ProcessStat(
        pid=pid,
        command=command,
        directory=directory,
        cpu=cpu,
        rss=rss_pages * _PAGE,
        rtime=utime * 1000 // _TICKS,
        stime=stime * 1000 // _TICKS,
        listen_sockets=listening,
    )


def table(pids: list[int], sort_by: str = "pid", order: str = "asc") -> list[ProcessStat]:
    """The processes still alive among `pids`, sorted as asked."""
    if sort_by not in SORT_KEYS:
        raise ValueError(f"sort_by: one of {', '.join(SORT_KEYS)}")
    if order not in ("asc", "desc"):
        raise ValueError("order: asc or desc")
    found = [s for s in (stat(pid) for pid in sorted(set(pids))) if s is not None]
    found.sort(key=lambda s: getattr(s, sort_by), reverse=order == "desc")
    return found
