#!/usr/bin/env bash
# Installs what souk needs on a fresh Debian machine: system packages and a virtualenv in .venv.
set -euo pipefail
cd "$(dirname "$0")/.."

debs=(nats-server runc iproute2 nftables docker-registry umoci busybox-static)
missing=()
for pkg in "${debs[@]}"; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "installing Debian packages: ${missing[*]}"
    SUDO=""
    [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
.venv/bin/pip install -q --upgrade pip >/dev/null
.venv/bin/pip install -q -e '.[dev]'
