"""One attempt of an activity as the core sees it: what Temporal says of the attempt (which
delivery carries it, whether Temporal will retry it, the policy's nonce for it) and, for a gated
activity, its ``Call``: the input decoded into the declared types, the effect's key and
measure, who asks. The only place the adapter builds a ``Call``."""

from __future__ import annotations

import functools
from datetime import UTC, datetime, timedelta
from typing import Any

import temporalio.activity
from temporalio.exceptions import ApplicationError

from ..core.protocol import Call, Delivery, Done, Ticket
from .context import Authority
from .gated import EffectContext, GateSpec

#: how a Done says ``begin`` sent (and committed) the effect itself, for this attempt
SENT_NOW = ("dispatch", "reopened")


def is_last_attempt(info: temporalio.activity.Info, now: datetime | None = None) -> bool:
    """Whether Temporal will not schedule another attempt after this one fails."""
    policy = info.retry_policy
    if policy is not None and 0 < policy.maximum_attempts <= info.attempt:
        return True
    if info.schedule_to_close_timeout:
        now = now or datetime.now(UTC)
        deadline = info.scheduled_time + info.schedule_to_close_timeout
        interval = timedelta(seconds=1)
        if policy is not None:
            interval = policy.initial_interval * policy.backoff_coefficient ** (info.attempt - 1)
            if policy.maximum_interval is not None:
                interval = min(interval, policy.maximum_interval)
        if now + interval >= deadline:
            return True
    return False


def is_non_retryable(error: BaseException, info: temporalio.activity.Info) -> bool:
    """Whether Temporal will not retry the attempt ``error`` ends: the error says so, or the
    activity's retry policy names its type."""
    if isinstance(error, ApplicationError) and error.non_retryable:
        return True
    policy = info.retry_policy
    if policy is None or not policy.non_retryable_error_types:
        return False
    name = error.type if isinstance(error, ApplicationError) else type(error).__name__
    return name in policy.non_retryable_error_types


def delivery_nonce(info: temporalio.activity.Info) -> str:
    """The policy's nonce for this delivery of an activity: its run, activity id and attempt,
    and the time the attempt was scheduled. Delivered twice, one attempt is a replay; but an
    operator's ``temporal activity reset`` starts the attempts again at 1, and that new
    attempt 1 (scheduled anew) is not a replay of the first."""
    scheduled = info.current_attempt_scheduled_time
    stamp = f"@{round(scheduled.timestamp() * 1_000_000)}" if scheduled is not None else ""
    return f"{info.workflow_run_id}/{info.activity_id}/{info.attempt}{stamp}"


def delivery_of(info: temporalio.activity.Info) -> Delivery:
    """Which Temporal delivery carries this attempt (recorded, never part of the identity)."""
    return Delivery(
        workflow_id=info.workflow_id,
        run_id=info.workflow_run_id,
        activity_id=info.activity_id,
        attempt=info.attempt,
        task_queue=info.task_queue,
    )


def call_of(
    spec: GateSpec,
    info: temporalio.activity.Info,
    raw: Any,
    authority: Authority | None,
) -> Call:
    """The core's view of one attempt of a gated activity: its arguments, raw from Temporal,
    decoded and validated as the activity declares them (bad input fails here, once, naming
    the fields), with the effect's key and measure, who asks and which delivery carries it."""
    args = spec.decode(raw, temporalio.activity.payload_converter())
    effect_type = spec.effect_type or info.activity_type
    return Call(
        effect_type=effect_type,
        activity=info.activity_type,
        input=args[0] if len(args) == 1 else args,
        args=args,
        key=spec.key_of(args, effect_type),
        premises_field=spec.premises,
        principal=authority.principal if authority else None,
        lease_id=authority.lease_id if authority else None,
        session=(authority.session if authority else None) or info.workflow_id,
        namespace=info.workflow_namespace,
        measure=spec.measurer(effect_type),
        delivery=delivery_of(info),
        last_attempt=is_last_attempt(info),
        decode_args=spec.decode_json,
        param_names=spec.param_names,
        transaction=_transaction_of(spec),
    )


def _transaction_of(spec: GateSpec) -> Any:
    """A body that takes its target's transaction, bound to the target's ``transact``: what the
    gate runs inside the journal's transaction for a tier-0 target."""
    if spec.transaction is None:
        return None
    transact = getattr(spec.require_target(), "transact", None)
    return None if transact is None else functools.partial(transact, spec.transaction)


def effect_of(call: Call, ticket: Ticket) -> EffectContext:
    """What the body of a gated activity may know of the effect it sends (``current_effect()``)."""
    return EffectContext(
        effect_id=ticket.effect_id,
        effect_type=call.effect_type,
        via=ticket.via,
        dispatch_no=ticket.dispatch_no,
        attempt=call.delivery.attempt,
        principal=call.principal,
    )


def sent_in_begin(call: Call, done: Done) -> bool:
    """Whether ``begin`` itself dispatched and committed the effect, for this attempt: a tier-0
    target's write in the journal's one transaction (not a result recorded earlier)."""
    return call.transaction is not None and done.via in SENT_NOW
