"""Effect identity: sha256 of the RFC 8785 canonical JSON of {"effect_type", "key"}, recomputed
here by hand so the test does not trust the canonicaliser it checks."""

from __future__ import annotations

import decimal
import enum
import hashlib
import json
import math
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest
import rfc8785
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict, SecretStr

from interlock_temporal.core import identity
from interlock_temporal.core.identity import (
    UnserializableInput,
    canonical,
    canonical_json,
    digest,
    effect_id,
    equal_meaning,
    jsonable,
    unstable_part,
)

from .properties import examples


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_effect_id_is_sha256_of_the_canonical_bytes() -> None:
    key = {"order": "ord_1", "case": "C-9", "amount_cents": 3000}
    # members sorted, no whitespace, integers as written
    by_hand = b'{"effect_type":"refund","key":{"amount_cents":3000,"case":"C-9","order":"ord_1"}}'
    assert canonical({"effect_type": "refund", "key": key}) == by_hand
    assert effect_id("refund", key) == sha(by_hand)
    assert digest({"key": key, "effect_type": "refund"}) == sha(by_hand)


def test_effect_id_follows_rfc8785_on_the_hard_cases() -> None:
    # keys sort by UTF-16 code units (U+1F600 is D83D DE00, so it sorts before U+FB01),
    # 1.0 is written 1, 1e21 is written 1e+21, control characters are \\u escaped in lower
    # case, other characters are raw UTF-8
    key = {"\ufb01": 1.0, "\U0001f600": [True, None, 1e21, 0.5, -0.0], "é": '\x0f\n"\\'}
    by_hand = (
        '{"effect_type":"mail.send","key":{"é":"\\u000f\\n\\"\\\\",'
        '"\U0001f600":[true,null,1e+21,0.5,0],"\ufb01":1}}'
    ).encode()
    assert canonical({"effect_type": "mail.send", "key": key}) == by_hand
    assert effect_id("mail.send", key) == sha(by_hand)
    # the key's canonical bytes, when a caller has them, give the same id
    assert effect_id("mail.send", key, key_json=canonical(key)) == sha(by_hand)
    assert effect_id("m\u00e9l\x0f", key, key_json=canonical(key)) == effect_id("m\u00e9l\x0f", key)


def test_effect_id_is_256_bits_of_lower_hex() -> None:
    eid = effect_id("refund", {"order": 1})
    assert len(eid) == 64
    assert eid == eid.lower()
    int(eid, 16)


def test_key_order_does_not_matter() -> None:
    one = {"order": "o-1", "case": {"id": 7, "tier": "gold"}, "lines": [1, 2]}
    two = {"lines": [1, 2], "case": {"tier": "gold", "id": 7}, "order": "o-1"}
    assert list(one) != list(two)
    assert effect_id("refund", one) == effect_id("refund", two)


def test_a_different_type_or_key_is_a_different_effect() -> None:
    base = effect_id("refund", {"order": "o-1", "amount_cents": 3000})
    assert effect_id("refund.v2", {"order": "o-1", "amount_cents": 3000}) != base
    assert effect_id("refund", {"order": "o-2", "amount_cents": 3000}) != base
    assert effect_id("refund", {"order": "o-1", "amount_cents": 3001}) != base
    assert effect_id("refund", {"order": "o-1"}) != base
    assert effect_id("refund", {"order": "o-1", "amount_cents": "3000"}) != base
    # the type and the key cannot be traded against each other
    assert effect_id("a", "b") != effect_id("b", "a")


def test_an_empty_effect_type_is_refused() -> None:
    with pytest.raises(ValueError):
        effect_id("", {"order": 1})


class Line(BaseModel):
    sku: str
    qty: int


class Refund(BaseModel):
    order: str
    amount_cents: int
    at: datetime
    lines: list[Line]


@dataclass
class RefundData:
    order: str
    amount_cents: int
    at: datetime
    lines: list[dict[str, object]]


def test_models_and_dicts_with_the_same_data_agree() -> None:
    at = datetime(2024, 5, 1, 12, 30, tzinfo=UTC)
    model = Refund(order="o-1", amount_cents=3000, at=at, lines=[Line(sku="s", qty=2)])
    as_dict = {
        "lines": [{"qty": 2, "sku": "s"}],
        "at": "2024-05-01T12:30:00Z",
        "amount_cents": 3000,
        "order": "o-1",
    }
    as_dataclass = RefundData(order="o-1", amount_cents=3000, at=at, lines=[{"sku": "s", "qty": 2}])
    assert digest(model) == digest(as_dict) == digest(as_dataclass)
    assert effect_id("refund", model) == effect_id("refund", as_dict)
    assert effect_id("refund", {"r": model}) == effect_id("refund", {"r": as_dict})
    assert digest(model.model_copy(update={"amount_cents": 3001})) != digest(as_dict)


def test_secrets_never_reach_the_canonical_bytes() -> None:
    class Login(BaseModel):
        user: str
        password: SecretStr

    data = canonical(Login(user="u", password=SecretStr("hunter2-very-secret")))
    assert b"hunter2" not in data


@pytest.mark.parametrize(
    "bad",
    [2**53, -(2**53), 2**53 + 1, 10**30, float("nan"), float("inf"), float("-inf")],
    ids=["2^53", "-2^53", "2^53+1", "1e30-int", "nan", "inf", "-inf"],
)
def test_values_with_no_canonical_form_are_refused_without_echoing(bad: float) -> None:
    secret = "acct-4242-4242-very-private"
    key = {"account": secret, "amount": bad, "nested": [{"value": bad}]}
    with pytest.raises(UnserializableInput) as caught:
        effect_id("refund", key)
    message = str(caught.value)
    assert secret not in message
    if isinstance(bad, int):
        assert str(bad) not in message
        assert str(abs(bad)) not in message
    assert isinstance(caught.value, TypeError)
    with pytest.raises(UnserializableInput):
        digest(bad)


def test_the_interoperable_integer_range_is_accepted() -> None:
    assert canonical(2**53 - 1) == b"9007199254740991"
    assert canonical(-(2**53 - 1)) == b"-9007199254740991"
    effect_id("refund", {"amount": 2**53 - 1})


def test_objects_that_are_not_json_data_are_refused_without_echoing() -> None:
    class Opaque:
        def __repr__(self) -> str:
            return "Opaque(token=tok_live_secret)"

    with pytest.raises(UnserializableInput) as caught:
        effect_id("refund", {"thing": Opaque()})
    assert "tok_live_secret" not in str(caught.value)


# -- the fast path is byte-identical to the reference implementation ---------------------------

_json_data = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**60), max_value=2**60)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(alphabet=st.characters(codec=None), max_size=8)
    | st.sampled_from(["", "a", "é", "\U0001f600", "\ue000", "\x00\x1f\x7f", '"\\/'])
    | st.sampled_from([1e-4, 1e16, 0.1, 1e21, 1e-7, 123.0, -0.0, 5e-324, 1.7976931348623157e308]),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.text(alphabet=st.characters(codec=None), max_size=4)
            | st.sampled_from(["a", "b", "\ue000", "\U0001f600"]),
            children,
            max_size=4,
        )
    ),
    max_leaves=12,
)


@pytest.mark.properties
@examples(2000)
@given(_json_data)
def test_canonical_json_equals_rfc8785(data: object) -> None:
    try:
        expected: bytes | None = rfc8785.dumps(data)
    except (rfc8785.CanonicalizationError, UnicodeError):
        expected = None
    if expected is None:
        with pytest.raises(UnserializableInput):
            canonical_json(data)
    else:
        assert canonical_json(data) == expected


@pytest.mark.properties
@examples(500)
@given(st.text(alphabet=st.characters(codec="utf-8"), min_size=1, max_size=8), _json_data)
def test_an_effect_id_from_the_keys_canonical_bytes_is_the_same(
    effect_type: str, key: object
) -> None:
    """``key_json`` is the key's canonical JSON as ``equal_meaning`` spells it (what the gate
    passes: ``Named.key``); the raw spelling of a string NFC changes (U+F900 is U+8C48) names
    the effect of another key, so it is no stand-in."""
    try:
        key_json = canonical_json(equal_meaning(key, jsonable(key, "key"), "key"))
    except UnserializableInput:
        return
    assert effect_id(effect_type, key, key_json=key_json) == effect_id(effect_type, key)


def test_a_key_nfc_respells_names_one_effect_and_its_raw_bytes_another() -> None:
    """What hypothesis found at full counts: the raw canonical bytes of a key that NFC
    respells are not its spelled bytes, and only the spelled ones name its effect."""
    key = "\uf900"  # a CJK compatibility ideograph; NFC: U+8C48
    assert effect_id("0", key) == effect_id("0", "\u8c48")
    spelled = canonical_json(equal_meaning(key, jsonable(key, "key"), "key"))
    assert effect_id("0", key, key_json=spelled) == effect_id("0", key)
    assert effect_id("0", key, key_json=canonical_json(key)) != effect_id("0", key)


@pytest.mark.parametrize(
    "data",
    [
        {"b": [1, 2.5, None, True], "a": {"z": "\u00e9", "y": ""}},
        ["x", {"k": -1}],
        "plain",
    ],
)
@pytest.mark.parametrize("accelerated", [True, False], ids=["c-encoder", "pure-python"])
def test_the_prebuilt_encoder_writes_compact_sorted_json(
    data: object, accelerated: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fast path's encoder is made once at import; made again, with or without the C
    accelerator, it writes what ``json.dumps`` writes, sorted and without spaces or escapes of
    non-ASCII text."""
    if not accelerated:
        monkeypatch.setattr(identity, "c_make_encoder", None)
    encode = identity._sorted_compact_encoder()
    expected = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert encode(data) == expected


# -- where a value has no single canonical form -------------------------------------------------


class Color(enum.Enum):
    RED = "red"


@dataclass
class Point:
    x: float
    tags: object = None


class Open(BaseModel):
    model_config = ConfigDict(extra="allow")
    order: str


SET = "which has no order: its JSON changes between processes (use a sorted list)"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        # whatever the walk meets first, what comes after it is still looked at
        ({"items": {"a", "b"}, "order": "o-1"}, f"key['items'] is a set, {SET}"),
        ({"items": {"a"}, "n": 1}, f"key['items'] is a set, {SET}"),
        ({"items": {"a"}, "x": 1.5}, f"key['items'] is a set, {SET}"),
        ({"items": {"a"}, "none": None}, f"key['items'] is a set, {SET}"),
        ([frozenset({"a"}), "b"], f"key[0] is a frozenset, {SET}"),
        ({7: "x"}, "key has a key of type int, not a string"),
        (Open(order="o-1", tags={"a"}), f"key.tags is a set, {SET}"),
        (Point(x=1.0, tags={"a"}), f"key.tags is a set, {SET}"),
        (Point(x=math.nan), "key.x is a float that is NaN or infinite"),
        ({"at": decimal.Decimal("NaN")}, "key['at'] is a Decimal that is NaN or infinite"),
        (
            {"e": Color.RED, "n": 2**53},
            "key['n'] is an integer outside the interoperable JSON range (2**53)",
        ),
    ],
    ids=lambda v: type(v).__name__ if not isinstance(v, str) else "",
)
def test_where_a_value_has_no_canonical_form_is_named(value: object, message: str) -> None:
    assert unstable_part(value, "key") == message


@pytest.mark.parametrize(
    "value",
    [
        {"e": Color.RED, "n": -(2**53 - 1)},
        {"e": Color.RED, "n": 2**53 - 1},
        {"e": Color.RED, "d": decimal.Decimal("1.5"), "f": 0.5, "s": "x", "b": True, "z": None},
        Point(x=1.0, tags=["a", "b"]),
        Open(order="o-1", tags=["a"]),
    ],
)
def test_values_with_one_canonical_form_pass(value: object) -> None:
    assert unstable_part(value, "key") is None


# -- the fast paths answer for exactly what they claim ---------------------------------------------


@pytest.mark.parametrize(
    ("data", "plain"),
    [
        ({"a": ["b", 1, 0.5, True, None]}, True),
        (2**53 - 1, True),
        (-(2**53 - 1), True),
        (2**53, False),
        (-(2**53), False),
        (1e-4, True),
        (-1e-4, True),
        (123456789012.5, True),
        (-0.5, True),
        (0.5e-4, False),
        (1e16, False),
        (2.0, False),  # integral floats: 2.0 is written 2 by ECMAScript
        (float("nan"), False),
        ("caf\u00e9", False),
        ({"caf\u00e9": 1}, False),
        ({1: "a"}, False),
        ((1, 2), False),
        (True, True),
        (None, True),
        # deep inside containers too: leaves are checked where they stand
        ({"a": [0.5, {"b": None, "c": [True, "x"]}]}, True),
        ({"a": [{"b": 2.0}]}, False),
        ([{"k": {1: "x"}}], False),
        ({"a": {"b": "caf\u00e9"}}, False),
        ([[1, [2**53]]], False),
        ([{"a": (1,)}], False),
    ],
)
def test_json_dumps_is_trusted_only_where_it_writes_rfc8785(data: object, plain: bool) -> None:
    """``_json_module_is_canonical`` admits exactly the data its docstring names; the rest goes
    through the reference implementation."""
    assert identity._json_module_is_canonical(data) is plain


@pytest.mark.parametrize(
    ("data", "plain"),
    [
        ({"a": ["b", 1, 0.5, True, None]}, True),
        (2**53 - 1, True),
        (-(2**53 - 1), True),
        (2**53, False),
        (-(2**53), False),
        (True, True),
        (False, True),
        (None, True),
        (Line(sku="s", qty=1), True),
        (Open(order="o", tags=["a"]), True),
        (Open(order="o", tags={"a"}), False),
        ({1: "a"}, False),
        (float("inf"), False),
        (datetime(2024, 1, 1, tzinfo=UTC), True),
        ({"s"}, False),
        # a plain value met first does not end the walk: what is behind it is still looked at
        ([float("nan"), "x"], False),
        ([{"s"}, True], False),
        ([2**60, None], False),
    ],
)
def test_the_plain_data_shortcut_answers_only_for_plain_data(data: object, plain: bool) -> None:
    assert identity._plainly_stable(data) is plain


def test_a_lone_surrogate_is_refused_as_having_no_canonical_form() -> None:
    for data in ("\ud800", {"a": "caf\u00e9\ud800"}, ["x", "\udfff"]):
        with pytest.raises(UnserializableInput):
            canonical_json(data)


def test_refusals_say_what_is_wrong_in_words_that_name_no_value() -> None:
    with pytest.raises(UnserializableInput) as big:
        canonical_json({"n": 2**60})
    assert str(big.value) == "an integer outside the interoperable JSON range (2**53)"
    with pytest.raises(UnserializableInput) as nan:
        canonical_json({"x": float("nan")})
    assert str(nan.value) == "a float that is NaN or infinite"
    with pytest.raises(UnserializableInput) as not_json:
        canonical_json({1: "a"})
    assert str(not_json.value) == "a value with no canonical JSON form"
    for lone in ({"x": "\ud800"}, {"\ud800": 1}):  # in a value, or in a key
        with pytest.raises(UnserializableInput) as surrogate:
            canonical_json(lone)
        assert str(surrogate.value) == "a string that is not valid Unicode (a lone surrogate)"
    with pytest.raises(UnserializableInput) as opaque:
        identity.jsonable(object())
    assert str(opaque.value) == "value of type object is not JSON data"
    with pytest.raises(ValueError) as empty:
        effect_id("", {"order": 1})
    assert str(empty.value) == "effect_type must be a non-empty string"


def test_an_origin_needs_the_whole_temporal_activity() -> None:
    d = "ab" * 32
    assert identity.origin_of("wf", "run", "7", d) == sha(f"wf\x00run\x007\x00{d}".encode())
    for missing in [(None, "run", "7"), ("wf", None, "7"), ("wf", "run", None), (None, None, "7")]:
        assert identity.origin_of(*missing, d) is None
