#!/usr/bin/env bash
# The test command: sets up what is missing, then runs the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python -c "import xdist" 2>/dev/null || ./scripts/setup.sh  # a new dependency too
# Two processes, each taking whole test files: most tests wait on processes, sockets and fsync
# rather than on the CPU, and a file's tests share their fixtures.
exec .venv/bin/pytest -q -p no:cacheprovider -n 2 --dist loadfile "$@"
