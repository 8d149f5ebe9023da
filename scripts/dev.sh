#!/usr/bin/env bash
# Quick start: set up, then run a local worker with the example app on it. Ctrl-C stops everything.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
data=$(mktemp -d)
port=${SOUK_WORKER_PORT:-7100}
setsid .venv/bin/souk worker --name dev1 --region local --listen "127.0.0.1:$port" \
    --data-dir "$data" --cpus 4 --memory-mb 4096 --no-fsync &
worker=$!
api="http://127.0.0.1:$port"
cleanup() {
    # machines outlive their worker by design: destroy them before stopping it
    for id in $(curl -sf "$api/v1/machines" | .venv/bin/python -c \
            'import json,sys; print(" ".join(m["id"] for m in json.load(sys.stdin)))'); do
        curl -sf -X DELETE "$api/v1/machines/$id?force=true" >/dev/null || true
        curl -sf "$api/v1/machines/$id/wait?state=destroyed&timeout=10" >/dev/null || true
    done
    kill $worker 2>/dev/null; wait $worker 2>/dev/null; rm -rf "$data"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
for _ in $(seq 100); do curl -sf "$api/v1/capacity" >/dev/null && break; sleep 0.1; done
app=$(realpath examples/hello/app.py)
machine=$(curl -sf -H 'Content-Type: application/json' "$api/v1/machines" -d "{\"app\": \"hello\",
    \"config\": {\"init\": {\"exec\": [\"$(realpath .venv/bin/python)\", \"$app\"]},
                 \"env\": {\"PORT\": \"8080\"}, \"restart\": {\"policy\": \"always\"}}}")
id=$(echo "$machine" | .venv/bin/python -c 'import json,sys; print(json.load(sys.stdin)["id"])')
ip=$(echo "$machine" | .venv/bin/python -c 'import json,sys; print(json.load(sys.stdin)["private_ip"])')
curl -sf "$api/v1/machines/$id/wait?state=started&timeout=10" >/dev/null
for _ in $(seq 50); do curl -sf "http://$ip:8080/" && break; sleep 0.1; done
echo "worker API:  $api   (try: curl $api/v1/machines)"
echo "example app: http://$ip:8080/   (machine $id)"
echo "Ctrl-C to stop."
wait $worker
