"""Signals the worker was started with ignored, caught instead, so that its machines get them.

An ignored signal stays ignored across fork and exec, so every process a worker starts (a
machine's command, `souk-launch`, `runc` and the container it runs) would inherit what the worker's
own start ignored: SIGHUP under `nohup`, SIGINT and SIGQUIT for a shell's background job. A
machine could then neither trap them (a shell refuses to trap what it was started ignoring) nor
be stopped by them (SIGINT is the default stop signal). A caught signal, by contrast, is reset
to its default at exec: a handler that does nothing keeps the worker as deaf to them as before,
and gives its children the defaults they expect."""

from __future__ import annotations

import signal
import threading
from types import FrameType

# Left as they are: SIGPIPE and SIGXFSZ, which Python ignores itself and `subprocess` restores
# in its children; and the terminal's job control, whose signals, caught rather than ignored,
# would interrupt a background worker's reads and writes on its terminal over and over.
LEFT = frozenset({signal.SIGPIPE, signal.SIGXFSZ, signal.SIGTTIN, signal.SIGTTOU, signal.SIGTSTP})


def _ignore(_signum: int, _frame: FrameType | None) -> None:
    """Still ignored by the worker, but caught: exec resets it for the worker's children."""


def catch_ignored() -> list[int]:
    """Each signal ignored in this process, caught by a handler that does nothing; the ones
    changed. Only the main thread may set handlers: elsewhere, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        return []
    changed: list[int] = []
    for sig in signal.valid_signals():
        if sig in LEFT:
            continue
        try:
            if signal.getsignal(sig) is signal.SIG_IGN:
                signal.signal(sig, _ignore)
                changed.append(int(sig))
        except (OSError, ValueError):  # SIGKILL, SIGSTOP, or one reserved by the C library
            continue
    return changed
