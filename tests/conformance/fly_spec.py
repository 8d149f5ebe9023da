"""Fly's Machines API spec (its swagger document), and two checks of a body against it.

The document is Fly's, not souk's, so it is not kept in this repository: `SOUK_FLY_SPEC` names a
copy (a file), else `scripts/fetch-fly-spec.sh` (run by `scripts/setup.sh`) keeps one at
`tests/conformance/.fly-openapi.json`. Without either, the scenarios still run and every body is
checked for what souk promises of its own (no nulls: Fly's omitempty), and
`test_flys_spec_is_at_hand` skips, saying why, so that the run shows the spec was not checked.

- `validate`: JSON Schema validation of a body against a definition (draft 4, which swagger 2
  schemas are), with one change to the spec: `fly.Duration` is a string, as Fly sends
  durations; the spec's object for it is an artefact of the Go generator.
- `strict_types`: what a Go client's `json.Unmarshal` into the spec's types needs: no field
  whose JSON type differs from the spec's (a string id sent as a number fails the whole
  decode), and no null where the spec has a type (typed clients refuse them).
"""

from __future__ import annotations

import json
import os
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest

CACHED = Path(__file__).parent / ".fly-openapi.json"


MISSING = "no copy of Fly's spec: set SOUK_FLY_SPEC or run scripts/fetch-fly-spec.sh"


def path() -> Path:
    return Path(os.environ.get("SOUK_FLY_SPEC") or CACHED)


@cache
def spec() -> dict[str, Any]:
    if not path().is_file():
        pytest.skip(MISSING)
    document: dict[str, Any] = json.loads(path().read_text())
    definitions = document["definitions"]
    definitions["fly.Duration"] = {"type": "string"}  # as Fly sends durations: "5s"
    return document


def definitions() -> dict[str, Any]:
    return dict(spec()["definitions"])


def validate(body: Any, definition: str, array: bool = False) -> None:
    """Raise if `body` (or each item, with `array`) does not validate against the definition;
    without the spec, if it holds a null anywhere."""
    if not path().is_file():
        no_nulls(body, definition)
        return
    ref: dict[str, Any] = {"$ref": f"#/definitions/{definition}"}
    schema = {"type": "array", "items": ref} if array else ref
    jsonschema.Draft4Validator({**schema, "definitions": definitions()}).validate(body)
    strict_types(body, schema, definition)


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
}


UNTYPED = frozenset({"request", "details"})  # free-form in the spec: anything decodes


def no_nulls(value: Any, where: str) -> None:
    if value is None:
        raise AssertionError(f"{where}: null (Fly omits empty fields)")
    if isinstance(value, list):
        for i, item in enumerate(value):
            no_nulls(item, f"{where}[{i}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            if key not in UNTYPED:
                no_nulls(item, f"{where}.{key}")


def no_empties(value: Any, where: str) -> None:
    """Raise at an empty list or map inside an object: Fly's structs say omitempty on every
    list and map of a machine, so Fly never sends one (and some clients cannot decode it)."""
    if isinstance(value, list):
        for i, item in enumerate(value):
            no_empties(item, f"{where}[{i}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, list | dict) and not item:
                raise AssertionError(f"{where}.{key}: empty (Fly omits empty lists and maps)")
            no_empties(item, f"{where}.{key}")


def _resolve(schema: dict[str, Any]) -> dict[str, Any]:
    while True:
        if "$ref" in schema:
            schema = definitions()[schema["$ref"].rsplit("/", 1)[1]]
        elif "allOf" in schema and len(schema["allOf"]) == 1:
            schema = schema["allOf"][0]
        else:
            return schema


def strict_types(value: Any, schema: dict[str, Any], where: str) -> None:
    """Walk `value` along `schema`; raise AssertionError at the first field a Go client could not
    decode into the spec's type. Fields the spec does not declare are souk's own: skipped."""
    schema = _resolve(schema)
    kind = schema.get("type")
    if kind is None:
        if "properties" not in schema:
            return  # untyped (`request`, `details`): anything decodes
        kind = "object"
    if value is None:
        raise AssertionError(f"{where}: null where the spec has a {kind}")
    wanted = _JSON_TYPES[kind]
    if not isinstance(value, wanted) or (kind in ("integer", "number") and isinstance(value, bool)):
        raise AssertionError(f"{where}: {type(value).__name__} where the spec has a {kind}")
    if isinstance(value, list):
        for i, item in enumerate(value):
            strict_types(item, schema.get("items", {}), f"{where}[{i}]")
    elif isinstance(value, dict):
        properties = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            if key in properties:
                strict_types(item, properties[key], f"{where}.{key}")
            elif isinstance(extra, dict):
                strict_types(item, extra, f"{where}.{key}")
