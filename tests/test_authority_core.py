"""The signed authority header, without Temporal: HKDF from the journal's keys, the claim's
canonical bytes, why a header is refused, the bindings, and rotation."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from interlock_temporal.core.authority import (
    LABEL,
    NAME,
    ActivityBinding,
    Authority,
    AuthorityClaim,
    AuthorityInvalid,
    AuthorityKeys,
    ChildBinding,
    ContinueAsNewBinding,
    for_activity,
    for_start,
    refused_header,
)
from interlock_temporal.core.derived_keys import DerivedKey, hkdf_sha256
from interlock_temporal.core.journal.signing import Ed25519Key, HmacKey, Keyring

SECRET_A = bytes.fromhex("a1" * 32)
SECRET_B = bytes.fromhex("b2" * 32)
BOT = Authority(principal="refund-bot", lease_id="lease-1")
HERE = ActivityBinding(namespace="default", workflow_id="case-1", run_id="run-1")


def keys(*secrets: bytes) -> AuthorityKeys:
    """The authority keys of a journal signing with the first secret, the rest older keys."""
    first, *older = (HmacKey(s) for s in secrets)
    return AuthorityKeys.of(Keyring(first, older))


def opened(k: AuthorityKeys, value: Any) -> Authority:
    return for_activity(k.open(value), namespace="default", workflow_id="case-1", run_id="run-1")


def refusal(k: AuthorityKeys, value: Any) -> AuthorityInvalid:
    with pytest.raises(AuthorityInvalid) as err:
        opened(k, value)
    return err.value


@pytest.mark.parametrize(
    ("ikm", "salt", "info", "length", "okm"),
    [
        (  # RFC 5869, test case 1
            "0b" * 22,
            "000102030405060708090a0b0c",
            "f0f1f2f3f4f5f6f7f8f9",
            42,
            "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865",
        ),
        (  # RFC 5869, test case 3: no salt, no info
            "0b" * 22,
            "",
            "",
            42,
            "8da4e775a563c18f715f802a063c5a31b8a11f5c5ee1879ec3454e5f3c738d2d9d201395faa4b61a96c8",
        ),
    ],
)
def test_hkdf_matches_rfc_5869(ikm: str, salt: str, info: str, length: int, okm: str) -> None:
    out = hkdf_sha256(bytes.fromhex(ikm), bytes.fromhex(info), length, bytes.fromhex(salt))
    assert out.hex() == okm


def test_the_authority_key_is_derived_with_its_own_label_and_id() -> None:
    derived = DerivedKey.derive(HmacKey(SECRET_A), LABEL, NAME)
    assert derived is not None
    assert LABEL == b"interlock-authority-v1"
    assert derived.secret == hkdf_sha256(SECRET_A, LABEL)
    assert derived.secret != SECRET_A
    # the key id as released: headers already in flight name their key by it
    tag = b"interlock authority key id\x00"
    assert derived.key_id == "authority-" + hashlib.sha256(tag + derived.secret).hexdigest()[:16]
    assert derived.key_id != HmacKey(SECRET_A).key_id
    assert AuthorityKeys.of(Keyring(HmacKey(SECRET_A))).key_ids == [derived.key_id]


def test_signing_is_deterministic_and_verifies() -> None:
    """No time and no randomness: workflow code signs, and must replay to the same bytes."""
    k = keys(SECRET_A)
    first, again = k.sign(BOT, HERE), keys(SECRET_A).sign(BOT, HERE)
    assert first == again
    assert opened(k, first) == BOT


def test_the_mac_covers_canonical_json_whatever_order_the_header_arrives_in() -> None:
    """The CLI (or history) may re-encode the header's JSON; the claim's canonical bytes are
    what is checked."""
    value = keys(SECRET_A).sign(BOT, HERE)
    shuffled = json.loads(json.dumps(value, sort_keys=True, indent=3))
    shuffled["claim"] = dict(reversed(list(shuffled["claim"].items())))
    assert opened(keys(SECRET_A), shuffled) == BOT


@pytest.mark.parametrize(
    ("value", "code", "says"),
    [
        ({"principal": "refund-bot", "lease_id": "lease-1"}, "unsigned", "not signed"),
        ("refund-bot", "unsigned", "not signed"),
        (None, "unsigned", "not signed"),
        ({"claim": {}, "key_id": "k"}, "malformed", "claim.principal"),
        ({"key_id": "k", "mac": "00", "claim": {"principal": "x"}}, "malformed", "binding"),
    ],
)
def test_a_header_no_worker_signed_is_refused_saying_why(value: Any, code: str, says: str) -> None:
    err = refusal(keys(SECRET_A), value)
    assert (err.code, says in err.reason) == (code, True), err.reason


def test_an_altered_claim_fails_its_signature() -> None:
    value = keys(SECRET_A).sign(BOT, HERE)
    for field, forged in (("principal", "admin-bot"), ("lease_id", "lease-2"), ("session", "s")):
        altered = {**value, "claim": {**value["claim"], field: forged}}
        err = refusal(keys(SECRET_A), altered)
        assert err.code == "bad_signature", field
    extra = {**value, "claim": {**value["claim"], "role": "admin"}}
    assert refusal(keys(SECRET_A), extra).code == "malformed"  # nothing rides along unsigned


def test_a_key_no_worker_holds_is_refused() -> None:
    value = keys(b"an attacker's own key, 32 bytes!").sign(BOT, HERE)
    err = refusal(keys(SECRET_A), value)
    assert err.code == "unknown_key" and value["key_id"] in err.reason


def test_a_retired_key_kept_as_older_still_verifies_and_a_dropped_one_does_not() -> None:
    before = keys(SECRET_A).sign(BOT, HERE)
    rotated = keys(SECRET_B, SECRET_A)
    assert opened(rotated, before) == BOT
    assert rotated.sign(BOT, HERE)["key_id"] != before["key_id"]  # new headers: the new key
    assert refusal(keys(SECRET_B), before).code == "unknown_key"


def test_ed25519_journal_keys_derive_from_the_seed_and_public_keys_sign_nothing() -> None:
    seed = Ed25519Key(bytes(range(32)))
    k = AuthorityKeys.of(Keyring(seed))
    assert opened(k, k.sign(BOT, HERE)) == BOT
    public = AuthorityKeys.of(Keyring(None, [seed.public_only()]))
    assert public.signing is None and public.key_ids == []
    with pytest.raises(AuthorityInvalid) as err:
        public.sign(BOT, HERE)
    assert err.value.code == "unknown_key"


@pytest.mark.parametrize(
    ("where", "says"),
    [
        (
            {"namespace": "other"},
            "not for an activity of workflow 'case-1' (run run-1) in namespace 'other'",
        ),
        ({"workflow_id": "case-2"}, "signed for an activity of workflow 'case-1'"),
        ({"run_id": "run-2"}, "(run run-1)"),
    ],
)
def test_an_activity_header_is_good_for_its_own_run_only(where: dict[str, str], says: str) -> None:
    claim = keys(SECRET_A).open(keys(SECRET_A).sign(BOT, HERE))
    target = {"namespace": "default", "workflow_id": "case-1", "run_id": "run-1", **where}
    with pytest.raises(AuthorityInvalid) as err:
        for_activity(claim, **target)
    assert err.value.code == "wrong_binding" and says in err.value.reason


def test_a_standalone_activity_has_no_authority() -> None:
    claim = keys(SECRET_A).open(keys(SECRET_A).sign(BOT, HERE))
    with pytest.raises(AuthorityInvalid) as err:
        for_activity(claim, namespace=None, workflow_id=None, run_id=None)
    assert "not started by a workflow" in err.value.reason


def start(
    claim: AuthorityClaim, parent: tuple[str, str] | None, first_run: str = "first-1"
) -> Authority:
    return for_start(claim, workflow_id="child-1", first_execution_run_id=first_run, parent=parent)


def test_a_child_inherits_only_from_the_parent_run_that_started_it() -> None:
    k = keys(SECRET_A)
    binding = ChildBinding(workflow_id="child-1", parent_workflow_id="p", parent_run_id="p-run")
    claim = k.open(k.sign(BOT, binding))
    assert start(claim, ("p", "p-run")) == BOT
    for parent, says in (
        (None, "has no parent"),
        (("p", "p-run-2"), "(run p-run)"),
        (("q", "p-run"), "of workflow 'p'"),
    ):
        with pytest.raises(AuthorityInvalid) as err:
            start(claim, parent)
        assert err.value.code == "wrong_binding" and says in err.value.reason


def test_continue_as_new_carries_it_within_the_chain_only() -> None:
    k = keys(SECRET_A)
    binding = ContinueAsNewBinding(workflow_id="child-1", first_execution_run_id="first-1")
    claim = k.open(k.sign(BOT, binding))
    assert start(claim, None) == BOT
    with pytest.raises(AuthorityInvalid) as err:
        start(claim, None, first_run="first-2")  # a fresh start reusing the workflow id
    assert err.value.code == "wrong_binding"


def test_an_activity_header_grants_no_workflow_start() -> None:
    claim = keys(SECRET_A).open(keys(SECRET_A).sign(BOT, HERE))
    with pytest.raises(AuthorityInvalid) as err:
        start(claim, ("case-1", "run-1"))
    assert "not for a workflow's start" in err.value.reason


def test_a_refusal_travels_unsigned_and_grants_nothing() -> None:
    note = refused_header(AuthorityInvalid("bad_signature", "does not match"))
    err = refusal(keys(SECRET_A), note)
    assert err.code == "bad_signature" and "start header" in err.reason
    assert "does not match" in err.reason
    forged = {**note, "code": "whatever"}
    assert refusal(keys(SECRET_A), forged).code == "refused"
