#!/usr/bin/env bash
# A bounded soak: a fleet in network namespaces (three clustered nats-servers, six workers in two
# regions, two brokers), clients creating and destroying machines through every broker, and a
# seeded schedule of kill -9s and partitions for N minutes; then it prints lost, duplicated,
# orphaned and overcommitted machines and the time to converge after each fault (see
# docs/reliability.md). Exits non-zero if anything was lost, duplicated, orphaned or overcommitted.
#
#   scripts/soak.sh [--minutes 5] [--workers 6] [--brokers 2] [--regions mad,ams]
#                   [--faults kill-worker,kill-broker,...] [--seed 1] [--dir DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then
    echo "soak.sh needs root: it creates network namespaces" >&2
    exit 1
fi
[ -x .venv/bin/souk ] && command -v nft >/dev/null || ./scripts/setup.sh
exec .venv/bin/python -m tests.fleet soak "$@"
