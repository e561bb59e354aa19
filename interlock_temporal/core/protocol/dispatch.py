"""A dispatch: a new effect proposed, authorised and dispatched in one transaction (a tier-0
one with its body and commit, through ``Atomic``); a reopened one authorised afresh, under the
caller's authority and the facts current now; and, before a retry's first dispatch, the check
that the activity's effect key did not change between its attempts."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from .. import premises as premise
from ..errors import InFlight, Refused, UnstableEffectKey
from ..identity import origin_of
from ..journal import Journal
from ..journal.claims import Claim
from ..leases import Demand, LeaseProblem, check_lease, reservation_for
from ..models import Draft, Kind, Lease, Receipt
from ..receipts import EffectView, receipt_of
from ..sealing import Values
from ..targets import EffectTarget, capabilities
from .admission import Admission, policy_deciders
from .atomic import Atomic
from .calls import (
    CANONICAL_SPELLING,
    Call,
    Done,
    Measure,
    OnPoint,
    Ticket,
    as_input,
    decision_premises,
    delivery_record,
    no_lease,
)
from .recorder import Recorder, lease_refusal, refusal
from .recovery import Recovery


class Dispatch:
    """What an attempt writes before its send: the dispatch of a new or a reopened effect."""

    def __init__(
        self,
        journal: Journal,
        values: Values,
        clock: Callable[[], float],
        point: OnPoint,
        *,
        recorder: Recorder,
        admission: Admission,
        atomic: Atomic,
        recovery: Recovery,
    ) -> None:
        self.journal = journal
        self.values = values
        self.clock = clock
        self._point = point
        self._recorder = recorder
        self._admission = admission
        self._atomic = atomic
        #: closes out the first effect of an activity whose key changed
        self._recovery = recovery

    async def refuse_an_unstable_key(self, call: Call, target: EffectTarget, eid: str) -> None:
        """A retry that names a new effect: if an earlier attempt of this activity, with this
        very input, proposed another one, the key changed between attempts. Nothing is sent
        under the new id; the first effect is closed out without a send (its activity fails now
        and will never send it again): found → COMMITTED, absent → REFUSED, else AMBIGUOUS.
        Only a retry can find one, so only a retry asks (an indexed query)."""
        if call.delivery.attempt <= 1 or call.origin is None:
            return
        first = None
        for origin in self._origins(call):
            found = await self.journal.by_origin_async(origin)
            if (first := next((e for e in found if e != eid), None)) is not None:
                break
        if first is None:
            return
        try:
            receipt: Receipt | None = await self._recovery.close_out(
                first,
                target,
                owner_ended="abandoned",
                why="its activity's effect key changed between attempts",
                decode_args=call.decode_args,
            )
        except InFlight:
            receipt = self._recorder.receipt_or_none(first)
        raise UnstableEffectKey(eid, first, receipt)

    def _origins(self, call: Call) -> list[str]:
        """The origins an earlier attempt of this activity may have recorded: with the plain
        input digest, and with the keyed one (a codec configured between the attempts)."""
        found = [] if call.origin is None else [call.origin]
        scheme = self.values.scheme
        if scheme is not None and found:
            d = call.delivery
            keyed = self.values.digest(call.args_canonical, scheme)
            found.append(origin_of(d.workflow_id, d.run_id, d.activity_id, keyed) or "")
        return found

    def lease_problem(self, call: Call, lease: Lease | None, demand: Demand) -> LeaseProblem | None:
        """Why ``lease`` (as the dispatch transaction read it) does not authorise ``call``, or
        None: no lease at all (``no_lease``), else ``check_lease``, a lease this journal never
        saw named with the journal."""
        if call.lease_id is None:
            return no_lease(call)
        found = check_lease(lease, demand, self.clock())
        return self._admission.lease_seen(found, lease, call.lease_id)

    # -- 1. nothing recorded: propose, authorise, dispatch in one transaction --------------------

    async def first(
        self, call: Call, target: EffectTarget, eid: str, pdigest: str, claim: Claim | None
    ) -> Ticket | Done:
        caps = capabilities(target)
        admitted = self._admission.police(call, eid, pdigest, call.args)
        current = await premise.capture(target, call.input, eid)
        decided = decision_premises(call)
        recorded = decided if decided is not None else current
        changes = await premise.validate(target, recorded, current, call.input)
        approved, approved_json = self._admission.approved(call, admitted)
        scheme = self.values.scheme
        approved_digest = self.values.digest(approved_json, scheme)
        stored = await self.values.store(approved_json)
        proposed = self._proposed(
            call, target, pdigest, recorded, decided is None, scheme, caps.tier
        )
        measured = call.measure(approved) if call.measure else Measure()
        demand = Demand(call.principal, call.activity, measured.amount_cents, measured.resource)
        decided_by = ["lease", *policy_deciders(admitted, self._admission.policy_id)]

        def build(lease: Lease | None) -> list[Draft]:
            found = self.lease_problem(call, lease, demand)
            if found is not None:
                return [proposed, lease_refusal(found)]
            if changes:
                return [proposed, refusal("stale_premise", premise.describe(changes), changes)]
            return [
                proposed,
                Draft.of(
                    Kind.AUTHORIZED,
                    {
                        "lease": lease.snapshot() if lease else None,
                        "approved_digest": approved_digest,
                        "decided_by": decided_by,
                        "checks": ["lease", "premises", *(["policy"] if admitted else [])],
                        **self._admission.policy_note(admitted),
                    },
                ),
                self._admission.dispatched(
                    "dispatch", call, current, None, reservation_for(lease, demand)
                ),
            ]

        self._point("before_dispatch_tx", eid)
        if caps.transactional and call.transaction is not None:
            return await self._atomic.dispatch(
                call, target, eid, "", build, approved, stored, "dispatch"
            )
        written = await self.journal.append_async(
            eid,
            "",
            build,
            effect_type=call.effect_type,
            lease_id=call.lease_id,
            blobs={"approved": stored},
        )
        self._recorder.raise_if_refused(eid, written)
        self._point("after_dispatch_tx", eid)
        head = written[-1].hash
        return Ticket(
            eid,
            head,
            "dispatch",
            approved,
            as_input(approved),
            1,
            target,
            call,
            claim,
            written=written,
            digests=scheme,
        )

    def _proposed(
        self,
        call: Call,
        target: EffectTarget,
        pdigest: str,
        recorded: Any,
        captured: bool,
        scheme: str | None,
        tier: int,
    ) -> Draft:
        keyed = {} if scheme is None else {"digests": scheme}
        if self.journal.effect_ids is not None:
            keyed["ids"] = self.journal.effect_ids
        if call.named.respelled:  # its id or digest differs from the release before's
            keyed["spelling"] = CANONICAL_SPELLING
        input_digest = (
            call.input_digest if scheme is None else self.values.digest(call.args_canonical, scheme)
        )
        return Draft.of(
            Kind.PROPOSED,
            {
                **keyed,
                "effect_type": call.effect_type,
                "activity": call.activity,
                "payload_digest": pdigest,
                "principal": call.principal,
                "lease_id": call.lease_id,
                "session": call.session,
                "premises": recorded,
                "premises_source": "capture" if captured else "decision",
                "target": target.name,
                "tier": tier,
                "delivery": delivery_record(call),
                "input_digest": input_digest,
            },
        )

    # -- a reopened effect: authorised afresh -----------------------------------------------------

    async def redecide(
        self, call: Call, target: EffectTarget, view: EffectView, claim: Claim
    ) -> Ticket | Done:
        """An effect refused for the caller's own configuration (``view.configuration``: no
        ``act_as``, no lease, a lease this journal does not hold, an activity outside the
        lease): decided again, as a reopened one is, behind a ``REOPENED`` entry that names
        the refusal it reopens, in the same transaction as the new decision. That decision may
        be a dispatch, or any refusal (one about the effect stays until a person reopens it).

        Nothing is written when this attempt has the very configuration that was refused (the
        same problem, read before the transaction from the lease as it is now): the recorded
        refusal is answered, saying so. A re-decision checks everything a first attempt checks
        (the policy, the whole lease, the premises), so it grants nothing a first attempt under
        the new configuration would not, and a refusal about the effect (a budget, a revoked
        lease, another principal, a policy, a premise, a person) is never decided again here."""
        assert view.configuration is not None
        lease = None if call.lease_id is None else await self._lease_now(call.lease_id)
        still = self.lease_problem(call, lease, Demand(call.principal, call.activity))
        if (
            still is not None
            and still.configuration == view.configuration
            and still.detail == view.reason
        ):
            raise Refused(
                view.code or "lease",
                view.reason or "",
                receipt_of(view),
                refused_at=view.finished_ts or view.proposed_ts or self.clock(),
                configuration=view.configuration,
            )
        note = Draft.of(
            Kind.REOPENED,
            {
                "redecided": view.configuration,
                "refused_code": view.code,
                "reason": (
                    f"decided again: the refusal ({view.configuration}) was about the caller's "
                    "configuration, and this attempt's differs"
                ),
                "principal": call.principal,
                "lease_id": call.lease_id,
                "delivery": delivery_record(call),
            },
        )
        return await self.reopened(call, target, view, claim, redecided=note)

    async def _lease_now(self, lease_id: str) -> Lease | None:
        """The lease as it is now, read outside any transaction (off the loop where the journal
        shares it): only to tell that nothing changed, never to allow anything."""
        if self.journal.loop_shared:
            return await asyncio.to_thread(self.journal.leases.get, lease_id)
        return self.journal.leases.get(lease_id)

    async def reopened(
        self,
        call: Call,
        target: EffectTarget,
        view: EffectView,
        claim: Claim,
        *,
        redecided: Draft | None = None,
    ) -> Ticket | Done:
        """A person reopened a refused effect: authorise it afresh, under the caller's authority
        and the facts current now (the new baseline for any later recovery). ``redecided``: the
        gate's own ``REOPENED`` of an effect refused for the caller's configuration, written
        first in the same transaction (``redecide``)."""
        eid = view.effect_id
        current = await premise.capture(target, call.input, eid)
        decided = decision_premises(call)
        recorded = decided if decided is not None else current
        changes = await premise.validate(target, recorded, current, call.input)
        admitted = self._admission.police(call, eid, view.payload_digest or "", call.args)
        approved, approved_json = self._admission.approved(call, admitted)
        approved_digest = self.values.digest(approved_json, view.digests)
        stored = await self.values.store(approved_json)
        measured = call.measure(approved) if call.measure else Measure()
        demand = Demand(call.principal, call.activity, measured.amount_cents, measured.resource)

        reopening = [] if redecided is None else [redecided]
        reopened_by = (
            f"reopened:{view.operator}"
            if redecided is None
            else f"redecided:{redecided.data['redecided']}"
        )

        def build(lease: Lease | None) -> list[Draft]:
            found = self.lease_problem(call, lease, demand)
            if found is not None:
                return [*reopening, lease_refusal(found)]
            if changes:
                return [
                    *reopening,
                    refusal("stale_premise", premise.describe(changes), changes),
                ]
            return [
                *reopening,
                Draft.of(
                    Kind.AUTHORIZED,
                    {
                        "lease": lease.snapshot() if lease else None,
                        "lease_id": call.lease_id,
                        "principal": call.principal,
                        "premises": recorded,
                        "approved_digest": approved_digest,
                        "decided_by": [
                            "lease",
                            reopened_by,
                            *policy_deciders(admitted, self._admission.policy_id),
                        ],
                        "checks": ["lease", "premises", *(["policy"] if admitted else [])],
                        **self._admission.policy_note(admitted),
                    },
                ),
                self._admission.dispatched(
                    "reopened", call, current, None, reservation_for(lease, demand)
                ),
            ]

        if capabilities(target).transactional and call.transaction is not None:
            return await self._atomic.dispatch(
                call, target, eid, view.head, build, approved, stored, "reopened", view
            )
        written = await self.journal.append_async(
            eid, view.head, build, lease_id=call.lease_id, blobs={"approved": stored}
        )
        self._recorder.raise_if_refused(eid, written, view)
        self._point("after_dispatch_tx", eid)
        return Ticket(
            eid,
            written[-1].hash,
            "reopened",
            approved,
            as_input(approved),
            view.dispatches + 1,
            target,
            call,
            claim,
            prior=view,
            written=written,
            digests=view.digests,
        )
