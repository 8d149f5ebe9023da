"""Tokens: verified with the secret alone; tampering, bad caveats, expiry, revocation and
scope are refused, and attenuation never widens anything."""

from __future__ import annotations

import base64
import hashlib
import hmac
import itertools
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from souk.broker import tokens as tk
from souk.broker.tokens import Scope, TokenError, attenuate, mint, verify
from souk.cli.main import app as cli
from souk.node.cluster_secret import new_secret

SECRET = b"s" * 32
NOW = 1_700_000_000.0


def test_a_fresh_token_verifies_and_allows_everything_not_operator() -> None:
    grant = verify(mint(SECRET), SECRET)
    assert grant.apps is None and not grant.read_only and not grant.operator
    assert grant.permits(Scope("deploy", app="any")) and grant.sees("any", None, None)
    assert not grant.sees_fleet()


def test_operator_tokens_say_so() -> None:
    assert verify(mint(SECRET, operator=True), SECRET).operator


def test_another_secret_does_not_verify() -> None:
    with pytest.raises(TokenError, match="signature"):
        verify(mint(SECRET), new_secret())


def _body(token: str) -> tuple[dict[str, object], str]:
    body, sig = token.removeprefix("souk1_").split(".")
    return json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))), sig


def _rebuild(body: dict[str, object], sig: str) -> str:
    text = base64.urlsafe_b64encode(json.dumps(body).encode()).rstrip(b"=").decode()
    return f"souk1_{text}.{sig}"


def test_removing_or_editing_a_caveat_breaks_the_signature() -> None:
    token = mint(SECRET, apps=["a"], read_only=True)
    body, sig = _body(token)
    caveats = body["c"]
    assert isinstance(caveats, list)
    for forged in ([caveats[0]], [caveats[1]], ["apps=a,b", caveats[1]], []):
        with pytest.raises(TokenError, match="signature"):
            verify(_rebuild({**body, "c": forged}, sig), SECRET)


def test_promoting_a_token_to_operator_breaks_the_signature() -> None:
    body, sig = _body(mint(SECRET))
    ident = json.loads(str(body["i"]))
    forged = {**body, "i": json.dumps({**ident, "op": True})}
    with pytest.raises(TokenError, match="signature"):
        verify(_rebuild(forged, sig), SECRET)


@pytest.mark.parametrize(
    "garbage", ["", "Bearer x", "souk1_", "souk1_a.b", "souk1_!!!.??", "souk1_" + "A" * 9000]
)
def test_garbage_is_refused_not_crashed_on(garbage: str) -> None:
    with pytest.raises(TokenError):
        verify(garbage, SECRET)


def test_expiry() -> None:
    token = mint(SECRET, ttl=60, now=NOW)
    assert verify(token, SECRET, now=NOW + 59).expires == int(NOW + 60)
    with pytest.raises(TokenError, match="expired"):
        verify(token, SECRET, now=NOW + 60)


def test_app_scope_and_read_only() -> None:
    grant = verify(mint(SECRET, apps=["a", "b"], read_only=True), SECRET)
    assert grant.sees("a", None, None)
    assert not grant.sees("c", None, None)
    assert "app 'c'" in (grant.denial(Scope("read", app="c")) or "")
    assert "read-only" in (grant.denial(Scope("write", app="a")) or "")


def test_attenuation_narrows_without_the_secret_and_never_widens() -> None:
    token = mint(SECRET, apps=["a", "b"], ttl=100, now=NOW)
    narrower = attenuate(token, ["apps=b,c", "access=read", f"expires={int(NOW + 10)}"])
    grant = verify(narrower, SECRET, now=NOW)
    assert grant.apps == frozenset({"b"})
    assert grant.read_only
    assert grant.expires == int(NOW + 10)
    with pytest.raises(TokenError, match="expired"):
        verify(narrower, SECRET, now=NOW + 50)


def test_unknown_caveats_cannot_be_added() -> None:
    with pytest.raises(TokenError, match="unknown caveat"):
        attenuate(mint(SECRET), ["operator=true"])


def test_short_secrets_are_refused() -> None:
    with pytest.raises(ValueError):
        mint(b"short")


# --- caveats: strict, bounded, never a crash ------------------------------------------------


def _append_raw(token: str, caveat: object) -> str:
    """What any holder can do without the secret: chain one more caveat on the signature,
    whether or not a broker understands it (attenuate() refuses to)."""
    body, sig_text = _body(token)
    sig = base64.urlsafe_b64decode(sig_text + "=" * (-len(sig_text) % 4))
    data = caveat.encode() if isinstance(caveat, str) else json.dumps(caveat).encode()
    new_sig = hmac.new(sig, data, hashlib.sha256).digest()
    caveats = body["c"]
    assert isinstance(caveats, list)
    forged_sig = base64.urlsafe_b64encode(new_sig).rstrip(b"=").decode()
    return _rebuild({**body, "c": [*caveats, caveat]}, forged_sig)


@pytest.mark.parametrize(
    ("caveat", "reason"),
    [
        ("expires=\u00b2", "caveat_malformed"),  # str.isdigit() says yes, int() says no
        ("expires=" + "9" * 5000, "caveat_malformed"),
        ("expires=" + "9" * 13, "caveat_malformed"),
        ("expires=-1", "caveat_malformed"),
        ("expires=01", "caveat_malformed"),
        ("expires=1.5", "caveat_malformed"),
        ("expires=\u0663", "caveat_malformed"),  # an Arabic-Indic three
        ("apps=", "caveat_malformed"),
        ("apps=a,,b", "caveat_malformed"),
        ("apps=Bad", "caveat_malformed"),
        ("apps=" + ",".join(f"a{i}" for i in range(65)), "caveat_malformed"),
        ("apps=demo\n", "caveat_malformed"),
        ("apps=d\u00e9mo", "caveat_malformed"),
        ("actions=read,admin", "caveat_malformed"),
        ("access=write", "caveat_malformed"),
        ("machines=X", "caveat_malformed"),
        ("regions=m", "caveat_malformed"),
        ("regions=mad ams", "caveat_malformed"),
        ("operator=true", "caveat_unknown"),
        ("apps", "caveat_malformed"),
        ("", "caveat_malformed"),
        ("apps=" + "a" * 3000, "caveat_malformed"),
        (7, "caveat_malformed"),
        ({"apps": "a"}, "caveat_malformed"),
    ],
)
def test_a_caveat_nobody_can_check_makes_the_token_invalid(caveat: object, reason: str) -> None:
    token = _append_raw(mint(SECRET), caveat)
    with pytest.raises(TokenError) as info:
        verify(token, SECRET)
    assert info.value.reason == reason
    if isinstance(caveat, str):
        with pytest.raises(TokenError):
            attenuate(mint(SECRET), [caveat])


def test_the_number_of_caveats_is_bounded() -> None:
    token = mint(SECRET)
    for _ in range(tk.MAX_CAVEATS):
        token = _append_raw(token, "actions=read")
    assert verify(token, SECRET).read_only
    with pytest.raises(TokenError) as info:
        verify(_append_raw(token, "actions=read"), SECRET)
    assert info.value.reason == "token_malformed"
    with pytest.raises(TokenError):
        attenuate(token, ["actions=read"])


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 5000,  # nests deeper than any parser should recurse
        b'{"i": "x", "c": [], "extra": 1}',
        b'{"i": "x"}',
        b'{"i": 1, "c": []}',
        b"\xff\xfe",
        b"null",
    ],
)
def test_a_malformed_body_is_refused_cleanly(body: bytes) -> None:
    text = base64.urlsafe_b64encode(body).rstrip(b"=").decode()
    sig = base64.urlsafe_b64encode(b"s" * 32).rstrip(b"=").decode()
    with pytest.raises(TokenError) as info:
        verify(f"souk1_{text}.{sig}", SECRET)
    assert info.value.reason == "token_malformed"


def test_the_identifier_is_checked_strictly_even_when_signed() -> None:
    for ident in ('{"v":1,"id":"0123456789abcdef\\n","op":false}', '{"v":true,"id":"0","op":1}'):
        sig = hmac.new(SECRET, ident.encode(), hashlib.sha256).digest()
        body = base64.urlsafe_b64encode(json.dumps({"i": ident, "c": []}).encode())
        token = f"souk1_{body.rstrip(b'=').decode()}.{base64.urlsafe_b64encode(sig).decode()}"
        with pytest.raises(TokenError) as info:
            verify(token.rstrip("="), SECRET)
        assert info.value.reason == "token_malformed"


def test_the_older_read_only_spelling_still_verifies() -> None:
    grant = verify(_append_raw(mint(SECRET), "access=read"), SECRET)
    assert grant.actions == frozenset({"read"})


def test_each_kind_of_caveat_narrows_its_own_dimension() -> None:
    token = attenuate(
        mint(SECRET, operator=True),
        ["apps=a,b", "apps=b,c", "actions=read,write", "machines=m00001,m00002", "regions=mad"],
    )
    grant = verify(token, SECRET)
    assert grant.apps == frozenset({"b"}) and grant.actions == frozenset({"read", "write"})
    assert grant.machines == frozenset({"m00001", "m00002"}) and grant.regions == frozenset({"mad"})
    ok = Scope("write", app="b", machine="m00001", region="mad")
    assert grant.permits(ok)
    assert not grant.permits(Scope("deploy", app="b", machine="m00001", region="mad"))
    assert not grant.permits(Scope("write", app="a", machine="m00001", region="mad"))
    assert not grant.permits(Scope("write", app="b", machine="m00003", region="mad"))
    assert not grant.permits(Scope("write", app="b", machine="m00001", region="ams"))
    assert not grant.permits(Scope("write", app="b", machine="m00001"))  # region unknown
    assert not grant.permits(Scope("read", fleet=True))  # an operator's, but limited to apps


def test_operator_tokens_alone_do_fleet_operations() -> None:
    assert verify(mint(SECRET, operator=True), SECRET).permits(Scope("write", fleet=True))
    assert not verify(mint(SECRET), SECRET).permits(Scope("read", fleet=True))
    reader = verify(mint(SECRET, operator=True, read_only=True), SECRET)
    assert reader.permits(Scope("read", fleet=True))
    assert not reader.permits(Scope("write", fleet=True))


def test_revoked_ids_are_refused_with_their_own_reason() -> None:
    token = mint(SECRET)
    token_id, _, _ = tk.inspect(token)
    narrowed = attenuate(token, ["actions=read"])
    for t in (token, narrowed):  # attenuated copies share the id
        with pytest.raises(TokenError) as info:
            verify(t, SECRET, revoked={token_id}.__contains__)
        assert info.value.reason == "token_revoked"
    assert verify(mint(SECRET), SECRET, revoked={token_id}.__contains__)


def test_a_token_verified_before_is_still_refused_once_revoked_expired_or_resigned() -> None:
    """Its signature is checked once and kept; what changes with time is checked every time."""
    token = mint(SECRET, ttl=60, now=NOW)
    token_id, _, _ = tk.inspect(token)
    assert verify(token, SECRET, now=NOW).token_id == token_id  # kept from here on
    with pytest.raises(TokenError) as info:
        verify(token, SECRET, now=NOW, revoked={token_id}.__contains__)
    assert info.value.reason == "token_revoked"
    with pytest.raises(TokenError) as info:
        verify(token, SECRET, now=NOW + 60)
    assert info.value.reason == "token_expired"
    with pytest.raises(TokenError, match="signature"):
        verify(token, new_secret(), now=NOW)
    body, sig = _body(token)
    with pytest.raises(TokenError, match="signature"):  # the kept one's signature, its caveat gone
        verify(_rebuild({**body, "c": []}, sig), SECRET, now=NOW + 60)


# --- no sequence of attenuations widens what a token allows --------------------------------

APPS = ["a", "b", "c"]
MACHINES = ["m00001", "m00002", "m00003"]
REGIONS = ["mad", "ams", "sin"]


def _subset(names: list[str]) -> st.SearchStrategy[list[str]]:
    return st.lists(st.sampled_from(names), min_size=1, max_size=len(names), unique=True)


CAVEATS = st.one_of(
    _subset(APPS).map(tk.apps_caveat),
    _subset(sorted(tk.ACTIONS)).map(tk.actions_caveat),
    _subset(MACHINES).map(tk.machines_caveat),
    _subset(REGIONS).map(tk.regions_caveat),
    st.integers(int(NOW) - 10, int(NOW) + 10).map(tk.expires_caveat),
    st.just("access=read"),
)
SCOPES = st.builds(
    Scope,
    action=st.sampled_from(sorted(tk.ACTIONS)),
    app=st.sampled_from([None, *APPS, "z"]),
    machine=st.sampled_from([None, *MACHINES]),
    region=st.sampled_from([None, *REGIONS]),
    fleet=st.booleans(),
    lists_apps=st.booleans(),
)


def _allowed(token: str, scope: Scope, now: float) -> bool:
    try:
        return verify(token, SECRET, now=now).permits(scope)
    except TokenError:
        return False


@settings(max_examples=300, deadline=None)
@given(
    operator=st.booleans(),
    first=st.lists(CAVEATS, max_size=4),
    steps=st.lists(st.lists(CAVEATS, min_size=1, max_size=3), min_size=1, max_size=4),
    scopes=st.lists(SCOPES, min_size=1, max_size=8),
    now=st.floats(NOW - 20, NOW + 20),
)
def test_attenuation_never_widens(
    operator: bool,
    first: list[str],
    steps: list[list[str]],
    scopes: list[Scope],
    now: float,
) -> None:
    token = mint(SECRET, operator=operator, caveats=first)
    chain = [token]
    for step in steps:
        chain.append(attenuate(chain[-1], step))
    for scope in scopes:
        allowed = [_allowed(t, scope, now) for t in chain]
        for wider, narrower in itertools.pairwise(allowed):
            assert wider or not narrower, (scope, chain)


# --- the CLI ------------------------------------------------------------------------------


def test_cli_create_attenuate_inspect(tmp_path: Path) -> None:
    secret_file = tmp_path / "secret"
    secret_file.write_bytes(SECRET)
    runner = CliRunner()
    made = runner.invoke(
        cli, ["tokens", "create", "--secret-file", str(secret_file), "--app", "a", "--app", "b"]
    )
    assert made.exit_code == 0, made.output
    token = made.output.strip()
    narrow = ["--app", "b", "--action", "read", "--region", "mad", "--machine", "m00001"]
    narrowed = runner.invoke(cli, ["tokens", "attenuate", token, *narrow, "--expires", "1h"])
    assert narrowed.exit_code == 0, narrowed.output
    grant = verify(narrowed.output.strip(), SECRET)
    assert (
        grant.apps == frozenset({"b"})
        and grant.actions == frozenset({"read"})
        and grant.regions == frozenset({"mad"})
    )
    assert grant.machines == frozenset({"m00001"}) and grant.expires is not None
    shown = runner.invoke(cli, ["tokens", "inspect", narrowed.output.strip()])
    assert json.loads(shown.output)["id"] == tk.inspect(token)[0]
    for bad in (["--action", "admin"], ["--app", "Not An App"], ["--expires", "soon"], []):
        refused = runner.invoke(cli, ["tokens", "attenuate", token, *bad])
        assert refused.exit_code == 2, (bad, refused.output)
    refused = runner.invoke(cli, ["tokens", "attenuate", "souk1_nope", "--app", "a"])
    assert refused.exit_code == 2
