"""``InterlockPlugin``: one object that installs the gate on clients and workers."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta

import temporalio.worker
from temporalio.activity import _Definition
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.contrib.pydantic import PydanticPayloadConverter, pydantic_data_converter
from temporalio.converter import DataConverter, DefaultPayloadConverter
from temporalio.plugin import SimplePlugin
from temporalio.worker import WorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from ._gated import argument_names, spec_of
from ._interceptor import InterlockInterceptor
from ._reconciler import ReconcileActivity, Reconciler, ReconcileRequest
from ._review_workflow import EffectReview
from ._runtime import GateSource, WorkerRuntime
from ._telemetry import Telemetry
from .core.journal import Journal, KeyLike
from .core.policy import Policy
from .core.policy.file import PolicySource, check_arguments
from .core.review import ReviewRules

PASSTHROUGH = ("interlock_temporal", "rfc8785", "pydantic", "pydantic_core")


def _with_pydantic(existing: DataConverter | None) -> DataConverter:
    """Pydantic models on the wire, keeping whatever the user configured: a codec (encryption
    included) and a failure converter are kept; a custom payload converter is kept as is."""
    if existing is None:
        return pydantic_data_converter
    if existing.payload_converter_class is DefaultPayloadConverter:
        return dataclasses.replace(existing, payload_converter_class=PydanticPayloadConverter)
    return existing


def _with_passthrough(runner: WorkflowRunner | None) -> WorkflowRunner:
    if runner is None:
        raise ValueError("InterlockPlugin needs the worker's workflow runner")
    if isinstance(runner, SandboxedWorkflowRunner):
        return dataclasses.replace(
            runner, restrictions=runner.restrictions.with_passthrough_modules(*PASSTHROUGH)
        )
    return runner


class InterlockPlugin(SimplePlugin):
    """Register on the client (``Client.connect(..., plugins=[InterlockPlugin(...)])``); workers
    built from that client get the interceptor, the ``EffectReview`` and reconciler workflows
    with their activities, the data converter and sandbox passthrough.

    ``journal``: a URL (``sqlite:///interlock.db``) or an open ``Journal``.
    ``signing_key``: the journal's signing key (default: ``INTERLOCK_SIGNING_KEY``, else a key
    file beside a SQLite journal). It also signs the ``act_as`` headers (through a key derived
    from it), so only workers that hold it can grant authority.
    ``older_keys``: keys retired by a rotation: the entries and the headers of runs still under
    way that they signed keep verifying.
    ``review``: who may decide reviews, how many must agree, a deadline.
    ``review_task_queue``: where reviews run (default: the gated activity's task queue).
    ``reconcile_every``: also run the reconciler on each worker's task queue this often, for
    effects in doubt longer than ``reconcile_older_than``.
    ``policy``: limits and rules every activity of the worker is checked against: a ``Policy``,
    or the path of a YAML/JSON policy file (validated now, reloaded when it changes); denied
    calls fail with ``InterlockDenied`` and their bodies never run.
    ``telemetry``: where spans, metrics and receipt log records go (default: the global
    OpenTelemetry providers; put ``OpenTelemetryPlugin`` before this plugin to nest the gate's
    spans under Temporal's activity spans).
    ``on_point``: called at each named point of the protocol (tests use it to kill a worker at
    an exact step: ``interlock_temporal.testing.kill_at``).
    """

    def __init__(
        self,
        journal: Journal | str = "sqlite:///interlock.db",
        *,
        signing_key: str | bytes | None = None,
        older_keys: Sequence[KeyLike] = (),
        review: ReviewRules | None = None,
        review_task_queue: str | None = None,
        reconcile_every: timedelta | None = None,
        reconcile_older_than: timedelta = timedelta(seconds=60),
        on_point: Callable[[str, str], None] | None = None,
        policy: Policy | str | os.PathLike[str] | None = None,
        telemetry: Telemetry | None = None,
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
        )
        self._review = review or ReviewRules()
        self._review_task_queue = review_task_queue
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
            workflow_runner=_with_passthrough,
            workflows=[EffectReview, Reconciler],
        )

    def configure_worker(
        self, config: temporalio.worker.WorkerConfig
    ) -> temporalio.worker.WorkerConfig:
        """Each worker gets its own runtime (its client, its gated activities), with its own
        interceptor, review desk and reconciler on it; all share the plugin's gate."""
        runtime = WorkerRuntime(
            self._source,
            client=config.get("client"),
            review_rules=self._review,
            review_task_queue=self._review_task_queue,
        )
        arguments: dict[str, frozenset[str] | None] = {}
        for fn in config.get("activities") or []:
            # _Definition is private to the SDK: the Worker reads an activity's registered name
            # through it, and no public API gives it (see the note in workflow.py)
            name = _Definition.must_from_callable(fn).name or ""
            arguments[name] = argument_names(fn)
            spec = spec_of(fn)
            if spec is not None:
                runtime.runs(name, spec)
        # a rule naming an argument no activity has is a typo: refuse it now (and on reload)
        policy = self._policy
        if isinstance(policy, PolicySource):
            policy.on_load(lambda p: check_arguments(p, arguments))
        elif policy is not None:
            check_arguments(policy, arguments)
        # open the journal now: a bad URL or key fails the worker, not its first activity
        _ = runtime.gate
        interceptor = InterlockInterceptor.of(runtime)
        reconciler = ReconcileActivity(runtime, interceptor.desk)
        config["interceptors"] = [*(config.get("interceptors") or []), interceptor]
        config["activities"] = [
            *(config.get("activities") or []),
            interceptor.desk.record_decision,
            reconciler.reconcile,
        ]
        return super().configure_worker(config)

    def configure_replayer(
        self, config: temporalio.worker.ReplayerConfig
    ) -> temporalio.worker.ReplayerConfig:
        # a replay runs no activity: the journal is not opened (nor created) for it
        runtime = WorkerRuntime(self._source, review_rules=self._review, replay_only=True)
        interceptor = InterlockInterceptor.of(runtime)
        config["interceptors"] = [*(config.get("interceptors") or []), interceptor]
        return super().configure_replayer(config)

    async def run_worker(
        self,
        worker: temporalio.worker.Worker,
        next: Callable[[temporalio.worker.Worker], Awaitable[None]],
    ) -> None:
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
        await super().run_worker(worker, next)
