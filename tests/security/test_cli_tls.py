"""The TLS options of `souk worker`, `souk broker` and `souk proxy`, checked before anything
starts, and the CLI reaching an https broker whose certificate comes from a private CA."""

from __future__ import annotations

import asyncio
import json
import shutil
import ssl
from pathlib import Path

from aiohttp import web
from cryptography import x509
from typer.testing import CliRunner, Result

from souk.broker.runtime import BrokerSettings, broker_site
from souk.broker.tokens import mint
from souk.catalog.bus import InProcessBus
from souk.cli.main import app as souk
from souk.cli.tls import loopback
from souk.web.tls import ServerCert
from tests.security.conftest import listening
from tests.support.pki import LOOPBACK, Pki
from tests.support.ports import free_port
from tests.support.waiting import eventually

SECRET = b"cli-tls-test-secret-0123456789"


def invoke(args: list[str], env: dict[str, str] | None = None) -> Result:
    """The command in this process, its error box wide enough to keep paths on one line."""
    return CliRunner().invoke(souk, args, env={"COLUMNS": "1000", **(env or {})})


def said(result: Result) -> str:
    return " ".join(result.output.replace("│", " ").split())


def worker(tmp: Path, *args: str) -> Result:
    argv = ["worker", "--name", "w1", "--region", "mad", "--data-dir", str(tmp / "w1")]
    return invoke([*argv, "--cpus", "1", "--memory-mb", "64", *args])


def test_a_worker_without_tls_files_serves_plain_http_only_on_loopback(tmp_path: Path) -> None:
    refused = worker(tmp_path, "--listen", f"0.0.0.0:{free_port()}")
    assert refused.exit_code == 2
    assert "--tls-dir" in said(refused) and "--insecure" in said(refused)
    assert not (tmp_path / "w1").exists()  # nothing started
    assert loopback("127.0.0.1") and loopback("::1") and loopback("localhost")
    assert not loopback("0.0.0.0") and not loopback("10.0.0.7") and not loopback("mad-1")


def test_a_worker_refuses_node_files_that_are_not_its_own(tmp_path: Path, pki: Pki) -> None:
    listen = ("--listen", f"127.0.0.1:{free_port()}")
    other_name = pki.node("worker", "w2").cert.parent
    answer = worker(tmp_path, *listen, "--tls-dir", str(other_name))
    assert answer.exit_code == 2 and "w1.crt" in said(answer)  # it looks for NAME = --name

    broker_dir = pki.node("broker", "w1").cert.parent  # a broker's certificate named w1
    answer = worker(tmp_path, *listen, "--tls-dir", str(broker_dir))
    assert answer.exit_code == 2
    assert "broker w1, not of a worker" in said(answer)

    mixed = tmp_path / "mixed"
    shutil.copytree(pki.node("worker", "w1").cert.parent, mixed)
    shutil.copy(pki.node("worker", "w3").key, mixed / "w1.key")
    answer = worker(tmp_path, *listen, "--tls-dir", str(mixed))
    assert answer.exit_code == 2 and "is not the key of" in said(answer)

    expired = pki.node("worker", "w1", age_days=40).cert.parent
    answer = worker(tmp_path, *listen, "--tls-dir", str(expired))
    assert answer.exit_code == 2
    assert not (tmp_path / "w1").exists()


def test_a_tls_worker_takes_no_insecure_flag_nor_an_http_address(tmp_path: Path, pki: Pki) -> None:
    files = pki.node("worker", "w1").cert.parent
    listen = ("--listen", f"127.0.0.1:{free_port()}", "--tls-dir", str(files))
    assert worker(tmp_path, *listen, "--insecure").exit_code == 2
    answer = worker(tmp_path, *listen, "--advertise", "http://127.0.0.1:1")
    assert answer.exit_code == 2 and "https://" in said(answer)


def test_a_broker_needs_to_know_which_of_several_keys_is_its_own(tmp_path: Path, pki: Pki) -> None:
    shared = pki.node("broker", "b1").cert.parent
    for name in ("b2.crt", "b2.key"):
        shutil.copy(pki.node("broker", "b2").cert.parent / name, shared / name)
    (tmp_path / "secret").write_bytes(SECRET + b"\n")
    argv = ["broker", "--secret-file", str(tmp_path / "secret"), "--worker", "https://x:1"]
    answer = invoke([*argv, "--tls-dir", str(shared)])
    assert answer.exit_code == 2 and "--tls-name" in said(answer)
    half = invoke([*argv, "--tls-cert", str(shared / "b1.crt")])
    assert half.exit_code == 2 and "--tls-key" in said(half)


def test_a_proxy_checks_its_listener_certificate(tmp_path: Path, pki: Pki) -> None:
    files = pki.node("proxy", "p1")
    argv = ["proxy", "--nats", "nats://127.0.0.1:1", "--token", "t", "--api", "https://x"]
    answer = invoke([*argv, "--tls-cert", str(files.cert), "--tls-key", f"{files.key}.gone"])
    assert answer.exit_code == 2 and "cannot serve TLS" in said(answer)


async def test_the_cli_reaches_an_https_broker_with_a_ca_file(tmp_path: Path, pki: Pki) -> None:
    files = pki.node("broker", "broker-1")
    opts = BrokerSettings(
        host="127.0.0.1",
        port=0,
        secret=SECRET,
        workers=[],
        registry_dir=tmp_path / "registry",
        listener=ServerCert(files.cert, files.key),
    )
    bus = InProcessBus()
    async with broker_site(opts, bus) as url:
        assert url.startswith("https://")
        env = {"SOUK_API": url, "SOUK_TOKEN": mint(SECRET, operator=True), "SOUK_CA": ""}

        async def souk_cli(*args: str, **extra: str) -> Result:
            run = CliRunner().invoke
            return await asyncio.to_thread(run, souk, list(args), env={**env, **extra})

        made = await souk_cli("--ca", str(files.ca), "apps", "create", "demo", "--json")
        assert made.exit_code == 0, made.output
        listed = await souk_cli("apps", "list", "--json", SOUK_CA=str(files.ca))
        assert listed.exit_code == 0, listed.output
        assert [a["name"] for a in json.loads(listed.output)] == ["demo"]
        refused = await souk_cli("apps", "list")
        assert refused.exit_code == 1 and "did not trust" in refused.output
    await bus.close()


async def served_serial(port: int, ca: Path) -> int:
    ctx = ssl.create_default_context(cafile=ca)
    _, writer = await asyncio.open_connection(LOOPBACK, port, ssl=ctx)
    der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    writer.close()
    return x509.load_der_x509_certificate(der).serial_number


async def test_a_public_listener_serves_a_renewed_certificate_without_a_restart(
    pki: Pki,
) -> None:
    files = pki.node("broker", "broker-1")
    app = web.Application()
    async with listening(app, ServerCert(files.cert, files.key).context()) as url:
        port = int(url.rsplit(":", 1)[1])
        first = await served_serial(port, files.ca)
        renewed = pki.node("broker", "broker-1", reuse_key=True)
        new = x509.load_pem_x509_certificate(renewed.cert.read_bytes()).serial_number
        assert new != first

        async def serving_the_new_one() -> bool:
            return await served_serial(port, files.ca) == new

        await eventually(serving_the_new_one)
