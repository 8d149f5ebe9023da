"""`souk dev`: a whole cluster in one process on loopback, the way a user first meets souk.

Every part is the real one, wired as in a multi-host deployment, except that the bus is the
in-process one instead of NATS: six workers (three regions of two) publishing to the catalog and
answering offers, a broker hosting the app registry, and a proxy with its own replica.

With `secure`, it is wired as a cluster across hosts should be: a CA of its own in the data dir
(kept across runs), a certificate for every part, workers serving mutual TLS only, the broker
reaching them with its own certificate, and the broker and proxy serving HTTPS. The catalog is
signed as well: each worker signs its rows with its key, the broker the app registry's, and the
broker's and proxy's replicas apply nothing the cluster CA's certificates do not vouch for. Only
the bus itself stays in-process, with no network side to secure.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from souk import heap
from souk.broker.runtime import BrokerSettings, broker_site
from souk.broker.tokens import mint
from souk.catalog.bus import Bus, InProcessBus
from souk.catalog.node import NodeKey, ca_trust
from souk.catalog.replica import following
from souk.dev_images import REGISTRY_FILE, ensure_base_image, image_registry
from souk.models.machine import CpuKind
from souk.node.cluster_secret import kept_secret
from souk.node.signals import on_signals
from souk.node.site import served
from souk.pki import NodeFiles, init_ca, issue_files
from souk.pki.files import CA_CERT, CA_KEY
from souk.pki.public import init_public_ca, issue_public
from souk.proxy.server import ProxySettings, proxy_site
from souk.secret_files import write_file, write_secret
from souk.web.listener import DEFAULT_LIMITS, Limits
from souk.web.tls import ServerCert
from souk.worker import names
from souk.worker.daemon import make_app as make_worker_app
from souk.worker.daemon import make_driver, offering, publishing, running, tls_context
from souk.worker.engine import Engine
from souk.worker.errors import WorkerError
from souk.worker.settings import WorkerSettings
from souk.worker.volumes import disk as volume_disk

REGIONS = ("mad", "ams", "sin")
CPU_KINDS: tuple[CpuKind, ...] = ("shared", "performance")
END_BOUND = 15.0  # seconds a stopping `souk dev` gives its machines' forced destroys
TRUST = "trust.crt"  # in the dev PKI's directory: the cluster CA and the public CA, for clients
log = logging.getLogger("souk.dev")


@dataclass(frozen=True)
class DevCluster:
    api: str  # the broker's URL
    token: str  # an operator token
    proxy: str  # the proxy's URL
    domain: str
    workers: dict[str, str]  # id -> URL
    ca: Path | None = None  # secure: the CA every part's certificate is checked against
    operator: NodeFiles | None = None  # secure: a certificate that may call any worker route
    engines: tuple[Engine, ...] = field(default=(), repr=False)  # its workers', for ending
    image_registry: str | None = None  # HOST:PORT its workers pull from, a build pushes to


class DevPki:
    """`souk dev --secure`'s CA, in DIR/ca (kept across runs, so a CA file handed to a client
    stays good), and fresh certificates for its parts in DIR/NAME, keys 0600."""

    def __init__(self, root: Path, host: str) -> None:
        self.root = root
        self.sans = sorted({host, "127.0.0.1", "localhost"})
        if not (root / "ca" / CA_KEY).exists():
            init_ca(root / "ca", "souk dev CA")
        public_ca = init_public_ca(root / "public-ca", "souk dev public CA")
        # what a client of the broker or the proxy trusts: both CAs, one file (`--ca`)
        bundle = (root / "ca" / CA_CERT).read_bytes() + public_ca.read_bytes()
        write_file(self.ca, bundle, mode=0o644)

    @property
    def ca(self) -> Path:
        return self.root / TRUST

    def issue(self, role: str, name: str) -> NodeFiles:
        out = self.root / name
        files, _ = issue_files(self.root / "ca", out, role, name, self.sans, force=True)
        return files

    def public(self, name: str) -> ServerCert:
        """An ECDSA certificate for a public listener (the broker's, the proxy's), which
        browsers take: the cluster's Ed25519 ones they refuse at the handshake."""
        cert, key = issue_public(
            self.root / "public-ca", self.root / f"{name}-public", name, self.sans
        )
        return ServerCert(cert, key)


async def _start_worker(
    stack: contextlib.AsyncExitStack,
    bus: Bus,
    settings: WorkerSettings,
    driver: str,
    host: str,
    tls: NodeFiles | None,
    limits: Limits,
) -> tuple[Engine, str]:
    """A worker served on a free port, on `stack`; its engine and URL."""
    engine = await stack.enter_async_context(
        running(Engine(settings, make_driver(driver, settings)))
    )
    ctx = tls_context(tls) if tls is not None else None
    app = make_worker_app(engine, secure=tls is not None)
    url = await stack.enter_async_context(served(app, host, 0, ssl_context=ctx, limits=limits))
    signer = NodeKey(tls) if tls is not None else None
    await stack.enter_async_context(publishing(engine, bus, url, signer))
    await stack.enter_async_context(offering(engine, bus))
    return engine, url


@contextlib.asynccontextmanager
async def dev_cluster(
    data_dir: Path,
    host: str = "127.0.0.1",
    port: int = 4280,
    proxy_port: int = 4300,
    driver: str = "process",
    cpus: int = 4,
    memory_mb: int = 4096,
    idle_timeout: float = 60.0,
    secure: bool = False,
    insecure_registries: tuple[str, ...] = (),
    disk_mb: int | None = None,
    limits: Limits = DEFAULT_LIMITS,
    image_registry_port: int | None = None,
) -> AsyncIterator[DevCluster]:
    """Every worker offers both CPU kinds (`shared` and `performance`): clients that ask for
    either, as Fly's clients do by default, are placed; `insecure_registries` (host[:port]) are
    pulled from over plain http, as a worker's `--insecure-registry`. With `disk_mb`, each
    worker offers that much disk to volumes; at the end every volume is unmounted and its loop
    device let go (the files stay, mounted again by the next run on this data dir). With
    `image_registry_port`, an image registry on it (0: any port), its workers' to pull from and
    `souk deploy`'s to push a Dockerfile's build to (`souk.dev_images`)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    secret = kept_secret(data_dir / "secret")
    pki = DevPki(data_dir / "tls", host) if secure else None
    async with contextlib.AsyncExitStack() as stack:
        images = None
        (data_dir / REGISTRY_FILE).unlink(missing_ok=True)
        if image_registry_port is not None:
            registry_at = image_registry(data_dir / "image-registry", host, image_registry_port)
            images = await stack.enter_async_context(registry_at)
        if images is not None:
            insecure_registries = (*insecure_registries, images)
            if driver != "sim" and os.geteuid() == 0:
                await ensure_base_image()  # for FROM localhost/busybox, with no internet
        bus = InProcessBus()
        stack.push_async_callback(bus.close)
        workers: dict[str, str] = {}
        engines: list[Engine] = []
        if disk_mb:  # after every worker has stopped
            for region in REGIONS:
                for n in (1, 2):
                    folder = data_dir / "workers" / f"{region}{n}"
                    stack.callback(volume_disk.release_all, folder)
        for region in REGIONS:
            for n in (1, 2):
                name = f"{region}{n}"
                settings = WorkerSettings(
                    name=name,
                    region=region,
                    data_dir=data_dir / "workers" / name,
                    cpus=cpus,
                    memory_mb=memory_mb,
                    cpu_kinds=CPU_KINDS,
                    durable=False,
                    insecure_registries=insecure_registries,
                    disk_mb=disk_mb or None,
                )
                tls = pki.issue("worker", name) if pki else None
                engine, workers[name] = await _start_worker(
                    stack, bus, settings, driver, host, tls, limits
                )
                engines.append(engine)
        # One host: its first worker answers the machines' names for all (docs/network.md).
        await stack.enter_async_context(names.answering(engines[0].settings, bus))
        # after the broker and proxy have closed (nothing starts machines any more), before the
        # workers do
        stack.push_async_callback(end_machines, engines)
        broker_tls = pki.issue("broker", "broker") if pki else None
        opts = BrokerSettings(
            host=host,
            port=port,
            secret=secret,
            workers=list(workers.values()),
            registry_dir=data_dir / "registry",
            tls=broker_tls,
            listener=pki.public("broker") if pki else None,
            limits=limits,
        )
        api = await stack.enter_async_context(broker_site(opts, bus))
        token = mint(secret, operator=True)
        proxy_tls = pki.issue("proxy", "proxy") if pki else None
        trust = ca_trust(proxy_tls) if proxy_tls else None
        replica = await stack.enter_async_context(following(bus, bootstrap=False, trust=trust))
        proxy_opts = ProxySettings(
            host=host,
            port=proxy_port,
            api=api,
            token=token,
            idle_timeout=idle_timeout,
            ca=pki.ca if pki else None,
            listener=pki.public("proxy") if pki else None,
            tls=proxy_tls,  # asks workers whether a machine holds the socket at its address
            limits=limits,
        )
        _, proxy = await stack.enter_async_context(proxy_site(replica, proxy_opts))
        write_secret(data_dir / "token", token + "\n")  # an operator token: 0600
        (data_dir / "api").write_text(api + "\n")
        if images is not None:
            (data_dir / REGISTRY_FILE).write_text(images + "\n")
        yield DevCluster(
            api,
            token,
            proxy,
            proxy_opts.domain,
            workers,
            ca=pki.ca if pki else None,
            operator=pki.issue("operator", "operator") if pki else None,
            engines=tuple(engines),
            image_registry=images,
        )


def _secure_hints(dev: DevCluster) -> None:
    assert dev.ca is not None and dev.operator is not None
    ca, op = dev.ca, dev.operator
    worker, url = next(iter(dev.workers.items()))
    print(f"  every part speaks TLS, checked against {ca}; workers take mutual TLS only")
    print("  catalog rows are signed by their owners and checked by every replica")
    print(f"curl --cacert {ca} -H 'souk-app: hello' {dev.proxy}/")
    print(f'curl --cacert {ca} -H "Authorization: Bearer $SOUK_TOKEN" {dev.api}/v1/apps')
    print(f"a worker ({worker}), as an operator:")
    print(f"curl --cacert {ca} --cert {op.cert} --key {op.key} {url}/v1/capacity")
    print(f"export SOUK_CA={ca}")


async def end_machines(engines: list[Engine], bound: float = END_BOUND) -> int:
    """Destroy every machine of the cluster, forced, from whatever state it is in (suspended,
    stopping with a long timeout, starting on an image pull...): a forced destroy supersedes
    what the machine was doing and kills it at once. Waits `bound` seconds at most, then names
    the machines not yet destroyed; returns how many were destroyed."""

    async def destroy(engine: Engine, machine_id: str) -> bool:
        held = engine.lease(machine_id)  # a deploy's lease does not keep it
        nonce = held.nonce if held is not None else None
        try:
            await engine.submit(machine_id, "destroy", {"force": True}, nonce)
        except WorkerError as exc:
            log.warning("machine %s not destroyed: %s", machine_id, exc)
            return False
        ok, _ = await engine.wait(machine_id, "destroyed", bound, None)
        return ok

    live = [(e, m.id) for e in engines for m in e.machines() if m.state != "destroyed"]
    if not live:
        return 0
    print(f"souk dev: destroying {len(live)} machines", flush=True)
    done = await asyncio.gather(*(destroy(e, mid) for e, mid in live))
    left = [(e, mid) for (e, mid), ok in zip(live, done, strict=True) if not ok]
    for engine, mid in left:
        state = engine.get(mid, events=False).state
        print(f"souk dev: machine {mid} still {state} after {bound:g} s", flush=True)
    return len(live) - len(left)


def _on_signals(engines: list[Engine]) -> asyncio.Event:
    """Set at the first Ctrl-C (or SIGTERM), for an orderly end. A second one, whenever it
    comes, ends `souk dev` at once: every machine's processes are killed first (their cgroups,
    frozen ones too), so none is left running; what they held on disk stays for the next
    `souk dev` on this data to end."""
    first = asyncio.Event()

    def on_signal() -> None:
        if first.is_set():
            killed = sum(engine.kill_now() for engine in engines)
            print(f"souk dev: killed {killed} processes; exiting now", flush=True)
            os._exit(130)
        first.set()

    on_signals(on_signal)
    return first


def dashboard_url(dev: DevCluster) -> str:
    """The dashboard's login link: the token rides in the fragment, which the browser keeps to
    itself (no server or proxy log sees it); the page logs in with it and forgets it."""
    return f"{dev.api}/ui/login#token={dev.token}"


async def run_dev(
    data_dir: Path,
    host: str,
    port: int,
    proxy_port: int,
    driver: str,
    secure: bool = False,
    insecure_registries: tuple[str, ...] = (),
    disk_mb: int | None = None,
    limits: Limits = DEFAULT_LIMITS,
    image_registry_port: int | None = None,
) -> None:
    async with dev_cluster(
        data_dir,
        host,
        port,
        proxy_port,
        driver,
        secure=secure,
        insecure_registries=insecure_registries,
        disk_mb=disk_mb,
        limits=limits,
        image_registry_port=image_registry_port,
    ) as dev:
        signalled = _on_signals(list(dev.engines))
        heap.settle()
        print(f"souk dev: 3 regions ({', '.join(REGIONS)}) x 2 workers")
        print(f"  broker (Machines API): {dev.api}")
        print(f"  proxy: {dev.proxy}  (apps at <app>.{dev.domain}, or header 'souk-app: <app>')")
        print(f"  dashboard: {dashboard_url(dev)}")
        if disk_mb:
            print(f"  volumes: {disk_mb} MB of disk per worker (souk volumes create ...)")
        if dev.image_registry:
            print(f"  images: {dev.image_registry} (a [build] in souk.toml pushes there)")
        if secure:
            _secure_hints(dev)
        print(f"export SOUK_API={dev.api}")
        print(f"export SOUK_TOKEN={dev.token}")
        print("then, in examples/hello: souk deploy", flush=True)
        await signalled.wait()
        await end_machines(list(dev.engines))  # first: the rest may take its time to close
