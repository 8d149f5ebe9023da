#!/usr/bin/env bash
# Keeps a copy of Fly's Machines API spec (swagger 2) for the conformance tests
# (tests/conformance/); it is Fly's document, so it is copied or fetched, never kept in the
# repository (the copy is gitignored). A copy beside the checkout (../shared/reference/, or
# FLY_SPEC_FILE) is used first, so machines without network still run the spec checks.
set -euo pipefail
cd "$(dirname "$0")/.."
out=tests/conformance/.fly-openapi.json
local_copy=${FLY_SPEC_FILE:-../shared/reference/fly-machines-openapi.json}
if [ -f "$local_copy" ]; then
    install -m 0644 "$local_copy" "$out.tmp"
    mv "$out.tmp" "$out"
    exit 0
fi
url=${FLY_SPEC_URL:-https://docs.machines.dev/swagger/doc.json}
if curl -fsSL --max-time 30 "$url" -o "$out.tmp"; then
    mv "$out.tmp" "$out"
else
    rm -f "$out.tmp"
    if [ -f "$out" ]; then
        echo "could not fetch Fly's spec from $url; keeping the copy in $out" >&2
    else
        echo "could not fetch Fly's spec from $url; the conformance tests will skip" >&2
    fi
fi
