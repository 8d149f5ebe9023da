"""A deploy's steps as they happen: on stderr (Rich) for a person, kept as a list for --json."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console

from souk.cli.command import console as stderr_console


class Progress:
    def __init__(self, quiet: bool = False, console: Console | None = None) -> None:
        self.quiet = quiet
        self.console = console or stderr_console(stderr=True)
        self.started = time.monotonic()
        self.events: list[dict[str, Any]] = []

    def step(self, text: str, **data: Any) -> None:
        elapsed = time.monotonic() - self.started
        self.events.append({"t": round(elapsed, 3), "step": text, **data})
        if not self.quiet:
            self.console.print(f"[dim]{elapsed:6.1f}s[/dim] {text}")

    def warn(self, text: str) -> None:
        self.events.append({"t": round(time.monotonic() - self.started, 3), "warning": text})
        if not self.quiet:
            self.console.print(f"[yellow]warning:[/yellow] {text}")
