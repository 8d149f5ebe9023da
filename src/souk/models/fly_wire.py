"""A machine config as Fly's API reads and writes it, where souk's own models are stricter.

Fly's server decodes bodies with Go's `encoding/json`, which drops fields it does not know, and
encodes answers with `omitempty`, which leaves out empty lists and maps as well as nulls.
Clients written against Fly rely on both: some send fields of their own inside `config`, some
decode `"mounts": []` into a type that is not a list. The broker therefore reads a Fly client's
config with `split_unknown` (unknown fields ignored, and named back) and answers with `omit_empty`;
souk's own CLI and souk.toml build the strict models directly and stay strict.
"""

from __future__ import annotations

import types
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel


def split_unknown(model: type[BaseModel], data: Any, where: str) -> tuple[Any, list[str]]:
    """`data` without the fields `model` (and the models nested in it) does not declare, and
    the dotted paths of those fields, e.g. `config.services.0.auto_start_machines`."""
    ignored: list[str] = []
    return _strip(model, data, where, ignored), ignored


def _strip(model: type[BaseModel], data: Any, where: str, ignored: list[str]) -> Any:
    if not isinstance(data, dict):
        return data  # the model's own validation says what is wrong with it
    fields = model.model_fields
    names = {field.alias or name: name for name, field in fields.items()}
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = names.get(key)
        if name is None:
            ignored.append(f"{where}.{key}")
            continue
        out[key] = _strip_value(fields[name].annotation, value, f"{where}.{key}", ignored)
    return out


def _strip_value(annotation: Any, value: Any, where: str, ignored: list[str]) -> Any:
    """Follows a field's type into the models it holds: directly, in a list, a dict's values
    or one arm of an optional."""
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        models = [a for a in get_args(annotation) if _is_model(a) or get_origin(a) in (list, dict)]
        return _strip_value(models[0], value, where, ignored) if len(models) == 1 else value
    if origin is list and isinstance(value, list):
        (item,) = get_args(annotation) or (Any,)
        return [_strip_value(item, v, f"{where}.{i}", ignored) for i, v in enumerate(value)]
    if origin is dict and isinstance(value, dict):
        args = get_args(annotation)
        item = args[1] if len(args) == 2 else Any
        return {k: _strip_value(item, v, f"{where}.{k}", ignored) for k, v in value.items()}
    if _is_model(annotation):
        return _strip(annotation, value, where, ignored)
    return value


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def omit_empty(value: Any) -> Any:
    """A JSON value without nulls, empty lists and empty maps inside objects, as Go's
    `omitempty` leaves them out of Fly's answers (an object emptied by this goes too). Scalars
    are not recursed into: an answer has many, and every broker answer goes through here."""
    if type(value) is dict:
        out = {}
        for key, item in value.items():
            kind = type(item)
            if kind is dict or kind is list:
                item = omit_empty(item)
                if not item:
                    continue
            elif item is None:
                continue
            out[key] = item
        return out
    if type(value) is list:
        return [omit_empty(v) if type(v) is dict or type(v) is list else v for v in value]
    return value
