#!/usr/bin/env bash
# Quick start: set up, run a local cluster (`souk dev`: 3 regions x 2 workers and a broker, in one
# process), and the example app on it in two regions. Ctrl-C destroys the app and stops the cluster.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
souk=.venv/bin/souk
data=.souk-dev
rm -rf "$data"
# its own session, so that Ctrl-C reaches this script's cleanup first
setsid $souk dev --data-dir "$data" --listen 127.0.0.1:4280 > "$data.log" 2>&1 &
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
for _ in $(seq 100); do [ -s "$data/token" ] && break; sleep 0.1; done
cat "$data.log"

$souk apps create hello
app=$(realpath examples/hello/app.py)
python=$(realpath .venv/bin/python)
for region in mad ams; do
    $souk machines run -a hello -r "$region" -e PORT=8080 -e GREETING="from $region" \
        -- "$python" "$app"
done
echo
$souk machines list -a hello
for ip in $($souk machines list -a hello --json | .venv/bin/python -c \
        'import json,sys; print(" ".join(m["private_ip"] for m in json.load(sys.stdin)))'); do
    for _ in $(seq 50); do curl -sf "http://$ip:8080/" && break; sleep 0.1; done
done
echo
echo "Broker: http://127.0.0.1:4280 (souk finds the token in $data/token). Try:"
echo "  .venv/bin/souk machines list -a hello"
echo "  .venv/bin/souk machines run -a hello -r sin -- sleep 600"
echo "Ctrl-C stops the cluster."
wait "$dev"
