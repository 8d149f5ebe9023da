"""`python -m tests.fuzz`: fuzz the broker and one worker of a fresh small cluster with
schemathesis, and print what it found. scripts/fuzz.sh runs it with bigger bounds."""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

from tests.fuzz.cluster import BROKER_EXCLUDED, config, fuzz_cluster, schemathesis


async def fuzz(
    max_examples: int, max_time: float | None, report: Path | None, seed: int | None
) -> bool:
    with tempfile.TemporaryDirectory(prefix="souk-fuzz-") as tmp:
        async with fuzz_cluster(Path(tmp)) as cluster:
            worker = next(iter(cluster.workers.values()))  # the one with the machine
            seeded = config(Path(tmp) / "schemathesis.toml", cluster.app, cluster.machine)
            outcomes = [
                await schemathesis(
                    "broker",
                    cluster.broker,
                    cluster.token,
                    max_examples,
                    max_time,
                    report=report,
                    config_file=seeded,
                    excluded=BROKER_EXCLUDED,
                    seed=seed,
                ),
                # a worker without TLS checks no caller: no token to send
                await schemathesis(
                    "worker",
                    worker,
                    None,
                    max_examples,
                    max_time,
                    report=report,
                    config_file=seeded,
                    seed=seed,
                ),
            ]
    for outcome in outcomes:
        print(f"=== {outcome.target}: {'ok' if outcome.ok else 'FAILED'}")
        print(outcome.output if not outcome.ok else outcome.summary())
    return all(o.ok for o in outcomes)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz")
    parser.add_argument("--max-examples", type=int, default=50, help="cases per operation")
    parser.add_argument("--max-time", type=float, default=None, help="seconds per server")
    parser.add_argument("--report", type=Path, default=None, help="write ndjson reports here")
    parser.add_argument("--seed", type=int, default=None, help="replay a run (its 'Seed:')")
    args = parser.parse_args()
    clean = asyncio.run(fuzz(args.max_examples, args.max_time, args.report, args.seed))
    sys.exit(0 if clean else 1)


if __name__ == "__main__":
    main()
