"""``interlock reconcile`` (on Temporal): recover effects left in doubt, once, on a task queue."""

from __future__ import annotations

import argparse
import uuid
from datetime import timedelta
from typing import TYPE_CHECKING

from ..core.models import Kind
from ._args import (
    Groups,
    examples,
    json_flag,
    parse_age,
    parse_duration,
    positive,
    temporal_options,
)
from ._render import reconcile_summary, render_reconcile
from ._shared import EXIT_FAILED, EXIT_OK, CliError, emit, emit_json, warn
from ._temporal import failure_message, on_server

if TYPE_CHECKING:
    from temporalio.client import Client

    from .._reviews.reconciler import ReconcileOutcome

#: the outcomes an effect ends with
_ENDED = frozenset({Kind.COMMITTED.value, Kind.REFUSED.value, Kind.RESOLVED.value})


def needs_nobody(outcome: ReconcileOutcome) -> bool:
    """The effect needs nobody now: it ended COMMITTED, REFUSED or RESOLVED, is AMBIGUOUS in
    front of a person (a review is open), or a live attempt or the workflow that owns it will
    finish it."""
    if outcome.final in _ENDED:
        return True
    if outcome.final == Kind.AMBIGUOUS.value:
        return bool(outcome.review)
    return outcome.skipped in ("live_attempt", "owner_alive")


async def _has_pollers(client: Client, task_queue: str) -> bool:
    from temporalio.api.enums.v1 import TaskQueueType
    from temporalio.api.taskqueue.v1 import TaskQueue
    from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
    from temporalio.service import RPCError

    try:
        response = await client.workflow_service.describe_task_queue(
            DescribeTaskQueueRequest(
                namespace=client.namespace,
                task_queue=TaskQueue(name=task_queue),
                task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
            )
        )
    except RPCError:
        return True  # cannot tell: say nothing
    return bool(response.pollers)


async def reconcile(args: argparse.Namespace, client: Client) -> int:
    from temporalio.client import WorkflowFailureError
    from temporalio.exceptions import TimeoutError as WorkflowTimeout

    from .._reviews.reconciler import ReconcileReport, ReconcileRequest

    task_queue: str = args.task_queue
    timeout: timedelta = args.timeout
    request = ReconcileRequest(older_than_s=args.older_than.total_seconds(), limit=args.limit)
    if not await _has_pollers(client, task_queue):
        warn(f"no worker has polled task queue {task_queue} lately: waiting up to {timeout}")
    workflow_id = f"interlock-reconcile-{uuid.uuid4().hex}"
    try:
        report = await client.execute_workflow(
            "InterlockReconciler",
            request,
            id=workflow_id,
            task_queue=task_queue,
            result_type=ReconcileReport,
            execution_timeout=timeout,
            static_summary="interlock reconcile (from the command line)",
        )
    except WorkflowFailureError as err:
        if isinstance(err.cause, WorkflowTimeout):
            raise CliError(
                EXIT_FAILED,
                f"the reconciler did not finish within {timeout}: is a worker with "
                f"InterlockPlugin and the gated activities polling task queue {task_queue}?",
            ) from None
        raise CliError(
            EXIT_FAILED, f"the reconciler failed: {failure_message(err.cause)}"
        ) from None
    needing_someone = [o.effect_id for o in report.outcomes if not needs_nobody(o)]
    beyond = max(report.in_doubt - len(report.outcomes), 0)
    needing = len(needing_someone) + beyond
    if args.json:
        emit_json(
            {
                "workflow_id": workflow_id,
                **report.model_dump(mode="json"),
                "unsettled": needing_someone,  # the key as released
                "not_reached": beyond,
                "ok": needing == 0,
            }
        )
    else:
        if report.outcomes:
            emit(render_reconcile(report))
        emit(reconcile_summary(report, needing))
    if beyond:
        warn(f"{beyond} effect(s) in doubt beyond --limit {args.limit}: run again")
    return EXIT_OK if needing == 0 else EXIT_FAILED


cmd_reconcile = on_server(reconcile)


def register(groups: Groups) -> None:
    reconcile_help = (
        "run the reconciler once on a task queue: effects dispatched and never confirmed, with "
        "no live attempt, are recovered, and a review is opened for each that ends AMBIGUOUS; "
        "exit 1 if any is left without an outcome or a person"
    )
    reconcile_cmd = groups.add_parser(
        "reconcile",
        help="recover effects left in doubt, once, on a task queue (needs Temporal)",
        description=reconcile_help,
        epilog=examples(
            "interlock reconcile --task-queue refunds",
            "interlock reconcile --task-queue refunds --older-than 0s --json",
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    temporal_options(reconcile_cmd, top=True)
    reconcile_cmd.set_defaults(handler=cmd_reconcile)
    reconcile_cmd.add_argument(
        "--task-queue",
        required=True,
        metavar="Q",
        help="where workers with InterlockPlugin and the gated activities run",
    )
    reconcile_cmd.add_argument(
        "--older-than",
        type=parse_age,
        default=timedelta(seconds=60),
        metavar="AGE",
        help="only effects dispatched at least this long ago (default: 60s; 0s for all)",
    )
    reconcile_cmd.add_argument(
        "--limit", type=positive, default=200, metavar="N", help="at most N effects (200)"
    )
    reconcile_cmd.add_argument(
        "--timeout",
        type=parse_duration,
        default=timedelta(minutes=5),
        metavar="AGE",
        help="how long the reconciler may take (default: 5m)",
    )
    json_flag(reconcile_cmd)
