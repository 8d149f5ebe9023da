"""Machines brought to each state of fsm.py's table, by real means, through any Machines API
(a worker's own or a broker's), and what must be true once one has ended: for the walk of
every state against every way a machine or its worker can end (tests/worker/daemon/
test_teardown_walk.py)."""

from __future__ import annotations

import asyncio
import glob
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from tests.support.images import ImageSpec, busybox_layer, layer
from tests.support.machines import machine_processes
from tests.support.registry import Registry, push

Kind = Literal["command", "image"]
STOP_TIMEOUT = "120s"  # far past anything the walk waits for: a wait that ends sooner did not
# wait for it
SETTLE = 30.0  # how long a machine may take to reach a state it is brought to


class Api(Protocol):
    """The few Machines API calls the walk makes."""

    def create(self, config: dict[str, Any], start: bool) -> str: ...
    def post(self, mid: str, verb: str, body: dict[str, Any] | None = None) -> None: ...
    def destroy(self, mid: str) -> None: ...
    def state(self, mid: str) -> str: ...
    def pid(self, mid: str) -> int | None: ...


@dataclass(frozen=True)
class Images:
    """`runs`: an image that runs (busybox); `hangs`: one whose registry answers a pull with a
    body it never finishes, which holds a start in `starting` for as long as it is served."""

    runs: str
    hangs: str


def command(kind: Kind, images: Images | None, argv: list[str], **extra: Any) -> dict[str, Any]:
    config: dict[str, Any] = {"init": {"exec": argv}, **extra}
    if kind == "image":
        assert images is not None
        config["image"] = images.runs
    return config


def sleeper(kind: Kind, images: Images | None) -> dict[str, Any]:
    return command(kind, images, ["sleep", "600"], stop_config={"timeout": "1s"})


def stubborn(kind: Kind, images: Images | None) -> dict[str, Any]:
    """Ignores SIGTERM and gives a stop 120 s. An image's command too sets its trap: souk-init,
    not the command, is a container's PID 1 and passes the stop signal on."""
    argv = ["sh", "-c", "trap '' TERM INT; while :; do sleep 1; done"]
    return command(kind, images, argv, stop_config={"timeout": STOP_TIMEOUT})


def until(api: Api, mid: str, *states: str) -> str:
    deadline = time.monotonic() + SETTLE
    while (found := api.state(mid)) not in states:
        assert time.monotonic() < deadline, f"{mid} is {found}, not {states}"
        time.sleep(0.05)
    return mid


@dataclass(frozen=True)
class Held:
    """A machine in a state. `held`: real means keep it there; else it was caught passing
    through (the ending was sent while the operation that passes through it ran), and
    `then` is where that operation leads."""

    mid: str
    kind: Kind
    state: str
    held: bool = True
    then: str | None = None


Bring = Callable[[Api, Kind, "Images | None"], Held]


def _created(api: Api, kind: Kind, images: Images | None) -> Held:
    return Held(until(api, api.create(sleeper(kind, images), False), "created"), kind, "created")


def _starting(api: Api, kind: Kind, images: Images | None) -> Held:
    assert kind == "image" and images is not None
    mid = api.create({"image": images.hangs, "init": {"exec": ["sleep", "600"]}}, True)
    return Held(until(api, mid, "starting"), kind, "starting")


def _started(api: Api, kind: Kind, images: Images | None) -> Held:
    return Held(until(api, api.create(sleeper(kind, images), True), "started"), kind, "started")


def _stopping(api: Api, kind: Kind, images: Images | None) -> Held:
    mid = until(api, api.create(stubborn(kind, images), True), "started")
    time.sleep(0.2)  # its trap set: a SIGTERM before it would end it
    api.post(mid, "stop")
    return Held(until(api, mid, "stopping"), kind, "stopping")


def _stopped(api: Api, kind: Kind, images: Images | None) -> Held:
    mid = until(api, api.create(sleeper(kind, images), True), "started")
    api.post(mid, "stop")
    return Held(until(api, mid, "stopped"), kind, "stopped")


def _destroying(api: Api, kind: Kind, images: Images | None) -> Held:
    """No real means holds a machine here: a forced destroy kills at once, and a plain one is
    accepted only where nothing runs. Caught in flight: the ending follows the destroy."""
    mid = until(api, api.create(sleeper(kind, images), True), "started")
    api.destroy(mid)
    return Held(mid, kind, "destroying", held=False, then="destroyed")


def _destroyed(api: Api, kind: Kind, images: Images | None) -> Held:
    mid = until(api, api.create(sleeper(kind, images), False), "created")
    api.destroy(mid)
    return Held(until(api, mid, "destroyed"), kind, "destroyed")


def _failed(api: Api, kind: Kind, images: Images | None) -> Held:
    config = command(
        kind, images, ["sh", "-c", "exit 3"], restart={"policy": "on-failure", "max_retries": 0}
    )
    return Held(until(api, api.create(config, True), "failed"), kind, "failed")


def _suspended(api: Api, kind: Kind, images: Images | None) -> Held:
    mid = until(api, api.create(sleeper(kind, images), True), "started")
    api.post(mid, "suspend")
    return Held(until(api, mid, "suspended"), kind, "suspended")


# Every state of fsm.py, for each kind of machine: how to bring one there, or why there is no
# way to (None).
WALK: dict[str, dict[Kind, Bring | str]] = {
    "created": {"command": _created, "image": _created},
    "starting": {
        "command": "a host command's start is one spawn: nothing holds it in starting",
        "image": _starting,
    },
    "started": {"command": _started, "image": _started},
    "stopping": {"command": _stopping, "image": _stopping},
    "stopped": {"command": _stopped, "image": _stopped},
    "destroying": {"command": _destroying, "image": _destroying},
    "destroyed": {"command": _destroyed, "image": _destroyed},
    "failed": {"command": _failed, "image": _failed},
    "suspended": {"command": _suspended, "image": _suspended},
}


def bring_all(api: Api, kinds: tuple[Kind, ...], images: Images | None) -> list[Held]:
    """One machine in each state the walk holds, for each kind, brought there in parallel."""
    todo = [
        (bring, kind) for ways in WALK.values() for kind, bring in ways.items() if kind in kinds
    ]
    with ThreadPoolExecutor(len(todo)) as pool:
        futures = [pool.submit(b, api, k, images) for b, k in todo if not isinstance(b, str)]
        return [f.result() for f in futures]


def leftovers(mid: str) -> list[str]:
    """What of the machine is still on the host: live processes naming it, processes in its
    cgroups (frozen ones too), its network namespace."""
    found = [f"process {pid}" for pid in machine_processes({mid})]
    for procs in glob.glob(f"/sys/fs/cgroup/*/souk/*/{mid}/cgroup.procs"):
        try:
            pids = Path(procs).read_text().split()
        except OSError:
            continue
        found += [f"pid {pid} in {procs}" for pid in pids]
    if Path(f"/var/run/netns/souk-{mid}").exists():
        found.append("its network namespace")
    return found


def freezer_state(mid: str) -> str | None:
    """The machine's v1 freezer state, where the host has that hierarchy."""
    found = glob.glob(f"/sys/fs/cgroup/freezer/souk/*/{mid}/freezer.state")
    return Path(found[0]).read_text().strip() if found else None


@contextmanager
def hung_registry() -> Iterator[str]:
    """host:port of a registry that answers every request with a header it never finishes (a
    byte a second, hours before a header is too long): a pull from it hangs without ever
    timing out."""
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            try:
                while b"\r\n\r\n" not in conn.recv(65536):
                    pass
                conn.sendall(b"HTTP/1.1 200 OK\r\nX-Wait: ")
                while not stop.wait(1.0):
                    conn.sendall(b"a")
            except OSError:
                pass

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        server.close()


@contextmanager
def walk_images(registry: Registry) -> Iterator[Images]:
    """A busybox image pushed to `registry`, and one on a registry that hangs."""
    spec = ImageSpec([layer(busybox_layer().bytes())], cmd=["sleep", "600"])

    async def pushed() -> None:
        async with registry.client() as client:
            await push(client, registry, "walk:1", spec)

    asyncio.run(pushed())
    with hung_registry() as hung:
        yield Images(runs=f"{registry.host}/walk:1", hangs=f"{hung}/never:1")
