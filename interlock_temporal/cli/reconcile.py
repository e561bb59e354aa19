"""``interlock reconcile`` (on Temporal): recover effects left in doubt, once, on a task queue.

One reconciler workflow per task queue at a time (``interlock-reconcile-once-<task queue>``): a
command stopped by SIGINT (Ctrl-C) or SIGTERM cancels the workflow it waits on, and says so; one
that could not be (SIGKILL) leaves it running, and the next command waits on that one instead of
starting another, and says so."""

from __future__ import annotations

import argparse
import asyncio
import signal
from datetime import timedelta
from typing import TYPE_CHECKING, Any

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
from ._temporal import failure_message, is_not_found, on_server

if TYPE_CHECKING:
    from temporalio.client import Client, WorkflowHandle

    from .._reviews.reconciler import ReconcileOutcome, ReconcileReport, ReconcileRequest

#: the signals that stop the command, cancelling its reconciler; the exit code is 128 + signal
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
#: how long a cancelled reconciler may take to close before it is terminated
CANCEL_GRACE_S = 5.0

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


def workflow_id_for(task_queue: str) -> str:
    """The command's reconciler on ``task_queue`` (the scheduled one is
    ``interlock-reconciler-<task queue>``)."""
    return f"interlock-reconcile-once-{task_queue}"


async def _start_or_reuse(
    client: Client, request: ReconcileRequest, task_queue: str, timeout: timedelta
) -> WorkflowHandle[Any, ReconcileReport]:
    """The command's reconciler on ``task_queue``: started, or the one an earlier command left
    running (killed before it could cancel it), said so on stderr."""
    from temporalio.exceptions import WorkflowAlreadyStartedError

    from .._reviews.reconciler import ReconcileReport

    workflow_id = workflow_id_for(task_queue)
    try:
        return await client.start_workflow(
            "InterlockReconciler",
            request,
            id=workflow_id,
            task_queue=task_queue,
            result_type=ReconcileReport,
            execution_timeout=timeout,
            static_summary="interlock reconcile (from the command line)",
        )
    except WorkflowAlreadyStartedError:
        handle = client.get_workflow_handle(workflow_id, result_type=ReconcileReport)
        described = await handle.describe()
        started = described.start_time.strftime("%Y-%m-%dT%H:%M:%SZ")
        warn(
            f"reusing reconciler workflow {workflow_id}, still running since {started} (an "
            "earlier `interlock reconcile` was killed before it could cancel it): waiting for "
            "its report, made with the --older-than and --limit it was started with"
        )
        return client.get_workflow_handle(
            workflow_id, run_id=described.run_id, result_type=ReconcileReport
        )


async def _report_unless_stopped(handle: WorkflowHandle[Any, ReconcileReport]) -> ReconcileReport:
    """The reconciler's report; on SIGINT or SIGTERM meanwhile, the reconciler cancelled and
    ``CliError`` (exit 128 + the signal) saying so."""
    loop = asyncio.get_running_loop()
    caught: list[signal.Signals] = []
    result = asyncio.ensure_future(handle.result())

    def stop(sig: signal.Signals) -> None:
        if not caught:  # a second signal while the reconciler is cancelled: already stopping
            caught.append(sig)
            result.cancel()

    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stop, sig)
    try:
        return await result
    except asyncio.CancelledError:
        if not caught:
            raise
        raise CliError(128 + caught[0], await _cancelled(handle, caught[0])) from None
    finally:
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)


async def _cancelled(handle: WorkflowHandle[Any, Any], sig: signal.Signals) -> str:
    """Cancel the reconciler the command waited on; what became of it, in a sentence. One whose
    cancellation no worker runs within ``CANCEL_GRACE_S`` is terminated."""
    from temporalio.client import WorkflowExecutionStatus
    from temporalio.service import RPCError

    said = f"interrupted ({sig.name}): reconciler workflow {handle.id}"
    kept = "what it closed out before stays recorded in the journal"
    try:
        await handle.cancel(rpc_timeout=timedelta(seconds=CANCEL_GRACE_S))
    except RPCError as err:
        if is_not_found(err):  # it ended meanwhile
            return f"{said} had ended already"
        raise
    deadline = asyncio.get_running_loop().time() + CANCEL_GRACE_S
    while True:
        status = (await handle.describe()).status
        if status is not None and status != WorkflowExecutionStatus.RUNNING:
            ended = (
                "cancelled" if status == WorkflowExecutionStatus.CANCELED else status.name.lower()
            )
            return f"{said} {ended}; {kept}"
        if asyncio.get_running_loop().time() >= deadline:
            break
        await asyncio.sleep(0.2)
    await handle.terminate(
        reason=f"interlock reconcile interrupted ({sig.name}); no worker ran its cancellation"
    )
    return f"{said} terminated: no worker ran its cancellation within {CANCEL_GRACE_S:g}s; {kept}"


async def reconcile(args: argparse.Namespace, client: Client) -> int:
    from temporalio.client import WorkflowFailureError
    from temporalio.exceptions import TimeoutError as WorkflowTimeout

    from .._reviews.reconciler import ReconcileRequest

    task_queue: str = args.task_queue
    timeout: timedelta = args.timeout
    request = ReconcileRequest(older_than_s=args.older_than.total_seconds(), limit=args.limit)
    if not await _has_pollers(client, task_queue):
        warn(f"no worker has polled task queue {task_queue} lately: waiting up to {timeout}")
    handle = await _start_or_reuse(client, request, task_queue, timeout)
    workflow_id = handle.id
    try:
        report = await _report_unless_stopped(handle)
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
        "exit 1 if any is left without an outcome or a person. One reconciler per task queue: "
        "Ctrl-C or SIGTERM cancels it (exit 130 or 143), and one left running by a command "
        "that was killed is waited on by the next"
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
