"""Keys 0600, certificates 0644, directories 0700; a key is never replaced by accident."""

from __future__ import annotations

import os
import shutil
import stat
from dataclasses import replace
from pathlib import Path

import pytest

from souk.pki import (
    NodeFiles,
    PkiError,
    identity_of,
    init_ca,
    issue_files,
    load_cas,
    load_cert,
    load_key,
)
from souk.pki.files import save_key
from souk.pki.issue import new_key
from tests.support.pki import Pki


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_modes_of_everything_written(umask_022: None, pki: Pki, tmp_path: Path):
    assert mode(pki.ca_dir) == 0o700
    assert mode(pki.ca_dir / "ca.key") == 0o600
    assert mode(pki.ca_dir / "ca.crt") == 0o644
    files, _ = issue_files(pki.ca_dir, tmp_path / "out", "worker", "w1")
    assert mode(tmp_path / "out") == 0o700
    assert (mode(files.key), mode(files.cert), mode(files.ca)) == (0o600, 0o644, 0o644)
    assert files.ca.read_bytes() == (pki.ca_dir / "ca.crt").read_bytes()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["ca.crt", "w1.crt", "w1.key"]


def test_a_key_is_0600_from_its_first_byte(tmp_path: Path, umask_022: None):
    """The key is created with its mode and filled under another name: whenever its final name
    exists, it is complete and 0600. A tighter umask cannot make it any wider."""
    os.umask(0o077)
    save_key(tmp_path / "k.key", new_key())
    assert mode(tmp_path / "k.key") == 0o600
    assert load_key(tmp_path / "k.key") is not None
    assert [p.name for p in tmp_path.iterdir()] == ["k.key"]  # no temporary left behind


def test_keys_are_not_overwritten_without_force(pki: Pki, tmp_path: Path):
    out = tmp_path / "out"
    files, first = issue_files(pki.ca_dir, out, "worker", "w1")
    key_before = files.key.read_bytes()
    with pytest.raises(PkiError, match="exists; pass --force"):
        issue_files(pki.ca_dir, out, "worker", "w1")
    assert files.key.read_bytes() == key_before
    assert load_cert(files.cert).serial_number == first.serial_number

    _, forced = issue_files(pki.ca_dir, out, "worker", "w1", force=True)
    assert files.key.read_bytes() != key_before
    assert load_cert(files.cert).serial_number == forced.serial_number
    assert (
        identity_of(forced).public_key.public_bytes_raw()
        == load_key(files.key).public_key().public_bytes_raw()
    )


def test_reuse_key_renews_the_certificate_only(pki: Pki, tmp_path: Path):
    out = tmp_path / "out"
    files, first = issue_files(pki.ca_dir, out, "worker", "w1", days=1)
    key_before = files.key.read_bytes()
    _, renewed = issue_files(pki.ca_dir, out, "worker", "w1", days=30, reuse_key=True)
    assert files.key.read_bytes() == key_before
    assert renewed.serial_number != first.serial_number
    assert renewed.not_valid_after_utc > first.not_valid_after_utc
    assert identity_of(renewed).public_key == identity_of(first).public_key


def test_reuse_key_needs_a_key(pki: Pki, tmp_path: Path):
    with pytest.raises(PkiError, match="cannot read a private key"):
        issue_files(pki.ca_dir, tmp_path / "out", "worker", "w1", reuse_key=True)


def test_the_ca_is_not_replaced_without_force(pki: Pki):
    key_before = (pki.ca_dir / "ca.key").read_bytes()
    with pytest.raises(PkiError, match="exists"):
        init_ca(pki.ca_dir)
    assert (pki.ca_dir / "ca.key").read_bytes() == key_before
    init_ca(pki.ca_dir, force=True)
    assert (pki.ca_dir / "ca.key").read_bytes() != key_before


def test_issuing_needs_a_ca(tmp_path: Path):
    with pytest.raises(PkiError, match="cannot read a private key"):
        issue_files(tmp_path / "nowhere", tmp_path / "out", "worker", "w1")
    assert not (tmp_path / "out").exists()


def test_loading_refuses_other_keys_and_garbage(tmp_path: Path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ec import SECP256R1, generate_private_key

    ec = generate_private_key(SECP256R1()).private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    (tmp_path / "ec.key").write_bytes(ec)
    with pytest.raises(PkiError, match="not Ed25519"):
        load_key(tmp_path / "ec.key")
    (tmp_path / "junk.crt").write_text("not a certificate")
    with pytest.raises(PkiError, match="cannot read a certificate"):
        load_cert(tmp_path / "junk.crt")


def test_a_part_finds_and_checks_its_own_files(pki: Pki, other_pki: Pki):
    files = pki.node("worker", "w1")
    directory = files.cert.parent
    assert NodeFiles.find(directory) == files == NodeFiles.find(directory, "w1")
    ident = files.check(role="worker")
    assert (ident.role, ident.name) == ("worker", "w1")
    with pytest.raises(PkiError, match="certificate of worker w1, not of a bus"):
        files.check(role="bus")
    with pytest.raises(PkiError, match="bad name"):
        NodeFiles.find(directory, "W1")
    with pytest.raises(PkiError, match=r"one NAME\.key, not none"):
        NodeFiles.find(directory.parent)

    stranger = replace(other_pki.node("worker", "w2"), ca=files.ca)
    with pytest.raises(PkiError, match="not the CA's"):
        stranger.check()
    with pytest.raises(PkiError, match="expired"):
        pki.node("worker", "old", age_days=40).check()
    other = pki.node("worker", "w3")
    files.key.write_bytes(other.key.read_bytes())
    with pytest.raises(PkiError, match="is not the key of"):
        files.check()
    shutil.copy(other.key, directory / "w3.key")
    with pytest.raises(PkiError, match=r"one NAME\.key, not w1, w3"):
        NodeFiles.find(directory)


def test_a_bundle_of_two_cas_checks_the_nodes_of_either(pki: Pki, other_pki: Pki):
    """While the CA is replaced, ca.crt holds the old and the new: a part checks against both."""
    old, new = pki.node("worker", "w1"), other_pki.node("worker", "w2")
    bundle = old.ca.read_bytes() + (other_pki.ca_dir / "ca.crt").read_bytes()
    for files in (old, new):
        files.ca.write_bytes(bundle)
    assert load_cas(old.ca) == [
        load_cert(pki.ca_dir / "ca.crt"),
        load_cert(other_pki.ca_dir / "ca.crt"),
    ]
    assert old.check().name == "w1" and new.check().name == "w2"
    expired = pki.node("worker", "old", age_days=40)
    expired.ca.write_bytes(bundle)
    with pytest.raises(PkiError, match="expired"):  # the reason of the CA that signed it
        expired.check()
    alone = replace(new, ca=pki.ca_dir / "ca.crt")
    with pytest.raises(PkiError, match="not the CA's"):
        alone.check()
    with pytest.raises(PkiError, match="holds a certificate that is no CA"):
        load_cas(old.cert)
    (pki.root / "empty.crt").write_text("")
    with pytest.raises(PkiError, match="cannot read a certificate"):
        load_cas(pki.root / "empty.crt")
