"""The test bed by hand (`scripts/fleet.sh`): `up` runs a fleet until Ctrl-C, `down` removes
what earlier runs left behind."""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import threading
from pathlib import Path

from souk.broker.tokens import mint, new_secret, read_secret
from tests.fleet.netbed import BRIDGE, OBSERVER, TABLE, NetBed, clean_leftovers, unavailable
from tests.fleet.parts import MONITOR_PORT, SOUK, Fleet, build


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/fleet.sh")
    sub = parser.add_subparsers(dest="command")
    up = sub.add_parser("up", help="run a fleet until Ctrl-C (the default)")
    up.add_argument("--workers", type=int, default=2, help="number of workers (default 2)")
    up.add_argument("--brokers", type=int, default=1, help="number of brokers (default 1)")
    up.add_argument(
        "--regions", default="mad", help="comma-separated regions, dealt to workers in turn"
    )
    up.add_argument("--driver", default="process", choices=("process", "sim"))
    up.add_argument("--dir", type=Path, help="logs and data (default: a new temporary dir)")
    down = sub.add_parser("down", help="remove leftovers of fleets whose owner is gone")
    down.add_argument("--all", action="store_true", help="every skf namespace, owner or not")
    args = parser.parse_args(argv)
    if args.command == "down":
        gone = clean_leftovers(everything=args.all)
        print(f"removed {len(gone)} namespaces" + (f": {' '.join(gone)}" if gone else ""))
        return 0
    if args.command is None:
        args = parser.parse_args(["up", *(argv or sys.argv[1:])])
    return run_up(args)


def run_up(args: argparse.Namespace) -> int:
    why = unavailable()
    if why:
        print(f"cannot build the test bed: {why}", file=sys.stderr)
        return 1
    if not 1 <= args.workers <= 20 or not 1 <= args.brokers <= 10:
        print("--workers: 1 to 20, --brokers: 1 to 10", file=sys.stderr)
        return 2
    regions = [r for r in args.regions.split(",") if r]
    logs = args.dir or Path(tempfile.mkdtemp(prefix="souk-fleet-"))
    logs.mkdir(parents=True, exist_ok=True)
    secret = logs / "secret"
    secret.write_bytes(new_secret() + b"\n")
    token = mint(read_secret(secret), operator=True)
    (logs / "token").write_text(token + "\n")
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    bed = NetBed().up()
    dealt = [regions[i % len(regions)] for i in range(args.workers)]
    try:
        fleet = build(bed, logs, secret, token, dealt, args.brokers, args.driver)
        try:
            fleet.start()
            describe(fleet)
            stop.wait()
            print("\ntearing the fleet down", flush=True)
        finally:
            fleet.close()
    finally:
        bed.down()
    return 0


def describe(fleet: Fleet) -> None:
    bed = fleet.bed
    print(f"fleet up: namespaces {bed.run_id}-*, bridge {BRIDGE} in {bed.hub}")
    print(f"logs, data, secret and token in {fleet.logs}")
    for n in fleet.nats:
        print(f"  {n.host:<6} {n.url:<28} monitor http://{n.address}:{MONITOR_PORT}")
    for w in fleet.workers:
        print(f"  {w.host:<6} {w.url:<28} region {w.region}")
    for b in fleet.brokers:
        registry = "hosts the app registry" if b.registry_url is None else ""
        print(f"  {b.host:<6} {b.url:<28} {registry}")
    b = fleet.broker
    print(
        f"\nEverything is reached from the hub's namespace ({OBSERVER} on the bridge):\n"
        f"  export SOUK_API={b.url} SOUK_TOKEN=$(cat {fleet.logs}/token)\n"
        f"  ip netns exec {bed.hub} {SOUK} apps create demo\n"
        f"  ip netns exec {bed.hub} {SOUK} machines run -a demo --region {fleet.workers[0].region}"
        " -- sleep 600\n"
        f"  ip netns exec {bed.hub} {SOUK} catalog status --api $SOUK_API --token $SOUK_TOKEN\n"
        "Faults by hand:\n"
        f"  ip netns exec {bed.hub} ip link set v-w1 down      # w1's cable pulled\n"
        f"  ip netns exec {bed.hub} nft add rule bridge {TABLE} forward"
        f" ip saddr {fleet.workers[0].address} ip daddr {fleet.nats[0].address} drop\n"
        f"  ip netns exec {bed.hub} nft flush chain bridge {TABLE} forward   # heal the drops\n"
        "Ctrl-C tears it all down.",
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
