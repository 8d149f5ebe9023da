"""The test bed by hand (`scripts/fleet.sh`): `up` runs a fleet until Ctrl-C, `soak` runs faults
under load and audits (`scripts/soak.sh`), `down` removes what earlier runs left behind."""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import tempfile
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from rich.console import Console
from rich.table import Table

from souk.broker.tokens import mint
from souk.node.cluster_secret import new_secret, read_secret
from tests.fleet.netbed import BRIDGE, OBSERVER, TABLE, NetBed, clean_leftovers, unavailable
from tests.fleet.parts import MONITOR_PORT, SOUK, Fleet, build
from tests.fleet.soak import FAULTS, Report, soak, write_report


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
    sk = sub.add_parser("soak", help="faults under load for a while, then the audit")
    sk.add_argument("--minutes", type=float, default=5.0, help="how long (default 5)")
    sk.add_argument("--workers", type=int, default=6, help="number of workers (default 6)")
    sk.add_argument("--brokers", type=int, default=2, help="number of brokers (default 2)")
    sk.add_argument("--regions", default="mad,ams", help="regions, dealt to workers in turn")
    sk.add_argument("--faults", default=",".join(FAULTS), help="which faults, comma-separated")
    sk.add_argument("--seed", type=int, default=1, help="the schedule's random seed")
    sk.add_argument(
        "--settle", type=float, default=75.0, help="seconds before the audit (past the 60 s hold)"
    )
    sk.add_argument("--dir", type=Path, help="logs, data and report.json")
    down = sub.add_parser("down", help="remove leftovers of fleets whose owner is gone")
    down.add_argument("--all", action="store_true", help="every skf namespace, owner or not")
    args = parser.parse_args(argv)
    if args.command == "down":
        gone = clean_leftovers(everything=args.all)
        print(f"removed {len(gone)} namespaces" + (f": {' '.join(gone)}" if gone else ""))
        return 0
    if args.command is None:
        args = parser.parse_args(["up", *(argv or sys.argv[1:])])
    if args.command == "soak":
        return run_soak(args)
    return run_up(args)


@contextlib.contextmanager
def running_fleet(
    logs: Path, workers: int, brokers: int, regions: str, driver: str = "process"
) -> Iterator[Fleet]:
    """A fleet started on a new bed, torn down on leaving (Ctrl-C included)."""
    why = unavailable()
    if why:
        raise SystemExit(f"cannot build the test bed: {why}")
    if not 1 <= workers <= 20 or not 1 <= brokers <= 10:
        raise SystemExit("--workers: 1 to 20, --brokers: 1 to 10")
    names = [r for r in regions.split(",") if r]
    logs.mkdir(parents=True, exist_ok=True)
    secret = logs / "secret"
    secret.write_bytes(new_secret() + b"\n")
    token = mint(read_secret(secret), operator=True)
    (logs / "token").write_text(token + "\n")
    bed = NetBed().up()
    dealt = [names[i % len(names)] for i in range(workers)]
    try:
        fleet = build(bed, logs, secret, token, dealt, brokers, driver)
        try:
            fleet.start()
            yield fleet
        finally:
            fleet.close()
    finally:
        bed.down()


def run_soak(args: argparse.Namespace) -> int:
    logs = args.dir or Path(tempfile.mkdtemp(prefix="souk-soak-"))
    print(f"starting {args.workers} workers in {args.regions}, {args.brokers} brokers, 3 nats")
    with running_fleet(logs, args.workers, args.brokers, args.regions) as fleet:
        print(f"fleet up (logs in {logs}); soaking for {args.minutes:g} minutes", flush=True)
        report = soak(
            fleet,
            minutes=args.minutes,
            faults=[f for f in args.faults.split(",") if f],
            seed=args.seed,
            settle=args.settle,
            progress=lambda line: print(line, flush=True),
        )
    write_report(report, logs / "report.json")
    show(report)
    print(f"report: {logs / 'report.json'}")
    return 0 if report.clean else 1


def show(report: Report) -> None:
    console = Console()
    times = sorted(r.converged_in for r in report.rounds if r.converged_in is not None)
    stuck = sum(r.converged_in is None for r in report.rounds)
    faults = Counter(r.kind for r in report.rounds)
    table = Table(
        "figure", "value", title=f"soak: {report.minutes} minutes, {len(report.rounds)} faults"
    )
    table.add_row("acknowledged creates", str(report.acked))
    table.add_row("destroyed by clients", str(report.destroyed))
    table.add_row("creates never answered", str(report.unanswered))
    table.add_row("answers", ", ".join(f"{k}: {v}" for k, v in report.statuses.items()))
    for name in ("lost", "duplicated", "orphaned", "overcommitted"):
        found = getattr(report, name)
        shown = str(len(found)) + (f" ({', '.join(found[:5])})" if found else "")
        table.add_row(name, f"[red]{shown}[/red]" if found else shown)
    if times:
        p50, top = times[len(times) // 2], times[-1]
        table.add_row("time to converge", f"median {p50} s, max {top} s")
    table.add_row("not converged within the bound", str(stuck))
    table.add_row("faults", ", ".join(f"{k} x{v}" for k, v in sorted(faults.items())))
    console.print(table)


def run_up(args: argparse.Namespace) -> int:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    logs = args.dir or Path(tempfile.mkdtemp(prefix="souk-fleet-"))
    with running_fleet(logs, args.workers, args.brokers, args.regions, args.driver) as fleet:
        describe(fleet)
        stop.wait()
        print("\ntearing the fleet down", flush=True)
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
