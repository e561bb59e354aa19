"""The effect protocol (DESIGN section 4), with no Temporal import.

Every attempt runs under the effect's claim: claim, then read, then decide. ``begin`` returns
either the recorded outcome (``Done``) or a ``Ticket``: the dispatch is durably recorded and the
send may go out. The caller sends, then calls ``commit`` or ``fail``, which record the outcome and
release the claim. ``run`` strings the three together for callers with nothing to add.
"""

from __future__ import annotations

import hashlib
import os
import socket
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal, get_args

from . import premises as premise
from .errors import Ambiguous, HeadConflict, InFlight, InvalidCall, Refused, UnstableEffectKey
from .identity import (
    UnserializableInput,
    canonical,
    canonical_json,
    digest,
    effect_id,
    jsonable,
    origin_of,
    unstable_part,
)
from .journal import Journal, value_of
from .journal.claims import Claim
from .leases import Charge, Demand, charge_for, check_lease
from .models import Change, Draft, Entry, Kind, Lease, Receipt
from .policy import CallEvent, Decision, PolicyGuard, Scopes, Verdict, enforce
from .receipts import EffectView, fold, receipt_of
from .targets import (
    EffectTarget,
    capabilities,
    classify,
    confirmation_of,
    query,
    target_clock,
)

NO_LEASE = "no lease: run the activity under act_as(principal, lease)"
#: how soon to try again when a live attempt holds the effect
IN_FLIGHT_RETRY_S = 0.5
#: how soon another workflow's attempt looks again at an effect in doubt that only its owner
#: may send (each look may query the target)
NOT_OWNER_RETRY_S = 2.0
#: why the owner of an effect will never send it: the code of the refusal ``Gate.settle``
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
    """One attempt at an effect, as the adapter saw it.

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
    #: the policy's decision for this attempt, made once however often the attempt re-reads
    admission: dict[str, Decision] = field(default_factory=dict, compare=False, repr=False)

    @cached_property
    def args_json(self) -> list[Any]:
        """The arguments as JSON data, computed once per attempt."""
        try:
            data: list[Any] = jsonable(list(self.args))
        except UnserializableInput as err:
            raise InvalidCall(f"the input of {self.activity} is not JSON data: {err}") from None
        return data

    @cached_property
    def args_canonical(self) -> bytes:
        return canonical_json(self.args_json)

    @cached_property
    def input_digest(self) -> str:
        """The digest of the whole input as delivered (premises included): the same for every
        attempt of one activity."""
        return hashlib.sha256(self.args_canonical).hexdigest()

    @cached_property
    def origin(self) -> str | None:
        d = self.delivery
        return origin_of(d.workflow_id, d.run_id, d.activity_id, self.input_digest)


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
    #: state it followed, e.g. AMBIGUOUS (the commit settles a review) or REFUSED (an alarm)
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

    def release(self) -> None:
        if not self.released and self.claim is not None:
            self.released = True
            self.claim.release()


def _worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class Gate:
    """Runs the protocol against one journal. Cheap to construct; holds no per-effect state."""

    def __init__(
        self,
        journal: Journal,
        *,
        clock: Callable[[], float] = time.time,
        on_point: Callable[[str, str], None] | None = None,
        policy: PolicyGuard | None = None,
    ) -> None:
        self.journal = journal
        self.clock = clock
        #: consulted when a new effect is about to be dispatched or one in doubt resent (a
        #: duplicate of a recorded outcome never reaches it)
        self.policy = policy
        self._on_point = on_point
        self.worker = _worker_id()

    def _point(self, name: str, eid: str) -> None:
        if self._on_point is not None:
            self._on_point(name, eid)

    # -- identity ------------------------------------------------------------------------------

    @staticmethod
    def identify(call: Call) -> tuple[str, str]:
        """(effect id, proposed payload digest). The digest covers the input as proposed, without
        the premises it carries. A key or input with no single canonical JSON form (a set, NaN,
        bytes in a key, an unknown object) is refused, naming where."""
        unstable = None if call.key is None else unstable_part(call.key, "key")
        names = call.param_names
        if len(names) != len(call.args):
            names = tuple(f"args[{i}]" for i in range(len(call.args)))
        for name, arg in zip(names, call.args, strict=True):
            unstable = unstable or unstable_part(arg, name, allow_bytes=call.key is not None)
        if unstable is not None:
            raise InvalidCall(f"{call.activity}: the effect cannot be named: {unstable}")
        try:
            proposed = proposed_payload(call)
            key = proposed if call.key is None else jsonable(call.key)
            # without decision-time premises to leave out, the proposal is the input as sent
            body = call.args_canonical if proposed is call.args_json else canonical_json(proposed)
            eid = effect_id(call.effect_type, key, key_json=body if key is proposed else None)
            return eid, hashlib.sha256(body).hexdigest()
        except UnserializableInput as err:
            raise InvalidCall(
                f"the effect key or input of {call.activity} is not JSON data: {err}"
            ) from None

    # -- the policy ----------------------------------------------------------------------------

    def _police(self, call: Call, eid: str, pdigest: str, args: tuple[Any, ...]) -> Decision | None:
        """The policy's decision on sending ``args`` for this effect, once per attempt. Raises
        ``Denied`` or ``NeedsApproval``; nothing is journaled on the effect for either, so the
        effect may be proposed again once the session's circuit is reset or a person approves."""
        if self.policy is None:
            return None
        decision = call.admission.get(eid)
        if decision is None:
            d = call.delivery
            event = CallEvent(
                activity=call.activity,
                args=args,
                principal=call.principal,
                session=call.session,
                namespace=call.namespace,
                attempt=d.attempt,
                workflow_id=d.workflow_id,
                effect_id=eid,
                param_names=call.param_names,
            )
            decision = self.policy.check(
                event,
                Scopes.of(event, f"effect:{eid}", binding=eid),
                delivery=f"{d.run_id}/{d.activity_id}/{d.attempt}" if d.activity_id else "",
                digest=pdigest,
            )
            call.admission[eid] = decision
        return enforce(decision, session=call.session or call.delivery.workflow_id, binding=eid)

    @staticmethod
    def _rewritten_args(call: Call, args: Sequence[Any]) -> tuple[Any, ...]:
        """A policy rewrite as the body's argument types, before anything is recorded: the
        approved input the journal records is these values' JSON, the body receives exactly
        them, and recovery decodes the same types from the record. Validated from the values
        rather than their JSON, so a secret the journal masks still reaches the body."""
        if call.decode_args is None:
            return tuple(args)
        try:
            return call.decode_args(list(args))
        except Exception as err:
            raise InvalidCall(
                f"a policy rule rewrote the input of {call.activity} into one it does not "
                f"take: {err}"
            ) from None

    def _approved(self, call: Call, admitted: Decision | None) -> tuple[tuple[Any, ...], bytes]:
        """What a dispatch sends, and its canonical JSON: the input as proposed, or the
        policy's rewrite of it."""
        if admitted is None or admitted.verdict is not Verdict.MODIFY or not admitted.args:
            return call.args, call.args_canonical
        approved = self._rewritten_args(call, admitted.args)
        try:
            return approved, canonical_json(jsonable(list(approved)))
        except UnserializableInput as err:
            raise InvalidCall(
                f"a policy rule rewrote the input of {call.activity} into one that is not "
                f"JSON data: {err}"
            ) from None

    def _policy_note(self, decision: Decision | None) -> dict[str, Any]:
        if decision is None:
            return {}
        return {
            "policy": {
                "verdict": decision.verdict.value,
                "code": decision.code or None,
                "policy_id": decision.policy_id or self.policy_id,
                "epoch": decision.epoch,
                "observed": decision.observed,
            }
        }

    # -- the attempt ---------------------------------------------------------------------------

    async def run(
        self, call: Call, target: EffectTarget, send: Callable[[Ticket], Awaitable[Any]]
    ) -> Any:
        step = await self.begin(call, target)
        if isinstance(step, Done):
            return step.result
        try:
            result = await send(step)
        except Exception as err:
            await self.fail(step, err, last_attempt=call.last_attempt)
            raise
        except BaseException:
            step.release()
            raise
        return (await self.commit(step, result)).result

    async def begin(self, call: Call, target: EffectTarget) -> Ticket | Done:
        eid, pdigest = self.identify(call)
        started = time.perf_counter()
        claim = self.journal.claim(eid)
        if claim is None:
            return await self._unclaimed(call, target, eid, pdigest)
        try:
            self._point("claimed", eid)
            for _ in range(3):
                try:
                    step = await self._decide(call, target, eid, pdigest, claim)
                    break
                except HeadConflict:
                    continue  # another writer moved the chain: read again and decide again
            else:
                raise InFlight(eid, "the effect's record keeps moving", IN_FLIGHT_RETRY_S)
        except BaseException:
            claim.release()
            raise
        if isinstance(step, Done):
            claim.release()
        else:
            step.gate_s = time.perf_counter() - started
        return step

    async def _unclaimed(
        self, call: Call, target: EffectTarget, eid: str, pdigest: str
    ) -> Ticket | Done:
        """A live attempt holds the effect. Terminal records are stable and may be answered
        without the claim; anything else is in flight (or, on the last attempt, ambiguous)."""
        for _ in range(3):
            row = self.journal.row(eid)
            if row is not None and row.status in (Kind.COMMITTED, Kind.REFUSED, Kind.AMBIGUOUS):
                step = await self._decide(call, target, eid, pdigest, None)
                assert isinstance(step, Done)
                return step
            if not (call.last_attempt and row is not None and row.status is Kind.DISPATCHED):
                break
            view = fold(eid, self.journal.read(eid))
            if view.payload_digest != pdigest:
                await self._reject_conflict(view, pdigest, call)
            try:
                await self._ambiguous(
                    view,
                    "still in flight in another attempt when the last attempt ran",
                    "in_flight",
                )
            except HeadConflict:
                continue  # the holder recorded its outcome meanwhile: answer from that
        raise InFlight(eid, "another live attempt holds it", IN_FLIGHT_RETRY_S)

    async def _decide(
        self, call: Call, target: EffectTarget, eid: str, pdigest: str, claim: Claim | None
    ) -> Ticket | Done:
        entries = self.journal.read(eid)
        if not entries:
            await self._refuse_an_unstable_key(call, target, eid)
            return await self._dispatch_first(call, target, eid, pdigest, claim)
        view = fold(eid, entries)
        if view.payload_digest != pdigest:
            await self._reject_conflict(view, pdigest, call)
        status = view.status
        if status is Kind.COMMITTED:
            return Done(eid, value_of(entries, "result"), "duplicate")
        if status is Kind.REFUSED:
            raise Refused(view.code or "refused", view.reason or "", receipt_of(view))
        if status is Kind.AMBIGUOUS:
            raise Ambiguous(view.reason or "ambiguous", receipt_of(view))
        if status is Kind.RESOLVED and view.resolution == "happened":
            return Done(eid, value_of(entries, "result"), "resolved")
        if claim is None:  # pragma: no cover - _unclaimed only passes terminal states
            raise InFlight(eid, "another live attempt holds it", IN_FLIGHT_RETRY_S)
        if status is Kind.REOPENED:
            return await self._dispatch_reopened(call, target, view, claim)
        return await self._recover(call, target, view, claim)

    async def _refuse_an_unstable_key(self, call: Call, target: EffectTarget, eid: str) -> None:
        """A retry that names a new effect: if an earlier attempt of this activity, with this
        very input, proposed another one, the key changed between attempts. Nothing is sent
        under the new id; the first effect is settled without a send (its activity fails now
        and will never send it again): found → COMMITTED, absent → REFUSED, else AMBIGUOUS.
        Only a retry can find one, so only a retry asks (an indexed query)."""
        if call.delivery.attempt <= 1 or call.origin is None:
            return
        first = next((e for e in self.journal.by_origin(call.origin) if e != eid), None)
        if first is None:
            return
        try:
            receipt: Receipt | None = await self.settle(
                first,
                target,
                owner_ended="abandoned",
                why="its activity's effect key changed between attempts",
                decode_args=call.decode_args,
            )
        except InFlight:
            receipt = self.receipt_or_none(first)
        raise UnstableEffectKey(eid, first, receipt)

    # -- 1. nothing recorded: propose, authorise, dispatch in one transaction --------------------

    async def _dispatch_first(
        self, call: Call, target: EffectTarget, eid: str, pdigest: str, claim: Claim | None
    ) -> Ticket:
        caps = capabilities(target)
        admitted = self._police(call, eid, pdigest, call.args)
        current = await premise.capture(target, call.input, eid)
        decided = decision_premises(call)
        recorded = decided if decided is not None else current
        changes = await premise.validate(target, recorded, current, call.input)
        approved, approved_json = self._approved(call, admitted)
        approved_digest = hashlib.sha256(approved_json).hexdigest()
        proposed = Draft(
            kind=Kind.PROPOSED,
            data={
                "effect_type": call.effect_type,
                "activity": call.activity,
                "payload_digest": pdigest,
                "principal": call.principal,
                "lease_id": call.lease_id,
                "session": call.session,
                "premises": recorded,
                "premises_source": "capture" if decided is None else "decision",
                "target": target.name,
                "tier": caps.tier,
                "delivery": _delivery(call),
                "input_digest": call.input_digest,
            },
        )
        measured = call.measure(approved) if call.measure else Measure()
        demand = Demand(call.principal, call.activity, measured.amount_cents, measured.resource)
        decided_by = ["lease", *_policy_deciders(admitted, self.policy_id)]

        def build(lease: Lease | None) -> list[Draft]:
            if call.lease_id is None:
                return [proposed, _refusal("lease", NO_LEASE)]
            found = check_lease(lease, demand, self.clock())
            if found is not None:
                return [proposed, _refusal(found.code, found.detail)]
            if changes:
                return [proposed, _refusal("stale_premise", premise.describe(changes), changes)]
            return [
                proposed,
                Draft(
                    kind=Kind.AUTHORIZED,
                    data={
                        "lease": lease.snapshot() if lease else None,
                        "approved_digest": approved_digest,
                        "decided_by": decided_by,
                        "checks": ["lease", "premises", *(["policy"] if admitted else [])],
                        **self._policy_note(admitted),
                    },
                ),
                self._dispatched("dispatch", call, current, None, charge_for(lease, demand)),
            ]

        self._point("before_dispatch_tx", eid)
        written = await self.journal.append_async(
            eid,
            "",
            build,
            effect_type=call.effect_type,
            lease_id=call.lease_id,
            blobs={"approved": approved_json},
        )
        self._raise_if_refused(eid, written)
        self._point("after_dispatch_tx", eid)
        return Ticket(
            eid, written[-1].hash, "dispatch", approved, _as_input(approved), 1, target, call, claim
        )

    async def _dispatch_reopened(
        self, call: Call, target: EffectTarget, view: EffectView, claim: Claim
    ) -> Ticket:
        """A person reopened a refused effect: authorise it afresh, under the caller's authority
        and the facts current now (the new baseline for any later recovery)."""
        eid = view.effect_id
        current = await premise.capture(target, call.input, eid)
        decided = decision_premises(call)
        recorded = decided if decided is not None else current
        changes = await premise.validate(target, recorded, current, call.input)
        admitted = self._police(call, eid, view.payload_digest or "", call.args)
        approved, approved_json = self._approved(call, admitted)
        measured = call.measure(approved) if call.measure else Measure()
        demand = Demand(call.principal, call.activity, measured.amount_cents, measured.resource)

        def build(lease: Lease | None) -> list[Draft]:
            found = check_lease(lease, demand, self.clock()) if call.lease_id else None
            if call.lease_id is None:
                return [_refusal("lease", NO_LEASE)]
            if found is not None:
                return [_refusal(found.code, found.detail)]
            if changes:
                return [_refusal("stale_premise", premise.describe(changes), changes)]
            return [
                Draft(
                    kind=Kind.AUTHORIZED,
                    data={
                        "lease": lease.snapshot() if lease else None,
                        "lease_id": call.lease_id,
                        "principal": call.principal,
                        "premises": recorded,
                        "approved_digest": hashlib.sha256(approved_json).hexdigest(),
                        "decided_by": [
                            "lease",
                            f"reopened:{view.operator}",
                            *_policy_deciders(admitted, self.policy_id),
                        ],
                        "checks": ["lease", "premises", *(["policy"] if admitted else [])],
                        **self._policy_note(admitted),
                    },
                ),
                self._dispatched("reopened", call, current, None, charge_for(lease, demand)),
            ]

        written = await self.journal.append_async(
            eid, view.head, build, lease_id=call.lease_id, blobs={"approved": approved_json}
        )
        self._raise_if_refused(eid, written)
        self._point("after_dispatch_tx", eid)
        return Ticket(
            eid,
            written[-1].hash,
            "reopened",
            approved,
            _as_input(approved),
            view.dispatches + 1,
            target,
            call,
            claim,
        )

    @property
    def policy_id(self) -> str:
        return self.policy.policy.policy_id if self.policy else ""

    def _dispatched(
        self,
        via: str,
        call: Call,
        current: Mapping[str, Any],
        lease: Lease | None,
        charge: Charge | None = None,
    ) -> Draft:
        data: dict[str, Any] = {
            "via": via,
            "worker": self.worker,
            "delivery": _delivery(call),
            "premises_now": dict(current),
        }
        if lease is not None:
            data["lease"] = lease.snapshot()
        if charge is not None:
            # the journal reserves it in this transaction (once per effect)
            data["budget"] = charge.as_data()
        return Draft(kind=Kind.DISPATCHED, data=data)

    # -- 5. in doubt: settle, query, re-check, resend or stop ------------------------------------

    async def _recover(
        self, call: Call, target: EffectTarget, view: EffectView, claim: Claim
    ) -> Ticket | Done:
        if call.delivery.workflow_id != view.owner:
            return await self._recover_for_another(call, target, view)
        eid = view.effect_id
        caps = capabilities(target)
        absent = view.absence_confirmed
        args = self._approved_args(call, view)
        payload = _as_input(args)
        settled = True
        if not absent:
            settled = (
                view.last_dispatch_ts is None
                or self.clock() >= view.last_dispatch_ts + caps.settle_time.total_seconds()
            )
            if caps.queryable:
                found = await query(target, eid, payload)
                if found is not None:
                    return await self._record_commit(
                        eid,
                        view.head,
                        "recovery-query",
                        jsonable(found.result),
                        found.confirmation,
                    )
                absent = settled

        current = await premise.capture(target, payload, eid)
        changes = await premise.validate(target, view.premises or {}, current, payload)
        in_window = caps.resend_deduped(view.first_dispatch_ts, target_clock(target))
        # "not found" proves nothing until the target has settled; only a resend the target
        # dedupes (same key, inside its window, facts unchanged) is safe before that
        if not settled and not (in_window and not changes):
            if call.last_attempt:
                await self._ambiguous(view, "the target may still be executing it", "unsettled")
            raise InFlight(eid, "the target may still be executing it", IN_FLIGHT_RETRY_S)
        if in_window or absent:
            # a resend is re-checked against the policy like the lease (an approved input is
            # never rewritten again: only a denial or an escalation counts here)
            self._police(call, eid, view.payload_digest or "", args)
        measured = call.measure(args) if call.measure else Measure()
        demand = Demand(
            view.principal,
            view.activity or call.activity,
            measured.amount_cents,
            measured.resource,
        )
        outcome: dict[str, str] = {}

        def build(lease: Lease | None) -> list[Draft]:
            found = check_lease(lease, demand, self.clock()) if view.lease_id else None
            if view.lease_id is None:
                problem: tuple[str, str, list[Change]] | None = (
                    "lease_at_recovery",
                    "no lease",
                    [],
                )
            elif found is not None:
                code = "lease_budget" if found.code == "lease_budget" else "lease_at_recovery"
                problem = (code, found.detail, [])
            elif changes:
                problem = ("stale_premise_at_recovery", premise.describe(changes), changes)
            else:
                problem = None
            if problem is not None:
                code, reason, ch = problem
                if absent:
                    outcome["kind"] = "refused"
                    return [_refusal(code, reason, ch)]
                if not settled and not call.last_attempt:
                    # once the target has settled, "not found" will confirm absence: wait for
                    # that rather than call it ambiguous now
                    outcome["kind"] = "unsettled"
                    return []
                outcome["kind"] = "ambiguous"
                return [
                    _ambiguity(
                        code, f"{reason}, and the target cannot say whether the effect happened", ch
                    )
                ]
            # the window is judged again as the dispatch is recorded, as the lease is: the
            # capture before it may have taken long enough to carry the resend past its end
            deduped = in_window and caps.resend_deduped(
                view.first_dispatch_ts, target_clock(target)
            )
            if deduped:
                via = "retry-idempotent"
            elif absent:
                via = "recovery-reapply"
            elif not settled and not call.last_attempt:
                outcome["kind"] = "unsettled"
                return []
            else:
                outcome["kind"] = "ambiguous"
                return [
                    _ambiguity(
                        "unknowable",
                        "the target can neither dedupe a resend nor be asked whether "
                        "the effect happened",
                    )
                ]
            outcome["kind"] = "dispatch"
            outcome["via"] = via
            return [self._dispatched(via, call, current, lease, charge_for(lease, demand))]

        self._point("before_recovery_tx", eid)
        written = await self.journal.append_async(eid, view.head, build, lease_id=view.lease_id)
        if outcome["kind"] == "refused":
            self._raise_if_refused(eid, written)
        if outcome["kind"] == "ambiguous":
            self._raise_ambiguous(eid)
        if outcome["kind"] == "unsettled":
            raise InFlight(eid, "the target may still be executing it", IN_FLIGHT_RETRY_S)
        self._point("after_dispatch_tx", eid)
        return Ticket(
            eid,
            written[-1].hash,
            outcome["via"],
            args,
            payload,
            view.dispatches + 1,
            target,
            call,
            claim,
        )

    async def _recover_for_another(
        self, call: Call, target: EffectTarget, view: EffectView
    ) -> Done:
        """Another workflow's attempt (a duplicate submission) found the effect unconfirmed:
        only the workflow that owns it may send it, so this attempt may learn that it happened
        and never sends. It waits for the owner (or the reconciler, once the owner is gone); on
        its last attempt an effect still in doubt is AMBIGUOUS."""
        eid = view.effect_id
        if capabilities(target).queryable:
            args = self._approved_args(call, view)
            found = await query(target, eid, _as_input(args))
            if found is not None:
                return await self._record_commit(
                    eid, view.head, "recovery-query", jsonable(found.result), found.confirmation
                )
        if call.last_attempt and not view.absence_confirmed:
            await self._ambiguous(
                view,
                f"in doubt when the last attempt of workflow {call.delivery.workflow_id} ran, "
                f"and only the workflow that owns it ({view.owner}) may send it again",
                "not_owner",
            )
        raise InFlight(eid, "only the workflow that owns it may send it again", NOT_OWNER_RETRY_S)

    def _approved_args(self, call: Call, view: EffectView) -> tuple[Any, ...]:
        """Recovery resends the recorded approved input, never one derived again."""
        if view.approved_digest == hashlib.sha256(call.args_canonical).hexdigest():
            return call.args
        return self._recorded_args(view, call.decode_args)

    def _recorded_args(
        self, view: EffectView, decode_args: Callable[[list[Any]], tuple[Any, ...]] | None
    ) -> tuple[Any, ...]:
        blob = self.journal.blob(view.effect_id, "approved")
        if blob is None or digest(blob) != view.approved_digest:
            raise InvalidCall(
                f"effect {view.effect_id[:16]}: the approved input in the journal is missing "
                "or does not match its recorded digest"
            )
        return decode_args(blob) if decode_args else tuple(blob)

    # -- settling without a send -----------------------------------------------------------------

    async def settle(
        self,
        effect_id: str,
        target: EffectTarget,
        *,
        owner_ended: OwnerEnded,
        why: str | None = None,
        decode_args: Callable[[list[Any]], tuple[Any, ...]] | None = None,
    ) -> Receipt:
        """Settle an effect its owner will never send again, without ever sending it.

        For an effect dispatched and never confirmed (``DISPATCHED``, ``NOT_SENT``, or
        ``RESOLVED`` not_happened): the target finds it → ``COMMITTED`` via ``recovery-query``;
        its absence is confirmed (a query made ``settle_time`` after the last dispatch, a
        ``NOT_SENT``, a person's not_happened) → ``REFUSED`` with code ``owner_ended``
        (``cancelled``: the owning workflow was cancelled or terminated; ``abandoned``: it ended
        otherwise, or moved on), executed = false; a queryable target that may still be
        executing it (inside ``settle_time``) → left as it is, for a later call to confirm;
        otherwise → ``AMBIGUOUS`` (a person decides). Any other state is returned as it is. The
        caller decides that the owner is gone: this must not be called while the owner may
        still retry the effect.

        Runs under the effect's claim like any attempt: ``InFlight`` if a live attempt holds
        it. ``why`` says how the owner ended, in the recorded reason (default: said from
        ``owner_ended``). ``decode_args`` turns the recorded approved input back into what the
        target's ``query`` expects. Returns the effect's receipt.
        """
        if owner_ended not in get_args(OwnerEnded):
            raise InvalidCall(f"owner_ended must be one of {', '.join(get_args(OwnerEnded))}")
        claim = self.journal.claim(effect_id)
        if claim is None:
            raise InFlight(effect_id, "another live attempt holds it", IN_FLIGHT_RETRY_S)
        try:
            for _ in range(3):
                try:
                    return await self._settle(effect_id, target, owner_ended, why, decode_args)
                except HeadConflict:
                    continue  # another writer moved the chain: read again
            raise InFlight(effect_id, "the effect's record keeps moving", IN_FLIGHT_RETRY_S)
        finally:
            claim.release()

    async def _settle(
        self,
        eid: str,
        target: EffectTarget,
        owner_ended: OwnerEnded,
        why: str | None,
        decode_args: Callable[[list[Any]], tuple[Any, ...]] | None,
    ) -> Receipt:
        entries = self.journal.read(eid)
        if not entries:
            raise InvalidCall(f"effect {eid[:16]} is not in the journal")
        view = fold(eid, entries)
        unconfirmed = view.status in (Kind.DISPATCHED, Kind.NOT_SENT) or (
            view.status is Kind.RESOLVED and view.resolution == "not_happened"
        )
        if not unconfirmed:
            return receipt_of(view)
        caps = capabilities(target)
        absent = view.absence_confirmed
        if caps.queryable:
            args = self._recorded_args(view, decode_args)
            found = await query(target, eid, _as_input(args))
            if found is not None:
                await self._record_commit(
                    eid, view.head, "recovery-query", jsonable(found.result), found.confirmation
                )
                return self.receipt(eid)
            if not absent and not (
                view.last_dispatch_ts is None
                or self.clock() >= view.last_dispatch_ts + caps.settle_time.total_seconds()
            ):
                return receipt_of(view)  # "not found" proves nothing yet: ask again later
            absent = True
        whose = why or (
            "its workflow was cancelled or terminated"
            if owner_ended == "cancelled"
            else "its workflow ended or moved on without it"
        )
        if absent:
            draft = _refusal(
                owner_ended, f"{whose}, and it never happened; nobody else may send it"
            )
        else:
            draft = _ambiguity(
                "unknowable",
                f"{whose} while it was in doubt, and the target cannot say whether it happened",
            )
        await self.journal.append_async(eid, view.head, [draft])
        return self.receipt(eid)

    # -- after the send ------------------------------------------------------------------------

    async def commit(self, ticket: Ticket, result: Any, confirmation: str | None = None) -> Done:
        """Record that the target confirmed the effect, then release the claim."""
        started = time.perf_counter()
        try:
            self._point("after_send", ticket.effect_id)
            gate_s = ticket.gate_s + time.perf_counter() - started
            done = await self._record_commit(
                ticket.effect_id,
                ticket.head,
                ticket.via,
                jsonable(result),
                confirmation or confirmation_of(ticket.target, result),
                gate_s=gate_s,
            )
            done.gate_s = gate_s
            self._point("after_commit_tx", ticket.effect_id)
            done.result = result
            return done
        finally:
            ticket.release()

    async def fail(self, ticket: Ticket, error: BaseException, *, last_attempt: bool) -> None:
        """Record what a failed send means, release the claim, and raise the outcome (or return,
        so the caller re-raises ``error`` for Temporal to retry)."""
        try:
            verdict = classify(ticket.target, error)
            kind = type(error).__name__
            eid = ticket.effect_id
            changes = [c for c in getattr(error, "changes", None) or [] if isinstance(c, Change)]
            if verdict == "rejected" and changes:
                # the target re-checked the facts as it sent (a compare-and-swap) and they moved
                draft = _refusal("stale_premise", premise.describe(changes), changes)
            elif verdict == "rejected":
                draft = _refusal("target_rejected", f"the target rejected the request ({kind})")
            elif verdict == "not_sent" and last_attempt:
                # nothing happened and nothing will retry: say so, do not leave it pending
                draft = _refusal(
                    "not_sent",
                    f"the request never reached the target ({kind}) "
                    "and Temporal will make no further attempt",
                )
            elif verdict == "not_sent":
                draft = Draft(kind=Kind.NOT_SENT, data={"error": kind})
            elif last_attempt:
                draft = _ambiguity(
                    "send_failed",
                    f"the send failed in doubt ({kind}) on the last attempt Temporal will make",
                )
            else:
                return  # in doubt, and Temporal will retry: the next attempt recovers
            await self._record_after_send(eid, ticket.head, draft)
            view = fold(eid, self.journal.read(eid))
            if view.status is Kind.REFUSED:
                raise Refused(view.code or "refused", view.reason or "", receipt_of(view), changes)
            if view.status is Kind.AMBIGUOUS:
                raise Ambiguous(view.reason or "ambiguous", receipt_of(view))
        finally:
            ticket.release()

    async def _record_after_send(
        self, eid: str, head: str, draft: Draft, blobs: Mapping[str, Any] | None = None
    ) -> tuple[bool, Kind | None]:
        """Append the send's outcome after ``head``. If the chain moved meanwhile (a last attempt
        elsewhere recorded AMBIGUOUS, a duplicate proposal was rejected), append after the new
        head; an outcome that arrives after a final state is marked late. Returns False when
        there is nothing left to record (the outcome is already known), and the final state this
        outcome followed when it arrived late."""
        data = dict(draft.data)
        after: Kind | None = None
        for _ in range(5):
            try:
                await self.journal.append_async(
                    eid, head, [Draft(kind=draft.kind, data=data)], blobs=blobs
                )
                return True, after
            except HeadConflict:
                view = fold(eid, self.journal.read(eid))
                head = view.head
                if view.status in (Kind.DISPATCHED, Kind.NOT_SENT):
                    continue  # only annotations or a re-dispatch moved it: not late
                if view.status in (Kind.COMMITTED, Kind.RESOLVED):
                    return False, view.status  # known to have happened, or a person decided
                if view.status is Kind.REFUSED and draft.kind is not Kind.COMMITTED:
                    return False, view.status  # already refused; this attempt adds no execution
                if view.status is Kind.AMBIGUOUS and draft.kind is Kind.AMBIGUOUS:
                    return False, view.status
                after = view.status
                # what a zombie attempt learned settles an ambiguity, or contradicts a refusal
                data = {
                    **draft.data,
                    "late": True,
                    "after": view.status.value if view.status else None,
                }
                if view.status is Kind.REFUSED:
                    data["alarm"] = "executed_after_refused"
        raise InFlight(eid, "could not record the outcome: the record keeps moving", 0.1)

    async def _record_commit(
        self,
        eid: str,
        head: str,
        via: str,
        result: Any,
        confirmation: str | None,
        *,
        gate_s: float | None = None,
    ) -> Done:
        result_json = canonical(result)
        data: dict[str, Any] = {
            "via": via,
            "result_digest": hashlib.sha256(result_json).hexdigest(),
            "confirmation": confirmation,
            "worker": self.worker,
        }
        if gate_s is not None:
            # the gate's own time for this effect: before the send, and the commit's checks
            # (its own durable write, which records this, is the part not counted)
            data["gate_ms"] = round(gate_s * 1000, 3)
        draft = Draft(kind=Kind.COMMITTED, data=data)
        recorded, after = await self._record_after_send(
            eid, head, draft, blobs={"result": result_json}
        )
        if recorded:
            return Done(eid, result, via, after)
        view = fold(eid, self.journal.read(eid))
        return Done(eid, self.journal.blob(eid, "result"), view.via or via, after)

    # -- terminal records --------------------------------------------------------------------

    async def _reject_conflict(self, view: EffectView, pdigest: str, call: Call) -> None:
        eid = view.effect_id
        try:
            written = await self.journal.append_async(
                eid,
                view.head,
                [
                    Draft(
                        kind=Kind.REJECTED_PROPOSAL,
                        data={
                            "code": "conflicting_payload",
                            "payload_digest": pdigest,
                            "delivery": _delivery(call),
                        },
                    )
                ],
            )
            seq, head = written[-1].seq, written[-1].hash
        except HeadConflict:
            seq, head = view.head_seq, view.head
        base = receipt_of(view)
        rejected = base.model_copy(
            update={
                "final": Kind.REFUSED.value,
                "via": None,
                "code": "conflicting_payload",
                "reason": "a different payload was proposed under an effect id already decided",
                "executed": False,
                "recorded": True,
                "payload_digest": pdigest,
                "approved_digest": None,
                "result_digest": None,
                "confirmation": None,
                "journal_seq": seq,
                "journal_hash": head,
                "changed_facts": [],
            }
        )
        raise Refused("conflicting_payload", rejected.reason or "", rejected)

    async def _ambiguous(self, view: EffectView, reason: str, code: str) -> None:
        await self.journal.append_async(view.effect_id, view.head, [_ambiguity(code, reason)])
        self._raise_ambiguous(view.effect_id)

    def _raise_ambiguous(self, eid: str) -> None:
        view = fold(eid, self.journal.read(eid))
        raise Ambiguous(view.reason or "ambiguous", receipt_of(view))

    def _raise_if_refused(self, eid: str, written: Sequence[Entry]) -> None:
        last = written[-1]
        if last.kind is Kind.REFUSED:
            view = fold(eid, self.journal.read(eid))
            raise Refused(
                last.data["code"],
                last.data["reason"],
                receipt_of(view),
                [Change.model_validate(c) for c in last.data.get("changes", [])],
            )

    def receipt(self, eid: str) -> Receipt:
        return receipt_of(fold(eid, self.journal.read(eid)))

    def receipt_or_none(self, eid: str) -> Receipt | None:
        entries = self.journal.read(eid)
        return receipt_of(fold(eid, entries)) if entries else None


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


def _policy_deciders(decision: Decision | None, policy_id: str) -> list[str]:
    if decision is None:
        return []
    return [f"policy:{decision.policy_id or policy_id}"] + [
        f"approver:{name}" for name in decision.approvers
    ]


def _as_input(args: tuple[Any, ...]) -> Any:
    """What targets and extractors see: the single argument, or the tuple of them."""
    return args[0] if len(args) == 1 else args


def _delivery(call: Call) -> dict[str, Any]:
    d = call.delivery
    return {
        "namespace": call.namespace,
        "workflow_id": d.workflow_id,
        "run_id": d.run_id,
        "activity_id": d.activity_id,
        "attempt": d.attempt,
    }


def _refusal(code: str, reason: str, changes: Sequence[Change] = ()) -> Draft:
    return Draft(
        kind=Kind.REFUSED,
        data={
            "code": code,
            "reason": reason,
            "executed": False,
            "changes": [c.model_dump(mode="json") for c in changes],
        },
    )


def _ambiguity(code: str, reason: str, changes: Sequence[Change] = ()) -> Draft:
    return Draft(
        kind=Kind.AMBIGUOUS,
        data={
            "code": code,
            "reason": reason,
            "executed": "unknown",
            "changes": [c.model_dump(mode="json") for c in changes],
        },
    )
