"""The broker's domain refusals carry a reason only; the API's table gives each its status."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import souk.broker
from souk.broker.api.errors import REFUSAL_STATUS, refusal
from souk.broker.registry import MetadataRefused, check_metadata_patch
from souk.broker.secrets import SecretRefused, check_secret

RAISED = re.compile(r"\b\w*Refused\(\s*\"(\w+)\"")


def test_every_reason_the_broker_refuses_with_has_its_status_at_the_edge() -> None:
    root = Path(souk.broker.__file__).parent
    reasons = {r for path in root.rglob("*.py") for r in RAISED.findall(path.read_text())}
    assert {"invalid", "secret_too_large", "metadata_too_large"} <= reasons
    assert reasons <= set(REFUSAL_STATUS), reasons - set(REFUSAL_STATUS)


def test_a_refusal_becomes_its_status_reason_and_message() -> None:
    with pytest.raises(SecretRefused) as bad_name:
        check_secret("1nope", "v")
    with pytest.raises(SecretRefused) as too_large:
        check_secret("BIG", "x" * (1 << 20))
    with pytest.raises(MetadataRefused) as bad_key:
        check_metadata_patch({"no spaces": "v"})
    answers = [refusal(exc.value) for exc in (bad_name, too_large, bad_key)]
    assert [(a.http_status, a.reason) for a in answers] == [
        (400, "invalid"),
        (413, "secret_too_large"),
        (400, "invalid"),
    ]
    assert "bad secret name" in answers[0].message
    assert not hasattr(bad_name.value, "status")  # the domain error knows no HTTP
