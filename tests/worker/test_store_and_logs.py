"""The store's group commit and the log files' size budget."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from souk.worker import logs
from souk.worker.store import Commit, Store, Tx


async def test_a_failing_write_rolls_back_alone_within_a_shared_commit(tmp_path: Path) -> None:
    store = Store(tmp_path / "db.sqlite", durable=False)
    commits: list[Commit] = []
    store.listeners.append(commits.append)

    def good(n: int) -> Callable[[Tx], int]:
        def write(tx: Tx) -> int:
            return tx.log("machine", f"m{n}", "create", "reserve", "created")

        return write

    def bad(tx: Tx) -> None:
        tx.log("machine", "bad", "create", "reserve", "created")
        raise ValueError("does not fit")

    results = await asyncio.gather(
        *(store.write(good(n)) for n in range(20)), store.write(bad), return_exceptions=True
    )
    assert isinstance(results[-1], ValueError)
    seqs = sorted(r for r in results[:-1] if isinstance(r, int))
    assert seqs == list(range(1, 21))  # contiguous: the failed write left no hole
    logged = store.read.execute("SELECT resource FROM oplog").fetchall()
    assert "bad" not in {r[0] for r in logged} and len(logged) == 20
    await asyncio.sleep(0.01)
    assert sum(c.last_seq - c.first_seq + 1 for c in commits) == 20
    assert len(commits) < 20  # writes queued during a commit shared the next one
    store.close()


async def test_commits_survive_a_reopen(tmp_path: Path) -> None:
    store = Store(tmp_path / "db.sqlite")
    await store.write(lambda tx: tx.log("worker", "w1", "cordon", "set"))
    store.close()
    again = Store(tmp_path / "db.sqlite")
    assert again.head() == 1
    again.close()


def test_rotation_keeps_logs_within_budget(tmp_path: Path) -> None:
    (tmp_path / "stdout.log").write_bytes(b"x" * 5000)
    logs.rotate_if_large(tmp_path, 1000)
    assert (tmp_path / "stdout.log").stat().st_size == 0
    assert (tmp_path / "stdout.log.1").stat().st_size == 5000
    (tmp_path / "stdout.log").write_bytes(b"y" * 10)
    logs.rotate_if_large(tmp_path, 1000)
    assert (tmp_path / "stdout.log").read_bytes() == b"y" * 10
    assert logs.read_tail(tmp_path, "stdout", 4) == b"yyyy"


@pytest.mark.timeout(10)
async def test_follow_streams_new_output_across_a_rotation(tmp_path: Path) -> None:
    path = tmp_path / "stdout.log"
    path.write_bytes(b"old\n")
    stream = logs.follow(tmp_path, "stdout", poll=0.01)

    async def writer() -> None:
        await asyncio.sleep(0.05)
        with open(path, "ab") as f:
            f.write(b"one\n")
        await asyncio.sleep(0.05)
        logs.rotate_if_large(tmp_path, 1)
        with open(path, "ab") as f:
            f.write(b"two\n")

    task = asyncio.create_task(writer())
    seen = b""
    async for chunk in stream:
        seen += chunk
        if b"two" in seen:
            break
    await task
    assert seen == b"one\ntwo\n"
