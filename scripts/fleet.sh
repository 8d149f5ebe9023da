#!/usr/bin/env bash
# A souk fleet across network namespaces, by hand: three clustered nats-servers, N workers and
# M brokers, each the real program in a namespace of its own on one bridge (see
# docs/reliability.md). Prints the addresses and runs until Ctrl-C, which tears it all down.
#
#   scripts/fleet.sh [up] [--workers N] [--brokers M] [--regions mad,ams] [--driver sim]
#   scripts/fleet.sh down [--all]   # remove leftovers (--all: also fleets still running)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then
    echo "fleet.sh needs root: it creates network namespaces" >&2
    exit 1
fi
[ -x .venv/bin/souk ] && command -v nft >/dev/null || ./scripts/setup.sh
case "${1:-up}" in
    up | down) ;;
    -*) set -- up "$@" ;;
    *)
        echo "usage: scripts/fleet.sh [up|down] [options]; scripts/fleet.sh up --help" >&2
        exit 2
        ;;
esac
[ $# -gt 0 ] || set -- up
exec .venv/bin/python -m tests.fleet "$@"
