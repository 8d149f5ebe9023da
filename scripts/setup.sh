#!/usr/bin/env bash
# Installs what souk needs on a fresh Debian machine: system packages and a virtualenv in .venv.
set -euo pipefail
cd "$(dirname "$0")/.."

debs=(nats-server runc iproute2 nftables docker-registry umoci busybox-static chromium e2fsprogs util-linux
      gcc libc6-dev wireguard-go wireguard-tools buildah qemu-system-x86 qemu-utils
      linux-image-cloud-amd64)
missing=()
for pkg in "${debs[@]}"; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "installing Debian packages: ${missing[*]}"
    SUDO=""
    [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    # No recommends: the kernel package is only what the vm driver's guests boot (the worker
    # builds their initramfs itself), so no initramfs generator comes with it.
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
.venv/bin/pip install -q --upgrade pip >/dev/null
.venv/bin/pip install -q -e '.[dev]'
# fly-python-sdk, a Fly client the tests run (tests/clients/): its package pins an httpx older
# than the other clients', and its code runs on either, so it comes without its dependencies.
.venv/bin/pip install -q --no-deps 'fly-python-sdk==0.3.4'

# souk-launch, with which the process driver starts machines (src/souk/worker/drivers/launch.c):
# one static binary beside the interpreter, where the worker looks for it first.
cc -O2 -Wall -Werror -std=c11 -static -o .venv/bin/souk-launch src/souk/worker/drivers/launch.c
# souk-init, PID 1 of the vm driver's guests and of runc containers (src/souk/worker/drivers/init/),
# beside it: one program of that directory's .c files.
cc -O2 -Wall -Werror -std=c11 -static -o .venv/bin/souk-init src/souk/worker/drivers/init/*.c

# A root worker runs machines as their apps' own unprivileged users. The tests' and the
# example's machines run this venv's Python and files of this checkout, so those users must pass
# through (not list) every directory above the interpreter and the checkout. Only a directory
# that does not let them is changed (o+x), and each one is named; SOUK_SETUP_NO_CHMOD=1 changes
# none (then the tests' and the example's machines cannot start). A worker's own data dir needs
# nothing from here: the worker refuses to start, naming the directory, if they cannot reach it.
if [ "$(id -u)" = 0 ] && [ -z "${SOUK_SETUP_NO_CHMOD:-}" ]; then
    base=$(.venv/bin/python -c 'import sys; print(sys.base_prefix)')
    for dir in "$base" "$(pwd)"; do
        while [ "$dir" != / ]; do
            if [ "$(( 0$(stat -c %a "$dir") & 1 ))" = 0 ]; then
                chmod o+x "$dir"
                echo "let apps' users pass through $dir (chmod o+x): machines run this checkout's Python"
            fi
            dir=$(dirname "$dir")
        done
    done
fi

# Fly's spec for the conformance tests: copied from beside the checkout, else fetched
./scripts/fetch-fly-spec.sh || true
