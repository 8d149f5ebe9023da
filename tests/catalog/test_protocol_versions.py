"""Catalog messages carry their sender's protocol version: a release before versions (none sent)
and a neighbour version are understood, anything further is dropped as malformed; rows take a
field they do not know without refusing the row."""

from __future__ import annotations

import orjson
import pytest

from souk.catalog.protocol import (
    Batch,
    Change,
    Heartbeat,
    ProtocolError,
    decode_batch,
    decode_heartbeat,
    encode,
)
from souk.models.catalog import WorkerRow
from souk.models.wire import PROTOCOL


def batch(**extra: object) -> bytes:
    message = orjson.loads(encode(Batch("w1", "mad", "e1", 0, 1, [Change("t", "k", 1, {})])))
    message.update(extra)
    return orjson.dumps(message)


def test_a_message_says_its_version() -> None:
    assert orjson.loads(encode(Heartbeat("w1", "mad", "e1", 3)))["v"] == PROTOCOL


@pytest.mark.parametrize("version", [PROTOCOL - 1, PROTOCOL, PROTOCOL + 1])
def test_neighbour_versions_are_understood(version: int) -> None:
    assert decode_batch(batch(v=version)).head == 1


def test_a_release_before_versions_is_understood() -> None:
    message = orjson.loads(batch())
    del message["v"]
    assert decode_batch(orjson.dumps(message)).head == 1


@pytest.mark.parametrize("version", [PROTOCOL + 2, PROTOCOL - 2, "1", None])
def test_a_version_further_away_is_dropped(version: object) -> None:
    with pytest.raises(ProtocolError, match="protocol"):
        decode_batch(batch(v=version))
    beat = orjson.loads(encode(Heartbeat("w1", "mad", "e1", 3)))
    beat["v"] = version
    with pytest.raises(ProtocolError, match="protocol"):
        decode_heartbeat(orjson.dumps(beat))


def test_a_row_with_a_field_from_a_newer_owner_is_kept() -> None:
    row = WorkerRow(
        id="w1", region="mad", address="http://127.0.0.1:1", cpu_kinds=("shared",),
        cpus_total=4, memory_mb_total=1024, cpus_reserved=0, memory_mb_reserved=0, epoch="e1",
    )  # fmt: skip
    newer = {**row.model_dump(), "wireguard_key": "abc="}
    assert WorkerRow.model_validate(newer) == row
