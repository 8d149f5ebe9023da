"""The fuzz setup of scripts/fuzz.sh, on a small budget: schemathesis reaches both documents,
runs its checks against both servers and finds nothing. The real run is scripts/fuzz.sh."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fuzz.cluster import BROKER_EXCLUDED, config, fuzz_cluster, schemathesis

pytestmark = pytest.mark.integration

EXAMPLES = 2  # per operation
SEED = 1  # the same cases on every run: CI checks the setup, scripts/fuzz.sh explores
PHASES = ("examples", "fuzzing")  # not the coverage phase: it alone sends ~40 cases per operation


async def test_a_short_fuzz_finds_nothing_on_the_broker_and_a_worker(tmp_path: Path) -> None:
    async with fuzz_cluster(tmp_path / "cluster") as cluster:
        seeded = config(tmp_path / "schemathesis.toml", cluster.app, cluster.machine)
        broker = await schemathesis(
            "broker",
            cluster.broker,
            cluster.token,
            EXAMPLES,
            phases=PHASES,
            config_file=seeded,
            excluded=BROKER_EXCLUDED,
            seed=SEED,
        )
        worker_url = next(iter(cluster.workers.values()))
        worker = await schemathesis(
            "worker", worker_url, None, EXAMPLES, phases=PHASES, config_file=seeded, seed=SEED
        )
    for outcome in (broker, worker):
        assert outcome.ok, outcome.output
        # it did test: the operations of the document, with the token accepted
        assert "passed" in outcome.output and "Authentication failed" not in outcome.output
