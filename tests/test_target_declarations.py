"""What a target declares, checked when ``gated`` is applied, and ``BaseTarget``'s defaults.

A declaration that does not match what the target can do is refused at decoration time with a
``TargetDeclarationError`` that names the target and what is missing (never a value). A
``BaseTarget`` subclass that overrides nothing the gate may ask (classify, confirmation,
validate, clock) behaves exactly as a duck-typed target without those methods: both are run
through the protocol's fault cases on a real SQLite journal and must leave the same record.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import stripe
from temporalio import activity

from interlock_temporal import current_effect, gated, receipt
from interlock_temporal.core.errors import Ambiguous, InFlight, Refused
from interlock_temporal.core.journal import Journal
from interlock_temporal.core.models import Found, Kind
from interlock_temporal.core.protocol import Gate, Ticket
from interlock_temporal.core.targets import capabilities
from interlock_temporal.targets import BaseTarget, TargetDeclarationError
from interlock_temporal.targets.payments import RefundRequest, RefundResult, SimulatedPayments
from interlock_temporal.targets.repo import GitRepo
from interlock_temporal.targets.stripe import StripeRefunds
from interlock_temporal.testing import throwaway_journal
from workers.scenarios import ORDER
from workflows.activities import REFUND_EFFECT

from .test_protocol import (
    ACTIVITY,
    LEASE_MAX,
    PRINCIPAL,
    WINDOW,
    Rejected,
    TimedOut,
    Unreachable,
    make_call,
)
from .test_server import rig

QUERY = "write `def query(self, effect_id: str, args: Any) -> Found | None`"


async def body(p: dict[str, Any]) -> dict[str, Any]:
    return p


# -- targets for the refusals -------------------------------------------------------------------


class Duck:
    """Duck-typed, no tier declared: capture and query, nothing else."""

    name = "duck"
    dedupe_window: timedelta | None = None
    settle_time = timedelta(0)

    def capture(self, args: Any, effect_id: str) -> dict[str, Any]:
        return {}

    def query(self, effect_id: str, args: Any) -> Found | None:
        return None


class Queried(BaseTarget):
    name = "queried"
    tier = 2

    def capture(self, args: Any, effect_id: str) -> dict[str, Any]:
        return {}

    def query(self, effect_id: str, args: Any) -> Found | None:
        return None


class Unqueried(BaseTarget):
    name = "unqueried"
    tier = 3

    def capture(self, args: Any, effect_id: str) -> dict[str, Any]:
        return {}


def _with(cls: type, **attrs: Any) -> Any:
    """An instance of a subclass of ``cls`` with ``attrs`` as class attributes (a ``None``
    removes a method by shadowing it with a non-callable)."""
    return type(cls.__name__, (cls,), attrs)()


async def _one_arg_query(self: Any, effect_id: str) -> Found | None:
    return None


async def _async_classify(self: Any, error: BaseException) -> str:
    return "rejected"


async def _async_confirmation(self: Any, result: Any) -> str:
    return "ref"


async def _async_clock(self: Any) -> float:
    return 0.0


CAPTURE = "write `def capture(self, args: Any, effect_id: str) -> Mapping[str, Any]`"
VALIDATE = (
    "write `def validate(self, recorded: Mapping[str, Any], current: Mapping[str, Any], "
    "payload: Any) -> list[Change]`, or remove it (the default compares the facts field by field)"
)
CLASSIFY = (
    "write `def classify(self, error: BaseException) -> "
    'Literal["not_sent", "rejected", "in_doubt"]`'
)


REFUSED: list[tuple[str, Callable[[], Any], str]] = [
    # (case, the target, what the refusal must say)
    (
        "tier2_without_query",
        lambda: _with(Queried, query=None),
        f"target queried: declares tier 2 but has no query method: {QUERY}, or declare tier 3",
    ),
    (
        "duck_tier2_without_query",
        lambda: _with(Duck, tier=2, query=None),
        f"target duck: declares tier 2 but has no query method: {QUERY}",
    ),
    (
        "tier1_without_dedupe_window",
        lambda: _with(Queried, tier=1),
        "target queried: declares tier 1 but has no dedupe_window",
    ),
    (
        "tier1_with_an_empty_window",
        lambda: _with(Queried, tier=1, dedupe_window=timedelta(0)),
        "target queried: declares tier 1 but has no dedupe_window",
    ),
    (
        "tier2_with_a_dedupe_window",
        lambda: _with(Queried, dedupe_window=WINDOW),
        "target queried: declares tier 2 but has a dedupe_window: declare tier 1",
    ),
    (
        "tier3_with_query",
        lambda: _with(Unqueried, query=Queried.query),
        "target unqueried: declares tier 3 but has a query method",
    ),
    (
        "no_capture",
        lambda: _with(Unqueried, capture=None),
        "target unqueried: has no capture method; write "
        "`def capture(self, args: Any, effect_id: str) -> Mapping[str, Any]`",
    ),
    (
        "duck_without_capture",
        lambda: _with(Duck, capture=None),
        "target duck: has no capture method",
    ),
    (
        "no_name",
        lambda: _with(Duck, name=None),
        "target of type Duck: name must be a non-empty str",
    ),
    (
        "base_target_without_tier",
        lambda: type("NoTier", (BaseTarget,), {"name": "no-tier", "capture": Duck.capture})(),
        "target no-tier: declares no tier; a BaseTarget sets tier = 1, 2 or 3",
    ),
    (
        "tier_out_of_range",
        lambda: _with(Queried, tier=9),
        "target queried: tier must be 0, 1, 2 or 3",
    ),
    (
        "tier_not_an_int",
        lambda: _with(Queried, tier="2"),
        "target queried: tier must be 0, 1, 2 or 3",
    ),
    ("tier_a_bool", lambda: _with(Queried, tier=True), "target queried: tier must be 0, 1, 2 or 3"),
    (
        "query_without_the_effect_id",
        lambda: _with(Queried, query=lambda self: None),
        f"target queried: query must take the effect id and the effect's approved input; {QUERY}",
    ),
    (
        "query_with_a_keyword_only_effect_id",
        lambda: _with(Queried, query=lambda self, *, effect_id: None),
        f"target queried: query must take the effect id and the effect's approved input; {QUERY}",
    ),
    (
        "query_with_a_required_keyword",
        lambda: _with(Queried, query=lambda self, effect_id, args, *, strict: None),
        f"target queried: query must take the effect id and the effect's approved input; {QUERY}",
    ),
    # the mistakes that used to pass here and then fail every attempt with a TypeError Temporal
    # retries forever (a class for an instance, capture or clock called with what they do not
    # take), or be silently misread (a two-argument validate refused every effect as
    # stale_premise; an async classifier's answer was never awaited, so always "in_doubt")
    (
        "a_class_not_an_instance",
        lambda: Unqueried,
        "target Unqueried is a class: pass an instance, `target=Unqueried(...)`",
    ),
    (
        "capture_without_the_effect_id",
        lambda: _with(Unqueried, capture=lambda self, args: {}),
        "target unqueried: capture must take the activity's input and the effect id; " + CAPTURE,
    ),
    (
        "capture_with_keyword_only_arguments",
        lambda: _with(Unqueried, capture=lambda self, *, args, effect_id: {}),
        "target unqueried: capture must take the activity's input and the effect id; " + CAPTURE,
    ),
    (
        "duck_capture_as_a_plain_function",
        lambda: _with(Duck, capture=staticmethod(lambda args: {})),
        "target duck: capture must take the activity's input and the effect id; " + CAPTURE,
    ),
    (
        "validate_without_the_payload",
        lambda: _with(Unqueried, validate=lambda self, recorded, current: []),
        "target unqueried: validate must take the recorded facts, the current facts and the "
        "effect's approved input; " + VALIDATE,
    ),
    (
        "async_classify",
        lambda: _with(Unqueried, classify=_async_classify),
        "target unqueried: classify must be a plain def, not async def: the gate calls it "
        "without awaiting; " + CLASSIFY,
    ),
    (
        "classify_without_the_error",
        lambda: _with(Unqueried, classify=lambda self: "in_doubt"),
        "target unqueried: classify must take the error the send raised; " + CLASSIFY,
    ),
    (
        "async_confirmation",
        lambda: _with(Unqueried, confirmation=_async_confirmation),
        "target unqueried: confirmation must be a plain def, not async def: the gate calls it "
        "without awaiting; write `def confirmation(self, result: Any) -> str | None`",
    ),
    (
        "confirmation_without_the_result",
        lambda: _with(Unqueried, confirmation=lambda self: None),
        "target unqueried: confirmation must take the send's result; "
        "write `def confirmation(self, result: Any) -> str | None`",
    ),
    (
        "clock_with_an_argument",
        lambda: _with(Queried, tier=1, dedupe_window=WINDOW, clock=lambda self, now: 0.0),
        "target queried: clock must take no argument; write `def clock(self) -> float`",
    ),
    (
        "async_clock",
        lambda: _with(Queried, tier=1, dedupe_window=WINDOW, clock=_async_clock),
        "target queried: clock must be a plain def, not async def: the gate calls it without "
        "awaiting; write `def clock(self) -> float`",
    ),
]


@pytest.mark.parametrize(("make", "words"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_a_declaration_that_does_not_hold_is_refused_when_gated(
    make: Callable[[], Any], words: str
) -> None:
    target = make()
    with pytest.raises(TargetDeclarationError) as err:
        gated(body, target=target)
    assert str(err.value).startswith(words), str(err.value)
    assert "9" not in str(err.value) and "'2'" not in str(err.value)  # never the value itself


#: what a target written for the previous release (``query(self, effect_id)``) is told
DEPRECATED_QUERY = (
    "target {}: query(self, effect_id) is deprecated: query is also given the effect's approved "
    "input, as args (ignore it if the effect id is enough); write "
    "`def query(self, effect_id: str, args: Any) -> Found | None`; removed in 0.3.0"
)


@pytest.mark.parametrize(
    "make",
    [
        lambda: _with(Duck, query=_one_arg_query),
        lambda: _with(Queried, query=lambda self, effect_id: None),
        lambda: _with(Queried, query=staticmethod(lambda effect_id: None)),
    ],
    ids=["duck_async", "base_target", "static"],
)
def test_a_query_of_the_previous_release_is_accepted_with_a_warning(
    make: Callable[[], Any],
) -> None:
    """The one-argument ``query`` of the previous release is still accepted for one release: a
    ``DeprecationWarning`` names the target, the line to write and the release that removes it,
    and points at the line that applied ``gated`` (where Python's default filters show it)."""
    target = make()
    with pytest.warns(DeprecationWarning) as warned:
        gated(body, target=target)
    (warning,) = warned
    assert str(warning.message) == DEPRECATED_QUERY.format(target.name)
    assert warning.filename == __file__
    assert capabilities(target).tier == 2


def test_a_query_of_this_release_gives_no_warning() -> None:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        gated(body, target=Queried())
        gated(body, target=Flexible())
        gated(body, target=BaseStore(2))
    assert [w for w in seen if issubclass(w.category, DeprecationWarning)] == []


class Flexible(BaseTarget):
    """Every form the gate can call: async where it awaits, a static method, a builtin clock,
    optional parameters with defaults."""

    name = "flexible"
    tier = 2
    clock = time.time  # a builtin: no signature to read, and none needed

    @staticmethod
    async def capture(args: Any, effect_id: str, *, extra: int = 0) -> dict[str, Any]:
        return {}

    async def query(self, effect_id: str, args: Any = None) -> Found | None:
        return None

    async def validate(self, recorded: Any, current: Any, payload: Any) -> list[Any]:
        return []

    def classify(self, error: BaseException, *more: Any) -> Any:
        return "in_doubt"

    def confirmation(self, result: Any, **more: Any) -> str | None:
        return None


def test_the_forms_the_gate_can_call_are_accepted() -> None:
    gated(body, target=Flexible())
    assert capabilities(Flexible()).tier == 2


def test_the_shipped_targets_declare_the_tier_they_can_keep(tmp_path: Path) -> None:
    repo_dir = tmp_path / "repo"
    env = {**os.environ, "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"}
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo_dir)], check=True, env=env)
    subprocess.run(
        [
            "git",
            "-C",
            str(repo_dir),
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit",
            "-q",
            "--allow-empty",
            "-m",
            "first",
        ],
        check=True,
        env=env,
    )
    shipped = [
        *(SimulatedPayments(tmp_path / f"p{t}.db", tier=t) for t in (1, 2, 3)),
        GitRepo(repo_dir),
        StripeRefunds(stripe.StripeClient("sk_test_declarations")),
    ]
    for target in shipped:
        assert isinstance(target, BaseTarget)
        gated(body, target=target)
        assert target.tier == capabilities(target).tier, target
    assert [t.tier for t in shipped] == [1, 2, 3, 2, 1]
    # a duck-typed target that declares no tier keeps working: its tier is derived
    gated(body, target=Duck())
    assert capabilities(Duck()).tier == 2
    assert capabilities(_with(Duck, query=None)).tier == 3


# -- BaseTarget's defaults are what the gate does for a target without the methods ---------------


class _Store:
    """Facts in a dict and landed effects keyed by the effect id; no classify, confirmation,
    validate or clock (those come from ``BaseTarget``, or from the gate's own defaults)."""

    name = "store"

    def __init__(self, tier: int) -> None:
        self.dedupe_window: timedelta | None = WINDOW if tier == 1 else None
        self.settle_time = timedelta(0)
        if tier <= 2:
            self.query = self._query
        self.dedupes = tier == 1
        self.facts: dict[str, Any] = {"order": "o-1", "refundable_cents": 10_000}
        self.landed: dict[str, dict[str, Any]] = {}
        self.sends = 0
        self.fail_next: BaseException | None = None

    async def capture(self, args: Any, effect_id: str) -> dict[str, Any]:
        return dict(self.facts)

    def _query(self, effect_id: str, args: Any) -> Found | None:
        got = self.landed.get(effect_id)
        return None if got is None else Found(result=got, confirmation=got["ref"])

    async def send(self, ticket: Ticket) -> dict[str, Any]:
        self.sends += 1
        if self.fail_next is not None:
            error, self.fail_next = self.fail_next, None
            raise error
        prior = self.landed.get(ticket.effect_id)
        if prior is not None and self.dedupes:
            return prior
        result = {"ref": f"ref-{self.sends}", "amount": ticket.input["amount"]}
        self.landed[ticket.effect_id] = result
        return result


class DuckStore(_Store):
    """Duck-typed: the gate's defaults for the methods it lacks; its tier is derived."""


class BaseStore(_Store, BaseTarget):
    """The same, from ``BaseTarget``, overriding none of its defaults; its tier declared."""

    def __init__(self, tier: int) -> None:
        super().__init__(tier)
        self.tier = tier


async def _attempt(gate: Gate, call: Any, target: _Store, *, dies: str | None = None) -> str:
    """One attempt: its outcome, in words (the send's result, or what was raised). ``dies``:
    it records its dispatch and dies ``"before_send"`` or ``"after_send"``."""
    try:
        if dies is not None:
            ticket = await gate.begin(call, target)
            assert isinstance(ticket, Ticket)
            if dies == "after_send":
                await target.send(ticket)
            ticket.release()
            return "died"
        return f"ok {await gate.run(call, target, target.send)}"
    except (Refused, Ambiguous) as err:
        return f"{type(err).__name__} {err.receipt.code}"
    except InFlight:
        return "InFlight"
    except (Rejected, Unreachable, TimedOut) as err:
        return f"raised {type(err).__name__}"


async def _run_case(case: str, target: _Store, journal: Journal, lease: str) -> Any:
    gate = Gate(journal)
    call = make_call(lease)
    outcomes = []
    if case == "send_raises_on_the_last_attempt":
        target.fail_next = Rejected("boom")
        outcomes.append(await _attempt(gate, make_call(lease, last_attempt=True), target))
    elif case.startswith("send_raises_"):
        target.fail_next = {"rejected": Rejected, "unreachable": Unreachable}.get(
            case.removeprefix("send_raises_"), TimedOut
        )("boom")
        outcomes.append(await _attempt(gate, call, target))
        outcomes.append(await _attempt(Gate(journal), call, target))
    elif case == "commit":
        outcomes.append(await _attempt(gate, call, target))
    elif case == "stale_decision_premises":
        stale = make_call(lease, premises={"order": "o-1", "refundable_cents": 99})
        outcomes.append(await _attempt(gate, stale, target))
    elif case in ("facts_changed_at_recovery", "found_by_query", "resend"):
        when = "after_send" if case == "found_by_query" else "before_send"
        outcomes.append(await _attempt(gate, call, target, dies=when))
        if case == "facts_changed_at_recovery":
            target.facts["refundable_cents"] = 0
        outcomes.append(await _attempt(Gate(journal), call, target))
    eid = Gate.identify(call)[0]
    r = receipt(eid, journal=journal)
    volatile = {
        "lease_id",
        "lease_chain",
        "authority_at_send",
        "proposed_at",
        "finished_at",
        "journal_hash",
    }
    return {
        "outcomes": outcomes,
        "receipt": r.model_dump(exclude=volatile),
        "entries": [(e.kind, _stable(e.data)) for e in journal.read(eid)],
        "sends": target.sends,
        "landed": len(target.landed),
    }


def _stable(data: dict[str, Any]) -> dict[str, Any]:
    """An entry's data without what differs between two runs (the lease, a timing)."""
    return {k: v for k, v in data.items() if k not in ("lease", "lease_id", "gate_ms")}


#: what the gate did with a duck-typed target without those methods on main before BaseTarget
#: existed (run there): (final, via, code, confirmation) by case and tier
EXPECTED: dict[str, dict[int, tuple[str, str | None, str | None, str | None]]] = {
    "commit": {
        1: ("COMMITTED", "dispatch", None, None),
        2: ("COMMITTED", "dispatch", None, None),
        3: ("COMMITTED", "dispatch", None, None),
    },
    "send_raises_rejected": {
        1: ("COMMITTED", "retry-idempotent", None, None),
        2: ("COMMITTED", "recovery-reapply", None, None),
        3: ("AMBIGUOUS", None, "unknowable", None),
    },
    "send_raises_unreachable": {
        1: ("COMMITTED", "retry-idempotent", None, None),
        2: ("COMMITTED", "recovery-reapply", None, None),
        3: ("AMBIGUOUS", None, "unknowable", None),
    },
    "send_raises_timed_out": {
        1: ("COMMITTED", "retry-idempotent", None, None),
        2: ("COMMITTED", "recovery-reapply", None, None),
        3: ("AMBIGUOUS", None, "unknowable", None),
    },
    "send_raises_on_the_last_attempt": {
        1: ("AMBIGUOUS", None, "send_failed", None),
        2: ("AMBIGUOUS", None, "send_failed", None),
        3: ("AMBIGUOUS", None, "send_failed", None),
    },
    "stale_decision_premises": {
        1: ("REFUSED", None, "stale_premise", None),
        2: ("REFUSED", None, "stale_premise", None),
        3: ("REFUSED", None, "stale_premise", None),
    },
    "facts_changed_at_recovery": {
        1: ("REFUSED", None, "stale_premise_at_recovery", None),
        2: ("REFUSED", None, "stale_premise_at_recovery", None),
        3: ("AMBIGUOUS", None, "stale_premise_at_recovery", None),
    },
    "found_by_query": {
        1: ("COMMITTED", "recovery-query", None, "ref-1"),
        2: ("COMMITTED", "recovery-query", None, "ref-1"),
        3: ("AMBIGUOUS", None, "unknowable", None),
    },
    "resend": {
        1: ("COMMITTED", "retry-idempotent", None, None),
        2: ("COMMITTED", "recovery-reapply", None, None),
        3: ("AMBIGUOUS", None, "unknowable", None),
    },
}


CASES = list(EXPECTED)


@pytest.fixture
def fresh(tmp_path: Path) -> Iterator[Callable[[str], tuple[Journal, str]]]:
    opened: list[Journal] = []

    def open_(name: str) -> tuple[Journal, str]:
        (tmp_path / name).mkdir()
        journal = throwaway_journal(tmp_path / name)
        opened.append(journal)
        lease = journal.leases.issue(PRINCIPAL, activities=[ACTIVITY], max_amount_cents=LEASE_MAX)
        return journal, lease

    yield open_
    for journal in opened:
        assert journal.verify().ok
        journal.close()


@pytest.mark.parametrize("tier", [1, 2, 3])
@pytest.mark.parametrize("case", CASES)
async def test_base_target_defaults_are_the_gates_defaults(
    fresh: Callable[[str], tuple[Journal, str]], case: str, tier: int
) -> None:
    duck, base = DuckStore(tier), BaseStore(tier)
    gated(body, target=base)  # the declaration holds
    seen_duck = await _run_case(case, duck, *fresh("duck"))
    seen_base = await _run_case(case, base, *fresh("base"))
    assert seen_base == seen_duck
    # and what both do is what the gate did for such a target before BaseTarget existed
    r = seen_base["receipt"]
    assert (r["final"], r["via"], r["code"], r["confirmation"]) == EXPECTED[case][tier]
    assert Kind.NOT_SENT not in [kind for kind, _ in seen_base["entries"]]  # no classify
    if case in ("stale_decision_premises", "facts_changed_at_recovery"):  # no validate
        assert r["changed_facts"] == ["refundable_cents"]


def test_base_target_defaults_match_the_gates_fallbacks() -> None:
    """Each default, asked directly, is what the gate's fallback gives a duck-typed target."""
    from interlock_temporal.core import premises, targets

    class Bare:
        name = "bare"

    bare, base = Bare(), BaseStore(2)
    for error in (Rejected("x"), Unreachable("x"), TimedOut("x"), ValueError("x")):
        assert targets.classify(base, error) == targets.classify(bare, error) == "in_doubt"  # type: ignore[arg-type]
    assert targets.confirmation_of(base, {"ref": "r"}) is None
    assert targets.confirmation_of(bare, {"ref": "r"}) is None  # type: ignore[arg-type]
    recorded, current = {"a": 1, "b": 2}, {"a": 1, "b": 3, "c": 4}
    assert base.validate(recorded, current, None) == premises.default_validate(recorded, current)
    assert [c.fact for c in base.validate(recorded, current, None)] == ["b", "c"]
    assert abs(targets.target_clock(base) - targets.target_clock(bare)) < 1.0  # type: ignore[arg-type]
    assert dataclasses.asdict(capabilities(base)) == dataclasses.asdict(capabilities(DuckStore(2)))


# -- the previous release's query(effect_id), on a real gated call ------------------------------


class OldStore(_Store, BaseTarget):
    """A tier-2 target written for the previous release: ``query(self, effect_id)``."""

    def __init__(self) -> None:
        super().__init__(2)
        self.tier = 2
        self.asked: list[str] = []
        self.query = self._old_query  # type: ignore[assignment]

    def _old_query(self, effect_id: str) -> Found | None:
        self.asked.append(effect_id)
        return super()._query(effect_id, None)


async def test_a_previous_release_query_recovers_an_effect_after_a_crash(
    fresh: Callable[[str], tuple[Journal, str]],
) -> None:
    """The attempt dies after the target committed; the next one asks the target with the old
    ``query(effect_id)`` (adapted: the effect id alone) and records COMMITTED by query, exactly
    what a target of this release gets, which warns of nothing."""
    old = OldStore()
    with pytest.warns(DeprecationWarning):
        gated(body, target=old)
    seen_old = await _run_case("found_by_query", old, *fresh("old"))
    new = BaseStore(2)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        gated(body, target=new)
        seen_new = await _run_case("found_by_query", new, *fresh("new"))
    assert [w for w in seen if issubclass(w.category, DeprecationWarning)] == []
    assert seen_old == seen_new
    r = seen_old["receipt"]
    assert (r["final"], r["via"], r["confirmation"]) == ("COMMITTED", "recovery-query", "ref-1")
    assert old.asked == [r["effect_id"]] and old.sends == 1


@pytest.mark.server
async def test_a_previous_release_query_on_a_worker_recovers_by_query(
    dev_server: Any, tmp_path: Path
) -> None:
    """On a real worker: a gated refund whose tier-2 target has the previous release's
    ``query(effect_id)``. The refund lands, the connection drops (in doubt); Temporal's next
    attempt asks the target with the effect id alone and records COMMITTED by query, with no
    second refund."""

    class OldPayments(SimulatedPayments):
        def __init__(self, path: Path) -> None:
            super().__init__(path, tier=2, name="payments-old")
            self.asked: list[str] = []
            self.query = self._old_query  # type: ignore[assignment]

        def _old_query(self, effect_id: str) -> Found | None:
            self.asked.append(effect_id)
            return self._query(effect_id, None)

    old = OldPayments(tmp_path / "old-payments.db")
    old.open_order(ORDER, 10_000)

    @activity.defn(name="refund_old")
    async def refund_old(r: RefundRequest) -> RefundResult:
        return await old.refund(
            r.order_id, r.amount_cents, idempotency_key=current_effect().effect_id
        )

    with pytest.warns(DeprecationWarning) as warned:
        gated_refund = gated(refund_old, target=old, **REFUND_EFFECT)
    assert str(warned[0].message) == DEPRECATED_QUERY.format("payments-old")
    try:
        async with rig(dev_server, tmp_path, extra=[gated_refund]) as r:
            lease = r.journal.leases.issue(
                "refund-bot", activities=["refund_old"], max_amount_cents=5000
            )
            old.arm("after_commit", "reset")
            request = RefundRequest(
                case_id=f"old-{uuid.uuid4().hex[:8]}",
                order_id=ORDER,
                amount_cents=2000,
                premises=old.order_facts(ORDER),
            )
            result = await r.call(
                "refund_old", request, principal="refund-bot", lease=lease, maximum_attempts=3
            )
            assert result["amount_cents"] == 2000
            (row,) = r.journal.effects()
            found = receipt(row.effect_id, journal=r.journal)
            assert (found.final, found.via, found.executed) == (
                "COMMITTED",
                "recovery-query",
                True,
            )
            assert old.asked == [row.effect_id]
            assert old.refunded_cents(ORDER) == 2000 and len(old.refund_records(ORDER)) == 1
    finally:
        old.close()
