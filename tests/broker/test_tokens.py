"""Tokens: verified with the secret alone; tampering, expiry and scope are refused."""

from __future__ import annotations

import base64
import json

import pytest

from souk.broker.tokens import TokenError, attenuate, mint, new_secret, verify

SECRET = b"s" * 32
NOW = 1_700_000_000.0


def test_a_fresh_token_verifies_and_allows_everything_not_operator() -> None:
    grant = verify(mint(SECRET), SECRET)
    assert grant.apps is None and not grant.read_only and not grant.operator
    assert grant.allows("any", write=True)


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
    assert grant.allows("a", write=False)
    assert not grant.allows("c", write=False)
    assert "app 'c'" in grant.why_not("c", write=False)
    assert not grant.allows("a", write=True)
    assert "read-only" in grant.why_not("a", write=True)


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
