"""Every state of fsm.py, against every way a machine or its worker ends, for host commands
and images (runc): a forced destroy leaves nothing of the machine and gives its room back,
whatever its state and stop config; a worker stopped with SIGTERM finds each machine as it
left it; and `souk dev` stopped with Ctrl-C (once or twice) leaves nothing of any machine it
made."""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
import urllib.error
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from souk.worker.ops.fsm import STATES
from tests.support.machines import (
    api_pid,
    kill_machine_processes,
    machine_processes,
    recorded_ids,
)
from tests.support.ports import free_port
from tests.support.registry import registry_or_skip
from tests.support.walk import (
    WALK,
    Held,
    Images,
    Kind,
    bring_all,
    freezer_state,
    leftovers,
    until,
    walk_images,
)
from tests.support.worker_process import WorkerProcess
from tests.worker.daemon.test_dev_cleanup import DevProcess, up

pytestmark = pytest.mark.integration

KINDS: tuple[Kind, ...] = ("command", "image")


def test_the_walk_covers_every_state_of_the_table() -> None:
    assert set(WALK) == set(STATES)
    for state, ways in WALK.items():
        assert set(ways) == set(KINDS), state


@pytest.fixture
def images(tmp_path: Path) -> Iterator[Images]:
    if os.geteuid() != 0 or shutil.which("runc") is None:
        pytest.skip("image machines need root and runc")
    with registry_or_skip(tmp_path / "registry") as registry, walk_images(registry) as found:
        yield found


@dataclass
class WorkerApi:
    worker: WorkerProcess

    def create(self, config: dict[str, Any], start: bool) -> str:
        return str(self.worker.create(config, start=start)["id"])

    def post(self, mid: str, verb: str, body: dict[str, Any] | None = None) -> None:
        self.worker.ok("POST", f"/v1/machines/{mid}/{verb}", body or {})

    def destroy(self, mid: str) -> None:
        self.worker.ok("DELETE", f"/v1/machines/{mid}?force=true")

    def state(self, mid: str) -> str:
        return str(self.worker.machine(mid)["state"])

    def pid(self, mid: str) -> int | None:
        return api_pid(self.worker.machine(mid))


@dataclass
class ImageWorker(WorkerProcess):
    registries: tuple[str, ...] = ()

    def argv(self) -> list[str]:
        return [*super().argv(), *(f"--insecure-registry={r}" for r in self.registries)]


def start_own(worker: ImageWorker, tries: int = 5) -> None:
    """Started and answering as itself: a port another worker took meanwhile (ours then fails
    to bind, and the other answers) is given up for another."""
    for _ in range(tries):
        with suppress(RuntimeError, OSError, KeyError, TypeError):  # its port was taken
            worker.start()
            if worker.call("GET", "/v1/status").body["worker"] == worker.name:
                return
        assert worker.proc is not None
        worker.proc.wait(10)  # ours, failing to bind
        worker.port = free_port()
    raise AssertionError(f"no port of its own for worker {worker.name}")


def settled(api: WorkerApi, held: Held) -> str:
    """Where the machine is once what it was caught in has run its course."""
    if held.then is None:
        return held.state
    until(api, held.mid, held.then)
    return held.then


def test_every_state_ends_by_forced_destroy_and_outlives_a_worker_sigterm(
    tmp_path: Path, images: Images
) -> None:
    registries = tuple(image.split("/")[0] for image in (images.runs, images.hangs))
    name = f"walk{uuid.uuid4().hex[:8]}"
    worker = ImageWorker(tmp_path / "w", tmp_path / "w.log", 64, 65536, name=name)
    worker.registries = registries
    start_own(worker)
    api = WorkerApi(worker)
    try:
        destroyed, kept = bring_all(api, KINDS, images), bring_all(api, KINDS, images)
        assert {h.state for h in destroyed} == set(STATES)

        # (a) a forced destroy, from every state: nothing of the machine remains
        for held in destroyed:
            api.destroy(held.mid)
        for held in destroyed:
            until(api, held.mid, "destroyed")
            assert leftovers(held.mid) == [], held

        # (c) SIGTERM: the worker keeps its machines, and finds each where it left it
        before = {h.mid: (settled(api, h), api.pid(h.mid)) for h in kept}
        frozen = {h.mid: freezer_state(h.mid) for h in kept if h.state == "suspended"}
        assert worker.proc is not None
        worker.proc.send_signal(signal.SIGTERM)
        assert worker.proc.wait(30) == 0
        start_own(worker)
        after = {h.mid: (api.state(h.mid), api.pid(h.mid)) for h in kept}
        assert after == before
        for mid, state in frozen.items():
            assert freezer_state(mid) == state  # still frozen (None: a host without v1)
            api.post(mid, "start")  # and still resumable: the same process runs on
            assert (until(api, mid, "started"), api.pid(mid)) == (mid, before[mid][1])

        # and then ended all the same, with every reservation given back
        for held in kept:
            api.destroy(held.mid)
        for held in kept:
            until(api, held.mid, "destroyed")
            assert leftovers(held.mid) == [], held
        capacity = worker.ok("GET", "/v1/capacity")
        assert (capacity["machines"], capacity["reserved"]["cpus"]) == (0, 0)
    finally:
        if worker.proc is not None and worker.proc.poll() is None:
            for mid in worker.known_ids():  # their network and files too, whatever the state
                worker.call("DELETE", f"/v1/machines/{mid}?force=true", timeout=5)
        worker.close()
        for group in Path("/sys/fs/cgroup").glob(f"*/souk/{name}"):  # its machines' parent
            with suppress(OSError):
                group.rmdir()


@dataclass
class DevApi:
    """`souk dev`'s broker: the Machines API as a user meets it."""

    dev: DevProcess
    app: str = "walk"
    made: itertools.count[int] = field(default_factory=itertools.count)

    def path(self, mid: str = "") -> str:
        return f"/v1/apps/{self.app}/machines" + (f"/{mid}" if mid else "")

    def create(self, config: dict[str, Any], start: bool) -> str:
        region = ("mad", "ams", "sin")[next(self.made) % 3]  # room for the walk: every region's
        body = {"config": config, "region": region, "skip_launch": not start}
        return str(self.dev.call("POST", self.path(), body)["id"])

    def post(self, mid: str, verb: str, body: dict[str, Any] | None = None) -> None:
        self.dev.call("POST", f"{self.path(mid)}/{verb}", body or {})

    def destroy(self, mid: str) -> None:
        self.dev.call("DELETE", f"{self.path(mid)}?force=true")

    def state(self, mid: str) -> str:
        try:
            return str(self.dev.call("GET", self.path(mid))["state"])
        except urllib.error.HTTPError as exc:
            if exc.code == 404:  # gone from the app's list once destroyed
                return "destroyed"
            raise

    def pid(self, mid: str) -> int | None:
        return None


@contextmanager
def souk_dev(data: Path, images: Images) -> Iterator[DevApi]:
    registries = {image.split("/")[0] for image in (images.runs, images.hangs)}
    dev = up(data, *(f"--insecure-registry={r}" for r in sorted(registries)))
    try:
        with suppress(urllib.error.HTTPError):  # 409: made by an earlier run on this data
            dev.call("POST", "/v1/apps", {"name": "walk"})
        yield DevApi(dev)
    finally:
        if dev.proc.poll() is None:  # a failed test's: its own Ctrl-C ends what it made
            os.kill(dev.proc.pid, signal.SIGINT)
            with suppress(subprocess.TimeoutExpired):
                dev.proc.wait(60)
        dev.kill()
        for db in data.glob("workers/*/worker.db"):
            kill_machine_processes(recorded_ids(db))


def ended(dev: DevProcess, code: int) -> None:
    assert dev.proc.wait(60) == code, dev.log.read_text()[-3000:]


def test_souk_dev_ends_every_machine_from_every_state(tmp_path: Path, images: Images) -> None:
    made: list[Held] = []
    try:
        with souk_dev(tmp_path / "dev", images) as api:
            made = bring_all(api, KINDS, images)
            assert {h.state for h in made} == set(STATES)
            os.kill(api.dev.proc.pid, signal.SIGINT)
            ended(api.dev, 0)
            log = api.dev.log.read_text()
        assert {h.mid: leftovers(h.mid) for h in made} == {h.mid: [] for h in made}
        assert "destroying" in log and "still" not in log  # nothing forced the bound
    finally:
        kill_machine_processes({h.mid for h in made})


def running_on(data: Path) -> list[str]:
    """Processes whose command line names `data`: what `souk dev` started there, still alive."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with suppress(OSError):
            argv = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if str(data) in argv:
                found.append(argv)
    return found


def test_a_second_ctrl_c_ends_souk_dev_at_once_with_nothing_left_running(
    tmp_path: Path, images: Images
) -> None:
    """The second signal kills the machines' processes and exits; the next `souk dev` on the
    same data finds them gone, and ends them (their network and files) on its own Ctrl-C."""
    made: list[Held] = []
    try:
        with souk_dev(tmp_path / "dev", images) as api:
            made = bring_all(api, KINDS, images)
            os.kill(api.dev.proc.pid, signal.SIGINT)
            # a second SIGINT sent now could merge with the first, still pending: no signal
            # of another number can
            os.kill(api.dev.proc.pid, signal.SIGTERM)
            ended(api.dev, 130)
            assert "exiting now" in api.dev.log.read_text()
            assert running_on(tmp_path / "dev" / "image-registry") == []  # dies with souk dev
        assert {h.mid: machine_processes({h.mid}) for h in made} == {h.mid: [] for h in made}
        with souk_dev(tmp_path / "dev", images) as api:
            os.kill(api.dev.proc.pid, signal.SIGINT)
            ended(api.dev, 0)
        assert {h.mid: leftovers(h.mid) for h in made} == {h.mid: [] for h in made}
    finally:
        kill_machine_processes({h.mid for h in made})
