"""`.internal` names (`souk.network.dns`), asked by machines through their own resolv.conf on
a host of its own (`one_host.py`): a worker following the catalog over a bus, its DNS on the
resolver's address."""

from __future__ import annotations

import os
import shutil
from typing import Any

import pytest

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root"),
    pytest.mark.skipif(not shutil.which("nats-server"), reason="needs nats-server"),
]


def test_an_apps_names_give_its_started_machines(seen: dict[str, Any]) -> None:
    names, at = seen["names"], seen["addresses"]
    assert names["alpha"] == sorted([at["a1"], at["a2"]])
    assert names["region"] == names["alpha"]  # both in the worker's region
    assert names["other_region"] == ["nxdomain"]  # no machine there: no address
    assert names["vm"] == [at["a2"]]
    assert len(names["top1"]) == 1 and names["top1"][0] in names["alpha"]
    assert names["apps"] == ["alpha"]  # the asker's network's apps only
    assert names["nothing"] == ["nxdomain"]


def test_a_machine_asks_over_tcp_and_gets_the_same_answer(seen: dict[str, Any]) -> None:
    assert seen["names"]["alpha_tcp"] == seen["names"]["alpha"]


def test_a_network_does_not_see_anothers_names(seen: dict[str, Any]) -> None:
    assert seen["names"]["beta_from_alpha"] == ["nxdomain"]
    assert seen["names"]["alpha_from_beta"] == ["nxdomain"]


def test_a_machine_reaches_another_of_its_app_by_name(seen: dict[str, Any]) -> None:
    assert seen["by_name"] == seen["ids"]["a2"]


def test_a_destroyed_machines_name_goes_within_a_second(seen: dict[str, Any]) -> None:
    assert seen["gone_after"] < 1.0
