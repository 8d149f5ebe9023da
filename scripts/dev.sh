#!/usr/bin/env bash
# Quick start: set up, run a local cluster (`souk dev`: 3 regions x 2 workers, a broker and a
# proxy, in one process), deploy the example app to two regions with `souk deploy`, and query it
# through the proxy. Ctrl-C destroys the app's machines and stops the cluster.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
souk=$(realpath .venv/bin/souk)
data=.souk-dev
rm -rf "$data"
# its own session, so that Ctrl-C reaches this script's cleanup first
setsid $souk dev --data-dir "$data" --listen 127.0.0.1:4280 --proxy 127.0.0.1:4300 \
    > "$data.log" 2>&1 &
dev=$!
cleanup() {
    for id in $($souk machines list -a hello --json 2>/dev/null | .venv/bin/python -c \
            'import json,sys; print(" ".join(m["id"] for m in json.load(sys.stdin)))'); do
        $souk machines destroy -a hello --force "$id" >/dev/null 2>&1 || true
    done
    kill "$dev" 2>/dev/null || true
    wait "$dev" 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM
for _ in $(seq 100); do [ -s "$data/api" ] && break; sleep 0.1; done
cat "$data.log"
export SOUK_API=http://127.0.0.1:4280 SOUK_TOKEN=$(cat "$data/token")

# One started machine and one stopped standby (on another worker) per region.
(cd examples/hello && $souk deploy)
$souk status -a hello

echo
echo "Through the proxy (header souk-app, or Host: hello.souk.local):"
for _ in 1 2 3 4; do
    curl -sf -H 'souk-app: hello' http://127.0.0.1:4300/
done
echo
echo "Try:"
echo "  curl -H 'souk-app: hello' http://127.0.0.1:4300/"
echo "  (cd examples/hello && ../../.venv/bin/souk deploy)   # a new release, rolled out"
echo "  .venv/bin/souk releases -a hello; .venv/bin/souk rollback -a hello"
echo "  .venv/bin/souk status -a hello   # idle machines stop after 60 s; a request starts one"
echo "Ctrl-C stops the cluster."
wait "$dev"
