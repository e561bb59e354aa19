"""An entry's signed bytes are the RFC 8785 canonical JSON of its whole document, checked here
against the reference implementation (``rfc8785.dumps``), not against the journal's own
canonicaliser: the writer builds the fields around ``data`` by hand where their form is plain,
and must write exactly the bytes the reference writes, or refuse where it refuses."""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

import pytest
import rfc8785
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from interlock_temporal.core.identity import UnserializableInput
from interlock_temporal.core.journal import entries
from interlock_temporal.core.journal.entries import RawEntry, check_entry, encode_entry
from interlock_temporal.core.journal.signing import HmacKey, Keyring
from interlock_temporal.core.models import Draft, Entry, Kind

from .properties import examples

KEY = HmacKey(bytes.fromhex("42" * 32))
KEYRING = Keyring(KEY)

_text = st.text(alphabet=st.characters(codec=None), max_size=6) | st.sampled_from(
    ["", "a", "é", "\U0001f600", "\x00\x1f\x7f", '"\\/', "\ud800", "0" * 64]
)
_data = st.dictionaries(
    _text,
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**60), max_value=2**60)
    | st.floats(allow_nan=False, allow_infinity=False)
    | _text
    | st.lists(st.integers(min_value=-5, max_value=5), max_size=3),
    max_size=4,
)
_ts = st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from(
    [1796193111.9328914, 1000.0, 1e-5, 1e16, 1e21, -3.5, 0.5, 1e-4]
)
_seq = st.integers(min_value=0, max_value=2**60) | st.sampled_from([1, 2**53 - 1, 2**53])


def reference(doc: dict[str, Any]) -> bytes | None:
    try:
        return rfc8785.dumps(doc)
    except (rfc8785.CanonicalizationError, UnicodeError):
        return None


@pytest.mark.properties
@examples(1500)
@given(
    seq=_seq,
    ts=_ts,
    effect_id=_text,
    kind=st.sampled_from(list(Kind)),
    prev=_text,
    data=_data,
    vals=st.none() | st.sampled_from(['{"result":1}', '{"approved":["é"]}']),
)
def test_the_signed_bytes_are_the_reference_canonical_json(
    seq: int,
    ts: float,
    effect_id: str,
    kind: Kind,
    prev: str,
    data: dict[str, Any],
    vals: str | None,
) -> None:
    doc: dict[str, Any] = {
        "v": 2,
        "seq": seq,
        "ts": ts,
        "effect_id": effect_id,
        "kind": kind.value,
        "prev": prev,
        "key_id": KEY.key_id,
        "data": data,
    }
    if vals is not None:
        doc["vals"] = hashlib.sha256(vals.encode()).hexdigest()
    expected = reference(doc)
    fields: dict[str, Any] = dict(
        seq=seq, ts=ts, effect_id=effect_id, kind=kind, prev=prev, key=KEY, data=data, vals=vals
    )
    if expected is None:
        with pytest.raises(UnserializableInput):
            encode_entry(**fields)
        return
    entry = encode_entry(**fields)
    assert entry.body == expected
    assert entry.hash == hashlib.sha256(expected).hexdigest()
    raw = RawEntry(
        entry.seq,
        entry.effect_id,
        entry.kind.value,
        entry.prev,
        entry.hash,
        entry.key_id,
        entry.sig,
        entry.body,
        vals,
    )
    assert check_entry(raw, KEYRING) is None


def test_a_typical_entry_is_written_as_the_reference_writes_it() -> None:
    data = {
        "delivery": {"activity_id": "2", "attempt": 1, "namespace": None, "run_id": "run-1"},
        "premises_now": {"eligible": True, "order_paid_cents": 10_000, "ratio": 0.25},
        "via": "dispatch",
    }
    entry = encode_entry(
        seq=3,
        ts=1796193111.9328914,
        effect_id="9d63" * 16,
        kind=Kind.DISPATCHED,
        prev="676d" * 16,
        key=KEY,
        data=data,
        vals='{"approved":[{"amount_cents":2000}]}',
    )
    assert entry.body == rfc8785.dumps(
        {
            "v": 2,
            "seq": 3,
            "ts": 1796193111.9328914,
            "effect_id": "9d63" * 16,
            "kind": "DISPATCHED",
            "prev": "676d" * 16,
            "key_id": KEY.key_id,
            "data": data,
            "vals": hashlib.sha256(b'{"approved":[{"amount_cents":2000}]}').hexdigest(),
        }
    )


@pytest.mark.properties
@examples(300)
@given(secret=st.binary(min_size=16, max_size=200), entry_hash=st.binary(min_size=32, max_size=32))
def test_an_hmac_signature_is_the_reference_hmac_sha256(secret: bytes, entry_hash: bytes) -> None:
    """The signer hashes its pads once and copies them per entry (secrets longer than the
    block hashed first, as RFC 2104 says): the signature is still ``hmac``'s own."""
    key = HmacKey(secret)
    expected = hmac.new(secret, entry_hash, hashlib.sha256).hexdigest()
    assert key.sign(entry_hash) == expected
    assert key.sign(entry_hash) == expected  # the pads were copied, not updated
    assert key.verify(entry_hash, expected)
    assert key.verifier()(entry_hash, expected)


# -- entries and drafts the gate builds are made without validation, and are the same models ----


@pytest.mark.properties
@examples(300)
@given(
    seq=st.integers(min_value=1, max_value=2**53 - 1),
    ts=st.floats(min_value=1.0, max_value=4e9) | st.integers(min_value=1, max_value=4_000_000_000),
    kind=st.sampled_from(list(Kind)),
    data=_data,
    vals=st.none() | st.sampled_from(['{"result":1}', '{"approved":[{"a":"é"}]}']),
)
def test_a_built_entry_is_the_entry_validation_would_make(
    seq: int, ts: float, kind: Kind, data: dict[str, Any], vals: str | None
) -> None:
    """``encode_entry`` makes its ``Entry`` without pydantic's validation (``models.built``):
    field for field, type for type, it is the model validation makes of the same values, and
    it behaves as one (equality, ``model_copy``, ``model_dump``)."""
    try:
        entry = encode_entry(
            seq=seq, ts=ts, effect_id="e" * 64, kind=kind, prev="", key=KEY, data=data, vals=vals
        )
    except UnserializableInput:
        return
    validated = Entry.model_validate(dict(entry.__dict__))
    assert entry == validated
    assert {k: type(v) for k, v in entry.__dict__.items()} == {
        k: type(v) for k, v in validated.__dict__.items()
    }
    assert list(entry.__dict__) == list(Entry.model_fields)
    assert entry.model_fields_set == validated.model_fields_set
    assert entry.model_dump() == validated.model_dump()
    moved = entry.model_copy(update={"ts": 5.0})
    assert moved.ts == 5.0 and entry.ts == float(ts) and "ts" in moved.model_fields_set
    with pytest.raises(ValidationError):
        entry.seq = 2  # type: ignore[misc]  # frozen, as a validated entry is


def test_a_built_entry_holds_its_own_data() -> None:
    data: dict[str, Any] = {"a": 1}
    entry = encode_entry(
        seq=1, ts=1.5, effect_id="e" * 64, kind=Kind.PROPOSED, prev="", key=KEY, data=data
    )
    data["a"] = 2
    assert entry.data == {"a": 1}


def test_a_draft_the_gate_builds_is_the_draft_validation_would_make() -> None:
    data = {"via": "dispatch", "n": 1}
    built = Draft.of(Kind.DISPATCHED, data)
    validated = Draft(kind=Kind.DISPATCHED, data=dict(data))
    assert built == validated
    assert built.model_fields_set == validated.model_fields_set
    assert built.model_dump() == validated.model_dump()
    assert type(built.kind) is Kind


@pytest.mark.parametrize(
    "text",
    [
        '{"approved":[{"a":"\\u00e9","n":1.5}],"result":null}',
        '{"r":1}',
        ' {"r":1}',
        '{"r":1} ',
        "[1]",
        '"x"',
    ],
)
def test_values_read_back_as_json_reads_them(text: str) -> None:
    """An entry's ``values`` are its stored values' JSON, parsed (a shortcut for compact text,
    ``json.loads`` for the rest); text that is not one JSON value is refused as it refuses it."""
    assert entries._loads_compact(text) == json.loads(text)
    for bad in (text + "x", text + " 2", "[" + text):
        with pytest.raises(ValueError):
            json.loads(bad)
        with pytest.raises(ValueError):
            entries._loads_compact(bad)
