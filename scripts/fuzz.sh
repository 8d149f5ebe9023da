#!/usr/bin/env bash
# Fuzz the Machines API and the worker API from their own /openapi.json with schemathesis: a
# small cluster on loopback (sim-driver workers, a broker, an app and a machine to aim at), an
# operator token for the broker, the worker reached directly over plain HTTP. Fails on any 5xx
# and on any answer the document does not describe; prints schemathesis's summary per server.
#
#   scripts/fuzz.sh [--max-examples N] [--max-time SECONDS] [--report DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/st ] || ./scripts/setup.sh
export PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec .venv/bin/python -m tests.fuzz "$@"
