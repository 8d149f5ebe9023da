"""Bad requests to a real worker process: each is a 4xx with a machine-readable code, never a 500,
and none of them leaves anything behind."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.worker_process import WorkerProcess

pytestmark = pytest.mark.integration

JSON = {"Content-Type": "application/json"}
GOOD = {"init": {"exec": ["sleep", "60"]}}


def config(**fields: Any) -> dict[str, Any]:
    return {"app": "demo", "start": False, "config": {**GOOD, **fields}}


# (method, path, JSON body or raw bytes, status, code)
CASES: list[tuple[str, str, Any, int, str]] = [
    # Not JSON at all.
    ("POST", "/v1/machines", b"{nope", 400, "invalid_json"),
    ("POST", "/v1/machines", b"\xff\xfe\x00", 400, "invalid_json"),
    ("POST", "/v1/machines/{id}/stop", b"[", 400, "invalid_json"),
    # JSON, but not an object.
    ("POST", "/v1/machines", [1, 2], 400, "invalid"),
    ("POST", "/v1/machines", "machine", 400, "invalid"),
    ("POST", "/v1/machines", b"null", 400, "invalid"),
    # Wrong types and values.
    ("POST", "/v1/machines", {"app": "demo", "config": {"init": 5}}, 400, "invalid"),
    ("POST", "/v1/machines", {"app": 7, "config": GOOD}, 400, "invalid"),
    ("POST", "/v1/machines", {"app": "Bad App!", "config": GOOD}, 400, "invalid"),
    ("POST", "/v1/machines", {"app": "demo"}, 400, "invalid"),
    ("POST", "/v1/machines", config(guest={"cpus": "lots"}), 400, "invalid"),
    ("POST", "/v1/machines", config(guest={"cpus": 0}), 400, "invalid"),
    ("POST", "/v1/machines", config(guest={"cpus": 10**100}), 400, "invalid"),
    ("POST", "/v1/machines", config(guest={"memory_mb": -1}), 400, "invalid"),
    ("POST", "/v1/machines", config(restart={"policy": "sometimes"}), 400, "invalid"),
    ("POST", "/v1/machines", config(restart={"max_retries": -1}), 400, "invalid"),
    ("POST", "/v1/machines", config(stop_config={"signal": "SIGFOO"}), 400, "invalid"),
    ("POST", "/v1/machines", config(stop_config={"timeout": "forever"}), 400, "invalid"),
    ("POST", "/v1/machines", config(stop_config={"timeout": -1}), 400, "invalid"),
    ("POST", "/v1/machines", config(env={"1BAD": "x"}), 400, "invalid"),
    ("POST", "/v1/machines", config(init={"exec": []}), 400, "invalid"),
    # A NUL cannot reach execve: refused up front, not a machine that fails to spawn.
    ("POST", "/v1/machines", config(init={"exec": ["sleep", "6\u00000"]}), 400, "invalid"),
    ("POST", "/v1/machines", config(init={"exec": ["true"], "cmd": ["a\u0000"]}), 400, "invalid"),
    ("POST", "/v1/machines", config(env={"A": "x\u0000y"}), 400, "invalid"),
    ("POST", "/v1/machines", {**config(), "id": "NOT/AN/ID"}, 400, "invalid"),
    # Python's json reads these non-standard literals; a duration must still be finite.
    (
        "POST",
        "/v1/machines",
        b'{"app": "demo", "config": {"init": {"exec": ["true"]},'
        b' "stop_config": {"timeout": Infinity}}}',
        400,
        "invalid",
    ),
    (
        "POST",
        "/v1/machines",
        b'{"app": "demo", "config": {"init": {"exec": ["true"]}, "stop_config": {"timeout": NaN}}}',
        400,
        "invalid",
    ),
    ("POST", "/v1/machines", config(stop_config={"timeout": "9" * 400 + "s"}), 400, "invalid"),
    ("POST", "/v1/machines", b'{"app": "demo", "config": 1e400}', 400, "invalid"),
    ("POST", "/v1/machines/{id}/stop", {"timeout": 1e400}, 400, "invalid"),
    ("POST", "/v1/machines/{id}/stop", {"signal": 9}, 400, "invalid"),
    ("POST", "/v1/offers", {"guest": {"cpus": "x"}}, 400, "invalid"),
    ("POST", "/v1/machines/{id}/lease", {"ttl": 0}, 400, "invalid"),
    ("PATCH", "/v1/machines/{id}/metadata", {"set": {"a": 1}}, 400, "invalid"),
    # Unknown fields, where the models forbid them.
    ("POST", "/v1/machines", {**config(), "colour": "red"}, 400, "invalid"),
    ("POST", "/v1/machines", config(colour="red"), 400, "invalid"),
    ("POST", "/v1/machines", config(guest={"gpus": 1}), 400, "unsupported"),
    ("POST", "/v1/machines/{id}/stop", {"signal": "SIGTERM", "grace": 1}, 400, "invalid"),
    ("PUT", "/v1/machines/{id}", {"config": GOOD, "colour": "red"}, 400, "invalid"),
    ("POST", "/v1/offers", {"guest": {}, "colour": "red"}, 400, "invalid"),
    # Query parameters.
    ("GET", "/v1/machines/{id}/wait?state=asleep", None, 400, "invalid"),
    ("GET", "/v1/machines/{id}/wait?timeout=soon", None, 400, "invalid"),
    ("GET", "/v1/machines/{id}/wait?timeout=nan", None, 400, "invalid"),
    ("GET", "/v1/machines/{id}/wait?timeout=1e9", None, 400, "invalid"),
    ("GET", "/v1/machines/{id}/logs?stream=stdin", None, 400, "invalid"),
    # Unknown machines.
    ("GET", "/v1/machines/nosuchmachine", None, 404, "not_found"),
    ("PUT", "/v1/machines/nosuchmachine", {"config": GOOD}, 404, "not_found"),
    ("DELETE", "/v1/machines/nosuchmachine?force=true", None, 404, "not_found"),
    ("POST", "/v1/machines/nosuchmachine/start", None, 404, "not_found"),
    ("POST", "/v1/machines/nosuchmachine/stop", {}, 404, "not_found"),
    ("POST", "/v1/machines/nosuchmachine/restart", None, 404, "not_found"),
    ("GET", "/v1/machines/nosuchmachine/wait?state=started&timeout=0", None, 404, "not_found"),
    ("GET", "/v1/machines/nosuchmachine/events", None, 404, "not_found"),
    ("GET", "/v1/machines/nosuchmachine/logs", None, 404, "not_found"),
    ("GET", "/v1/machines/nosuchmachine/lease", None, 404, "not_found"),
    ("POST", "/v1/machines/nosuchmachine/lease", {}, 404, "not_found"),
    ("PATCH", "/v1/machines/nosuchmachine/metadata", {"set": {"a": "b"}}, 404, "not_found"),
    ("GET", "/v1/machines/..%2F..%2Fworker.db/logs", None, 404, "not_found"),
    # Unknown routes and methods.
    ("GET", "/v1/nothing-here", None, 404, "not_found"),
    ("PATCH", "/v1/capacity", {}, 405, "method_not_allowed"),
    # Illegal transitions of a machine that was created and never started.
    ("POST", "/v1/machines/{id}/stop", {}, 409, "invalid_state"),
    ("POST", "/v1/machines/{id}/restart", None, 409, "invalid_state"),
    # Does not fit, or not offered here.
    ("POST", "/v1/machines", config(guest={"cpus": 64}), 412, "insufficient_capacity"),
    (
        "POST",
        "/v1/machines",
        config(guest={"cpu_kind": "performance"}),
        412,
        "insufficient_capacity",
    ),
    (
        "PUT",
        "/v1/machines/{id}",
        {"config": {**GOOD, "guest": {"cpus": 64}}},
        412,
        "insufficient_capacity",
    ),
]


@pytest.fixture
def parked(worker: WorkerProcess) -> str:
    """A machine that was created and never started."""
    return str(worker.create(GOOD, start=False)["id"])


def send(worker: WorkerProcess, method: str, path: str, body: Any) -> Any:
    if isinstance(body, bytes):
        return worker.call(method, path, data=body, headers=JSON)
    return worker.call(method, path, body)


def test_bad_requests_are_4xx_with_a_code(worker: WorkerProcess, parked: str) -> None:
    wrong = []
    for method, path, body, status, code in CASES:
        reply = send(worker, method, path.replace("{id}", parked), body)
        ok = (
            reply.status == status
            and isinstance(reply.body, dict)
            and reply.body.get("code") == code
            and reply.body.get("status") == code
            and isinstance(reply.body.get("error"), str)
        )
        if not ok:
            wrong.append((method, path, body if not isinstance(body, bytes) else body[:80], reply))
    assert not wrong, "\n".join(map(repr, wrong))
    # Nothing was created or reserved by any of them, and the server never failed.
    assert [m["id"] for m in worker.ok("GET", "/v1/machines")] == [parked]
    assert worker.ok("GET", "/v1/capacity")["reserved"] == {"cpus": 1, "memory_mb": 256}
    assert "unhandled error" not in worker.log_path.read_text()


def test_illegal_transitions_of_a_destroyed_machine(worker: WorkerProcess, parked: str) -> None:
    worker.ok("DELETE", f"/v1/machines/{parked}")
    worker.wait(parked, "destroyed")
    for method, path, body in [
        ("POST", f"/v1/machines/{parked}/start", None),
        ("POST", f"/v1/machines/{parked}/stop", {}),
        ("POST", f"/v1/machines/{parked}/restart", None),
        ("PUT", f"/v1/machines/{parked}", {"config": GOOD}),
        ("PATCH", f"/v1/machines/{parked}/metadata", {"set": {"a": "b"}}),
    ]:
        reply = worker.call(method, path, body)
        assert reply.status == 409 and reply.body["code"] == "invalid_state", (path, reply)
    assert worker.ok("GET", "/v1/capacity")["reserved"] == {"cpus": 0, "memory_mb": 0}


def test_an_id_taken_is_refused(worker: WorkerProcess, parked: str) -> None:
    reply = worker.call("POST", "/v1/machines", {**config(), "id": parked})
    assert reply.status == 409 and reply.body["code"] == "already_exists"


def test_wrong_content_type_is_415(worker: WorkerProcess) -> None:
    reply = worker.call(
        "POST", "/v1/machines", data=b"app=demo", headers={"Content-Type": "text/plain"}
    )
    assert reply.status == 415 and reply.body["code"] == "unsupported_media_type"


def test_a_body_past_the_size_limit_is_413(worker: WorkerProcess) -> None:
    big = config(env={"A": "x" * (2 << 20)})  # the worker takes at most 1 MiB
    reply = worker.call("POST", "/v1/machines", big)
    assert reply.status == 413 and reply.body["code"] == "body_too_large"
    assert worker.ok("GET", "/v1/machines") == []
    # The worker goes on answering.
    assert worker.ok("GET", "/v1/capacity")["machines"] == 0
