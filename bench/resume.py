"""How fast a suspended machine answers again after a start (resume), against a cold start of
the same machine; in one run, on one `souk worker` (process driver, fsync on).

The machine is a small TCP server on its private address that answers every connection with a
line. Each round: the machine is stopped; `POST /start`, then connect until it answers (cold:
the process is spawned and the server binds again); `POST /suspend` and wait until suspended;
`POST /start`, then connect (resume: the kernel accepts the connection while the process is
frozen, and the first byte comes once it is thawed). Both times run from sending the start to
the first byte of the answer; "accepted" until the start is acknowledged (durably queued),
"settled" until the worker's wait says `started` (the step logged, fsync included). The floor,
"bare thaw": the same server as a plain process in a freezer group of the bench's own, thawed
by a direct write (cgroup v1 hosts, as root). Then the runc driver alone (no worker, no HTTP
API): a busybox httpd container started cold from a cached image, against a thaw of its
freezer group, both until the first byte of an HTTP answer (root, runc, busybox and
docker-registry; `--no-runc` skips it).

Usage: .venv/bin/python bench/resume.py [--rounds 20] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from rich.table import Table

from _harness import pct, report, workdir, worker

PORT = 18080
SERVER = f"""
import os, socket
ip = os.environ["SOUK_PRIVATE_IP"]
s = socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((ip, {PORT}))
s.listen(64)
while True:
    c, _ = s.accept()
    c.sendall(b"ok\\n")
    c.close()
"""
RETRY = 0.0005
FREEZER = Path("/sys/fs/cgroup/freezer")


@dataclass
class Row:
    start: str
    rounds: int
    answer_p50_ms: float
    answer_p99_ms: float
    accepted_p50_ms: float
    settled_p50_ms: float
    vs_cold: float = 1.0  # cold start's p50 over this one's


async def answered(ip: str, began: float, request: bytes = b"", timeout: float = 10.0) -> float:
    """Seconds from `began` to the first byte of the machine's answer (to `request`, sent on
    connecting, if any)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            reader, writer = await asyncio.open_connection(ip, PORT)
        except OSError:
            if time.monotonic() > deadline:
                raise SystemExit(f"nothing answers on {ip}:{PORT}") from None
            await asyncio.sleep(RETRY)
            continue
        try:
            writer.write(request)
            first = await asyncio.wait_for(reader.read(1), timeout)
        except (OSError, TimeoutError):
            first = b""
        finally:
            writer.close()
        if first:
            return time.perf_counter() - began
        if time.monotonic() > deadline:
            raise SystemExit(f"{ip}:{PORT} closes without answering")
        await asyncio.sleep(RETRY)


async def measure(rounds: int, fsync: bool = True, with_runc: bool = True) -> list[Row]:
    # per kind: until the answer's first byte, until the start was accepted, until settled
    times: dict[str, tuple[list[float], list[float], list[float]]] = {
        "cold": ([], [], []),
        "resume": ([], [], []),
    }
    with workdir() as tmp:
        async with (
            worker("process", Path(tmp) / "worker", fsync=fsync) as url,
            aiohttp.ClientSession() as http,
        ):

            async def call(method: str, path: str, **kw: object) -> dict[str, object]:
                async with http.request(method, url + path, **kw) as resp:  # type: ignore[arg-type]
                    if resp.status >= 300:
                        raise SystemExit(f"{method} {path}: {resp.status} {await resp.text()}")
                    body: dict[str, object] = await resp.json()
                    return body

            config = {
                "init": {"exec": [sys.executable, "-c", SERVER]},
                "guest": {"cpus": 1, "memory_mb": 64},
                "restart": {"policy": "no"},
                "stop_config": {"signal": "SIGKILL"},
            }
            m = await call(
                "POST", "/v1/machines", json={"app": "bench", "config": config, "start": False}
            )
            path = f"/v1/machines/{m['id']}"
            ip = str(m["private_ip"])

            async def until(state: str) -> None:
                await call("GET", path + "/wait", params={"state": state, "timeout": "30"})

            async def start(kind: str) -> None:
                began = time.perf_counter()

                async def accept() -> float:
                    await call("POST", path + "/start")
                    return time.perf_counter() - began

                # the answer is awaited from the moment the start is sent, not after its
                # acknowledgement: a machine may run again before the start is answered
                accepted, took = await asyncio.gather(accept(), answered(ip, began))
                await until("started")
                times[kind][0].append(took)
                times[kind][1].append(accepted)
                times[kind][2].append(time.perf_counter() - began)

            for _ in range(rounds):
                await start("cold")
                await call("POST", path + "/suspend")
                await until("suspended")
                await start("resume")
                await call("POST", path + "/stop", json={})
                await until("stopped")
        floor = await bare_thaw(Path(tmp), rounds)
        runc = await runc_rounds(Path(tmp), rounds) if with_runc else {}
    rows = [
        Row(kind, rounds, pct(answer, 50), pct(answer, 99), pct(accepted, 50), pct(settled, 50))
        for kind, (answer, accepted, settled) in times.items()
    ]
    if floor:
        rows.append(Row("bare thaw", rounds, pct(floor, 50), pct(floor, 99), 0.0, 0.0))
    for kind, took in runc.items():
        rows.append(Row(kind, rounds, pct(took, 50), pct(took, 99), 0.0, 0.0))
    for row in rows:  # each against the cold start of its own driver
        base = rows[0] if not row.start.startswith("runc") else rows[-2]
        row.vs_cold = base.answer_p50_ms / row.answer_p50_ms
    return rows


async def bare_thaw(work: Path, rounds: int) -> list[float]:
    """The floor: the same server as a plain process in a v1 freezer group of the bench's own,
    frozen and thawed by writing the group's state directly, timed from the write to the first
    byte. Empty where the host has no writable v1 freezer."""
    group = FREEZER / f"souk-bench-{os.getpid()}"
    if not os.access(FREEZER, os.W_OK):
        return []
    group.mkdir()
    env = {**os.environ, "SOUK_PRIVATE_IP": "127.0.0.1"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", SERVER, env=env, cwd=work, start_new_session=True
    )
    took: list[float] = []
    try:
        (group / "cgroup.procs").write_text(str(proc.pid))
        await answered("127.0.0.1", time.perf_counter())
        for _ in range(rounds):
            (group / "freezer.state").write_text("FROZEN")
            while (group / "freezer.state").read_text().strip() != "FROZEN":
                await asyncio.sleep(RETRY)
            began = time.perf_counter()

            async def thaw() -> None:
                await asyncio.sleep(0)  # the connection is made first, as in the worker's rounds
                (group / "freezer.state").write_text("THAWED")

            took.append((await asyncio.gather(answered("127.0.0.1", began), thaw()))[0])
    finally:
        (group / "freezer.state").write_text("THAWED")
        proc.kill()
        await proc.wait()
        group.rmdir()
    return took


HTTP_GET = b"GET /index.html HTTP/1.0\r\n\r\n"


async def runc_rounds(work: Path, rounds: int) -> dict[str, list[float]]:
    """The runc driver on its own (no worker): a busybox httpd container, cold (root
    filesystem from the cached image, network, `runc run`) against a thaw of its freezer
    group; both until the first byte of an HTTP answer. Empty without root, runc, busybox or
    docker-registry."""
    import shutil

    from souk.models.machine import MachineConfig
    from souk.worker.drivers.base import Launch
    from souk.worker.drivers.runc import RuncDriver
    from souk.worker.oci.images import ImageCache
    from souk.worker.oci.reference import ImageRef
    from souk.worker.oci.registry import RegistryClient
    from tests.support.images import ImageSpec, busybox_layer, layer, push_image
    from tests.support.registry import REGISTRY, running_registry

    if os.geteuid() != 0 or not shutil.which("runc") or not shutil.which("busybox"):
        return {}
    if REGISTRY is None:
        return {}
    times: dict[str, list[float]] = {"runc cold": [], "runc resume": []}
    with running_registry(work / "registry", access_log=False) as registry:
        www = busybox_layer().file("www/index.html", b"ok\n").bytes()
        spec = ImageSpec([layer(www)], cmd=["httpd", "-f", "-p", str(PORT), "-h", "/www"])
        async with RegistryClient(registry.config()) as client:
            await push_image(client, ImageRef(registry.host, "resume", "1"), spec)
        cache = ImageCache(work / "cache", RegistryClient(registry.config()))
        driver = RuncDriver(cache, work / "runc", cgroup_parent=f"souk-bench-{os.getpid()}")
        config = MachineConfig(image=f"{registry.host}/resume:1")
        await cache.pull(config.image or "")  # cold starts from a cached image, as a restart
        try:
            for i in range(rounds):
                mid = f"resume{i}"
                rundir = work / "machines" / mid
                rundir.mkdir(parents=True)
                ip = f"10.215.0.{i + 2}"
                launch = Launch(mid, "bench", "local", "i", config, f"m{i}", rundir, ip)
                began = time.perf_counter()
                await driver.prepare(launch)
                handle = await driver.spawn(launch)
                times["runc cold"].append(await answered(ip, began, HTTP_GET))
                await driver.freeze(mid, handle)
                began = time.perf_counter()
                answer = asyncio.ensure_future(answered(ip, began, HTTP_GET))
                await asyncio.sleep(0)  # connecting, as in the worker's rounds
                await driver.thaw(mid, handle)
                times["runc resume"].append(await answer)
                await driver.stop(mid, handle, "SIGKILL", 1.0)
                await driver.cleanup(launch)
        finally:
            await cache.client.close()
    return times


def table(rows: list[Row]) -> Table:
    out = Table(title="from the start to the machine's first byte")
    columns = ("answer p50 ms", "answer p99 ms", "accepted p50 ms", "settled p50 ms")
    for name in ("start", "rounds", *columns, "vs cold"):
        out.add_column(name, justify="left" if name == "start" else "right")
    for r in rows:
        bare = r.start == "bare thaw" or r.start.startswith("runc")
        out.add_row(
            r.start,
            str(r.rounds),
            f"{r.answer_p50_ms:.1f}",
            f"{r.answer_p99_ms:.1f}",
            "" if bare else f"{r.accepted_p50_ms:.1f}",
            "" if bare else f"{r.settled_p50_ms:.1f}",
            f"{r.vs_cold:.1f}x faster" if r.vs_cold > 1.5 else f"{r.vs_cold:.2f}",
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=20, help="cold starts and resumes each")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--no-fsync", action="store_true", help="a worker without fsync")
    parser.add_argument("--no-runc", action="store_true", help="skip the runc driver's rounds")
    args = parser.parse_args()
    rows = asyncio.run(measure(args.rounds, not args.no_fsync, not args.no_runc))
    report(rows, table(rows), args.json, width=110)


if __name__ == "__main__":
    main()
