#!/usr/bin/env bash
# The test command: sets up what is missing, then runs the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/pytest ] || ./scripts/setup.sh
exec .venv/bin/pytest -q -p no:cacheprovider "$@"
