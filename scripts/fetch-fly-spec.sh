#!/usr/bin/env bash
# Keeps a copy of Fly's Machines API spec (swagger 2) for the conformance tests
# (tests/conformance/); it is Fly's document, so it is fetched, not kept in the repository.
set -euo pipefail
cd "$(dirname "$0")/.."
out=tests/conformance/.fly-openapi.json
url=${FLY_SPEC_URL:-https://docs.machines.dev/swagger/doc.json}
if curl -fsSL --max-time 30 "$url" -o "$out.tmp"; then
    mv "$out.tmp" "$out"
else
    rm -f "$out.tmp"
    echo "could not fetch Fly's spec from $url; the conformance tests will skip" >&2
fi
