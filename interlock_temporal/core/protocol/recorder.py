"""What the gate records of an effect's outcome: the send's confirmation or failure, a
refusal, an ambiguity, a conflicting proposal; and the receipts it answers with.

An outcome the gate appends is folded into the view it already holds (``fold_checked``): the
receipt it raises or returns is the one a fresh read of the chain gives, without decoding and
folding the chain again; the chain is still checked, so an edit made since the read stops the
outcome with ``JournalCorrupt``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from .. import premises as premise
from ..errors import Ambiguous, HeadConflict, InFlight, Refused
from ..identity import canonical_json, jsonable
from ..journal import Journal, value_of
from ..leases import LeaseProblem
from ..models import Change, Draft, Entry, Found, Kind, Receipt
from ..receipts import EffectView, fold, fold_checked, receipt_of
from ..sealing import Values
from ..targets import classify, confirmation_of
from .calls import Call, Done, OnPoint, Ticket, delivery_record


class AfterSend(NamedTuple):
    """What ``record_after_send`` did: whether it recorded the outcome, the final state the
    outcome followed when it arrived late, and the effect's view after it (when known)."""

    recorded: bool
    after: Kind | None
    view: EffectView | None


class Recorder:
    """The recording of outcomes: what the send's confirmation or failure means, refusals and
    ambiguities, a conflicting proposal; the stored values and receipts the gate answers with."""

    def __init__(self, journal: Journal, values: Values, point: OnPoint, worker: str) -> None:
        self.journal = journal
        self.values = values
        self._point = point
        #: the worker named in COMMITTED
        self.worker = worker

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
                scheme=ticket.digests,
            )
            done.gate_s = gate_s
            self._point("after_commit_tx", ticket.effect_id)
            done.result = result
            return done
        finally:
            await ticket.release_async(self.journal)

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
                draft = refusal("stale_premise", premise.describe(changes), changes)
            elif verdict == "rejected":
                draft = refusal(
                    "target_rejected", f"the target rejected the request ({kind}{_detail(error)})"
                )
            elif verdict == "not_sent" and last_attempt:
                # nothing happened and nothing will retry: say so, do not leave it pending
                draft = refusal(
                    "not_sent",
                    f"the request never reached the target ({kind}) "
                    "and Temporal will make no further attempt",
                )
            elif verdict == "not_sent":
                draft = Draft.of(Kind.NOT_SENT, {"error": kind})
            elif last_attempt:
                draft = ambiguity(
                    "send_failed",
                    f"the send failed in doubt ({kind}) on the last attempt Temporal will make",
                )
            else:
                return  # in doubt, and Temporal will retry: the next attempt recovers
            sent = await self.record_after_send(eid, ticket.head, draft, view=ticket.view())
            view = (
                sent.view
                if sent.view is not None
                else fold(eid, await self.journal.read_async(eid))
            )
            if view.status is Kind.REFUSED:
                raise Refused(view.code or "refused", view.reason or "", receipt_of(view), changes)
            if view.status is Kind.AMBIGUOUS:
                raise Ambiguous(view.reason or "ambiguous", receipt_of(view))
        finally:
            await ticket.release_async(self.journal)

    async def record_after_send(
        self,
        eid: str,
        head: str,
        draft: Draft,
        blobs: Mapping[str, Any] | None = None,
        *,
        view: EffectView | None = None,
    ) -> AfterSend:
        """Append the send's outcome after ``head``. If the chain moved meanwhile (a last attempt
        elsewhere recorded AMBIGUOUS, a duplicate proposal was rejected), append after the new
        head; an outcome that arrives after a final state is marked late. Not recorded when
        there is nothing left to record (the outcome is already known); ``after`` is the final
        state this outcome followed when it arrived late. ``view``: the effect as of ``head``,
        when the caller holds it; the answer's view is the effect after this append."""
        data = dict(draft.data)
        after: Kind | None = None
        for _ in range(5):
            try:
                written = await self.journal.append_async(
                    eid, head, [Draft.of(draft.kind, data)], blobs=blobs
                )
                return AfterSend(
                    True, after, None if view is None else fold_checked(self.journal, view, written)
                )
            except HeadConflict:
                view = fold(eid, await self.journal.read_async(eid))
                head = view.head
                if view.status in (Kind.DISPATCHED, Kind.NOT_SENT):
                    continue  # only annotations or a re-dispatch moved it: not late
                if view.status in (Kind.COMMITTED, Kind.RESOLVED):
                    # known to have happened, or a person decided
                    return AfterSend(False, view.status, view)
                if view.status is Kind.REFUSED and draft.kind is not Kind.COMMITTED:
                    # already refused; this attempt adds no execution
                    return AfterSend(False, view.status, view)
                if view.status is Kind.AMBIGUOUS and draft.kind is Kind.AMBIGUOUS:
                    return AfterSend(False, view.status, view)
                after = view.status
                # what a zombie attempt learned resolves an ambiguity, or contradicts a refusal
                data = {
                    **draft.data,
                    "late": True,
                    "after": view.status.value if view.status else None,
                }
                if view.status is Kind.REFUSED:
                    data["alarm"] = "executed_after_refused"
        raise InFlight(eid, "could not record the outcome: the record keeps moving", 0.1)

    def commit_draft(
        self,
        via: str,
        result_json: bytes,
        confirmation: str | None,
        gate_s: float | None = None,
        *,
        scheme: str | None = None,
    ) -> Draft:
        data: dict[str, Any] = {
            "via": via,
            "result_digest": self.values.digest(result_json, scheme),
            "confirmation": confirmation,
            "worker": self.worker,
        }
        if gate_s is not None:
            # the gate's own time for this effect: before the send, and the commit's checks
            # (its own durable write, which records this, is the part not counted)
            data["gate_ms"] = round(gate_s * 1000, 3)
        return Draft.of(Kind.COMMITTED, data)

    async def _record_commit(
        self,
        eid: str,
        head: str,
        via: str,
        result: Any,
        confirmation: str | None,
        *,
        gate_s: float | None = None,
        scheme: str | None = None,
    ) -> Done:
        result_json = canonical_json(result)  # JSON data already (``jsonable``)
        draft = self.commit_draft(via, result_json, confirmation, gate_s, scheme=scheme)
        stored = await self.values.store_outcome(result_json)
        sent = await self.record_after_send(eid, head, draft, blobs={"result": stored})
        if sent.recorded:
            return Done(eid, result, via, sent.after)
        view = sent.view if sent.view is not None else fold(eid, await self.journal.read_async(eid))
        return Done(eid, await self.stored(eid, "result"), view.via or via, sent.after)

    async def commit_found(self, view: EffectView, found: Found) -> Done:
        """The target says the effect happened: record it, as the query found it."""
        return await self._record_commit(
            view.effect_id,
            view.head,
            "recovery-query",
            jsonable(found.result),
            found.confirmation,
            scheme=view.digests,
        )

    async def stored(self, eid: str, name: str, entries: Sequence[Entry] | None = None) -> Any:
        """The value last stored under ``name`` for the effect, decoded if it is sealed."""
        found = value_of(await self.journal.read_async(eid) if entries is None else entries, name)
        return await self.values.open(found)

    # -- terminal records --------------------------------------------------------------------

    async def reject_conflict(self, view: EffectView, pdigest: str, call: Call) -> None:
        eid = view.effect_id
        try:
            written = await self.journal.append_async(
                eid,
                view.head,
                [
                    Draft.of(
                        Kind.REJECTED_PROPOSAL,
                        {
                            "code": "conflicting_payload",
                            "payload_digest": pdigest,
                            "delivery": delivery_record(call),
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

    async def ambiguous(self, view: EffectView, reason: str, code: str) -> None:
        written = await self.journal.append_async(
            view.effect_id, view.head, [ambiguity(code, reason)]
        )
        self.raise_ambiguous(fold_checked(self.journal, view, written))

    def raise_ambiguous(self, view: EffectView) -> None:
        raise Ambiguous(view.reason or "ambiguous", receipt_of(view))

    def raise_if_refused(
        self, eid: str, written: Sequence[Entry], before: EffectView | None = None
    ) -> None:
        """Raise ``Refused`` when the append that wrote ``written`` after ``before`` (None: the
        effect had no entries) ended in a refusal."""
        last = written[-1]
        if last.kind is Kind.REFUSED:
            view = fold_checked(self.journal, before or EffectView(effect_id=eid), written)
            raise Refused(
                last.data["code"],
                last.data["reason"],
                receipt_of(view),
                [Change.model_validate(c) for c in last.data.get("changes", [])],
                configuration=last.data.get("configuration"),
            )

    def receipt(self, eid: str) -> Receipt:
        return receipt_of(fold(eid, self.journal.read(eid)))

    def receipt_or_none(self, eid: str) -> Receipt | None:
        entries = self.journal.read(eid)
        return receipt_of(fold(eid, entries)) if entries else None


def refusal(
    code: str, reason: str, changes: Sequence[Change] = (), *, configuration: str | None = None
) -> Draft:
    """A REFUSED entry. ``configuration`` (one of ``leases.CONFIGURATION``) marks, in the signed
    entry, a refusal about the caller's own configuration: the next attempt decides it again
    (``Dispatch.redecide``); without it, the refusal stays until a person reopens it."""
    data: dict[str, Any] = {
        "code": code,
        "reason": reason,
        "executed": False,
        "changes": [c.model_dump(mode="json") for c in changes],
    }
    if configuration is not None:
        data["configuration"] = configuration
    return Draft.of(Kind.REFUSED, data)


def lease_refusal(problem: LeaseProblem) -> Draft:
    """The REFUSED entry of a lease's problem (marked when it is the caller's configuration)."""
    return refusal(problem.code, problem.detail, configuration=problem.configuration)


def ambiguity(code: str, reason: str, changes: Sequence[Change] = ()) -> Draft:
    return Draft.of(
        Kind.AMBIGUOUS,
        {
            "code": code,
            "reason": reason,
            "executed": "unknown",
            "changes": [c.model_dump(mode="json") for c in changes],
        },
    )


def _detail(error: BaseException) -> str:
    """What the target answered, as its error states it in ``refusal_detail`` (a status code,
    an SMTP reply code: no argument value), for the refusal's reason."""
    detail = getattr(error, "refusal_detail", None)
    if not isinstance(detail, str) or not detail.strip():
        return ""
    return f": {detail.strip()[:80]}"
