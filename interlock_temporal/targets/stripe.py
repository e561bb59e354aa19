"""Stripe refunds as an effect target, with the official ``stripe`` SDK (``StripeClient``).

What Stripe can honestly promise (tier 1):

- it dedupes a resend that carries the same ``Idempotency-Key`` (the effect id) for at least
  24 hours, so inside that window, measured from the first dispatch, less ``settle_time`` and
  the gate's margin, a resend is safe;
- a refund is found again by listing the charge's refunds and matching ``metadata.effect_id``
  (there is no refunds search, and the Search API is not read-after-write), which is how
  recovery asks after the window;
- a request Stripe is still executing after its sender died may land later: ``settle_time``
  covers it before "not found" is believed. It must also cover the SDK's own retries: a
  ``StripeClient(max_network_retries=N)`` may send a request again, and have it processed, up
  to N backoffs and N+1 request timeouts after the gate handed it over; raise ``settle_time``
  to match when you raise N (the default client retries 0 times).

Never import this module from workflow code (the workflow sandbox rejects ``stripe``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any

from pydantic import BaseModel, Field

from ..core.errors import HeadConflict
from ..core.exports import lender
from ..core.extras import needs_extra
from ..core.journal import Journal
from ..core.models import Change, Draft, Found, Kind
from ..core.targets import BaseTarget, Classification, default_validate

with needs_extra("stripe", "interlock_temporal.targets.stripe"):
    import stripe

log = logging.getLogger("interlock_temporal.stripe")

__all__ = ["REFUND_EVENTS", "StripeRefund", "StripeRefunds", "WebhookReport"]

REFUND_EVENTS = ("refund.created", "refund.updated", "refund.failed", "charge.refunded")


class StripeRefund(BaseModel):
    """What a refund effect returns (and what its receipt cites)."""

    refund_id: str
    charge_id: str
    amount_cents: int
    currency: str
    status: str


class WebhookReport(BaseModel):
    """What a verified webhook event confirmed in the journal, and what it could not place."""

    event_id: str
    event_type: str
    confirmed: list[str] = Field(default_factory=list)
    already: list[str] = Field(default_factory=list)
    #: refunds tagged with an effect id the journal does not know: reported, never dropped
    unknown: list[str] = Field(default_factory=list)
    #: refunds with no effect id (made outside the gate, e.g. by hand in the dashboard)
    untagged: list[str] = Field(default_factory=list)
    #: effects whose refund Stripe reports failed or canceled: the money did not move, whatever
    #: the effect's state says; their CONFIRMED entry carries an alarm
    failed: list[str] = Field(default_factory=list)


def _field(name: str) -> Callable[[Any], Any]:
    def read(args: Any) -> Any:
        value = args.get(name) if isinstance(args, Mapping) else getattr(args, name, None)
        if value is None:
            raise ValueError(f"the refund input has no {name}")
        return value

    return read


def _plain(obj: Any) -> dict[str, Any]:
    to_dict = getattr(obj, "to_dict", None)
    return dict(to_dict() if callable(to_dict) else obj or {})


class StripeRefunds(BaseTarget):
    """The target adapter for refunds on Stripe charges.

    ``charge`` and ``amount`` read the charge id and the amount (cents) from the activity's
    input (default: its ``charge_id`` and ``amount_cents`` fields). ``eligibility_metadata``
    names charge metadata keys the refund relies on (say a ``refund_eligible`` flag a fraud
    review sets): they join the premises.
    """

    name = "stripe-refunds"
    tier = 1

    def __init__(
        self,
        client: stripe.StripeClient,
        *,
        charge: Callable[[Any], str] | None = None,
        amount: Callable[[Any], int] | None = None,
        eligibility_metadata: Sequence[str] = (),
        dedupe_window: timedelta = timedelta(hours=24),
        settle_time: timedelta = timedelta(seconds=30),
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.client = client
        self._charge = charge or _field("charge_id")
        self._amount = amount or _field("amount_cents")
        self._eligibility = tuple(eligibility_metadata)
        self.dedupe_window = dedupe_window
        self.settle_time = settle_time
        self._clock = clock

    def clock(self) -> float:
        """The clock the 24-hour window is measured on (injectable: keys never expire in tests)."""
        return self._clock()

    # -- the facts ---------------------------------------------------------------------------

    def facts(self, charge_id: str, *, exclude_effect: str | None = None) -> dict[str, Any]:
        """The charge as a refund relies on it; refunds tagged ``exclude_effect`` are left out
        of ``amount_refunded_other`` (an effect's own refund is not a changed world)."""
        charge = self.client.v1.charges.retrieve(charge_id)
        own = 0
        if exclude_effect is not None:
            for refund in self._refunds(charge_id):
                if _plain(refund.metadata).get("effect_id") == exclude_effect and (
                    refund.status not in ("failed", "canceled")
                ):
                    own += int(refund.amount)
        facts: dict[str, Any] = {
            "charge": charge_id,
            "amount": int(charge.amount),
            "currency": charge.currency,
            "status": charge.status,
            "disputed": bool(charge.disputed),
            "amount_refunded_other": int(charge.amount_refunded) - own,
        }
        metadata = _plain(charge.metadata)
        for key in self._eligibility:
            facts[f"metadata.{key}"] = metadata.get(key)
        return facts

    async def capture(self, args: Any, effect_id: str) -> dict[str, Any]:
        return await asyncio.to_thread(self.facts, self._charge(args), exclude_effect=effect_id)

    def validate(
        self, recorded: Mapping[str, Any], current: Mapping[str, Any], payload: Any
    ) -> list[Change]:
        """Every recorded fact must still hold (a refund someone else made since the decision
        is a changed fact, not merely a smaller remainder: it may be this very refund, made by
        hand), and the predicates a refund needs: a succeeded charge, no dispute, and a
        refundable remainder that still covers this refund."""
        changes = default_validate(recorded, current)
        named = {c.fact for c in changes}

        def need(fact: str, ok: bool, rule: str, value: Any) -> None:
            if not ok and fact not in named:
                changes.append(
                    Change(fact=fact, recorded=recorded.get(fact), current=value, rule=rule)
                )

        need(
            "status",
            current.get("status") == "succeeded",
            "charge succeeded",
            current.get("status"),
        )
        need("disputed", not current.get("disputed"), "no dispute", current.get("disputed"))
        remainder = int(current.get("amount", 0)) - int(current.get("amount_refunded_other", 0))
        wanted = int(self._amount(payload))
        if remainder < wanted:
            changes.append(
                Change(
                    fact="refundable_remainder",
                    recorded=wanted,
                    current=remainder,
                    rule="remainder >= amount",
                )
            )
        return changes

    # -- finding a refund again ------------------------------------------------------------------

    def _refunds(self, charge_id: str) -> list[Any]:
        listed = self.client.v1.refunds.list(params={"charge": charge_id, "limit": 100})
        return list(listed.auto_paging_iter())

    def find(self, effect_id: str, charge_id: str) -> Found | None:
        for refund in self._refunds(charge_id):
            if _plain(refund.metadata).get("effect_id") != effect_id:
                continue
            if refund.status in ("failed", "canceled"):
                continue
            return Found(result=self.found_result(refund), confirmation=refund.id)
        return None

    async def query(self, effect_id: str, args: Any) -> Found | None:
        if args is None:
            # without the charge there is nowhere to look: "not found" would be a guess
            raise ValueError("Stripe refunds are found through their charge: no input given")
        return await asyncio.to_thread(self.find, effect_id, self._charge(args))

    # -- the send ------------------------------------------------------------------------------

    def refund(self, args: Any, *, effect_id: str) -> StripeRefund:
        """Create the refund: the effect id is the Idempotency-Key and is kept in metadata."""
        refund = self.client.v1.refunds.create(
            params={
                "charge": self._charge(args),
                "amount": int(self._amount(args)),
                "metadata": {"effect_id": effect_id},
            },
            options={"idempotency_key": effect_id},
        )
        return self._result(refund)

    async def refund_async(self, args: Any, *, effect_id: str) -> StripeRefund:
        return await asyncio.to_thread(self.refund, args, effect_id=effect_id)

    def found_result(self, refund: Any) -> Any:
        """A refund found by recovery, in the shape the gated activity returns (recovery hands
        it back as that activity's result): ``StripeRefund`` by default. Override it when your
        activity returns something else."""
        return self._result(refund).model_dump(mode="json")

    @staticmethod
    def _result(refund: Any) -> StripeRefund:
        return StripeRefund(
            refund_id=refund.id,
            charge_id=refund.charge if isinstance(refund.charge, str) else refund.charge.id,
            amount_cents=int(refund.amount),
            currency=refund.currency,
            status=refund.status,
        )

    def confirmation(self, result: Any) -> str | None:
        refund_id = getattr(result, "refund_id", None)
        if refund_id is None and isinstance(result, Mapping):
            refund_id = result.get("refund_id")
        return refund_id if isinstance(refund_id, str) else None

    def classify(self, error: BaseException) -> Classification:
        """What a failed request means. Stripe refused it before doing anything (a card or
        request error, bad credentials): nothing happened. Rate limited: never processed.
        A lost connection, a 5xx, a 409 ``idempotency_key_in_use``, and a 400
        ``idempotency_error`` (a request under this key may have landed; the gate's identity
        check already refuses real payload conflicts): in doubt, recovered by lookup."""
        if isinstance(error, stripe.IdempotencyError):
            return "in_doubt"
        if isinstance(error, stripe.RateLimitError):
            return "not_sent"
        if isinstance(
            error,
            stripe.CardError
            | stripe.InvalidRequestError
            | stripe.AuthenticationError
            | stripe.PermissionError,
        ):
            return "rejected"
        return "in_doubt"

    # -- webhooks ------------------------------------------------------------------------------

    def confirm_webhook(
        self,
        payload: bytes | str,
        signature: str,
        secret: str,
        journal: Journal,
        *,
        tolerance: int = 300,
    ) -> WebhookReport:
        """Verify a webhook with Stripe's own signature check, and append a ``CONFIRMED``
        annotation to the journal of each effect whose refund the event reports. It confirms;
        it never changes an effect's state. Raises ``stripe.SignatureVerificationError`` for a
        bad signature (and ``ValueError`` for a payload that is not an event)."""
        text = payload.decode() if isinstance(payload, bytes) else payload
        event = stripe.Webhook.construct_event(text, signature, secret, tolerance)
        outcome = WebhookReport(event_id=event.id, event_type=event.type)
        if event.type not in REFUND_EVENTS:
            return outcome
        obj = _plain(event.data.object)
        if event.type.startswith("refund."):
            refunds = [obj]
        else:
            refunds = list((obj.get("refunds") or {}).get("data", []))
            if not refunds and obj.get("id"):
                # newer API versions do not embed a charge's refunds: ask for them
                refunds = [_plain(r) for r in self._refunds(str(obj["id"]))]
        for refund in refunds:
            effect_id = (refund.get("metadata") or {}).get("effect_id")
            if not effect_id:
                outcome.untagged.append(str(refund.get("id")))
                continue
            if journal.row(effect_id) is None:
                log.warning(
                    "webhook %s reports refund %s for effect %s, which this journal does not know",
                    event.id,
                    refund.get("id"),
                    effect_id[:16],
                )
                outcome.unknown.append(effect_id)
                continue
            data = {
                "source": "stripe-webhook",
                "event_id": event.id,
                "event_type": event.type,
                "refund_id": refund.get("id"),
                "status": refund.get("status"),
                "amount": refund.get("amount"),
            }
            if refund.get("status") in ("failed", "canceled") or event.type == "refund.failed":
                data["alarm"] = "refund_failed"
                outcome.failed.append(effect_id)
                log.warning(
                    "webhook %s: the refund of effect %s is %s",
                    event.id,
                    effect_id[:16],
                    refund.get("status"),
                )
            if self._annotate(journal, effect_id, data):
                outcome.confirmed.append(effect_id)
            else:
                outcome.already.append(effect_id)
        return outcome

    @staticmethod
    def _annotate(journal: Journal, effect_id: str, data: dict[str, Any]) -> bool:
        """Append the confirmation once per event (Stripe redelivers), after whatever head."""
        for _ in range(5):
            entries = journal.read(effect_id)
            if any(
                e.kind is Kind.CONFIRMED
                and e.data.get("event_id") == data["event_id"]
                and e.data.get("refund_id") == data["refund_id"]
                for e in entries
            ):
                return False
            try:
                journal.append(effect_id, entries[-1].hash, [Draft(kind=Kind.CONFIRMED, data=data)])
                return True
            except HeadConflict:
                continue
        raise HeadConflict(effect_id, "", "?")


# WebhookOutcome, this report's old name, one more release (core/deprecated.py)
__getattr__ = lender(__name__, {})
