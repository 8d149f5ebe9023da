"""The pieces of a signed catalog on their own: the hash tree and its paths, tick chains,
subject tokens, certificate rules and a replica file from before proofs were kept."""

from __future__ import annotations

import hashlib
import sqlite3
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding
from cryptography.x509.oid import NameOID

from souk.catalog.certs import bus_options, load_signer
from souk.catalog.protocol import (
    REGISTRY_OWNER,
    Change,
    changes_subject,
    pull_subject,
    subject_names,
    token,
)
from souk.catalog.signing import (
    Signed,
    TickChain,
    b64,
    head_proof_header,
    header_for,
    leaf,
    root_from_path,
    row_proof_header,
    rows_tree,
    tick_follows,
    tick_step,
    tree,
    unb64,
)
from souk.catalog.store import ReplicaStore
from souk.catalog.trust import CaTrust, Refused
from souk.pki import PkiError, new_key
from tests.catalog.pki import Ca


def test_every_leaf_of_every_tree_leads_to_its_root() -> None:
    for count in range(1, 34):
        leaves = [leaf("machines", f"m{i}", i, b"{}") for i in range(count)]
        root, paths = tree(leaves)
        assert len(paths) == count
        for i, lf in enumerate(leaves):
            assert root_from_path(lf, i, count, paths[i]) == root
            assert root_from_path(lf, (i + 1) % count, count, paths[i]) != root or count == 1
        other = leaf("machines", "m0", 0, b'{"app":"x"}')
        assert root_from_path(other, 0, count, paths[0]) != root
    assert tree([])[0] == bytes(32)
    one = leaf("workers", "w1", 1, b"{}")
    assert tree([one]) == (one, [[]])
    assert root_from_path(one, 0, 1, [one]) is None  # a path longer than the tree is tall


def test_what_owners_sign_and_replicas_relay_keeps_its_bytes() -> None:
    """Statements and proofs are stored in replica files and checked by replicas of other
    versions: the bytes of each stay as they were first made."""
    changes = [
        Change("machines", "m1", 7, {"b": 1, "a": "x"}),
        Change("machines", "m2", 8, None),
        Change("workers", "w1", 9, {"id": "w1"}),
    ]
    header, texts, paths = header_for("batch", "w1", "mad", "e1", 6, 9, False, changes, "f" * 32)
    root = "cr4LUBozmENeFKXTb8uz+m4ifOe89QkgAJvhdDca3Y8="
    fp = '"ffffffffffffffffffffffffffffffff"'
    assert header.statement() == (
        f'["souk.catalog/1","batch","w1","mad","e1",6,9,false,3,"{root}",{fp}]'.encode()
    )
    assert texts == [b'{"a":"x","b":1}', b"null", b'{"id":"w1"}']
    signed = header.signed("c2ln", texts, paths)
    part = f'"batch","mad","e1",6,9,false,3,{fp},"c2ln"'
    assert signed.head_proof() == f'[{part},"{root}"]'
    assert Signed(f"[{part}", root, texts, paths) == signed
    last = "ZsTUnjE4vT2x1+OEhgSptyjTN7ugcu1KFesBez2RhE8="
    assert signed.row_proof(2) == f'[{part},2,["{last}"]]'
    [text], one, [path] = rows_tree(changes[:1])
    assert (text, path) == (texts[0], [])  # a lone row's leaf, made inline, is the tree's
    assert one == b64(tree([leaf("machines", "m1", 7, text)])[0])
    lone = Signed(f"[{part}", one, [text], [path])
    assert lone.row_proof(0) == f"[{part},0,[]]" and lone.head_proof() == f'[{part},"{one}"]'
    for i, change in enumerate(changes):
        proof = orjson.loads(signed.row_proof(i))
        again = row_proof_header("w1", change.table, change.key, change.seq, texts[i], proof)
        assert again == (header, b"sig")
    assert head_proof_header("w1", orjson.loads(signed.head_proof())) == (header, b"sig")


def test_a_tick_chain_is_followed_across_lost_beats_and_renewed_when_used_up() -> None:
    chain = TickChain(length=4)
    at, n, tick = chain.next()
    _, n2, tick2 = chain.next()
    assert (n, n2) == (1, 2) and tick_follows(unb64(tick2), 1, unb64(tick))
    _, n4, tick4 = (chain.next(), chain.next())[1]  # beat 3 lost
    assert n4 == 4 and tick_follows(unb64(tick4), 2, unb64(tick2))
    assert not tick_follows(unb64(tick2), 2, unb64(tick4))  # a chain runs one way only
    assert not tick_follows(unb64(tick4), 1, unb64(tick2))
    later, n, fresh = chain.next()  # used up: a new chain, made later
    assert (n, later > at) == (1, True) and not tick_follows(unb64(fresh), 4, unb64(tick4))


def test_a_chain_step_is_the_hash_every_release_takes() -> None:
    """A replica's step (a prepared hash, copied) is BLAKE2b-256 of 0x03 and the element, as
    owners of every release make their chains: one step after another, across copies."""
    x = b"\x07" * 32
    for _ in range(3):
        assert tick_step(x) == hashlib.blake2b(b"\x03" + x, digest_size=32).digest()
        x = tick_step(x)


def test_names_become_one_subject_token_each() -> None:
    assert token("w1") == "w1" and token("app-registry") == "app-registry"
    assert token("w1.mad") == "w1%2Emad" and token("a*b>c d") == "a%2Ab%3Ec%20d"
    assert token("%2E") != token(".")
    subject = changes_subject("mad", "w1.mad")
    assert subject == "souk.cat.ch.mad.w1%2Emad"
    assert subject_names(subject) == ("mad", "w1.mad")
    assert subject_names("souk.cat.ch.mad") is None
    assert pull_subject("x.y") == "souk.cat.pull.x%2Ey"


def test_a_certificate_counts_only_for_its_owner_its_role_and_its_time() -> None:
    ca = Ca()
    trust = CaTrust([ca.cert])
    w1 = ca.node("worker", "w1")
    fp = trust.learn(w1.der)
    assert trust.verifier("w1", fp) is not None
    assert trust.verifier("w1", "0" * 32) is None  # not known here
    with pytest.raises(Refused) as refused:
        trust.verifier("w2", fp)
    assert refused.value.reason == "wrong_owner"
    broker = trust.learn(ca.node("broker", "b1").der)
    assert trust.verifier(REGISTRY_OWNER, broker) is not None
    with pytest.raises(Refused):
        trust.verifier("b1", broker)  # a broker writes no worker's rows
    for role, name in (("worker", REGISTRY_OWNER), ("proxy", "w1"), ("operator", "w1")):
        other = trust.learn(ca.node(role, name).der)
        for owner in ("w1", REGISTRY_OWNER):
            with pytest.raises(Refused) as refused:
                trust.verifier(owner, other)
            assert refused.value.reason == "wrong_owner"
    for der in (Ca().node("worker", "w1").der, ca.node("worker", "w9", age_days=2).der, b"junk"):
        with pytest.raises(Refused) as refused:
            trust.learn(der)
        assert refused.value.reason == "bad_certificate"
    new = Ca()  # the CA being replaced: both trusted meanwhile, each for its own
    both = CaTrust([ca.cert, new.cert])
    assert both.verifier("w1", both.learn(w1.der)) is not None
    assert both.verifier("w2", both.learn(new.node("worker", "w2").der)) is not None
    later = CaTrust([ca.cert], clock=lambda: time.time() + 3 * 86400)  # after w1's expires
    later.known = trust.known
    with pytest.raises(Refused) as refused:
        later.verifier("w1", fp)
    assert refused.value.reason == "bad_certificate"


def test_a_certificate_the_cluster_pki_would_not_take_is_refused() -> None:
    """A certificate is read by `souk.pki`, as strictly as a TLS peer's: signed by the CA but
    without its URI name (or any other layout) it is no identity."""
    ca = Ca()
    now = datetime.now(UTC)
    key = new_key()
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "souk"),
            x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "worker"),
            x509.NameAttribute(NameOID.COMMON_NAME, "w1"),
        ]
    )
    bare = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca.key, None)
    )
    with pytest.raises(Refused) as refused:
        ca.trust().learn(bare.public_bytes(Encoding.DER))
    assert refused.value.reason == "bad_certificate" and "extension" in str(refused.value)


def test_a_node_signs_from_its_files_only_the_rows_it_may(tmp_path: Path) -> None:
    ca = Ca()
    files = ca.node("worker", "w1").write(tmp_path / "w1")
    signer = load_signer(files, "w1")
    trust = ca.trust()
    assert trust.learn(signer.certificate) == signer.fingerprint
    verifier = trust.verifier("w1", signer.fingerprint)
    assert verifier is not None and verifier.verify(signer.sign(b"rows"), b"rows")
    assert bus_options(files)["inbox_prefix"] == "_INBOX.worker.w1"
    with pytest.raises(PkiError, match="may not sign 'w2'"):
        load_signer(files, "w2")
    broker = ca.node("broker", "b1").write(tmp_path / "b1")
    assert load_signer(broker, REGISTRY_OWNER).fingerprint != signer.fingerprint
    with pytest.raises(PkiError, match="may not sign"):
        load_signer(broker, "b1")
    other = ca.node("worker", "w1").write(tmp_path / "other")
    files.key.write_bytes(other.key.read_bytes())
    with pytest.raises(PkiError, match="is not the key of"):
        load_signer(files, "w1")
    expired = ca.node("worker", "w1", age_days=2).write(tmp_path / "expired")
    with pytest.raises(PkiError, match="expired"):
        load_signer(expired, "w1")


def test_a_replica_file_from_before_proofs_opens_and_keeps_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    old = sqlite3.connect(path)
    old.executescript(
        """
        CREATE TABLE rows (owner TEXT NOT NULL, tbl TEXT NOT NULL, key TEXT NOT NULL,
            seq INTEGER NOT NULL, row TEXT, PRIMARY KEY (owner, tbl, key));
        CREATE TABLE owners (owner TEXT PRIMARY KEY, region TEXT NOT NULL, epoch TEXT NOT NULL,
            head INTEGER NOT NULL);
        INSERT INTO rows VALUES ('w1', 'images', 'sha256:00', 3, '{"x": 1}');
        INSERT INTO owners VALUES ('w1', 'mad', 'e1', 3);
        """
    )
    old.commit()
    old.close()
    store = ReplicaStore(path)
    assert list(store.owners()) == [("w1", "mad", "e1", 3)]
    assert list(store.all_rows()) == [("w1", "images", "sha256:00", 3, {"x": 1})]
    store.begin()
    store.put("w1", "images", "sha256:01", 4, {"x": 2}, b'{"x":2}', '["proof"]')
    store.commit()
    assert store.live_rows({"w1"})[-1] == ("w1", "images", "sha256:01", 4, '{"x":2}', '["proof"]')
    store.close()
