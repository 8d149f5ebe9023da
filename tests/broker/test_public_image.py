"""An image machine as the public API shows it: the digest its version runs where Fly shows it,
in `image_ref`, and no field of souk's own for it."""

from __future__ import annotations

import json
from typing import Any

from souk.broker.api.answers import fly_reply, public
from souk.models.machine import Machine, MachineConfig
from tests.conformance.fly_spec import validate

DIGEST = "sha256:" + "c" * 64


def machine(image: str, digest: str | None) -> Machine:
    return Machine(
        id="0123456789abcd",
        name="web",
        app="web",
        region="mad",
        state="started",
        instance_id="01AB",
        config=MachineConfig(image=image),
        worker="w1",
        created_at="2026-11-27T00:00:00Z",
        updated_at="2026-11-27T00:00:00Z",
        image_digest=digest,
    )


def shown(m: Machine) -> Any:
    """The machine's JSON as the broker answers it, checked against Fly's spec."""
    body = fly_reply(public(m)).body
    assert isinstance(body, bytes)
    data = json.loads(body)
    validate(data, "Machine")
    return data


def test_the_digest_a_version_runs_is_in_its_image_ref() -> None:
    data = shown(machine("registry.test/web:1", DIGEST))
    assert data["image_ref"] == {
        "registry": "registry.test",
        "repository": "web",
        "tag": "1",
        "digest": DIGEST,
    }  # no labels: Fly leaves an empty map out
    assert "image_digest" not in data
    not_started = shown(machine("registry.test/web:1", None))
    assert not_started["image_ref"] == {**data["image_ref"], "digest": ""}
    named = shown(machine(f"registry.test/web@{DIGEST}", None))  # the reference's own
    assert named["image_ref"]["digest"] == DIGEST
