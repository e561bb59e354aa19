"""Equal-meaning values name one effect (issue 34): a Decimal is written in an effect's key and
payload digest as its canonical text (``30.0`` and ``30.00`` are ``30``), strings in Unicode NFC,
so an agent that re-decides "$30.00" instead of "$30.0", or spells ``café`` another way, gets no
second refund. No version is hashed: every other id is the one the release before gave it, and
an effect that release recorded keeps its id, so its recovery after an upgrade is no
``UnstableEffectKey``. And a message about an input says where the problem is in a bounded
length, however deep the input. Money is read from the payments service."""

from __future__ import annotations

import dataclasses
import enum
import json
import shutil
import sys
import unicodedata
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict, Field, RootModel, field_serializer
from temporalio import activity
from temporalio.converter import PayloadConverter

from interlock_temporal import current_effect, gated, open_journal
from interlock_temporal._worker.errors import InvalidEffectInput
from interlock_temporal._worker.gated import Inputs
from interlock_temporal.core.errors import InvalidCall
from interlock_temporal.core.identity import (
    DEPTH_LIMIT,
    UnserializableInput,
    canonical_json,
    decimal_text,
    effect_id,
    equal_meaning,
    jsonable,
    may_respell,
    unstable_part,
)
from interlock_temporal.core.journal import Journal
from interlock_temporal.core.models import Kind
from interlock_temporal.core.protocol import Call, Delivery, Done, Gate, Measure, Ticket
from interlock_temporal.core.protocol.calls import identify_earlier
from interlock_temporal.core.receipts import receipt
from interlock_temporal.targets.payments import RefundRequest, RefundResult, SimulatedPayments
from interlock_temporal.testing import DevServer

from .fixtures import make_spelled_journal as spelled
from .fixtures.make_spelled_journal import DollarRefund
from .properties import examples
from .test_server import rig

NFC = unicodedata.normalize("NFC", "café")
NFD = unicodedata.normalize("NFD", "café")
ORDER = "o-777"
KEY = "4d" * 32
#: a limit on a message about an input, however deep or wide the input
SHORT = 1_000


def test_the_two_spellings_of_cafe_differ() -> None:
    assert NFC != NFD and len(NFD) == len(NFC) + 1


# -- the spelling --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("30.00", "30"),
        ("30.0", "30"),
        ("30", "30"),
        ("3E+1", "30"),
        ("10", "10"),
        ("1E+1", "10"),
        ("1.50", "1.5"),
        ("1.5", "1.5"),
        ("0.10", "0.1"),
        ("-0", "0"),
        ("-0.00", "0"),
        ("0E+5", "0"),
        ("0E-9", "0"),
        ("-1.2300", "-1.23"),
        ("1E-7", "0.0000001"),
        ("-12.5E-3", "-0.0125"),
        ("5E+3", "5000"),
        ("123456789012345678901234567890.1230", "123456789012345678901234567890.123"),
    ],
)
def test_a_decimal_is_written_as_its_canonical_text(value: str, text: str) -> None:
    assert decimal_text(Decimal(value)) == text


def test_a_decimal_too_long_to_write_without_an_exponent_is_refused_naming_where() -> None:
    huge = Decimal("1E+5000")
    assert unstable_part({"amount": huge}, "key") == (
        "key['amount'] is a Decimal longer than 1,000 characters written without an exponent"
    )
    with pytest.raises(UnserializableInput, match="longer than 1,000 characters"):
        decimal_text(huge)
    assert decimal_text(Decimal("1E+998")) == "1" + "0" * 998  # at the limit: written out


class Line(BaseModel):
    sku: str
    price: Decimal


class Order(BaseModel):
    model_config = ConfigDict(extra="allow")

    case: str
    total: Decimal
    tip: Decimal | None = None
    lines: list[Line] = []
    by_sku: dict[str, Decimal] = {}
    fee: Decimal = Field(default=Decimal("0"), serialization_alias="feeAmount")


@dataclasses.dataclass
class Amount:
    value: Decimal
    currency: str


class Rate(enum.Enum):
    STANDARD = Decimal("0.20")


Price = RootModel[Decimal]


def _order(spell: Callable[[str], Decimal], case: str) -> Order:
    return Order(
        case=case,
        total=spell("30.0"),
        tip=spell("1.50"),
        lines=[Line(sku=case, price=spell("10"))],
        by_sku={case: spell("2.0")},
        fee=spell("0.50"),
        note=spell("7.0"),  # an extra field
    )


def _trailing(text: str) -> Decimal:
    """The same amount with two more trailing zeros (and 10 as 1E+1)."""
    return Decimal("1E+1") if text == "10" else Decimal(text + "00")


@pytest.mark.parametrize(
    ("one", "other"),
    [
        ({"amount": Decimal("30.0")}, {"amount": Decimal("30.00")}),
        ({"amount": Decimal("1")}, {"amount": Decimal("1.00")}),
        ({"amount": Decimal("10")}, {"amount": Decimal("1E+1")}),
        ({"amount": Decimal("-0")}, {"amount": Decimal("0.00")}),
        ({"case": NFC}, {"case": NFD}),
        ({NFC: 1}, {NFD: 1}),
        ([Decimal("2.50"), NFC], (Decimal("2.5"), NFD)),
        (_order(Decimal, NFC), _order(_trailing, NFD)),
        (Amount(Decimal("4.0"), NFC), Amount(Decimal("4"), NFD)),
        ({"rate": Rate.STANDARD}, {"rate": Decimal("0.2")}),
        (Price(Decimal("9.90")), Decimal("9.9")),
    ],
    ids=[
        "30.0-30.00",
        "1-1.00",
        "10-1E+1",
        "zeros",
        "nfc-nfd",
        "keys",
        "list-tuple",
        "model",
        "dataclass",
        "enum",
        "root-model",
    ],
)
def test_equal_meaning_values_name_one_effect(one: Any, other: Any) -> None:
    assert effect_id("refund", one) == effect_id("refund", other)


def test_a_model_field_reaches_the_key_as_its_canonical_text() -> None:
    """pydantic writes a Decimal field as the string ``str(d)``; the key holds the canonical
    text of that string, under the field's serialization alias when it has one."""
    order = _order(_trailing, NFD)
    data = jsonable(order, "key")
    assert data["total"] == "30.000" and data["feeAmount"] == "0.5000"  # as pydantic wrote them
    spelled_data = equal_meaning(order, data, "key")
    assert spelled_data == {
        "case": NFC,
        "total": "30",
        "tip": "1.5",
        "lines": [{"sku": NFC, "price": "10"}],
        "by_sku": {NFC: "2"},
        "feeAmount": "0.5",
        "note": "7",
    }


def test_an_int_and_a_decimal_of_one_value_name_two_effects() -> None:
    """The rule: a Decimal is a JSON string (as pydantic writes it), so it is spelled alike
    with the string of its canonical text, never with a number; an int and a float of one
    value are one JSON number already (RFC 8785 writes 30.0 as 30)."""
    as_decimal = effect_id("refund", {"amount": Decimal("30.00")})
    assert as_decimal == effect_id("refund", {"amount": Decimal("30")})
    assert as_decimal == effect_id("refund", {"amount": "30"})
    assert as_decimal != effect_id("refund", {"amount": 30})
    assert effect_id("refund", {"amount": 30}) == effect_id("refund", {"amount": 30.0})
    # a string is a string: only a Decimal's text is respelled
    assert effect_id("refund", {"amount": "30.00"}) != as_decimal


def test_a_field_written_by_its_own_serializer_is_left_as_written() -> None:
    class Priced(BaseModel):
        amount: Decimal

        @field_serializer("amount")
        def with_currency(self, amount: Decimal) -> str:
            return f"{amount} EUR"

    one, other = Priced(amount=Decimal("30.0")), Priced(amount=Decimal("30.00"))
    assert effect_id("refund", one) != effect_id("refund", other)


def test_nothing_changes_where_nothing_needs_to() -> None:
    data = jsonable({"case": "c-1", "amount": 3000, "at": "30.00", "lines": [{"sku": "x"}]})
    assert equal_meaning({"at": "30.00"}, data) is data  # the same object: no respelling


def test_two_keys_that_are_one_string_in_nfc_are_refused_naming_where() -> None:
    key = {"order": {NFC: 1, NFD: 2}}
    with pytest.raises(UnserializableInput) as caught:
        effect_id("refund", key)
    assert str(caught.value) == "key['order'] has two keys that are one string in Unicode NFC"


# -- every other id is unchanged ------------------------------------------------------------------

#: computed at commit 92ab32d, before equal-meaning spelling
BEFORE = {
    "ordinary": "97e76b124e4f190a715f5686df07536b151cb4fa1a5356a8d5024bef05469cf3",
    "model": "d7d89efce31d40b4fbf1069d0e728ede566f330570d586cdb2fb821fe3028907",
    "keyed": "153b76f1d589f72ccd7dbe29b1cc62529d80585904683f7afd3a707cf2c80fe8",
    "payload": "6e24f34c31836afc9e347d4434e4646087a3bfe2e23cd941afb0d2b314dee83a",
    "30.00": "2658f1683e24c8cd1301703f8bb409d42e6cd81d63cb010646a0ddf2074bcb97",
    "nfd": "923fb647662edfd1e57945294f8bbd52a67aa193e684c980ade1a27dd4b25f6e",
}


class _Item(BaseModel):
    sku: str
    price: Decimal
    qty: int


def test_ids_of_inputs_without_a_decimal_to_respell_or_a_non_nfc_string_are_unchanged() -> None:
    import datetime as dt
    import uuid

    ordinary = {
        "case": "c-1",
        "order": "o-990",
        "amount_cents": 3000,
        "ratio": 0.25,
        "ok": True,
        "none": None,
        "when": dt.datetime(2024, 5, 1, 12, 0, tzinfo=dt.UTC),
        "id": uuid.UUID(int=7),
        "cafe": NFC,
        "emoji": "\U0001f600",
        "nested": [{"b": 1, "a": [2, 3]}],
        "canon": Decimal("30"),
        "canon2": Decimal("1.5"),
        "line": _Item(sku="a", price=Decimal("2.5"), qty=2),
    }
    assert effect_id("refund", ordinary) == BEFORE["ordinary"]
    req = RefundRequest(case_id="c-1", order_id="o-990", amount_cents=3000, reason="café ok")
    whole = Call(effect_type="refund", activity="refund", input=req, args=(req,))
    assert Gate.identify(whole) == (BEFORE["model"], BEFORE["payload"])
    keyed = dataclasses.replace(whole, key={"case": "c-1"})
    assert Gate.identify(keyed) == (BEFORE["keyed"], BEFORE["payload"])


def test_the_earlier_spelling_is_the_release_befores() -> None:
    for key, before, now in [
        ({"amount": Decimal("30.00")}, BEFORE["30.00"], {"amount": "30"}),
        ({"who": NFD}, BEFORE["nfd"], {"who": NFC}),
    ]:
        call = Call(effect_type="refund", activity="refund", input=1, args=(1,), key=key)
        assert identify_earlier(call)[0] == before
        assert Gate.identify(call)[0] == effect_id("refund", now) != before


# -- one refund after a re-decision, in-process ----------------------------------------------------


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    with open_journal(tmp_path / "journal.db", signing_key=KEY) as j:
        yield j


@pytest.fixture
def payments(tmp_path: Path) -> Iterator[SimulatedPayments]:
    service = SimulatedPayments(tmp_path / "payments.db", tier=2)
    service.open_order(ORDER, 10_000)
    yield service
    service.close()


def dollar_call(
    req: DollarRefund, lease: str, workflow_id: str, *, keyed: bool, attempt: int = 1
) -> Call:
    key = {"case": req.case_id, "order": req.order_id, "amount": req.amount} if keyed else None
    return Call(
        effect_type="refund_dollars",
        activity="refund_dollars",
        input=req,
        args=(req,),
        key=key,
        principal="refund-bot",
        lease_id=lease,
        measure=lambda args: Measure(int(args[0].amount * 100)),
        delivery=Delivery(workflow_id=workflow_id, run_id="r-1", activity_id="1", attempt=attempt),
        decode_args=lambda blob: (DollarRefund.model_validate(blob[0]),),
        param_names=("r",),
    )


async def decide(
    journal: Journal, payments: SimulatedPayments, call: Call
) -> tuple[Ticket | Done, Any]:
    """One attempt: the body runs when the gate says so (a refund in cents, keyed by the id)."""
    gate = Gate(journal)
    step = await gate.begin(call, payments)
    if isinstance(step, Done):
        return step, step.result
    result = await spelled.send(payments, step)
    await gate.commit(step, result)
    return step, result


@pytest.mark.parametrize("keyed", [True, False], ids=["key-of-fields", "whole-input"])
@pytest.mark.parametrize(
    ("first", "again"),
    [
        (("30.0", NFC), ("30.00", NFD)),
        (("30.00", NFD), ("30", NFC)),
        (("3E+1", NFC), ("30.0", NFC)),
    ],
    ids=["30.0-nfc/30.00-nfd", "30.00-nfd/30-nfc", "3E+1/30.0"],
)
async def test_a_redecision_spelled_another_way_refunds_once(
    journal: Journal,
    payments: SimulatedPayments,
    keyed: bool,
    first: tuple[str, str],
    again: tuple[str, str],
) -> None:
    lease = journal.leases.issue(
        "refund-bot", activities=["refund_dollars"], max_amount_cents=5_000
    )

    def request(amount: str, case: str) -> DollarRefund:
        return DollarRefund(case_id=case, order_id=ORDER, amount=Decimal(amount), reason=case)

    sent, result = await decide(
        journal, payments, dollar_call(request(*first), lease, "wf-1", keyed=keyed)
    )
    assert isinstance(sent, Ticket)
    redecided = dollar_call(request(*again), lease, "wf-2", keyed=keyed)
    done, again_result = await decide(journal, payments, redecided)
    assert isinstance(done, Done) and done.via == "duplicate"
    assert done.effect_id == sent.effect_id
    assert RefundResult.model_validate(again_result).refund_id == result.refund_id
    (refund,) = payments.refund_records(ORDER)
    assert (refund.effect_id, refund.amount_cents) == (sent.effect_id, 3_000)
    assert payments.refunded_cents(ORDER) == 3_000 and payments.calls(ORDER) == 1


async def test_a_new_effect_records_its_spelling_only_where_it_differs(
    journal: Journal, payments: SimulatedPayments
) -> None:
    lease = journal.leases.issue(
        "refund-bot", activities=["refund_dollars"], max_amount_cents=5_000
    )
    respelled = DollarRefund(case_id=NFD, order_id=ORDER, amount=Decimal("12.50"))
    plain = DollarRefund(case_id="c-2", order_id=ORDER, amount=Decimal("12.5"))
    for req, recorded in [(respelled, {"spelling": "canonical"}), (plain, {})]:
        ticket, _ = await decide(
            journal, payments, dollar_call(req, lease, req.case_id, keyed=True)
        )
        proposed = journal.read(ticket.effect_id)[0]
        assert proposed.kind is Kind.PROPOSED
        assert {k: v for k, v in proposed.data.items() if k == "spelling"} == recorded
    assert journal.verify().ok


# -- a journal the release before wrote ---------------------------------------------------------


async def test_effects_in_doubt_the_release_before_recorded_recover_under_their_ids(
    tmp_path: Path,
) -> None:
    """The journal of tests/fixtures/make_spelled_journal.py, written at 92ab32d: two effects
    in doubt whose key holds a Decimal with trailing zeros (in a model's field) and an NFD
    string, and one committed. After the upgrade each retry recovers its effect under the id
    that release gave it (no ``UnstableEffectKey``), and the refund goes out once, under that
    id; a re-decision spelled as the committed one was returns its outcome."""
    path = tmp_path / "spelled.db"
    shutil.copyfile(spelled.TARGET, path)
    ids = json.loads(spelled.IDS.read_text())
    payments = SimulatedPayments(tmp_path / "payments.db", tier=2)
    spelled.open_orders(payments)
    with open_journal(f"sqlite:///{path}", signing_key=spelled.KEY, create=False) as journal:
        assert journal.verify().ok
        assert sorted(r.effect_id for r in journal.in_doubt()) == sorted(
            [ids["decimal"], ids["nfd"]]
        )
        retries = {
            "decimal": spelled.dollar_call(
                spelled.dollars("decimal", "30.00", payments), "wf-decimal", attempt=2
            ),
            "nfd": spelled.case_call(spelled.by_case(payments), "wf-nfd", attempt=2),
        }
        gate = Gate(journal)
        for name, retry in retries.items():
            assert Gate.identify(retry)[0] != ids[name]  # the key is spelled otherwise now
            ticket = await gate.begin(retry, payments)
            assert isinstance(ticket, Ticket) and ticket.effect_id == ids[name]
            await gate.commit(ticket, await spelled.send(payments, ticket))
            (refund,) = payments.refund_records(spelled.ORDERS[name])
            assert refund.effect_id == ids[name]
            final = receipt(ids[name], journal=journal)
            assert (final.final, final.via) == ("COMMITTED", "recovery-reapply")
        assert payments.refunded_cents(spelled.ORDERS["decimal"]) == 3_000
        assert payments.refunded_cents(spelled.ORDERS["nfd"]) == 1_200

        # the committed refund, re-decided by another workflow spelled as it was: its outcome
        redecided = spelled.dollar_call(
            spelled.dollars("committed", "30.0", payments), "wf-committed-again"
        )
        done = await gate.begin(redecided, payments)
        assert isinstance(done, Done) and done.via == "duplicate"
        assert done.effect_id == ids["committed"]
        assert payments.calls(spelled.ORDERS["committed"]) == 0  # sent by the release before
        assert journal.in_doubt() == [] and journal.verify().ok
    payments.close()


# -- a message about an input is short ------------------------------------------------------------


def nested(depth: int, wrap: Callable[[Any], Any]) -> Any:
    value: Any = []
    for _ in range(depth):
        value = wrap(value)
    return value


DEEP = {
    "list": lambda: nested(20_000, lambda x: [x]),
    "dict": lambda: nested(20_000, lambda x: {"a": x}),
    "model": lambda: nested(20_000, lambda x: Line.model_construct(sku=x, price=Decimal(1))),
}


@pytest.mark.parametrize("shape", sorted(DEEP))
@pytest.mark.parametrize("where", ["input", "input-with-key", "key"])
async def test_a_20000_deep_input_gets_a_short_message_naming_the_argument(
    journal: Journal, payments: SimulatedPayments, shape: str, where: str
) -> None:
    deep = DEEP[shape]()
    arg = {"order_id": ORDER, "amount_cents": 100} if where == "key" else deep
    key = {"order": ORDER} if where == "input-with-key" else deep if where == "key" else None
    lease = journal.leases.issue("refund-bot")
    call = Call(
        effect_type="refund",
        activity="refund",
        input=arg,
        args=(arg,),
        key=key,
        principal="refund-bot",
        lease_id=lease,
        param_names=("r",),
    )
    with pytest.raises(InvalidCall) as caught:
        await Gate(journal).begin(call, payments)
    message = str(caught.value)
    assert len(message) < SHORT, len(message)
    named = "key" if where == "key" else "r"
    assert f"the effect cannot be named: {named}" in message, message
    assert f"nested more than {DEPTH_LIMIT} levels deep" in message
    assert "more levels)" in message  # the middle of the path is counted, not written
    assert journal.effects() == [] and payments.calls() == 0


def test_the_depth_limit_is_where_pydantic_stops() -> None:
    """Nothing pydantic writes is refused for its depth but by one level of lists: 254 nested
    lists pass, 255 are refused (pydantic writes 255, not 256)."""
    assert unstable_part(nested(DEPTH_LIMIT - 1, lambda x: [x]), "r") is None
    jsonable(nested(DEPTH_LIMIT - 1, lambda x: [x]))
    too_deep = unstable_part(nested(DEPTH_LIMIT, lambda x: [x]), "r")
    assert too_deep is not None and too_deep.endswith(
        "is nested more than 254 levels deep (or contains itself)"
    )


async def test_an_input_that_contains_itself_is_refused_not_walked_forever(
    journal: Journal, payments: SimulatedPayments
) -> None:
    loop: list[Any] = [Decimal("1")]
    loop.append(loop)
    looped: dict[str, Any] = {"order": ORDER}
    looped["self"] = looped
    for arg in (loop, looped):
        call = Call(
            effect_type="refund", activity="refund", input=arg, args=(arg,), param_names=("r",)
        )
        with pytest.raises(InvalidCall) as caught:
            await Gate(journal).begin(call, payments)
        assert "(or contains itself)" in str(caught.value) and len(str(caught.value)) < SHORT


def test_jsonable_of_a_deep_value_names_where_in_a_short_message() -> None:
    with pytest.raises(UnserializableInput) as caught:
        jsonable(DEEP["dict"](), "r")
    message = str(caught.value)
    assert message.startswith("r['a']['a']") and len(message) < SHORT
    assert message.endswith(f"is nested more than {DEPTH_LIMIT} levels deep (or contains itself)")


def test_a_long_mapping_key_is_cut_in_a_path() -> None:
    long_name = "k" * 10_000
    message = unstable_part({long_name: {"x": {1, 2}}}, "key")
    assert message is not None and len(message) < 200, message
    assert message.startswith("key['kkkk") and "\u2026" in message


def test_thousands_of_invalid_fields_name_five_and_count_the_rest() -> None:
    inputs = Inputs("refund", ("items",), (list[int],))
    with pytest.raises(InvalidEffectInput) as caught:
        inputs.decode([["x"] * 10_000], PayloadConverter.default)
    message = caught.value.message
    assert len(message) < SHORT, len(message)
    assert message.startswith("refund: invalid input: items.0: int_parsing; items.1: int_parsing")
    assert message.endswith("; and 9,995 more")


def test_a_recursion_error_while_naming_is_a_clear_refusal() -> None:
    """Naming an effect recurses only as deep as its input (at most ``DEPTH_LIMIT``); a caller
    that is already deep in its own stack gets a refusal, not a ``RecursionError``."""
    key = {"amount": nested(200, lambda x: [x, Decimal("1.0")])}
    call = Call(effect_type="refund", activity="refund", input=1, args=(1,), key=key)

    def deep_caller(frames: int) -> Any:
        if frames:
            return deep_caller(frames - 1)
        return Gate.identify(call)

    spare = 150  # fewer frames than naming a 200-deep key needs
    with pytest.raises(InvalidCall) as caught:
        deep_caller(sys.getrecursionlimit() - spare - _stack_depth())
    assert "nested too deep to write" in str(caught.value)
    assert Gate.identify(call)[0] == effect_id("refund", key)  # from a shallow stack: named


def _stack_depth() -> int:
    frame, depth = sys._getframe(), 0
    while frame is not None:
        frame, depth = frame.f_back, depth + 1  # type: ignore[assignment]
    return depth


# -- on a real Temporal worker --------------------------------------------------------------------


@pytest.mark.server
async def test_on_a_worker_a_redecision_spelled_another_way_refunds_once(
    dev_server: DevServer, tmp_path: Path
) -> None:
    service = SimulatedPayments(tmp_path / "dollar-payments.db", tier=2)
    service.open_order(ORDER, 10_000)

    @activity.defn(name="refund_dollars")
    @gated(
        target=service,
        key=lambda r: {"case": r.case_id, "order": r.order_id, "amount": r.amount},
        amount=lambda r: int(r.amount * 100),
    )
    async def refund_dollars(r: DollarRefund) -> RefundResult:
        cents = int(r.amount * 100)
        return await service.refund(r.order_id, cents, idempotency_key=current_effect().effect_id)

    async with rig(dev_server, tmp_path, extra=[refund_dollars]) as r:
        lease = r.journal.leases.issue(
            "refund-bot", activities=["refund_dollars"], max_amount_cents=5_000
        )
        first = DollarRefund(case_id=NFC, order_id=ORDER, amount=Decimal("30.0"))
        again = DollarRefund(case_id=NFD, order_id=ORDER, amount=Decimal("30.00"))
        sent = await r.call("refund_dollars", first, principal="refund-bot", lease=lease)
        duplicate = await r.call("refund_dollars", again, principal="refund-bot", lease=lease)
        assert duplicate["refund_id"] == sent["refund_id"]
        (refund,) = service.refund_records(ORDER)
        assert refund.amount_cents == 3_000 and service.calls(ORDER) == 1
        (effect,) = r.journal.effects()
        assert refund.effect_id == effect.effect_id
    service.close()


# -- the scan that spares the walk ----------------------------------------------------------------

_decimals = st.decimals(allow_nan=False, allow_infinity=False, places=None).map(
    lambda d: Decimal(str(d))
)
_texts = st.text(alphabet=st.sampled_from('ae\u0301\u00e9c0123456789.E+-"\\x'), max_size=8)
_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | _decimals | _texts,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_texts, inner, max_size=4),
    max_leaves=10,
)


@pytest.mark.properties
@examples(1000)
@given(_values)
def test_where_the_scan_of_canonical_bytes_says_no_respelling_nothing_is_respelled(
    value: Any,
) -> None:
    """``name`` skips ``equal_meaning``'s walk when ``may_respell`` of the bytes says no: that
    answer must never be wrong (a false yes only costs the walk)."""
    try:
        data = jsonable(value, "value")
        written = canonical_json(data)
        spelled = equal_meaning(value, data, "value")
    except UnserializableInput:
        return
    if not may_respell(written):
        assert spelled is data


def test_the_scan_finds_a_decimal_text_and_a_string_nfc_may_change() -> None:
    assert may_respell(canonical_json({"amount": "30.00"}))
    assert may_respell(canonical_json(["1E+1"]))
    assert may_respell(canonical_json({NFD: 1}))
    assert not may_respell(canonical_json({"case": "c-1", "order": "o-1", "amount_cents": 3000}))
    assert not may_respell(canonical_json({"note": 'say "5" twice', "n": 30}))
