"""The example app (`examples/hello/app.py`) as a machine: machines that run it are real
processes answering HTTP on `PORT`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

HELLO = Path(__file__).resolve().parents[2] / "examples" / "hello" / "app.py"
PORT = 8080


def hello_config(autostop: bool = True, min_running: int = 0, **extra: Any) -> dict[str, Any]:
    return {
        "init": {"exec": [sys.executable, str(HELLO)]},
        "env": {"PORT": str(PORT)},
        "restart": {"policy": "no"},
        "services": [
            {
                "internal_port": PORT,
                "autostop": "stop" if autostop else "off",
                "min_machines_running": min_running,
            }
        ],
        **extra,
    }
