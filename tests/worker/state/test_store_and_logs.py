"""The store's group commit and the log files' size budget."""

from __future__ import annotations

import asyncio
import errno
from collections.abc import Callable
from pathlib import Path

import pytest

from souk.worker.errors import StorageFault
from souk.worker.host import logs
from souk.worker.state.store import Commit, Store, Tx


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


def test_a_sweep_rotates_every_machine_past_one_that_fails(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    logs.rotate_all(tmp_path / "machines", 1000)  # none yet: nothing to do, nothing raised
    for name in ("a", "c"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "stdout.log").write_bytes(b"x" * 5000)
    (tmp_path / "b").write_text("not a directory")  # its files cannot be reached
    logs.rotate_all(tmp_path, 1000)
    for name in ("a", "c"):
        assert (tmp_path / name / "stdout.log").stat().st_size == 0
        assert (tmp_path / name / "stdout.log.1").stat().st_size == 5000
    assert "rotating the logs in" in caplog.text and "/b:" in caplog.text


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


def logs_one(resource: str) -> Callable[[Tx], int]:
    return lambda tx: tx.log("machine", resource, "create", "reserve", "created")


async def test_a_deferred_commit_is_announced_with_the_durable_one_after_it(
    tmp_path: Path,
) -> None:
    store = Store(tmp_path / "db.sqlite")
    commits: list[Commit] = []
    store.listeners.append(commits.append)
    await store.write(logs_one("m0"))
    await asyncio.sleep(0.01)
    assert store.head() == 1 and len(commits) == 1
    await store.write(logs_one("m1"), durable=False)
    mark = store.commits
    await asyncio.sleep(0.01)
    assert store.unsynced
    assert store.head() == 1  # not durable yet: not counted, and announced to nobody
    assert len(commits) == 1
    assert store.read.execute("SELECT COUNT(*) FROM oplog").fetchone()[0] == 2  # but committed
    await store.write(logs_one("m2"))  # durable: the deferred commit with it
    await store.synced(mark)  # at once: durable already
    await asyncio.sleep(0.01)
    assert not store.unsynced and store.head() == 3
    assert commits[1] == Commit(2, 3, frozenset({("machine", "m1"), ("machine", "m2")}))
    store.close()


async def test_a_deferred_commit_is_made_durable_on_request_or_by_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Store(tmp_path / "db.sqlite")
    commits: list[Commit] = []
    store.listeners.append(commits.append)
    await store.write(logs_one("m1"), durable=False)
    await store.synced()  # no durable write follows: the writer fsyncs the log itself
    await asyncio.sleep(0.01)
    assert not store.unsynced and store.head() == 1
    assert [c.touched for c in commits] == [frozenset({("machine", "m1")})]

    monkeypatch.setattr("souk.worker.state.store.SYNC_WITHIN", 0.05)
    await store.write(logs_one("m2"), durable=False)
    assert store.unsynced
    for _ in range(100):  # nobody asks: it is made durable within SYNC_WITHIN all the same
        if not store.unsynced:
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.01)
    assert not store.unsynced and store.head() == 2 and len(commits) == 2
    store.close()


async def test_a_store_without_fsync_groups_its_announcements_as_one_with_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """So that a worker run with `--no-fsync` (and every benchmark's) publishes the catalog
    batches a durable one does: a create and its start's spawn as one."""
    store = Store(tmp_path / "db.sqlite", durable=False)
    monkeypatch.setattr(store, "_fsync_log", lambda: pytest.fail("fsync without durability"))
    commits: list[Commit] = []
    store.listeners.append(commits.append)
    await store.write(logs_one("m1"), durable=False)
    await asyncio.sleep(0.01)
    assert store.unsynced and store.head() == 0 and commits == []
    await store.write(logs_one("m2"))
    await store.write(logs_one("m3"), durable=False)
    await store.synced()
    await asyncio.sleep(0.01)
    assert not store.unsynced and store.head() == 3
    assert [(c.first_seq, c.last_seq) for c in commits] == [(1, 2), (3, 3)]
    store.close()


async def test_a_failed_sync_leaves_the_deferred_commit_to_be_synced_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Store(tmp_path / "db.sqlite")
    await store.write(logs_one("m1"), durable=False)
    real, calls = store._fsync_log, []

    def fails_once() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise OSError(errno.EIO, "I/O error")
        real()

    monkeypatch.setattr(store, "_fsync_log", fails_once)
    with pytest.raises((OSError, StorageFault)):
        await store.synced()
    assert store.unsynced and store.head() == 0
    await store.synced()
    assert not store.unsynced and store.head() == 1 and len(calls) == 2
    store.close()
