"""Every model's defaults: immutable values, or a factory.

Pydantic deep-copies a mutable default (`{}`, `[]`, a model instance) every time a model is
validated without that field, through Python's `copy.deepcopy`: a few microseconds per field,
and a machine's config has a dozen of them, validated on every create by the broker, the worker
and each replica. A `default_factory` builds a fresh value for a fraction of that.
"""

from __future__ import annotations

import enum
import importlib
import pkgutil
from collections.abc import Iterator

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

import souk
from souk.models.machine import MachineConfig

IMMUTABLE = (type(None), str, bytes, int, float, bool, tuple, frozenset, enum.Enum)


def souk_models() -> Iterator[type[BaseModel]]:
    for info in pkgutil.walk_packages(souk.__path__, "souk."):
        if not info.name.endswith("__main__"):  # that one runs the CLI
            importlib.import_module(info.name)
    seen: set[type[BaseModel]] = set()
    todo = list(BaseModel.__subclasses__())
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.add(cls)
        todo += cls.__subclasses__()
        if cls.__module__.startswith("souk."):
            yield cls


def test_no_model_has_a_mutable_default() -> None:
    models = list(souk_models())
    assert len(models) > 50  # the walk found the models, not an empty package
    mutable = [
        f"{cls.__module__}.{cls.__qualname__}.{name}"
        for cls in models
        for name, field in cls.model_fields.items()
        if field.default is not PydanticUndefined and not isinstance(field.default, IMMUTABLE)
    ]
    assert mutable == []


def test_a_default_made_by_a_factory_is_each_instance_s_own() -> None:
    a = MachineConfig.model_validate({"init": {"exec": ["true"]}})
    b = MachineConfig.model_validate({"init": {"exec": ["true"]}})
    a.env["K"] = "v"
    a.guest.cpus = 4
    assert b.env == {} and b.guest.cpus == 1
    assert MachineConfig.model_validate({"init": {"exec": ["true"]}}).env == {}
