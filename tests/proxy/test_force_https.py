"""`force_https` on a service port: the proxy's policy carries it, and plain HTTP is redirected."""

from __future__ import annotations

from aiohttp.test_utils import make_mocked_request

from souk.models.machine import MachineConfig
from souk.proxy.forward import _plain_http, _to_https
from souk.proxy.policy import policy_of


def config(**port: object) -> MachineConfig:
    service = {"internal_port": 8080, "ports": [{"port": 80, **port}, {"port": 443}]}
    return MachineConfig.model_validate({"init": {"exec": ["a"]}, "services": [service]})


def test_the_policy_carries_force_https() -> None:
    assert policy_of(config(force_https=True)).force_https
    assert not policy_of(config()).force_https
    off = config().model_copy(update={"disable_machine_autostart": True})
    assert not policy_of(off).autostart


def test_plain_http_is_redirected_to_the_same_url_over_https() -> None:
    request = make_mocked_request("GET", "/a/b?c=1", headers={"Host": "demo.souk.local"})
    assert _plain_http(request)
    answer = _to_https(request)
    assert (answer.status, answer.headers["Location"]) == (301, "https://demo.souk.local/a/b?c=1")
    claiming_tls = make_mocked_request("GET", "/", headers={"X-Forwarded-Proto": "https"})
    assert _plain_http(claiming_tls)  # any client can say so: not believed
