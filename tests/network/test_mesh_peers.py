"""Which peers a node sets (`souk.network.mesh`), from catalog rows and announcements."""

from __future__ import annotations

from souk.models.catalog import MachineRow, MeshPeer, WorkerRow
from souk.network.mesh import Announced, Announcement, node_address, peers_of
from souk.worker.machines.addresses import DEFAULT_PREFIX, worker_prefix

KEY_A, KEY_B, KEY_P = ("A" * 43 + "=", "B" * 43 + "=", "P" * 43 + "=")


def worker(name: str, key: str | None) -> WorkerRow:
    address = node_address(DEFAULT_PREFIX, name)
    mesh = MeshPeer(public_key=key, endpoint=f"{name}:51820", address=address) if key else None
    return WorkerRow(
        id=name,
        region="mad",
        address=f"http://{name}",
        cpu_kinds=("shared",),
        cpus_total=1,
        memory_mb_total=1,
        cpus_reserved=0,
        memory_mb_reserved=0,
        epoch="e",
        mesh=mesh,
    )


def machine(mid: str, on: str, network: str, state: str = "started") -> MachineRow:
    ip = str(worker_prefix(DEFAULT_PREFIX, network, on)[7])
    return MachineRow(
        id=mid,
        app="a",
        region="mad",
        worker_id=on,
        state=state,
        instance_id="i",
        cpu_kind="shared",
        cpus=1,
        memory_mb=256,
        private_ip=ip,
        updated_at="t",
    )


def test_a_peer_is_every_other_node_on_the_mesh_with_its_machines_prefixes() -> None:
    workers = [worker("w1", KEY_A), worker("w2", KEY_B), worker("w3", None)]
    machines = [
        machine("m1", "w2", "acme/default"),
        machine("m2", "w2", "acme/default"),
        machine("m3", "w2", "acme/db"),
        machine("m4", "w2", "acme/old", state="destroyed"),
        machine("m5", "w3", "acme/default"),
    ]
    peers = peers_of("w1", workers, machines)
    assert set(peers) == {KEY_B}  # not itself, not a worker off the mesh
    endpoint, allowed = peers[KEY_B]
    assert endpoint == "w2:51820"
    assert allowed == sorted(
        [
            f"{node_address(DEFAULT_PREFIX, 'w2')}/128",
            str(worker_prefix(DEFAULT_PREFIX, "acme/default", "w2")),
            str(worker_prefix(DEFAULT_PREFIX, "acme/db", "w2")),
        ]
    )


def test_an_announcement_is_taken_only_for_a_hosts_address() -> None:
    announced = Announced(DEFAULT_PREFIX)
    own = MeshPeer(public_key=KEY_P, endpoint="p:51820", address=node_address(DEFAULT_PREFIX, "p"))
    announced.heard(Announcement(node="p", peer=own).model_dump_json().encode())
    assert announced.peers() == {KEY_P: ("p:51820", [f"{own.address}/128"])}
    # a machine's address claimed: it would take that machine's traffic; refused
    stolen = str(worker_prefix(DEFAULT_PREFIX, "acme/default", "w2")[7])
    thief = MeshPeer(public_key=KEY_A, endpoint="t:51820", address=stolen)
    announced.heard(Announcement(node="t", peer=thief).model_dump_json().encode())
    announced.heard(b"not json")
    assert set(announced.peers()) == {KEY_P}


def test_a_proxy_that_rotated_its_key_is_a_peer_by_its_new_key_alone() -> None:
    announced = Announced(DEFAULT_PREFIX)
    address = node_address(DEFAULT_PREFIX, "p")
    for key in (KEY_P, KEY_A):  # its announcement, then the same node's after `souk mesh rotate`
        peer = MeshPeer(public_key=key, endpoint="p:51820", address=address)
        announced.changed.clear()
        announced.heard(Announcement(node="p", peer=peer).model_dump_json().encode())
        assert announced.changed.is_set()
    assert announced.peers() == {KEY_A: ("p:51820", [f"{address}/128"])}
