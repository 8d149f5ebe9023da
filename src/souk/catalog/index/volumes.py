"""Volume rows, by id; each written by the worker that holds the volume."""

from __future__ import annotations

from souk.catalog.index.base import KeyedIndex, register
from souk.models.catalog import VolumeRow


@register
class VolumeIndex(KeyedIndex[VolumeRow]):
    table = "volumes"
    model = VolumeRow
