"""The soak's own check, short: a few faults under load on the session's fleet, then the audit
that `scripts/soak.sh` prints. The long runs and their figures are in docs/reliability.md."""

from __future__ import annotations

import pytest

from tests.fleet.parts import Fleet
from tests.fleet.soak import FAULTS, soak

pytestmark = pytest.mark.integration


def test_a_short_soak_loses_duplicates_orphans_and_overcommits_nothing(fleet: Fleet) -> None:
    lines: list[str] = []
    report = soak(
        fleet,
        rounds=3,
        # Faults whose lost answers the broker cleans up at once; a client that gives up on a
        # killed broker leaves its machine to the 60 s provisional hold, longer than this test.
        faults=["kill-worker", "worker-off-bus"],
        hold=(1.0, 2.0),
        settle=5.0,
        progress=lines.append,
    )
    assert len(report.rounds) == 3 and len(lines) == 4  # a line per fault, one for the audit
    assert report.acked > 0
    assert all(r.converged_in is not None for r in report.rounds), report.rounds
    assert (report.lost, report.duplicated, report.orphaned, report.overcommitted) == (
        [],
        [],
        [],
        [],
    ), report


def test_an_unknown_fault_is_refused_before_anything_runs(fleet: Fleet) -> None:
    with pytest.raises(ValueError, match="unknown faults"):
        soak(fleet, rounds=1, faults=["kill-everything"])
    assert "kill-worker" in FAULTS
