"""Image references and image configs: pure parsing, no registry."""

from __future__ import annotations

import pytest

from souk.models.machine import InitConfig
from souk.worker.oci.config import ImageConfig
from souk.worker.oci.reference import ImageRef, ReferenceError, parse_reference

DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:5000/app:v1", ImageRef("127.0.0.1:5000", "app", "v1")),
        ("127.0.0.1:5000/team/app", ImageRef("127.0.0.1:5000", "team/app", "latest")),
        (f"localhost/app@{DIGEST}", ImageRef("localhost", "app", None, DIGEST)),
        (f"r.example/app:v2@{DIGEST}", ImageRef("r.example", "app", "v2", DIGEST)),
        ("docker.io/redis", ImageRef("registry-1.docker.io", "library/redis", "latest")),
    ],
)
def test_parse(text: str, expected: ImageRef) -> None:
    assert parse_reference(text) == expected


def test_default_registry_only_when_configured() -> None:
    with pytest.raises(ReferenceError, match="no registry"):
        parse_reference("team/app:v1")
    assert parse_reference("team/app:v1", "r.example:443").registry == "r.example:443"


@pytest.mark.parametrize(
    "text", ["r.example/App:v1", "r.example/app@sha256:xyz", "r.example/app:-bad", "r.example/"]
)
def test_rejects(text: str) -> None:
    with pytest.raises(ReferenceError):
        parse_reference(text)


def test_reference_prefers_digest() -> None:
    ref = parse_reference(f"r.example/app:v1@{DIGEST}")
    assert ref.reference == DIGEST and str(ref) == f"r.example/app:v1@{DIGEST}"


CONFIG = b"""{"architecture": "amd64", "os": "linux", "config": {
  "Entrypoint": ["/entry"], "Cmd": ["serve", "--port=80"], "Env": ["PATH=/bin", "A=1"],
  "WorkingDir": "/srv", "User": "1000:1000", "ExposedPorts": {"80/tcp": {}, "53/udp": {}}}}"""


@pytest.mark.parametrize(
    ("init", "argv"),
    [
        (InitConfig(), ["/entry", "serve", "--port=80"]),
        (InitConfig(cmd=["other"]), ["/entry", "other"]),
        (InitConfig(entrypoint=["/bin/sh"]), ["/bin/sh"]),  # the image's cmd is dropped
        (InitConfig(entrypoint=["/bin/sh"], cmd=["-c", "x"]), ["/bin/sh", "-c", "x"]),
        (InitConfig(exec=["/bin/true"], cmd=["ignored"]), ["/bin/true"]),
    ],
)
def test_argv_overrides(init: InitConfig, argv: list[str]) -> None:
    assert ImageConfig.parse(CONFIG).argv(init) == argv


def test_config_fields() -> None:
    config = ImageConfig.parse(CONFIG)
    assert config.environment({"A": "2", "B": "3"}) == ["PATH=/bin", "A=2", "B=3"]
    assert (config.workdir, config.user, config.ports()) == ("/srv", "1000:1000", [80])
    assert ImageConfig.parse(b'{"config": {"Cmd": "echo hi"}}').cmd == ["/bin/sh", "-c", "echo hi"]
