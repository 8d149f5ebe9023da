"""Who an app's machines run as on the host: an app's identity, which the drivers, the image
code (a root filesystem owned by it, a user namespace mapped to it) and the app users' registry
(`app_users.py`, which gives it out) all name. It imports nothing of the worker's, so each of
them may."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HostUser:
    """The host identity an app's machines run as: `uid`/`gid` for host commands, and the `span`
    of ids from there that a container's user namespace maps (its root is `uid` on the host)."""

    uid: int
    gid: int
    span: int
