"""An effect in doubt (dispatched, no outcome recorded): its owner's next attempt waits out the
target's ``settle_time``, queries, re-checks, then resends or stops; another workflow's attempt
only learns; ``close_out`` ends an effect whose owner is gone, without ever sending it."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, get_args

from .. import premises as premise
from ..errors import HeadConflict, InFlight, InvalidCall
from ..identity import canonical, jsonable
from ..journal import Journal
from ..journal.claims import Claim
from ..leases import Demand, check_lease, reservation_for
from ..models import Change, Draft, Kind, Lease, Receipt
from ..receipts import EffectView, fold, fold_checked, receipt_of
from ..sealing import Values
from ..targets import Capabilities, EffectTarget, capabilities, query, target_clock
from .admission import Admission
from .calls import (
    IN_FLIGHT_RETRY_S,
    NOT_OWNER_RETRY_S,
    Call,
    Done,
    Measure,
    OnPoint,
    OwnerEnded,
    Ticket,
    as_input,
)
from .recorder import Recorder, ambiguity, refusal


@dataclass
class _Resend:
    """What the owner's attempt found about an effect in doubt, and (once the recovery
    transaction has run) what it wrote: ``kind`` is refused, ambiguous, unsettled (inside the
    target's ``settle_time``: nothing written) or dispatch (then ``via`` names how)."""

    call: Call
    target: EffectTarget
    view: EffectView
    caps: Capabilities
    current: dict[str, Any]
    changes: list[Change]
    demand: Demand
    #: the effect is known not to have happened
    absent: bool
    #: the target has had its ``settle_time`` since the last dispatch
    past_settle_time: bool
    #: a resend now falls inside the target's dedupe window
    in_window: bool
    kind: str = ""
    via: str = ""


class Recovery:
    """The gate's handling of effects dispatched and never confirmed."""

    def __init__(
        self,
        journal: Journal,
        values: Values,
        clock: Callable[[], float],
        point: OnPoint,
        *,
        recorder: Recorder,
        admission: Admission,
    ) -> None:
        self.journal = journal
        self.values = values
        self.clock = clock
        self._point = point
        self._recorder = recorder
        self._admission = admission

    def _past_settle_time(self, view: EffectView, caps: Capabilities) -> bool:
        """The target has had ``settle_time`` since the last dispatch: "not found" now means
        absent."""
        return (
            view.last_dispatch_ts is None
            or self.clock() >= view.last_dispatch_ts + caps.settle_time.total_seconds()
        )

    async def recover(
        self, call: Call, target: EffectTarget, view: EffectView, claim: Claim
    ) -> Ticket | Done:
        if call.delivery.workflow_id != view.owner:
            return await self._recover_for_another(call, target, view)
        eid = view.effect_id
        caps = capabilities(target)
        absent = view.absence_confirmed
        args = await self._approved_args(call, view)
        payload = as_input(args)
        past_settle_time = True
        if not absent:
            past_settle_time = self._past_settle_time(view, caps)
            if caps.queryable:
                found = await query(target, eid, payload)
                if found is not None:
                    return await self._recorder.commit_found(view, found)
                absent = past_settle_time

        current = await premise.capture(target, payload, eid)
        changes = await premise.validate(target, view.premises or {}, current, payload)
        in_window = caps.resend_deduped(view.first_dispatch_ts, target_clock(target))
        # "not found" proves nothing until the target's settle_time has passed; only a resend
        # the target dedupes (same key, inside its window, facts unchanged) is safe before that
        if not past_settle_time and not (in_window and not changes):
            if call.last_attempt:
                await self._recorder.ambiguous(
                    view, "the target may still be executing it", "unsettled"
                )
            raise InFlight(eid, "the target may still be executing it", IN_FLIGHT_RETRY_S)
        if in_window or absent:
            # a resend is re-checked against the policy like the lease (an approved input is
            # never rewritten again: only a denial or an escalation counts here)
            self._admission.police(call, eid, view.payload_digest or "", args)
        measured = call.measure(args) if call.measure else Measure()
        demand = Demand(
            view.principal,
            view.activity or call.activity,
            measured.amount_cents,
            measured.resource,
        )
        plan = _Resend(
            call, target, view, caps, current, changes, demand, absent, past_settle_time, in_window
        )
        self._point("before_recovery_tx", eid)
        written = await self.journal.append_async(
            eid, view.head, functools.partial(self._resend_drafts, plan), lease_id=view.lease_id
        )
        if plan.kind == "refused":
            self._recorder.raise_if_refused(eid, written, view)
        if plan.kind == "ambiguous":
            self._recorder.raise_ambiguous(fold_checked(self.journal, view, written))
        if plan.kind == "unsettled":  # the journal's ambiguity code for the same case
            raise InFlight(eid, "the target may still be executing it", IN_FLIGHT_RETRY_S)
        self._point("after_dispatch_tx", eid)
        return Ticket(
            eid,
            written[-1].hash,
            plan.via,
            args,
            payload,
            view.dispatches + 1,
            target,
            call,
            claim,
            prior=view,
            written=written,
        )

    def _resend_drafts(self, plan: _Resend, lease: Lease | None) -> list[Draft]:
        """What the recovery transaction writes, given the lease as read in it."""
        problem = self._resend_problem(plan, lease)
        if problem is not None:
            return self._stopped(plan, *problem)
        # the window is judged again as the dispatch is recorded, as the lease is: the
        # capture before it may have taken long enough to carry the resend past its end
        deduped = plan.in_window and plan.caps.resend_deduped(
            plan.view.first_dispatch_ts, target_clock(plan.target)
        )
        if deduped:
            via = "retry-idempotent"
        elif plan.absent:
            via = "recovery-reapply"
        elif not plan.past_settle_time and not plan.call.last_attempt:
            plan.kind = "unsettled"
            return []
        else:
            plan.kind = "ambiguous"
            return [
                ambiguity(
                    "unknowable",
                    "the target can neither dedupe a resend nor be asked whether "
                    "the effect happened",
                )
            ]
        plan.kind = "dispatch"
        plan.via = via
        reservation = reservation_for(lease, plan.demand)
        return [self._admission.dispatched(via, plan.call, plan.current, lease, reservation)]

    def _resend_problem(
        self, plan: _Resend, lease: Lease | None
    ) -> tuple[str, str, list[Change]] | None:
        """Why the effect may not be sent again (code, reason, changed facts), or None."""
        found = check_lease(lease, plan.demand, self.clock()) if plan.view.lease_id else None
        if plan.view.lease_id is None:
            return ("lease_at_recovery", "no lease", [])
        if found is not None:
            code = "lease_budget" if found.code == "lease_budget" else "lease_at_recovery"
            return (code, found.detail, [])
        if plan.changes:
            return ("stale_premise_at_recovery", premise.describe(plan.changes), plan.changes)
        return None

    @staticmethod
    def _stopped(plan: _Resend, code: str, reason: str, changes: list[Change]) -> list[Draft]:
        """The effect may not be sent again: refused if it never happened, else in doubt."""
        if plan.absent:
            plan.kind = "refused"
            return [refusal(code, reason, changes)]
        if not plan.past_settle_time and not plan.call.last_attempt:
            # once the target's settle_time has passed, "not found" will confirm absence: wait for
            # that rather than call it ambiguous now
            plan.kind = "unsettled"
            return []
        plan.kind = "ambiguous"
        return [
            ambiguity(
                code, f"{reason}, and the target cannot say whether the effect happened", changes
            )
        ]

    async def _recover_for_another(
        self, call: Call, target: EffectTarget, view: EffectView
    ) -> Done:
        """Another workflow's attempt (a duplicate submission) found the effect unconfirmed:
        only the workflow that owns it may send it, so this attempt may learn that it happened
        and never sends. It waits for the owner (or the reconciler, once the owner is gone); on
        its last attempt an effect still in doubt is AMBIGUOUS."""
        eid = view.effect_id
        if capabilities(target).queryable:
            args = await self._approved_args(call, view)
            found = await query(target, eid, as_input(args))
            if found is not None:
                return await self._recorder.commit_found(view, found)
        if call.last_attempt and not view.absence_confirmed:
            await self._recorder.ambiguous(
                view,
                f"in doubt when the last attempt of workflow {call.delivery.workflow_id} ran, "
                f"and only the workflow that owns it ({view.owner}) may send it again",
                "not_owner",
            )
        raise InFlight(eid, "only the workflow that owns it may send it again", NOT_OWNER_RETRY_S)

    async def _approved_args(self, call: Call, view: EffectView) -> tuple[Any, ...]:
        """Recovery resends the recorded approved input, never one derived again."""
        if view.approved_digest == self.values.digest(call.args_canonical, view.digests):
            return call.args
        return await self.recorded_args(view, call.decode_args)

    async def recorded_args(
        self, view: EffectView, decode_args: Callable[[list[Any]], tuple[Any, ...]] | None
    ) -> tuple[Any, ...]:
        blob = await self._recorder.stored(view.effect_id, "approved")
        if blob is None or self.values.digest(canonical(blob), view.digests) != (
            view.approved_digest
        ):
            raise InvalidCall(
                f"effect {view.effect_id[:16]}: the approved input in the journal is missing "
                "or does not match its recorded digest"
            )
        return decode_args(blob) if decode_args else tuple(blob)

    # -- closing out without a send ---------------------------------------------------------------

    async def close_out(
        self,
        effect_id: str,
        target: EffectTarget,
        *,
        owner_ended: OwnerEnded,
        why: str | None = None,
        decode_args: Callable[[list[Any]], tuple[Any, ...]] | None = None,
    ) -> Receipt:
        """Close out an effect its owner will never send again, without ever sending it.

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
                    return await self._close_out(effect_id, target, owner_ended, why, decode_args)
                except HeadConflict:
                    continue  # another writer moved the chain: read again
            raise InFlight(effect_id, "the effect's record keeps moving", IN_FLIGHT_RETRY_S)
        finally:
            claim.release()

    async def _close_out(
        self,
        eid: str,
        target: EffectTarget,
        owner_ended: OwnerEnded,
        why: str | None,
        decode_args: Callable[[list[Any]], tuple[Any, ...]] | None,
    ) -> Receipt:
        entries = await self.journal.read_async(eid)
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
            args = await self.recorded_args(view, decode_args)
            found = await query(target, eid, as_input(args))
            if found is not None:
                result_json = canonical(jsonable(found.result))
                draft = self._recorder.commit_draft(
                    "recovery-query", result_json, found.confirmation, scheme=view.digests
                )
                stored = await self.values.store_outcome(result_json)
                sent = await self._recorder.record_after_send(
                    eid, view.head, draft, blobs={"result": stored}, view=view
                )
                return (
                    receipt_of(sent.view) if sent.view is not None else self._recorder.receipt(eid)
                )
            if not absent and not self._past_settle_time(view, caps):
                return receipt_of(view)  # "not found" proves nothing yet: ask again later
            absent = True
        whose = why or (
            "its workflow was cancelled or terminated"
            if owner_ended == "cancelled"
            else "its workflow ended or moved on without it"
        )
        if absent:
            draft = refusal(owner_ended, f"{whose}, and it never happened; nobody else may send it")
        else:
            draft = ambiguity(
                "unknowable",
                f"{whose} while it was in doubt, and the target cannot say whether it happened",
            )
        written = await self.journal.append_async(eid, view.head, [draft])
        return receipt_of(fold_checked(self.journal, view, written))
