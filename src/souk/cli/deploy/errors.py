"""Why a deploy stopped: each error carries `details` for --json."""

from __future__ import annotations

from typing import Any


class DeployError(Exception):
    """A deploy stopped; `details` says why, for --json."""

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details


class DeployInProgress(DeployError):
    """Another deploy holds a lease of the app's machines, or its deploy lock."""


class MachineFailed(DeployError):
    """A machine exited or failed while the deploy waited for it; details carry its exit
    code and last log lines."""


class Aborted(DeployError):
    """Another job of the same batch failed first."""
