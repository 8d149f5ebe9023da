"""Each app's own identity on a worker's host, and the directories it may reach.

Without one, every machine would run as the worker (root): any app could read the worker's
database, other apps' files and the host's secrets, and signal any process. So a root worker runs
each app's machines under host ids of the app's own: the first time one of its machines starts
here, the app gets the next *slot*, and slot n owns the ids `BASE + n * SPAN` up to `SPAN` ids
further. The first of them is the uid and gid its host commands run as, and the one its
containers' root is mapped to (the rest of the span maps the container's other ids). Slots are kept
in the worker's database, logged in its operations log, and never given to another app, so a
restarted worker runs an app as the same ids, which still own its files.

The data directory is laid out so that a machine reaches its own directory and nothing else:

    <data dir>/              0711 root   traversable, not listable
      worker.db, machines/, images/, ...  no access for group or others (swept before each start)
      volumes/<id>/          0711 root   a volume: its disk file and snapshots (0600, 0700)
        mnt/                 0700 <app uid>, once a machine mounts it (volume_disk.py)
      apps/                  0711 root
        <app>/               0710 root:<app gid>   only the app (and root) get through
          <machine>/         0700 <app uid>  a host command's home and working directory, or
                             0710 root:<app gid> for an image machine (its root filesystem)

The app's own directory is root's, not the app's, because the worker (root) creates, mounts and
removes paths below it: an app that could rename its entries could point them anywhere on the host.
A worker that is not root runs machines as itself, as it must: it has no other ids to give.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import stat
from dataclasses import replace
from pathlib import Path

from souk.models.base import APP_NAME
from souk.worker.drivers.base import Launch
from souk.worker.host.identity import HostUser
from souk.worker.state import queries
from souk.worker.state.store import Store, Tx, now_iso

BASE = 200_000
SPAN = 65_536  # a container's ids 0..65535: every id an image's files normally use
LAST_ID = 2**32 - 2  # (uid_t) -1 means "leave unchanged" to chown and setresuid
APPS = "apps"
VOLUMES = "volumes"  # traversable (0711): each volume's mount point is its app's own
_swept: dict[Path, tuple[int, int, int]] = {}  # data dirs as they were when last swept


class NoIdsLeft(RuntimeError):
    """Every slot of the host's id space has been given to an app."""


def host_user_for(tx: Tx, app: str) -> tuple[int, int]:
    """The app's uid and gid on this host, allocated (and logged) on first use."""
    found = queries.app_user(tx, app)
    if found is not None:
        return found
    last = queries.last_app_slot(tx)
    slot = 0 if last is None else last + 1
    uid = BASE + slot * SPAN
    if uid + SPAN - 1 > LAST_ID:
        raise NoIdsLeft(f"no host ids left for app {app}: {slot} apps have run on this worker")
    queries.insert_app_user(tx, app, slot, uid, uid, now_iso())
    tx.log("app", app, "host_user", "allocated", data={"uid": uid, "gid": uid, "span": SPAN})
    return uid, uid


def lookup(conn: sqlite3.Connection, app: str) -> tuple[int, int] | None:
    """The app's ids if it has some already: a read, so that a start costs no extra commit."""
    return queries.app_user(conn, app)


def home(data_dir: Path, app: str, machine_id: str) -> Path:
    """The machine's own directory, below its app's."""
    if not APP_NAME.match(app) or not machine_id.isalnum():
        raise ValueError(f"not an app and machine name: {app!r}, {machine_id!r}")
    return data_dir / APPS / app / machine_id


def secure(data_dir: Path) -> None:
    """Close the data directory to everyone but the worker, except the way to `apps/`.

    Checked before every start rather than set once, so that whatever appeared at the top since
    (a new cache directory, SQLite's side files) is closed before any machine runs again; the
    directory's mtime says whether anything did."""
    st = os.lstat(data_dir)
    if _swept.get(data_dir) == (st.st_ino, st.st_mtime_ns, stat.S_IMODE(st.st_mode)):
        return
    _set_mode(data_dir, 0o711, st)
    for entry in os.scandir(data_dir):
        if entry.name in (APPS, VOLUMES) or entry.is_symlink():
            continue
        try:
            mode = stat.S_IMODE(entry.stat(follow_symlinks=False).st_mode)
            if mode & 0o077:
                os.chmod(entry.path, mode & 0o700)
        except FileNotFoundError:  # gone meanwhile (a journal SQLite removed)
            continue
    _make_dir(data_dir / APPS, 0o711, os.geteuid(), os.getegid())
    # As it was before the sweep: anything added meanwhile makes the next start look again.
    _swept[data_dir] = (st.st_ino, st.st_mtime_ns, 0o711)


async def assign(store: Store, data_dir: Path, launch: Launch) -> Launch:
    """The launch with its machine's directory made and, on a root worker, the app's ids."""
    secure(data_dir)
    _make_dir(launch.rundir.parent, 0o700, os.geteuid(), os.getegid())
    _make_dir(launch.rundir, 0o700, os.geteuid(), os.getegid())
    user: HostUser | None = None
    if os.geteuid() == 0:
        ids = lookup(store.read, launch.app)
        if ids is None:
            ids = await store.write(lambda tx: host_user_for(tx, launch.app))
        user = HostUser(ids[0], ids[1], SPAN)
    mine = home(data_dir, launch.app, launch.machine_id)
    make_home(mine, user, image=bool(launch.config.image))
    return replace(launch, home=mine, user=user)


def make_home(path: Path, user: HostUser | None, image: bool) -> None:
    """The app's directory and the machine's in it, owned as the module's docstring says.

    A machine's directory changes hands when a host command becomes an image (or back): it is
    emptied then, so that nothing the app left in it is ever followed by root."""
    worker = (os.geteuid(), os.getegid())
    uid, gid = (user.uid, user.gid) if user is not None else worker
    _make_dir(path.parent, 0o710, worker[0], gid)
    want = (worker[0], gid, 0o710) if image else (uid, gid, 0o700)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISDIR(st.st_mode) or (st.st_uid, st.st_gid) != want[:2]:
            _remove(path)
    _make_dir(path, want[2], want[0], want[1])


def remove_home(path: Path | None) -> None:
    if path is not None:
        _remove(path)


def _remove(path: Path) -> None:
    """Remove without following anything the app may have put there."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _make_dir(path: Path, mode: int, uid: int, gid: int) -> None:
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(f"{path} is not a directory")
    if (st.st_uid, st.st_gid) != (uid, gid):
        os.chown(path, uid, gid, follow_symlinks=False)
    _set_mode(path, mode, st)


def _set_mode(path: Path, mode: int, st: os.stat_result | None = None) -> None:
    st = st or os.lstat(path)
    if stat.S_IMODE(st.st_mode) != mode:
        os.chmod(path, mode)  # a directory, lstat says: no link to follow


def closed_above(data_dir: Path) -> Path | None:
    """The first directory above `data_dir` that the apps' users cannot pass through (no
    search bit for others), or None. A root worker runs machines as ids of their own, whose
    homes are below the data dir: behind such a directory every machine would fail to start,
    so the worker refuses to start instead (the data dir itself it makes 0711)."""
    for folder in reversed(data_dir.absolute().parents):
        try:
            mode = os.stat(folder).st_mode
        except (FileNotFoundError, NotADirectoryError):
            return None  # made by the worker, with the modes it sets (or it says why not)
        if not stat.S_ISDIR(mode):
            return None  # not a directory: the worker's own check of its data dir says so
        if not mode & stat.S_IXOTH:
            return folder
    return None
