"""Request bodies: JSON read with bounds, then validated by a model; every failure a 4xx.

Python's `json` parser recurses once per nesting level, so `[` repeated 100,000 times raises
RecursionError (a 500) before any model sees it. Nesting is therefore measured first, by a scan
that does not recurse, and anything deeper than `MAX_DEPTH` is refused; no souk body needs more.
"""

from __future__ import annotations

import json
import re
from itertools import accumulate
from typing import Any, TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError

from souk.models.limits import INCOMING, LIMIT_EXCEEDED
from souk.web.errors import ApiError

M = TypeVar("M", bound=BaseModel)

MAX_DEPTH = 64
MAX_BODY_BYTES = 1 << 20  # a request body's limit on every souk server
BODY_KEY = web.RequestKey("json_body", object)  # the parsed body, so a second read is free

# Strings are skipped whole (brackets inside them are text); what remains of a valid document
# is punctuation, numbers and literals, of which only brackets matter here. An unterminated
# string runs to the end, as it would for a parser: the pattern always matches where it starts,
# so a scan is linear whatever the input (one that could fail would be retried at every quote).
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\\?\Z)', re.S)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = [0] * 256
_STEP[ord("[")] = _STEP[ord("{")] = 1
_STEP[ord("]")] = _STEP[ord("}")] = -1

# Validation error types answered with their own status and reason (the type) rather than a
# 400 `invalid`: `unsupported` is a valid field souk cannot honour (see models/config_rules.py),
# `limit_exceeded` a config over one of the bounds of models/limits.py.
_ERROR_STATUS = {"metadata_too_large": 413, "unsupported": 400, LIMIT_EXCEEDED: 400}


def json_depth(raw: bytes) -> int:
    """How deeply arrays and objects nest in a UTF-8 JSON text, without recursing.

    Exact for valid JSON; for invalid JSON it never counts fewer levels than a parser would
    enter before failing, since both agree on where strings start and end."""
    brackets = _STRING.sub(b"", raw).translate(None, _NOT_BRACKETS)
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0)


def parse_json(raw: bytes, max_depth: int = MAX_DEPTH) -> Any:
    """JSON from bytes: UTF-8 only, nested at most `max_depth` deep; ApiError 400 otherwise."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiError(400, "invalid_json", f"body is not UTF-8: {exc.reason}") from exc
    depth = json_depth(raw)
    if depth > max_depth:
        raise ApiError(
            400,
            "invalid_json",
            f"body nests arrays and objects {depth} deep; at most {max_depth} are accepted",
        )
    try:
        return json.loads(text)
    except ValueError as exc:  # JSONDecodeError, and ints over Python's digit limit
        raise ApiError(400, "invalid_json", f"body is not valid JSON: {exc}") from exc


async def read_json(request: web.Request) -> Any:
    """The body as JSON, `{}` when there is none."""
    if BODY_KEY in request:
        return request[BODY_KEY]
    if not request.body_exists:
        return {}
    if request.content_type not in ("application/json", "application/octet-stream", ""):
        raise ApiError(415, "unsupported_media_type", "send the body as application/json")
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge as exc:
        raise ApiError(413, "body_too_large", f"body too large: {exc.text}") from exc
    data = parse_json(raw) if raw.strip() else {}
    request[BODY_KEY] = data
    return data


def validation_error(exc: ValidationError) -> ApiError:
    errors = exc.errors(include_url=False)
    problems = [
        {"field": ".".join(str(p) for p in err["loc"]) or "(body)", "message": err["msg"]}
        for err in errors
    ]
    for err, problem in zip(errors, problems, strict=True):
        status = _ERROR_STATUS.get(err["type"])
        if status is not None:
            message = f"{problem['field']}: {problem['message']}"
            return ApiError(status, err["type"], message, {"problems": [problem]})
    first = problems[0]
    return ApiError(400, "invalid", f"{first['field']}: {first['message']}", {"problems": problems})


async def read_model(request: web.Request, model: type[M]) -> M:
    """The body as `model`, with the bounds on what a request may ask (models/limits.py)."""
    data = await read_json(request)
    try:
        return model.model_validate(data, context=INCOMING)
    except ValidationError as exc:
        raise validation_error(exc) from exc
