"""In-process workers: a real engine and store on a temporary directory."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from souk.worker.daemon import make_driver, running
from souk.worker.engine import Engine
from souk.worker.settings import WorkerSettings
from souk.worker.state import queries


def settings(tmp_path: Path, **overrides: Any) -> WorkerSettings:
    """A small worker (w1 in mad, 4 cpus, 4 GiB) without fsync; `overrides` replace fields."""
    base = WorkerSettings(
        name="w1", region="mad", data_dir=tmp_path / "w1", cpus=4, memory_mb=4096, durable=False
    )
    return dataclasses.replace(base, **overrides)


async def destroy_all(engine: Engine) -> None:
    """Machines outlive their worker: take them down with it (leased ones with their nonce)."""
    for found in engine.machines():
        held = queries.lease(engine.store.read, found.id)
        nonce = held.nonce if held is not None else None
        await engine.submit(found.id, "destroy", {"force": True}, nonce)
    for found in engine.machines():
        await engine.wait(found.id, "destroyed", 15, None)


@contextlib.asynccontextmanager
async def engine(tmp_path: Path, driver: str = "process") -> AsyncIterator[Engine]:
    """A started engine with the default `settings`; its machines destroyed and the engine
    stopped on the way out."""
    s = settings(tmp_path)
    async with running(Engine(s, make_driver(driver, s))) as e:
        try:
            yield e
        finally:
            await destroy_all(e)
