"""Structured logs: every line names a resource and its state, as text or as JSON."""

from __future__ import annotations

import io
import json
import logging

import pytest

from souk.logsetup import about, setup


@pytest.fixture
def restore_logging():
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)


def test_json_lines_name_the_resource_and_state(restore_logging) -> None:
    out = io.StringIO()
    setup("info", "json", resource="w1", kind="worker", stream=out)
    log = logging.getLogger("souk.test")
    log.info("operation %s on %s", "stop", "m1", extra=about("m1", "stopping", op="stop"))
    log.info("listening on %s", "127.0.0.1:7100")
    log.debug("not shown")
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("failed", extra=about("m2", None))
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert len(lines) == 3
    first, second, third = lines
    assert first["resource"] == "m1" and first["state"] == "stopping"
    assert first["kind"] == "machine" and first["op"] == "stop"
    assert first["msg"] == "operation stop on m1" and first["level"] == "info"
    assert second["resource"] == "w1" and second["kind"] == "worker" and second["state"] == "-"
    assert third["resource"] == "m2" and "ValueError: boom" in third["exc"]


def test_text_lines_carry_the_same_fields(restore_logging) -> None:
    out = io.StringIO()
    setup("info", "text", resource="broker", kind="broker", stream=out)
    logging.getLogger("souk.test").warning("hello", extra=about("m1", "started", app="demo"))
    logging.getLogger("souk.test").warning("plain")
    first, second = out.getvalue().splitlines()
    assert "machine/m1 [started] hello app=demo" in first
    assert "broker/broker [-] plain" in second


def test_an_unknown_format_is_refused() -> None:
    with pytest.raises(ValueError, match="json"):
        setup("info", "xml")  # type: ignore[arg-type]
