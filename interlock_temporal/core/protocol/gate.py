"""The gate's attempt path: claim, read, decide; a new effect proposed, authorised and
dispatched in one transaction; a reopened one authorised afresh; one in doubt handed to
recovery; a recorded outcome answered as it is."""

from __future__ import annotations

import functools
import hashlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

from .. import premises as premise
from ..errors import Ambiguous, HeadConflict, InFlight, Refused, UnstableEffectKey
from ..identity import origin_of
from ..journal.claims import Claim
from ..leases import Demand, charge_for, check_lease
from ..models import Draft, Entry, Kind, Lease, Receipt
from ..receipts import EffectView, fold, receipt_of
from ..targets import EffectTarget, capabilities
from .admission import policy_deciders
from .atomic import Atomic
from .calls import (
    IN_FLIGHT_RETRY_S,
    NO_LEASE,
    Call,
    Done,
    Measure,
    Ticket,
    as_input,
    decision_premises,
    delivery_record,
    identify,
)
from .recorder import refusal
from .recovery import Recovery


def _sha256_hex(data: bytes) -> str:
    """A digest in the plain scheme (``Values.digest(data, None)``)."""
    return hashlib.sha256(data).hexdigest()


class Gate(Recovery, Atomic):
    """Runs the protocol against one journal. Cheap to construct; holds no per-effect state."""

    @staticmethod
    def identify(call: Call) -> tuple[str, str]:
        """(effect id, proposed payload digest) in a journal whose ids are plain sha256 (the
        default): see ``calls.identify``."""
        return identify(call)

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

    def _digest_in(self, scheme: str | None) -> Callable[[bytes], str]:
        if scheme is None:
            return _sha256_hex
        return functools.partial(self.values.digest, scheme=scheme)

    def _payload_digest(self, call: Call, view: EffectView, pdigest: str) -> str:
        """The call's payload digest in the scheme of the recorded effect (``pdigest`` is in
        the scheme a new effect would get): an effect recorded before a codec was configured
        keeps comparing on plain digests, and the other way round."""
        if view.digests == self.values.scheme:
            return pdigest
        return identify(call, self._digest_in(view.digests))[1]

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

    async def begin(self, call: Call, target: EffectTarget) -> Ticket | Done:
        eid, pdigest = identify(
            call, self._digest_in(self.values.scheme), self.values.ids(self.journal.effect_ids)
        )
        started = time.perf_counter()
        claim, entries = await self.journal.claim_reading(eid)
        if claim is None:
            return await self._unclaimed(call, target, eid, pdigest)
        try:
            self._point("claimed", eid)
            for _ in range(3):
                try:
                    step = await self._decide(call, target, eid, pdigest, claim, entries)
                    break
                except HeadConflict:
                    entries = None  # another writer moved the chain: read again, decide again
            else:
                raise InFlight(eid, "the effect's record keeps moving", IN_FLIGHT_RETRY_S)
        except BaseException:
            claim.release()
            raise
        if isinstance(step, Done):
            await self.journal.release_async(claim)
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
            view = fold(eid, await self.journal.read_async(eid))
            if view.payload_digest != (mine := self._payload_digest(call, view, pdigest)):
                await self._reject_conflict(view, mine, call)
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
        self,
        call: Call,
        target: EffectTarget,
        eid: str,
        pdigest: str,
        claim: Claim | None,
        entries: list[Entry] | None = None,
    ) -> Ticket | Done:
        """Decide on the effect's entries: ``entries`` when read under this claim already."""
        if entries is None:
            entries = await self.journal.read_async(eid)
        if not entries:
            await self._refuse_an_unstable_key(call, target, eid)
            return await self._dispatch_first(call, target, eid, pdigest, claim)
        view = fold(eid, entries)
        pdigest = self._payload_digest(call, view, pdigest)
        if view.payload_digest != pdigest:
            await self._reject_conflict(view, pdigest, call)
        status = view.status
        if status is Kind.COMMITTED:
            return Done(eid, await self.stored(eid, "result", entries), "duplicate")
        if status is Kind.REFUSED:
            # refused by an earlier attempt: say so, with when, instead of as if it were news
            raise Refused(
                view.code or "refused",
                view.reason or "",
                receipt_of(view),
                refused_at=view.finished_ts or view.proposed_ts or self.clock(),
            )
        if status is Kind.AMBIGUOUS:
            raise Ambiguous(view.reason or "ambiguous", receipt_of(view))
        if status is Kind.RESOLVED and view.resolution == "happened":
            return Done(eid, await self.stored(eid, "result", entries), "resolved")
        if claim is None:  # pragma: no cover - _unclaimed only passes terminal states
            raise InFlight(eid, "another live attempt holds it", IN_FLIGHT_RETRY_S)
        if status is Kind.REOPENED:
            return await self._dispatch_reopened(call, target, view, claim)
        return await self._recover(call, target, view, claim)

    async def _refuse_an_unstable_key(self, call: Call, target: EffectTarget, eid: str) -> None:
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
            receipt: Receipt | None = await self.close_out(
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
    ) -> Ticket | Done:
        caps = capabilities(target)
        admitted = self._police(call, eid, pdigest, call.args)
        current = await premise.capture(target, call.input, eid)
        decided = decision_premises(call)
        recorded = decided if decided is not None else current
        changes = await premise.validate(target, recorded, current, call.input)
        approved, approved_json = self._approved(call, admitted)
        scheme = self.values.scheme
        approved_digest = self.values.digest(approved_json, scheme)
        stored = await self.values.store(approved_json)
        proposed = self._proposed(
            call, target, pdigest, recorded, decided is None, scheme, caps.tier
        )
        measured = call.measure(approved) if call.measure else Measure()
        demand = Demand(call.principal, call.activity, measured.amount_cents, measured.resource)
        decided_by = ["lease", *policy_deciders(admitted, self.policy_id)]

        def build(lease: Lease | None) -> list[Draft]:
            if call.lease_id is None:
                return [proposed, refusal("lease", NO_LEASE)]
            found = self._lease_seen(check_lease(lease, demand, self.clock()), lease, call.lease_id)
            if found is not None:
                return [proposed, refusal(found.code, found.detail)]
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
                        **self._policy_note(admitted),
                    },
                ),
                self._dispatched("dispatch", call, current, None, charge_for(lease, demand)),
            ]

        self._point("before_dispatch_tx", eid)
        if caps.transactional and call.transaction is not None:
            return await self._dispatch_atomic(
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
        self._raise_if_refused(eid, written)
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

    async def _dispatch_reopened(
        self, call: Call, target: EffectTarget, view: EffectView, claim: Claim
    ) -> Ticket | Done:
        """A person reopened a refused effect: authorise it afresh, under the caller's authority
        and the facts current now (the new baseline for any later recovery)."""
        eid = view.effect_id
        current = await premise.capture(target, call.input, eid)
        decided = decision_premises(call)
        recorded = decided if decided is not None else current
        changes = await premise.validate(target, recorded, current, call.input)
        admitted = self._police(call, eid, view.payload_digest or "", call.args)
        approved, approved_json = self._approved(call, admitted)
        approved_digest = self.values.digest(approved_json, view.digests)
        stored = await self.values.store(approved_json)
        measured = call.measure(approved) if call.measure else Measure()
        demand = Demand(call.principal, call.activity, measured.amount_cents, measured.resource)

        def build(lease: Lease | None) -> list[Draft]:
            found = check_lease(lease, demand, self.clock()) if call.lease_id else None
            found = self._lease_seen(found, lease, call.lease_id)
            if call.lease_id is None:
                return [refusal("lease", NO_LEASE)]
            if found is not None:
                return [refusal(found.code, found.detail)]
            if changes:
                return [refusal("stale_premise", premise.describe(changes), changes)]
            return [
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
                            f"reopened:{view.operator}",
                            *policy_deciders(admitted, self.policy_id),
                        ],
                        "checks": ["lease", "premises", *(["policy"] if admitted else [])],
                        **self._policy_note(admitted),
                    },
                ),
                self._dispatched("reopened", call, current, None, charge_for(lease, demand)),
            ]

        if capabilities(target).transactional and call.transaction is not None:
            return await self._dispatch_atomic(
                call, target, eid, view.head, build, approved, stored, "reopened", view
            )
        written = await self.journal.append_async(
            eid, view.head, build, lease_id=call.lease_id, blobs={"approved": stored}
        )
        self._raise_if_refused(eid, written, view)
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
