"""Whether this run checked bodies against Fly's own spec (see fly_spec.py)."""

from __future__ import annotations

from tests.conformance import fly_spec


def test_flys_spec_is_at_hand() -> None:
    definitions = fly_spec.definitions()  # skips, saying why, without a copy
    assert {"Machine", "MachineEvent", "fly.MachineConfig"} <= set(definitions)
