"""What a machine's config chooses (its env, its `files`) never steers a privileged process: the
dynamic loader's and Python's variables, and libraries shipped in `files`, run code as the app's
own user, if at all, on both drivers. Each payload records who ran it in a file of its own, and
tries to read a file only root may."""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from souk.worker.daemon import make_app, make_driver, running
from souk.worker.drivers import launcher
from souk.worker.engine import Engine
from souk.worker.machines import app_users
from souk.worker.settings import WorkerSettings
from tests.support.clients import Client
from tests.support.engines import destroy_all
from tests.support.images import ImageSpec, busybox_layer, layer
from tests.support.registry import Registry, push

from .conftest import needs_root

pytestmark = [
    pytest.mark.integration,
    needs_root,
    pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler for the payload"),
]

# Runs at load, in whatever loads it: writes "uid euid read|refused" to ./payload-<pid>.
PAYLOAD_C = r"""
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>
__attribute__((constructor)) static void payload(void) {
    char path[64];
    int secret = open(SECRET, O_RDONLY);
    snprintf(path, sizeof path, "payload-%d", (int)getpid());
    FILE *out = fopen(path, "w");
    if (out) {
        fprintf(out, "%d %d %s\n", (int)getuid(), (int)geteuid(), secret >= 0 ? "read" : "refused");
        fclose(out);
    }
}
"""
PAYLOAD_PY = """
import os
try:
    open({secret!r}, "rb").close()
    got = "read"
except OSError:
    got = "refused"
with open(f"payload-{{os.getpid()}}", "w") as out:
    out.write(f"{{os.getuid()}} {{os.geteuid()}} {{got}}\\n")
"""


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    """A file only root may read."""
    path = tmp_path / "root-only"
    path.write_text("the host's secret\n")
    path.chmod(0o600)
    return path


@pytest.fixture
def payload(tmp_path: Path, secret: Path) -> bytes:
    source = tmp_path / "payload.c"
    source.write_text(PAYLOAD_C)
    built = tmp_path / "payload.so"
    define = f'-DSECRET="{secret}"'
    subprocess.run(["cc", "-shared", "-fPIC", define, "-o", built, source], check=True)
    return built.read_bytes()


def files(named: dict[str, bytes]) -> list[dict[str, str]]:
    """`config.files` (a host command's land in its working directory)."""
    return [
        {"guest_path": f"/{path.lstrip('/')}", "raw_value": base64.b64encode(data).decode()}
        for path, data in named.items()
    ]


def payloads(directory: Path) -> list[tuple[list[str], int]]:
    """What each payload wrote, and the host uid that owns what it wrote."""
    return [(path.read_text().split(), path.stat().st_uid) for path in directory.glob("payload-*")]


@pytest.fixture
async def api(worker_settings: WorkerSettings) -> AsyncIterator[tuple[Client, Engine]]:
    async with running(Engine(worker_settings, make_driver("process", worker_settings))) as e:
        try:
            async with TestClient(TestServer(make_app(e))) as c:
                yield c, e
        finally:
            await destroy_all(e)


async def run_until_stopped(api: Client, app: str, config: dict[str, Any]) -> str:
    made = await api.post("/v1/machines", json={"app": app, "config": config})
    assert made.status == 201, await made.text()
    mid = str((await made.json())["id"])
    waited = await api.get(f"/v1/machines/{mid}/wait", params={"state": "stopped", "timeout": 30})
    assert waited.status == 200, await waited.text()
    return mid


def app_uid(engine: Engine, app: str) -> int:
    row = engine.store.read.execute("SELECT uid FROM app_users WHERE app = ?", (app,))
    uid = int(row.fetchone()[0])
    assert uid >= app_users.BASE
    return uid


def assert_ran_as_the_app(seen: list[tuple[list[str], int]], uid: int) -> None:
    assert any(written for written, _ in seen), "the payload never ran: the test proves nothing"
    for written, owner in seen:
        assert owner == uid
        if written:  # empty: its process was killed (the machine stopping) before it wrote
            assert written == [str(uid), str(uid), "refused"], written


@pytest.mark.parametrize("via_launcher", [True, False], ids=["souk-launch", "python"])
async def test_loader_variables_and_shadowing_files_reach_no_root_process(
    api: tuple[Client, Engine],
    worker_settings: WorkerSettings,
    payload: bytes,
    via_launcher: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if via_launcher and launcher.LAUNCHER is None:
        pytest.skip("souk-launch is not built (scripts/setup.sh builds it)")
    if not via_launcher:
        monkeypatch.setattr(launcher, "LAUNCHER", None)
    client, engine = api
    config = {
        "env": {
            "LD_PRELOAD": "./payload.so:libpayload.so",
            "LD_LIBRARY_PATH": ".",
            "GCONV_PATH": ".",
        },
        # libm.so.6 shadows a library of the interpreter's, found first through LD_LIBRARY_PATH
        "files": files({"payload.so": payload, "libpayload.so": payload, "libm.so.6": payload}),
        "processes": [{"exec": ["sh", "-c", "exit 3"]}, {"exec": ["sleep", "600"]}],
        "restart": {"policy": "no"},
    }
    mid = await run_until_stopped(client, "loaded", config)
    uid = app_uid(engine, "loaded")
    assert_ran_as_the_app(payloads(app_users.home(worker_settings.data_dir, "loaded", mid)), uid)


async def test_python_variables_and_modules_in_files_reach_no_root_process(
    api: tuple[Client, Engine], worker_settings: WorkerSettings, secret: Path
) -> None:
    client, engine = api
    code = PAYLOAD_PY.format(secret=str(secret)).encode()
    config = {
        "env": {"PYTHONPATH": ".", "PYTHONSTARTUP": "./startup.py", "PYTHONINSPECT": ""},
        "files": files({"sitecustomize.py": code, "startup.py": code, "json.py": code}),
        "processes": [{"exec": [sys.executable, "-c", "pass"]}, {"exec": ["sleep", "600"]}],
        "restart": {"policy": "no"},
    }
    mid = await run_until_stopped(client, "pythonic", config)
    uid = app_uid(engine, "pythonic")
    assert_ran_as_the_app(payloads(app_users.home(worker_settings.data_dir, "pythonic", mid)), uid)


async def test_exec_hands_the_machines_env_to_no_root_process(
    api: tuple[Client, Engine], worker_settings: WorkerSettings, payload: bytes
) -> None:
    client, engine = api
    config = {
        "init": {"exec": ["sleep", "600"]},
        "env": {"LD_PRELOAD": "./payload.so", "GLIBC_TUNABLES": "glibc.malloc.check=3"},
        "files": files({"payload.so": payload}),
    }
    made = await client.post("/v1/machines", json={"app": "execs", "config": config})
    assert made.status == 201, await made.text()
    mid = (await made.json())["id"]
    await client.get(f"/v1/machines/{mid}/wait", params={"state": "started"})
    home = app_users.home(worker_settings.data_dir, "execs", mid)
    for existing in home.glob("payload-*"):  # the machine's own command's
        existing.unlink()
    ran = await client.post(f"/v1/machines/{mid}/exec", json={"command": ["env"]})
    result = await ran.json()
    assert result["exit_code"] == 0, result
    assert "LD_PRELOAD=./payload.so" in result["stdout"].splitlines()
    assert_ran_as_the_app(payloads(home), app_uid(engine, "execs"))


# -- image machines ---------------------------------------------------------------------------

HOST_LIBS = ("/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2")


@pytest.mark.skipif(
    shutil.which("runc") is None or not all(os.path.exists(p) for p in HOST_LIBS),
    reason="needs runc, and the host's x86-64 libc to put in the image",
)
async def test_an_image_machines_loader_variables_run_as_the_apps_ids(
    registry: Registry, worker_settings: WorkerSettings, payload: bytes
) -> None:
    """A dynamic program in the image loads what the env names, in the container: as its root,
    which is the app's own id on the host, at its start and in an `exec`."""
    dynamic = os.path.realpath(shutil.which("true") or "/bin/true")
    built = busybox_layer().file("bin/dyntrue", Path(dynamic).read_bytes(), 0o755)
    for lib in HOST_LIBS:
        built.file(lib.lstrip("/"), Path(lib).read_bytes(), 0o755)
    async with registry.client() as pusher:
        await push(pusher, registry, "loaded:1", ImageSpec([layer(built.bytes())]))
    s = replace(worker_settings, insecure_registries=(registry.host,))
    config = {
        "image": f"{registry.host}/loaded:1",
        "init": {"exec": ["sh", "-c", "cd / && dyntrue && exec sleep 600"]},
        "env": {"LD_PRELOAD": "/payload.so", "LD_LIBRARY_PATH": "/"},
        "files": files({"/payload.so": payload}),
    }
    async with running(Engine(s, make_driver("process", s))) as engine:
        try:
            async with TestClient(TestServer(make_app(engine))) as client:
                made = await client.post("/v1/machines", json={"app": "imaged", "config": config})
                assert made.status == 201, await made.text()
                mid = (await made.json())["id"]
                await client.get(f"/v1/machines/{mid}/wait", params={"state": "started"})
                ran = await client.post(
                    f"/v1/machines/{mid}/exec", json={"command": ["sh", "-c", "cd / && dyntrue"]}
                )
                assert (await ran.json())["exit_code"] == 0, await ran.text()
                uid = app_uid(engine, "imaged")
                rootfs = app_users.home(s.data_dir, "imaged", mid) / "image" / "rootfs"
                seen = payloads(rootfs)
        finally:
            await destroy_all(engine)
    assert len(seen) == 2, seen  # the start's and the exec's
    for written, owner in seen:
        assert written == ["0", "0", "refused"], written  # root only inside its namespace
        assert owner == uid


async def test_a_machines_processes_outlive_their_worker_and_are_adopted(
    worker_settings: WorkerSettings,
) -> None:
    """souk-launch's supervisor carries the machine's marker: a restarted worker finds it, and
    a stop ends it and every process it started."""
    config = {
        "processes": [{"exec": ["sleep", "600"]}, {"exec": ["sleep", "601"]}],
        "restart": {"policy": "no"},
    }
    engine = Engine(worker_settings, make_driver("process", worker_settings))
    await engine.recover()
    async with TestClient(TestServer(make_app(engine))) as client:
        made = await client.post("/v1/machines", json={"app": "adopted", "config": config})
        assert made.status == 201, await made.text()
        mid = (await made.json())["id"]
        await client.get(f"/v1/machines/{mid}/wait", params={"state": "started"})
    await engine.close()  # the worker dies; the machine lives on

    async with running(Engine(worker_settings, make_driver("process", worker_settings))) as e:
        try:
            async with TestClient(TestServer(make_app(e))) as client:
                ps = await (await client.get(f"/v1/machines/{mid}/ps")).json()
                commands = sorted(" ".join(p["command"].split()[-2:]) for p in ps)
                stopped = await client.post(f"/v1/machines/{mid}/stop")
                assert stopped.status == 200, await stopped.text()
                waited = await client.get(f"/v1/machines/{mid}/wait", params={"state": "stopped"})
                assert waited.status == 200, await waited.text()
                left = await (await client.get(f"/v1/machines/{mid}/ps")).json()
        finally:
            await destroy_all(e)
    assert commands[-2:] == ["sleep 600", "sleep 601"], ps
    assert left == []
