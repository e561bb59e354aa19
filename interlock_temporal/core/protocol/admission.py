"""What the gate asks before a dispatch or a resend: the policy's decision on the input (and its
rewrite), and the ``DISPATCHED`` entry that records the send about to go out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import InvalidCall
from ..identity import UnserializableInput, canonical_json, jsonable
from ..journal import Journal, redacted
from ..leases import LeaseProblem, Reservation
from ..models import Draft, Kind, Lease
from ..policy import Accounts, CallEvent, Decision, PolicyGuard, Verdict, enforce
from .calls import Call, delivery_record, not_json_args


class Admission:
    """The policy's say on an attempt, and the record of a dispatch."""

    def __init__(self, journal: Journal, policy: PolicyGuard | None, worker: str) -> None:
        #: named (without its password) when a lease is missing from it
        self.journal = journal
        #: consulted when a new effect is about to be dispatched or one in doubt resent (a
        #: duplicate of a recorded outcome never reaches it)
        self.policy = policy
        #: the worker named in DISPATCHED
        self.worker = worker

    @property
    def policy_id(self) -> str:
        return self.policy.policy.policy_id if self.policy else ""

    def police(self, call: Call, eid: str, pdigest: str, args: tuple[Any, ...]) -> Decision | None:
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
                run_id=d.run_id or None,
            )
            decision = self.policy.check(
                event,
                Accounts.of(event, f"effect:{eid}", binding=eid),
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

    def approved(self, call: Call, admitted: Decision | None) -> tuple[tuple[Any, ...], bytes]:
        """What a dispatch sends, and its canonical JSON: the input as proposed, or the
        policy's rewrite of it."""
        if admitted is None or admitted.verdict is not Verdict.MODIFY or not admitted.args:
            return call.args, call.args_canonical
        approved = self._rewritten_args(call, admitted.args)
        try:
            return approved, canonical_json(jsonable(list(approved)))
        except UnserializableInput as err:
            names = call.arg_names if len(approved) == len(call.args) else ()
            names = names or tuple(f"args[{i}]" for i in range(len(approved)))
            where = not_json_args(approved, names) or str(err)
            raise InvalidCall(
                f"a policy rule rewrote the input of {call.activity} into one that is not "
                f"JSON data: {where}"
            ) from None

    def lease_seen(
        self, found: LeaseProblem | None, lease: Lease | None, lease_id: str | None
    ) -> LeaseProblem | None:
        """``found``, and for a lease this journal has never seen, the likely cause: the lease
        was issued into another journal (this worker's named, without its password)."""
        if found is None or lease is not None or lease_id is None:
            return found
        return LeaseProblem(
            f"no lease {lease_id} in this worker's journal {redacted(self.journal.url)}: if "
            "it was issued, the workers (or `interlock leases issue`) may be on different "
            "journals; give every worker and the CLI the same journal URL",
            found.code,
            configuration=found.configuration,
        )

    def policy_note(self, decision: Decision | None) -> dict[str, Any]:
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

    def dispatched(
        self,
        via: str,
        call: Call,
        current: Mapping[str, Any],
        lease: Lease | None,
        reservation: Reservation | None = None,
    ) -> Draft:
        data: dict[str, Any] = {
            "via": via,
            "worker": self.worker,
            "delivery": delivery_record(call),
            "premises_now": dict(current),
        }
        if lease is not None:
            data["lease"] = lease.snapshot()
        if reservation is not None:
            # the journal reserves it in this transaction (once per effect)
            data["budget"] = reservation.as_data()
        return Draft.of(Kind.DISPATCHED, data)


def policy_deciders(decision: Decision | None, policy_id: str) -> list[str]:
    if decision is None:
        return []
    return [f"policy:{decision.policy_id or policy_id}"] + [
        f"approver:{name}" for name in decision.approvers
    ]
