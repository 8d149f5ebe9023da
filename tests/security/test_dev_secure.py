"""`souk dev --secure` (its cluster, in this process): a CA and certificates in the data dir,
workers serving mutual TLS only, the broker and the proxy HTTPS, catalog rows signed by their
owners and checked by the replicas. A machine is placed and listed through the broker, and an app
scaled to zero answers through the proxy."""

from __future__ import annotations

import asyncio
import json
import ssl
import stat
from pathlib import Path

import aiohttp
import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from typer.testing import CliRunner

from souk.cli.client import DEV_DIR
from souk.cli.main import app as souk
from souk.clients.machines import MachinesApiError, MachinesClient
from souk.dev import DevCluster, dev_cluster
from souk.models.api import CreateMachineRequest
from souk.models.machine import MachineConfig
from souk.pki import client_context, identity_of, load_cert
from tests.support.hello import hello_config
from tests.support.waiting import eventually


async def test_a_secure_dev_cluster_places_lists_and_serves(tmp_path: Path) -> None:
    async with dev_cluster(tmp_path, port=0, proxy_port=0, secure=True) as dev:
        assert dev.api.startswith("https://") and dev.proxy.startswith("https://")
        assert all(url.startswith("https://") for url in dev.workers.values())
        assert dev.ca is not None
        async with MachinesClient(dev.api, dev.token, ca=dev.ca) as api:
            await api.ensure_app("hello")
            config = MachineConfig.model_validate(hello_config())
            req = CreateMachineRequest(region="mad", config=config, skip_launch=True)
            machine = await api.create("hello", req)
            try:
                listed = await api.machines("hello")
                assert [m.id for m in listed] == [machine.id]
                status = await api.catalog_status()
                assert status["security"] == "signed"
                assert set(status["refused"]) <= {"unknown_signer"}, status["refused"]
                heads = {o["owner"]: o["head"] for o in status["owners"]}
                assert all(heads[w] > 0 for w in dev.workers), heads
                assert machine.state != "started"
                await answers_through_the_proxy(dev, machine.id)
                assert (await api.machine("hello", machine.id)).state == "started"
            finally:
                await api.destroy("hello", machine.id, force=True)


async def answers_through_the_proxy(dev: DevCluster, machine_id: str) -> None:
    assert dev.ca is not None
    trust = ssl.create_default_context(cafile=dev.ca)
    async with aiohttp.ClientSession() as http:

        async def served() -> bool:
            headers = {"souk-app": "hello"}
            async with http.get(dev.proxy + "/", headers=headers, ssl=trust) as resp:
                if resp.status != 200:
                    return False
                assert (await resp.json())["machine"] == machine_id
                return True

        await eventually(served, timeout=30)


async def test_every_part_has_its_certificate_and_keys_stay_private(tmp_path: Path) -> None:
    async with dev_cluster(tmp_path, port=0, proxy_port=0, driver="sim", secure=True) as dev:
        tls = tmp_path / "tls"
        keys = sorted(tls.rglob("*.key"))
        assert keys and all(stat.S_IMODE(k.stat().st_mode) == 0o600 for k in keys)
        roles, public = {}, {}
        for cert in tls.glob("*/*.crt"):
            if cert.parent.name.endswith("-public"):  # a listener's, for browsers: ECDSA
                key = load_cert(cert).public_key()
                public[cert.stem] = isinstance(key, ec.EllipticCurvePublicKey)
            elif cert.name != "ca.crt":
                ident = identity_of(load_cert(cert))
                roles[ident.name] = ident.role
        assert public == {"broker": True, "proxy": True}
        assert roles == {
            **{name: "worker" for name in dev.workers},
            "broker": "broker",
            "proxy": "proxy",
            "operator": "operator",
        }
        # The CLI's way in: the system's CAs do not know this cluster's, its CA file does.
        async with MachinesClient(dev.api, dev.token) as untrusting:
            with pytest.raises(MachinesApiError) as refused:
                await untrusting.apps()
            assert refused.value.reason == "untrusted"
        # A worker answers an operator's certificate, and a proxy's with 403.
        assert dev.operator is not None
        url = next(iter(dev.workers.values())) + "/v1/capacity"
        proxy_files = (tls / "proxy" / "proxy.crt", tls / "proxy" / "proxy.key")
        async with aiohttp.ClientSession() as http:
            async with http.get(url, ssl=client_context(dev.operator)) as resp:
                assert resp.status == 200
            ctx = ssl.create_default_context(cafile=dev.ca)
            ctx.load_cert_chain(*proxy_files)
            async with http.get(url, ssl=ctx) as resp:
                assert resp.status == 403


async def test_the_ca_is_kept_across_runs(tmp_path: Path) -> None:
    """A CA file handed to a client the first time still works the next."""
    async with dev_cluster(tmp_path, port=0, proxy_port=0, driver="sim", secure=True) as dev:
        assert dev.ca is not None
        kept = tmp_path / "handed-out-ca.crt"
        kept.write_bytes(dev.ca.read_bytes())
        async with MachinesClient(dev.api, dev.token, ca=kept) as api:
            await api.ensure_app("kept")
    async with (
        dev_cluster(tmp_path, port=0, proxy_port=0, driver="sim", secure=True) as again,
        MachinesClient(again.api, again.token, ca=kept) as api,
    ):
        assert [a.name for a in (await api.apps()).apps] == ["kept"]


async def test_the_cli_finds_souk_devs_url_token_and_ca(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in ("SOUK_API", "SOUK_TOKEN", "SOUK_CA"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    data = tmp_path / DEV_DIR
    async with dev_cluster(data, port=0, proxy_port=0, driver="sim", secure=True) as dev:
        async with MachinesClient(dev.api, dev.token, ca=dev.ca) as api:
            await api.ensure_app("found")
        found = await asyncio.to_thread(CliRunner().invoke, souk, ["apps", "list", "--json"])
        assert found.exit_code == 0, found.output
        assert [a["name"] for a in json.loads(found.output)] == ["found"]
        # Another broker's URL given: souk dev's CA is not trusted for it.
        env = {"SOUK_API": dev.api}
        refused = await asyncio.to_thread(CliRunner().invoke, souk, ["apps", "list"], env=env)
        assert refused.exit_code == 1
        assert "did not trust" in refused.output
