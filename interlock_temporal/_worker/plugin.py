"""``InterlockPlugin``: one object that installs the gate on clients and workers."""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import timedelta

import temporalio.worker
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.contrib.pydantic import PydanticPayloadConverter, pydantic_data_converter
from temporalio.converter import DataConverter, DefaultPayloadConverter
from temporalio.plugin import SimplePlugin

from .._reviews.notifying import review_settings
from .._reviews.reconciler import Reconciler, ReconcileRequest
from ..core.coverage import START_LINE
from ..core.journal import KeyLike
from ..core.policy import Policy
from ..core.policy.file import PolicySource
from ..core.review import ReviewRules
from ..core.targets import EffectTarget
from ..notify import DEFAULT, DefaultType, Notifier
from .install import WORKFLOWS, close_cached_runs, install, with_passthrough
from .interceptor import InterlockInterceptor, runtime_of
from .runtime import GateSource, JournalArg, WorkerRuntime
from .telemetry import Telemetry

log = logging.getLogger("interlock_temporal")


def _with_pydantic(existing: DataConverter | None) -> DataConverter:
    """Pydantic models on the wire, keeping whatever the user configured: a codec (encryption
    included) and a failure converter are kept; a custom payload converter is kept as is."""
    if existing is None:
        return pydantic_data_converter
    if existing.payload_converter_class is DefaultPayloadConverter:
        return dataclasses.replace(existing, payload_converter_class=PydanticPayloadConverter)
    return existing


class InterlockPlugin(SimplePlugin):
    """Register on the client (``Client.connect(..., plugins=[InterlockPlugin(...)])``); workers
    built from that client get the interceptor, the ``EffectReview`` and reconciler workflows
    with their activities, the data converter and sandbox passthrough.

    ``journal``: a URL (``sqlite:///interlock.db``), a path, or an open ``Journal``; default
    ``$INTERLOCK_JOURNAL``, else ``sqlite:///interlock.db`` in the working directory, as the
    ``interlock`` CLI chooses (the journal a worker did not name in code is logged once when
    it starts).
    ``targets``: targets bound by activity name, for activities gated without one
    (``gated(refund)``, bare ``@gated``): ``{"refund": payments}``. The key, premises, amount
    and effect type stay declared where the activity is. A worker that runs a gated activity
    bound nowhere refuses to start, naming it.
    ``signing_key``: the journal's signing key (default: ``INTERLOCK_SIGNING_KEY``, else a key
    file beside a SQLite journal). It also signs the ``act_as`` headers (through a key derived
    from it), so only workers that hold it can grant authority.
    ``older_keys``: keys retired by a rotation: the entries and the headers of runs still under
    way that they signed keep verifying.
    ``review``: who may decide reviews, how many must agree (and a deadline, instead of
    ``review_deadline``).
    ``notify``: who is told when a review opens, nears its deadline (``reminder``), expires,
    escalates or is resolved: notifiers from ``interlock_temporal.notify`` (``Webhook``,
    ``Slack``, ``Email``), each called from an activity the review runs, retried by Temporal,
    never in the gate's way; failed attempts are in ``interlock report``.
    ``review_deadline``: how long a review waits for a person (default
    ``notify.DEFAULT_REVIEW_DEADLINE``, 24 hours; ``None``: forever). At it an approval
    expires (the call is refused); an AMBIGUOUS review escalates (told again, marked) and
    stays open.
    ``reminder_every``: how often the notifiers hear of an open review again (default
    ``notify.DEFAULT_REMINDER_EVERY``, 4 hours; ``None``: never).
    ``review_task_queue``: where reviews run (default: the gated activity's task queue).
    ``reconcile_every``: also run the reconciler on each worker's task queue this often, for
    effects in doubt longer than ``reconcile_older_than``.
    ``policy``: limits and rules every activity of the worker is checked against: a ``Policy``,
    or the path of a YAML/JSON policy file (validated now; reloaded on a thread when it changes,
    the last good policy kept when a change does not validate); denied
    calls fail with ``InterlockDenied`` and their bodies never run.
    ``telemetry``: where spans, metrics and receipt log records go (default: the global
    OpenTelemetry providers; put ``OpenTelemetryPlugin`` before this plugin to nest the gate's
    spans under Temporal's activity spans).
    ``release_sticky_on_retry``: a retried gated attempt (attempt 2 or later) asks Temporal to
    drop its workflow's sticky queue before it returns (default True), so after a worker dies
    mid-send the workflow's next task goes to any live worker at once instead of waiting out
    the dead worker's ``sticky_queue_schedule_to_start_timeout``; False keeps stickiness (a
    retry on a live worker then needs no replay).
    ``on_point``: called at each named point of the protocol (tests use it to kill a worker at
    an exact step: ``interlock_temporal.testing.kill_at``).
    """

    def __init__(
        self,
        journal: JournalArg = None,
        *,
        targets: Mapping[str, EffectTarget] | None = None,
        signing_key: str | bytes | None = None,
        older_keys: Sequence[KeyLike] = (),
        review: ReviewRules | None = None,
        review_task_queue: str | None = None,
        notify: Sequence[Notifier] = (),
        review_deadline: timedelta | DefaultType | None = DEFAULT,
        reminder_every: timedelta | DefaultType | None = DEFAULT,
        reconcile_every: timedelta | None = None,
        reconcile_older_than: timedelta = timedelta(seconds=60),
        on_point: Callable[[str, str], None] | None = None,
        policy: Policy | str | os.PathLike[str] | None = None,
        telemetry: Telemetry | None = None,
        release_sticky_on_retry: bool = True,
    ) -> None:
        self._policy: Policy | PolicySource | None = (
            PolicySource(policy) if isinstance(policy, str | os.PathLike) else policy
        )
        #: the gate every worker of this plugin runs on (one journal), opened on first use
        self._source = GateSource(
            journal,
            signing_key=signing_key,
            older_keys=older_keys,
            on_point=on_point,
            policy=self._policy,
            telemetry=telemetry,
            targets=targets,
        )
        self._review = review_settings(review, notify, review_deadline, reminder_every)
        self._review_task_queue = review_task_queue
        self._release_sticky = release_sticky_on_retry
        self._reconcile = (
            None
            if reconcile_every is None
            else ReconcileRequest(
                older_than_s=reconcile_older_than.total_seconds(),
                every_s=reconcile_every.total_seconds(),
            )
        )
        super().__init__(
            "interlock_temporal.InterlockPlugin",
            data_converter=_with_pydantic,
            workflow_runner=with_passthrough,
            workflows=list(WORKFLOWS),
        )

    def configure_worker(
        self, config: temporalio.worker.WorkerConfig
    ) -> temporalio.worker.WorkerConfig:
        """Each worker gets its own runtime (its client, its gated activities), with its own
        interceptor, review desk and reconciler on it; all share the plugin's gate."""
        runtime = WorkerRuntime(
            self._source,
            client=config.get("client"),
            review_task_queue=self._review_task_queue,
            **self._review,
        )
        runtime.release_sticky = self._release_sticky
        install(config, InterlockInterceptor.of(runtime))
        return super().configure_worker(config)

    def configure_replayer(
        self, config: temporalio.worker.ReplayerConfig
    ) -> temporalio.worker.ReplayerConfig:
        # a replay runs no activity: the journal is not opened (nor created) for it
        runtime = WorkerRuntime(self._source, replay_only=True, **self._review)
        interceptor = InterlockInterceptor.of(runtime)
        config["interceptors"] = [*(config.get("interceptors") or []), interceptor]
        return super().configure_replayer(config)

    async def run_worker(
        self,
        worker: temporalio.worker.Worker,
        next: Callable[[temporalio.worker.Worker], Awaitable[None]],
    ) -> None:
        self._source.announce()
        runtime = self._runtime(worker)
        check = None if runtime is None else runtime.queue_check
        if runtime is not None:  # what escapes the gate, in one line (coverage.py)
            coverage = runtime.coverage
            log.log(coverage.level, "%s", coverage.line(), extra=START_LINE)
        try:
            if check is not None:  # one task queue, one journal: before the worker polls
                await check.start()
            await self._start_reconciler(worker)
            await super().run_worker(worker, next)
        finally:
            if check is not None:
                await check.stop()
            # the SDK leaves the workflows it cached to the garbage collector: close them here,
            # each in its own context (their spans end cleanly; nothing prints at exit)
            await close_cached_runs(worker.config(active_config=True).get("workflow_runner"))

    def _runtime(self, worker: temporalio.worker.Worker) -> WorkerRuntime | None:
        """``worker``'s runtime (the one ``configure_worker`` made)."""
        found = runtime_of(worker)
        return found if found is not None and found.source is self._source else None

    async def _start_reconciler(self, worker: temporalio.worker.Worker) -> None:
        if self._reconcile is not None:
            task_queue = worker.config()["task_queue"]
            await worker.client.start_workflow(
                Reconciler.run,
                self._reconcile,
                id=f"interlock-reconciler-{task_queue}",
                task_queue=task_queue,
                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
                static_summary="Interlock: finds effects left in doubt",
            )
