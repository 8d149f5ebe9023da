"""An authenticated bus: a nats-server configuration where every client shows a certificate from
the cluster CA, is mapped to a user by the name in it (`verify_and_map`), and may publish and
subscribe only where its role needs to. Nobody connects anonymously.

The users are named by the certificate's URI name, `souk://<role>/<name>`, which nats-server
matches before the subject. Roles and what they may do:

- worker: publish its own changes and heartbeats (`souk.cat.ch|hb.<region>.<name>`) and the one
  answer to each pull, certificate request and offer call it receives; subscribe to its own pull
  and certificate subjects, to hello, to its region's offer calls and to its reservations
  (`souk.reserve.<name>`). It reads no one's rows.
- broker: a replica, the app registry's owner, and the caller of offers: publish pulls,
  certificate and snapshot requests, hello, offer calls, reservations and the registry's changes and
  heartbeats; answer snapshot requests; subscribe to every change and heartbeat, snapshot
  requests, hello, the registry's pull and certificate subjects and its own inbox.
- proxy, operator: a replica (`souk proxy`, `souk catalog serve`): the same, without owning
  rows or calling offers.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from souk.catalog.protocol import (
    GLOBAL_REGION,
    HELLO,
    PREFIX,
    REGISTRY_OWNER,
    SNAPSHOT,
    WILDCARD,
    cert_subject,
    changes_subject,
    heartbeat_subject,
    pull_subject,
    reserve_subject,
    token,
)
from souk.models.capacity import offers_subject
from souk.pki import NodeFiles, PkiError
from souk.pki.identity import check_name, identity_uri

ROLES = ("worker", "broker", "proxy", "operator")  # the bus's clients; "bus" is its server
SNAPSHOT_ANSWERS = 100_000  # chunks one snapshot request may be answered with


class ConfigError(ValueError):
    """A node or option the configuration cannot be made from."""


@dataclass(frozen=True)
class Node:
    role: str
    name: str
    region: str | None = None  # a worker's, to narrow its subjects; else any region

    @property
    def user(self) -> str:
        """The URI name in its certificate, which nats-server maps it by."""
        return identity_uri(self.role, self.name)


def parse_node(text: str) -> Node:
    """`ROLE:NAME`, or `worker:NAME@REGION`; NAME as in its certificate (a lower-case DNS name,
    a worker's id)."""
    role, sep, rest = text.partition(":")
    name, _, region = rest.partition("@")
    if not sep or not name:
        raise ConfigError(f"{text!r}: write a node as ROLE:NAME (or worker:NAME@REGION)")
    if role not in ROLES:
        raise ConfigError(f"{text!r}: the role is one of {', '.join(ROLES)}")
    try:
        check_name(name)
    except PkiError as exc:
        raise ConfigError(f"{text!r}: {exc}") from None
    if region and role != "worker":
        raise ConfigError(f"{text!r}: only a worker has a region")
    return Node(role, name, region or None)


def inbox_prefix(role: str, name: str) -> str:
    """Where replies to a node's requests arrive: only that node may subscribe there."""
    return f"_INBOX.{token(role)}.{token(name)}"


def permissions(node: Node) -> dict[str, Any]:
    """A node's publish and subscribe permissions, as nats-server reads them."""
    inbox = f"{inbox_prefix(node.role, node.name)}.>"
    if node.role == "worker":
        region = node.region or WILDCARD
        return {
            "publish": {
                "allow": [
                    changes_subject(region, node.name),
                    heartbeat_subject(region, node.name),
                ]
            },
            "subscribe": {
                "allow": [
                    pull_subject(node.name),
                    cert_subject(node.name),
                    reserve_subject(node.name),
                    HELLO,
                    offers_subject(region),
                    inbox,
                ]
            },
            "allow_responses": {"max": 1},
        }
    replica_publish = [pull_subject(WILDCARD), cert_subject(WILDCARD), SNAPSHOT, HELLO]
    replica_subscribe = [f"{PREFIX}.ch.>", f"{PREFIX}.hb.>", SNAPSHOT, inbox]
    if node.role == "broker":
        return {
            "publish": {
                "allow": [
                    *replica_publish,
                    offers_subject(WILDCARD),
                    reserve_subject(WILDCARD),
                    changes_subject(GLOBAL_REGION, REGISTRY_OWNER),
                    heartbeat_subject(GLOBAL_REGION, REGISTRY_OWNER),
                ]
            },
            "subscribe": {
                "allow": [
                    *replica_subscribe,
                    HELLO,
                    pull_subject(REGISTRY_OWNER),
                    cert_subject(REGISTRY_OWNER),
                ]
            },
            "allow_responses": {"max": SNAPSHOT_ANSWERS, "expires": "1m"},
        }
    return {
        "publish": {"allow": replica_publish},
        "subscribe": {"allow": replica_subscribe},
        "allow_responses": {"max": SNAPSHOT_ANSWERS, "expires": "1m"},
    }


def _value(value: Any, indent: int) -> str:
    """nats-server's configuration syntax for a value: JSON-like, with `key: value` blocks."""
    pad = "  " * indent
    if isinstance(value, dict):
        inner = "\n".join(f"{pad}  {k}: {_value(v, indent + 1)}" for k, v in value.items())
        return "{\n" + inner + f"\n{pad}}}"
    if isinstance(value, list):
        if not value:
            return "[]"
        inner = "\n".join(f"{pad}  {_value(v, indent + 1)}" for v in value)
        return "[\n" + inner + f"\n{pad}]"
    return json.dumps(value)  # strings quoted, so `$`, `*` and `>` are never read as syntax


def render(
    nodes: Sequence[Node],
    server: NodeFiles,
    host: str = "0.0.0.0",
    port: int = 4222,
    routes: Sequence[str] = (),
    cluster_port: int = 6222,
    cluster_name: str = "souk",
    extra_users: Sequence[dict[str, Any]] = (),
) -> str:
    """The whole configuration file; `server`: the files of the bus's own certificate (role
    `bus`) and of the CA it checks clients against. With `routes`, the server joins a cluster
    whose route connections use the same TLS and accept only peers whose certificate names one
    of the routes' hosts (`verify_cert_and_check_known_urls`). `extra_users`: users with permissions
    of their own, as nats-server reads them (a benchmark speaking for a thousand owners)."""
    if not nodes:
        raise ConfigError("no nodes: give at least one --node ROLE:NAME")
    users = [n.user for n in nodes]
    if len(set(users)) != len(users):
        raise ConfigError("a node is given twice")
    tls = {
        "cert_file": str(server.cert.resolve()),
        "key_file": str(server.key.resolve()),
        "ca_file": str(server.ca.resolve()),
    }
    config: dict[str, Any] = {
        "listen": f"{host}:{port}",
        "tls": {**tls, "verify_and_map": True},
        "authorization": {
            "users": [
                *({"user": n.user, "permissions": permissions(n)} for n in nodes),
                *extra_users,
            ]
        },
    }
    if routes:
        config["cluster"] = {
            "name": cluster_name,
            "listen": f"{host}:{cluster_port}",
            "tls": {**tls, "verify_cert_and_check_known_urls": True},
            "routes": list(routes),
        }
    header = "# nats-server configuration for souk, made by `souk nats config`.\n"
    return header + "\n".join(f"{k}: {_value(v, 0)}" for k, v in config.items()) + "\n"
