"""One attempt at an effect as the adapter sees it (``Call``, its ``Delivery``), what a lease may
cap of it (``Measure``), what the gate answers (``Done`` or a ``Ticket``), and how a call names
its effect (``identify``)."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar, overload

from ..errors import InvalidCall
from ..identity import (
    UnserializableInput,
    canonical_json,
    effect_id,
    equal_meaning,
    jsonable,
    may_respell,
    origin_of,
    unstable_part,
)
from ..journal import Journal
from ..journal.claims import Claim
from ..leases import LeaseProblem
from ..models import Entry, Kind
from ..policy import Decision
from ..receipts import EffectView, fold_appended
from ..targets import EffectTarget

T = TypeVar("T")
V = TypeVar("V")


class once(Generic[V]):
    """``functools.cached_property`` without its lock (Python 3.12 dropped it too): the value is
    computed on first use and kept in the instance's ``__dict__``, where later reads find it
    without calling anything. Two threads reading it first at once compute it twice, alike:
    the values cached here are pure functions of the frozen call."""

    def __init__(self, fn: Callable[[Any], V]) -> None:
        self.fn = fn
        self.name = fn.__name__
        self.__doc__ = fn.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, instance: None, owner: type | None = None) -> once[V]: ...
    @overload
    def __get__(self, instance: object, owner: type | None = None) -> V: ...
    def __get__(self, instance: object | None, owner: type | None = None) -> V | once[V]:
        if instance is None:
            return self
        value = instance.__dict__[self.name] = self.fn(instance)
        return value


#: how soon to try again when a live attempt holds the effect
IN_FLIGHT_RETRY_S = 0.5
#: how soon another workflow's attempt looks again at an effect in doubt that only its owner
#: may send (each look may query the target)
NOT_OWNER_RETRY_S = 2.0
#: why the owner of an effect will never send it: the code of the refusal ``Gate.close_out``
#: records when the target confirms it never happened
OwnerEnded = Literal["cancelled", "abandoned"]
#: named points where the sweep injects crashes (see ``Gate(on_point=...)``)
POINTS = (
    "claimed",
    "before_dispatch_tx",
    "after_dispatch_tx",
    "after_send",
    "after_commit_tx",
    "before_recovery_tx",
)
#: the points of a tier-0 effect's one transaction (the body runs between them); before it is
#: ``before_dispatch_tx``, after its commit ``after_commit_tx``
ATOMIC_POINTS = ("atomic_before_body", "atomic_before_commit")
#: called with a point's name (``POINTS``, ``ATOMIC_POINTS``) and the effect id as the gate
#: passes it (see ``Gate(on_point=...)``)
OnPoint = Callable[[str, str], None]
#: a tier-0 effect's body, run inside the journal's transaction: ``(connection, approved
#: arguments, effect id) -> result``
Transaction = Callable[[Any, tuple[Any, ...], str], Any]


@dataclass(frozen=True)
class Delivery:
    """Which Temporal delivery carried the attempt: recorded, never part of the identity."""

    workflow_id: str | None = None
    run_id: str | None = None
    activity_id: str | None = None
    attempt: int = 1
    task_queue: str | None = None


@dataclass(frozen=True)
class Call:
    """One attempt at an effect: one call as the gate sees it (payload, key, lease, delivery),
    built by the adapter. The policy sees the same call as a ``CallEvent`` (what the rules
    read) and a ``CallFacts`` (what the breaker's ``decide`` reads).

    ``input`` is what targets and extractors see (the single argument, or the tuple);
    ``args`` is what the body receives. ``key`` names the approved decision.
    """

    effect_type: str
    activity: str
    input: Any
    args: tuple[Any, ...]
    #: names the approved decision; None: the whole proposed payload is the key
    key: Any = None
    #: the field of the (single) input that carries the premises captured at decision time;
    #: it is neither part of the payload digest nor of the default key
    premises_field: str | None = None
    principal: str | None = None
    lease_id: str | None = None
    session: str | None = None
    namespace: str | None = None
    #: what a lease may cap, read from the arguments the body will receive; recovery reads it
    #: again from the recorded approved input, so a lease is checked against what is sent
    measure: Callable[[tuple[Any, ...]], Measure] | None = None
    delivery: Delivery = field(default_factory=Delivery)
    last_attempt: bool = False
    #: turns the recorded approved input (JSON data), or a policy's rewrite, into the body's
    #: argument types; its errors name fields, never values
    decode_args: Callable[[list[Any]], tuple[Any, ...]] | None = None
    #: the body's parameter names (policy rules may name arguments by them)
    param_names: tuple[str, ...] = ()
    #: tier 0: the body, run inside the journal's transaction (the adapter binds it to its
    #: target's ``transact``); the gate uses it only for a target that declares tier 0
    transaction: Transaction | None = None
    #: the policy's decision for this attempt, made once however often the attempt re-reads
    admission: dict[str, Decision] = field(default_factory=dict, compare=False, repr=False)

    @property
    def arg_names(self) -> tuple[str, ...]:
        """How messages name each argument: its parameter's name, else ``args[i]``."""
        if len(self.param_names) == len(self.args):
            return self.param_names
        return tuple(f"args[{i}]" for i in range(len(self.args)))

    @once
    def args_json(self) -> list[Any]:
        """The arguments as JSON data, computed once per attempt."""
        try:
            data: list[Any] = jsonable(list(self.args))
        except UnserializableInput as err:
            where = not_json_args(self.args, self.arg_names) or str(err)
            raise InvalidCall(f"the input of {self.activity} is not JSON data: {where}") from None
        return data

    @once
    def args_canonical(self) -> bytes:
        return canonical_json(self.args_json)

    @once
    def input_digest(self) -> str:
        """The digest of the whole input as delivered (premises included): the same for every
        attempt of one activity."""
        return hashlib.sha256(self.args_canonical).hexdigest()

    @once
    def origin(self) -> str | None:
        d = self.delivery
        return origin_of(d.workflow_id, d.run_id, d.activity_id, self.input_digest)

    @once
    def named(self) -> Named:
        """What names the effect and digests its proposal (``name``), computed once."""
        return name(self)


def no_lease(call: Call) -> LeaseProblem:
    """Why a call with no lease is refused, in the words of the line to write: no ``act_as`` at
    all (no principal), or ``act_as`` that names a principal and no lease. Both are the
    caller's configuration (``LeaseProblem.configuration``): the next attempt decides again."""
    if call.principal is None:
        return LeaseProblem(
            f"no act_as: the workflow ran {call.activity} outside act_as, so it acts for no "
            f'principal under no lease. Run it inside `with act_as("<principal>", '
            f'lease="<lease id>"):` in the workflow',
            configuration="no_act_as",
        )
    return LeaseProblem(
        f"no lease: act_as named principal {call.principal!r} and no lease. Run {call.activity} "
        f'inside `with act_as({call.principal!r}, lease="<lease id>"):`, with a lease issued '
        f"to {call.principal} (`interlock leases issue {call.principal} --activity "
        f"{call.activity}`)",
        configuration="no_lease",
    )


@dataclass(frozen=True)
class Measure:
    amount_cents: int | None = None
    resource: str | None = None


@dataclass
class Done:
    """The effect's recorded outcome: the body does not run (again)."""

    effect_id: str
    result: Any
    via: str
    #: set when this commit arrived after another outcome was recorded (a late writer): the
    #: state it followed, e.g. AMBIGUOUS (the commit closes a review) or REFUSED (an alarm)
    after: Kind | None = None
    #: the gate's own time for this attempt (recorded as ``gate_ms`` in COMMITTED)
    gate_s: float | None = None


@dataclass
class Ticket:
    """A dispatch is durably recorded: the holder may send ``args``, then commit or fail."""

    effect_id: str
    head: str
    via: str
    args: tuple[Any, ...]
    input: Any
    dispatch_no: int
    target: EffectTarget
    call: Call
    claim: Claim | None
    released: bool = False
    #: seconds the gate spent before the send (claim, reads, checks, the dispatch transaction)
    gate_s: float = 0.0
    #: the effect as the attempt read it before its dispatch (None: it had no entries)
    prior: EffectView | None = field(default=None, repr=False, compare=False)
    #: the entries the dispatch transaction wrote, ending at ``head``
    written: Sequence[Entry] = field(default=(), repr=False, compare=False)
    #: the effect's digest scheme (None: plain sha256; see ``core.sealing``)
    digests: str | None = None

    def release(self) -> None:
        if not self.released and self.claim is not None:
            self.released = True
            self.claim.release()

    async def release_async(self, journal: Journal) -> None:
        """``release`` off the event loop where the journal can (``Journal.release_async``)."""
        if not self.released and self.claim is not None:
            self.released = True
            await journal.release_async(self.claim)

    def view(self) -> EffectView | None:
        """The effect as of ``head``, from what the attempt read and wrote (no read); None when
        the ticket does not hold them."""
        if not self.written or self.written[-1].hash != self.head:
            return None
        return fold_appended(self.prior or EffectView(effect_id=self.effect_id), self.written)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


#: what a PROPOSED records (as ``spelling``) when the effect's key or proposal is spelled
#: otherwise than the release before spelled it (see ``Named``)
CANONICAL_SPELLING = "canonical"


@dataclass(frozen=True)
class Named:
    """The canonical JSON that names an effect (``key``) and that its payload digest covers
    (``body``), spelled so that values of one meaning name one effect (``equal_meaning``: a
    Decimal as its canonical text, strings in NFC); and, where they differ, the same as the
    release before spelled them (a Decimal as pydantic writes it, strings as given):
    ``earlier_key``, ``earlier_body``. An effect that release recorded keeps the id and the
    digest it had: the gate looks for it under ``earlier_key`` (see ``Gate.begin``)."""

    key: bytes
    body: bytes
    earlier_key: bytes | None = None
    earlier_body: bytes | None = None

    @property
    def respelled(self) -> bool:
        """The key or the proposal is spelled otherwise than the release before spelled it
        (PROPOSED then records ``spelling``)."""
        return self.earlier_key is not None or self.earlier_body is not None


def name(call: Call) -> Named:
    """The canonical JSON that names ``call``'s effect and that its payload digest covers (see
    ``Named``), without the premises the proposal carries. A key or input with no single
    canonical JSON form (a set, NaN, bytes in a key, an unknown object, a value nested too
    deep or containing itself) is refused, naming where, with a message of bounded length."""
    unstable = None if call.key is None else unstable_part(call.key, "key")
    for arg_name, arg in zip(call.arg_names, call.args, strict=True):
        unstable = unstable or unstable_part(arg, arg_name, allow_bytes=call.key is not None)
    if unstable is not None:
        raise InvalidCall(f"{call.activity}: the effect cannot be named: {unstable}")
    try:
        proposed = proposed_payload(call)
        # without decision-time premises to leave out, the proposal is the input as sent
        as_sent = call.args_canonical if proposed is call.args_json else canonical_json(proposed)
        spelled = _spelled_args(call, proposed) if may_respell(as_sent) else proposed
        body, earlier_body = (
            (as_sent, None) if spelled is proposed else (canonical_json(spelled), as_sent)
        )
        if call.key is None:  # the proposal is the key
            return Named(body, body, earlier_body, earlier_body)
        as_given = jsonable(call.key, "key")
        given = canonical_json(as_given)
        key = equal_meaning(call.key, as_given, "key") if may_respell(given) else as_given
        if key is as_given:
            return Named(given, body, None, earlier_body)
        return Named(canonical_json(key), body, given, earlier_body)
    except UnserializableInput as err:
        raise InvalidCall(
            f"the effect key or input of {call.activity} is not JSON data: {err}"
        ) from None
    except RecursionError:  # a value whose serializer recurses without end
        raise InvalidCall(
            f"the effect key or input of {call.activity} is not JSON data: it is nested too "
            "deep to write"
        ) from None


def _spelled_args(call: Call, proposed: list[Any]) -> list[Any]:
    """The proposal spelled as ``equal_meaning`` spells it, argument by argument (``proposed``
    itself when no argument changes)."""
    spelled = [
        equal_meaning(arg, data, arg_name)
        for arg, data, arg_name in zip(call.args, proposed, call.arg_names, strict=True)
    ]
    if all(s is p for s, p in zip(spelled, proposed, strict=True)):
        return proposed
    return spelled


def identify(
    call: Call,
    digest: Callable[[bytes], str] = _sha256,
    keyed_ids: Callable[[bytes], str] | None = None,
) -> tuple[str, str]:
    """(effect id, proposed payload digest). The digest covers the input as proposed, without
    the premises it carries; ``digest`` makes it (default sha256). The id is sha256, or
    ``keyed_ids`` in a journal whose ids are keyed (``Values.ids``). Both are over the call's
    JSON spelled so that values of one meaning name one effect (``name``). A key or input with
    no single canonical JSON form (a set, NaN, bytes in a key, an unknown object) is refused,
    naming where."""
    named = call.named
    eid = effect_id(call.effect_type, None, key_json=named.key, keyed=keyed_ids)
    return eid, digest(named.body)


def identify_earlier(
    call: Call,
    digest: Callable[[bytes], str] = _sha256,
    keyed_ids: Callable[[bytes], str] | None = None,
) -> tuple[str, str]:
    """(effect id, proposed payload digest) as the release before equal-meaning spelling made
    them (``Named.earlier_key``, ``Named.earlier_body``): ``identify``'s where they agree."""
    named = call.named
    key = named.key if named.earlier_key is None else named.earlier_key
    body = named.body if named.earlier_body is None else named.earlier_body
    return effect_id(call.effect_type, None, key_json=key, keyed=keyed_ids), digest(body)


def not_json_args(args: Sequence[Any], names: Sequence[str]) -> str | None:
    """Which argument is not JSON data, where in it and of what type (None: all are)."""
    for name, arg in zip(names, args, strict=True):
        try:
            jsonable(arg, name)
        except UnserializableInput as err:
            return str(err)
    return None


def proposed_payload(call: Call) -> list[Any]:
    """The input as proposed, as JSON data, without the decision-time premises it carries
    (``call.args_json`` itself when there are none: not to be modified)."""
    data = call.args_json
    field_name = call.premises_field
    if field_name is not None and data and isinstance(data[0], dict) and field_name in data[0]:
        data = [{k: v for k, v in data[0].items() if k != field_name}, *data[1:]]
    return data


def decision_premises(call: Call) -> dict[str, Any] | None:
    """The premises the agent captured when it decided, if the input carries them."""
    if call.premises_field is None or not call.args:
        return None
    first = call.args_json[0]
    value = first.get(call.premises_field) if isinstance(first, dict) else None
    return dict(value) if isinstance(value, dict) else None


def as_input(args: tuple[Any, ...]) -> Any:
    """What targets and extractors see: the single argument, or the tuple of them."""
    return args[0] if len(args) == 1 else args


def delivery_record(call: Call) -> dict[str, Any]:
    """The call's delivery as the journal records it."""
    d = call.delivery
    return {
        "namespace": call.namespace,
        "workflow_id": d.workflow_id,
        "run_id": d.run_id,
        "activity_id": d.activity_id,
        "attempt": d.attempt,
    }


async def to_the_end(work: Awaitable[T]) -> T:
    """Await ``work`` to its end even if the attempt is cancelled meanwhile (a send that went
    out must be recorded; a transaction cannot be stopped half way), holding the claim until it
    is over. The cancellation is raised once it is."""
    task = asyncio.ensure_future(work)
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.done():
                raise
            cancelled = True
            continue
        if cancelled:
            raise asyncio.CancelledError()
        return result
