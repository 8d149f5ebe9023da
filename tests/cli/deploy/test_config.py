"""souk.toml: what parses, what it becomes, and how a mistake is reported (by its field)."""

from __future__ import annotations

from pathlib import Path

import pytest

from souk.cli.deploy.config import ConfigError, load, loads
from souk.models.wire import HIDDEN_KEY, RELEASE_KEY, ROLE_KEY

FULL = """
app = "shop"
command = ["python3", "app.py"]

[regions]
mad = 2
ams = 1

[guest]
cpu_kind = "performance"
cpus = 2
memory_mb = 512

[env]
GREETING = "hi"

[[services]]
internal_port = 8080
protocol = "tcp"
autostop = "stop"
autostart = true
min_machines_running = 1
concurrency = { type = "requests", soft_limit = 10, hard_limit = 20 }

[checks.alive]
type = "tcp"
port = 8080
interval = "5s"

[checks.web]
type = "http"
port = 8080
path = "/health"
timeout = "500ms"
grace_period = "2s"

[restart]
policy = "always"

[deploy]
strategy = "canary"
max_unavailable = 0.5
standbys = false
"""


def test_a_full_file_becomes_the_machine_config() -> None:
    cfg = loads(FULL)
    assert cfg.regions == {"mad": 2, "ams": 1}
    assert cfg.deploy.strategy == "canary" and cfg.deploy.standbys is False
    assert cfg.deploy.batch_size(5) == 3  # half of five, rounded up
    config = cfg.machine_config(7, "standby", standby_for="abc", hidden=True)
    assert config.init.exec == ["python3", "app.py"]
    assert config.guest.cpus == 2 and config.guest.cpu_kind == "performance"
    assert cfg.env == {"GREETING": "hi"} and config.env == {}  # its values go to secrets
    assert config.services[0].concurrency is not None
    assert config.services[0].concurrency.soft_limit == 10
    assert config.checks["web"].path == "/health" and config.checks["web"].timeout == 0.5
    assert config.checks["alive"].interval == 5.0
    assert config.restart.policy == "always"
    assert config.standbys == ["abc"]
    assert config.metadata == {ROLE_KEY: "standby", RELEASE_KEY: "7", HIDDEN_KEY: "true"}


def test_defaults_and_region_lists() -> None:
    cfg = loads('app = "a"\nimage = "reg:5000/a:1"\nregions = ["mad", "sin"]\ncount = 2\n')
    assert cfg.regions == {"mad": 2, "sin": 2}
    assert cfg.deploy.strategy == "rolling" and cfg.deploy.standbys is True
    assert cfg.deploy.batch_size(10) == 1
    config = cfg.machine_config(1, "primary")
    assert config.image == "reg:5000/a:1" and config.init.exec is None
    assert config.metadata == {ROLE_KEY: "primary", RELEASE_KEY: "1"}
    assert config.standbys == []


B = 'app = "a"\ncommand = ["x"]\nregions = { mad = 1 }\n'


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('app = "Shop"\ncommand = ["x"]\nregions = { mad = 1 }', "app: app names"),
        ('app = "a"\nregions = { mad = 1 }', "image, command, build: give exactly one"),
        ('app = "a"\nimage = "i"\ncommand = ["x"]\nregions = { mad = 1 }', "image, command"),
        ('app = "a"\ncommand = []\nregions = { mad = 1 }', "command: the command is an argv"),
        ('app = "a"\ncommand = ["x"]\nregions = ["mad"]', "count: needed when regions"),
        (B + "count = 1", "count: only with a list"),
        ('app = "a"\ncommand = ["x"]\nregions = ["mad", "mad"]\ncount = 1', "listed twice"),
        ('app = "a"\ncommand = ["x"]\nregions = { MAD = 1 }', "regions: 'MAD' is not a region"),
        ('app = "a"\ncommand = ["x"]\nregions = { mad = -1 }', "regions: mad: a count cannot"),
        ('app = "a"\ncommand = ["x"]\nregions = {}', "regions: at least one region"),
        (B + "[guest]\ncpus = 0", "guest.cpus:"),
        (
            B + '[checks.c]\ntype = "udp"\nport = 1',
            "checks.c.type:",
        ),
        (
            B + '[checks.c]\nport = 1\ninterval = "x"',
            "checks.c.interval: bad duration",
        ),
        (
            B + "[[services]]\ninternal_port = 0",
            "services.0.internal_port:",
        ),
        (
            B + '[deploy]\nstrategy = "yolo"',
            "deploy.strategy:",
        ),
        (
            B + "[deploy]\nmax_unavailable = 2.5",
            "deploy.max_unavailable: a whole number",
        ),
        (B + 'region = "mad"', "region: unknown field"),
        (B + '[env]\n"1X" = "y"', "env: bad"),
        ('app = "a"\ncommand = ["x"\n', "not valid TOML"),
    ],
)
def test_mistakes_name_their_field(text: str, problem: str) -> None:
    with pytest.raises(ConfigError) as info:
        loads(text)
    assert problem in str(info.value)


def test_every_problem_is_listed_and_the_file_named(tmp_path: Path) -> None:
    path = tmp_path / "souk.toml"
    path.write_text(B + "foo = 1\n[guest]\ncpus = 0\n")
    with pytest.raises(ConfigError) as info:
        load(path)
    lines = str(info.value).splitlines()
    assert lines[0].startswith(str(path))
    assert any("foo: unknown field" in line for line in lines)
    assert any("guest.cpus:" in line for line in lines)
    with pytest.raises(ConfigError, match="cannot read"):
        load(tmp_path / "missing.toml")


def test_dot_slash_arguments_are_files_beside_souk_toml(tmp_path: Path) -> None:
    path = tmp_path / "souk.toml"
    path.write_text('app = "x"\ncommand = ["python3", "./app.py", "-v"]\nregions = {mad = 1}\n')
    assert load(path).command == ["python3", str(tmp_path.resolve() / "app.py"), "-v"]


def test_a_build_section_names_its_files_beside_souk_toml(tmp_path: Path) -> None:
    toml = tmp_path / "souk.toml"
    toml.write_text('app = "a"\nregions = { mad = 1 }\n[build]\nimage = "r.example:5000/a"\n')
    cfg = load(toml)
    assert cfg.build is not None and cfg.image is None
    assert cfg.build.dockerfile == str(tmp_path / "Dockerfile")
    assert cfg.build.context == str(tmp_path)
    with pytest.raises(ConfigError, match=r"build\.image"):
        loads('app = "a"\nregions = { mad = 1 }\n[build]\nimage = "r.example/a:1"\n')
