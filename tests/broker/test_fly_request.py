"""A Fly client's create is validated as it came, and walked for fields to ignore only when that
fails (`souk.broker.api.machines.read_fly_request`): right only while every model a config holds
refuses the fields it does not know, which this holds it to."""

from __future__ import annotations

import types
from typing import Any, Union, get_args, get_origin

import pytest
from pydantic import BaseModel, ValidationError

from souk.models.api import CreateMachineRequest, UpdateMachineRequest
from souk.models.fly_wire import split_unknown
from souk.models.machine import MachineConfig


def models_in(annotation: Any, seen: set[type[BaseModel]]) -> None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        if annotation not in seen:
            seen.add(annotation)
            for field in annotation.model_fields.values():
                models_in(field.annotation, seen)
        return
    if get_origin(annotation) in (Union, types.UnionType, list, dict, tuple):
        for arg in get_args(annotation):
            models_in(arg, seen)


def test_every_model_of_a_fly_request_refuses_fields_it_does_not_know() -> None:
    seen: set[type[BaseModel]] = set()
    for model in (CreateMachineRequest, UpdateMachineRequest):
        models_in(model, seen)
    assert MachineConfig in seen and len(seen) > 10
    lenient = sorted(m.__name__ for m in seen if m.model_config.get("extra") != "forbid")
    assert lenient == []


def test_a_body_that_validates_has_nothing_to_ignore_and_one_with_unknown_fields_does_not() -> None:
    config = {
        "init": {"exec": ["true"]},
        "guest": {"cpus": 1, "memory_mb": 256},
        "services": [{"internal_port": 8080, "ports": [{"port": 80}], "checks": [{}]}],
        "checks": {"up": {"port": 8080}},
        "size": "shared-cpu-2x",
    }
    CreateMachineRequest.model_validate({"region": "ams", "config": config})
    assert split_unknown(MachineConfig, config, "config")[1] == []
    config["services"][0]["ports"][0]["tls"] = True  # type: ignore[index]
    assert split_unknown(MachineConfig, config, "config")[1] == ["config.services.0.ports.0.tls"]
    with pytest.raises(ValidationError, match="tls"):
        CreateMachineRequest.model_validate({"region": "ams", "config": config})
