"""Several processes in one machine (Fly's `processes`), for the process driver.

The driver runs this file as the machine's one process (its handle, in the machine's process
group and cgroup, which it joins before it runs), with the processes to run in
`SOUK_PROCESSES`: each its own command, environment and host ids. It imports only the standard
library, so it runs as a script wherever the interpreter is, whatever the machine's
environment. It starts them all, and exits when the first of them does, with that one's
status, after asking the others to stop: a machine is up while all its processes are.
Signals the machine is sent reach every process through the process group; this one only
waits.

It is what runs them where `souk-launch` (whose `--processes` does the same in C) is not built,
always as the app's own user: it is Python, which reads its environment and finds its modules
in ways a machine's config could steer, so it never runs as root. It changes ids only if given
some while root, which the driver never asks of it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

SPEC_ENV = "SOUK_PROCESSES"
GRACE = 10.0  # seconds the other processes get to exit once the first has


def _status(code: int) -> int:
    """A shell's view of a child's return code: 128 + n for death by signal n."""
    return 128 - code if code < 0 else code


def _start(spec: dict[str, Any]) -> subprocess.Popen[bytes]:
    ids: dict[str, Any] = {}
    if spec.get("uid") is not None and os.geteuid() == 0:
        ids = {"user": spec["uid"], "group": spec["gid"], "extra_groups": []}
    return subprocess.Popen(spec["argv"], env=spec["env"], stdin=subprocess.DEVNULL, **ids)


def main() -> int:
    specs: list[dict[str, Any]] = json.loads(os.environ.pop(SPEC_ENV))
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, lambda *_: None)  # the group's processes get it; we wait for them
    children: list[subprocess.Popen[bytes]] = []
    try:
        children = [_start(spec) for spec in specs]
    except OSError as exc:
        print(f"souk: cannot start a process: {exc}", file=sys.stderr, flush=True)
        first = 127
    else:
        first = _status(_first_exit(children))
    for child in children:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + GRACE
    for child in children:
        try:
            child.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
    return first


def _first_exit(children: list[subprocess.Popen[bytes]]) -> int:
    by_pid = {child.pid: child for child in children}
    while True:
        pid, status = os.wait()
        if pid in by_pid:
            by_pid[pid].returncode = os.waitstatus_to_exitcode(status)
            return by_pid[pid].returncode


if __name__ == "__main__":
    sys.exit(main())
