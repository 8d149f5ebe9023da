"""JSON bodies: nesting measured without recursion, then parsed; anything wrong is a 400."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from souk.web import ApiError
from souk.web.body import MAX_DEPTH, json_depth, parse_json

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=30,
)


def depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max((depth(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((depth(v) for v in value.values()), default=0)
    return 0


@given(JSON_VALUES, st.booleans())
def test_depth_is_exact_for_valid_json(value: Any, ascii_only: bool) -> None:
    raw = json.dumps(value, ensure_ascii=ascii_only).encode()
    assert json_depth(raw) == depth(value)


@given(st.binary(max_size=300))
def test_anything_at_all_is_a_value_or_a_400(raw: bytes) -> None:
    try:
        parse_json(raw)
    except ApiError as exc:
        assert (exc.http_status, exc.reason) == (400, "invalid_json")


@pytest.mark.parametrize(
    "raw",
    [
        b"[" * 100_000,
        b"[" * 100_000 + b"]" * 100_000,
        b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
        b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1),
        b'["\\"",' + b"[" * 1000,  # the string holds an escaped quote, then ends
        b'["' + b"\\\\" * 10 + b'",' + b"[" * 1000,  # an escaped backslash escapes nothing
    ],
)
def test_deep_nesting_is_refused_before_parsing(raw: bytes) -> None:
    with pytest.raises(ApiError) as info:
        parse_json(raw)
    assert (info.value.http_status, info.value.reason) == (400, "invalid_json")
    assert "deep" in info.value.message


def test_nesting_up_to_the_limit_and_brackets_in_strings_are_fine() -> None:
    ok = b"[" * MAX_DEPTH + b"]" * MAX_DEPTH
    assert depth(parse_json(ok)) == MAX_DEPTH
    assert parse_json(b'{"a": "' + b"[" * 10_000 + b'"}') == {"a": "[" * 10_000}


@pytest.mark.parametrize(
    "raw",
    [
        '{"a": 1}'.encode("utf-16"),  # json.loads would guess UTF-16; a brace scan could not
        b"\xff\xfe\x00",
        b"[" + b"1" * 5000 + b"]",  # over Python's int digit limit
        b"{nope",
        b'"unterminated',
    ],
)
def test_non_utf8_and_invalid_json_are_400(raw: bytes) -> None:
    with pytest.raises(ApiError) as info:
        parse_json(raw)
    assert (info.value.http_status, info.value.reason) == (400, "invalid_json")


def test_quote_runs_scan_in_linear_passes() -> None:
    # Many escaped quotes in an unterminated string: a pattern that could fail would be retried
    # at each quote, quadratically. This completes at once; a regression would hang the test.
    assert json_depth(b'"' + b'\\"' * 500_000) == 0
    assert json_depth(b'["' + b'\\"[' * 300_000) == 1
