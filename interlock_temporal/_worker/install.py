"""What a worker needs to run the gate, added to its configuration: the interceptor, the review
and reconciler workflows with their activities, each gated activity's target, the sandbox
passthrough that lets ``act_as`` reach activities, and a workflow runner that closes the
workflows still cached when the worker stops.

``InterlockPlugin`` does this for every worker built from its client; where plugins are not
supported, ``InterlockInterceptor.worker_options`` does the same for one worker by hand.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Protocol

from temporalio.activity import _Definition  # private: no public API reads an activity's definition
from temporalio.bridge.proto.workflow_activation import (
    RemoveFromCache,
    WorkflowActivation,
    WorkflowActivationJob,
)
from temporalio.converter import DefaultPayloadConverter
from temporalio.worker import WorkflowInstance, WorkflowInstanceDetails, WorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from .._reviews.notifying import NotifyDesk
from .._reviews.reconciler import ReconcileActivity, Reconciler
from .._reviews.workflow import EffectReview
from ..core.coverage import START_LINE
from ..core.journal import Journal, redacted
from ..core.journal_identity import identity_with_journal
from ..core.operators import roster_of
from ..core.policy import Policy
from ..core.policy.file import PolicySource, check_activities, check_arguments
from .coverage import classify
from .gated import GateSpec, argument_names, spec_of
from .journal_check import QueueJournalCheck
from .runtime import WorkerSetupError

if TYPE_CHECKING:
    import temporalio.client

    from .._reviews.desk import ReviewDesk
    from .runtime import WorkerRuntime

log = logging.getLogger("interlock_temporal")

#: modules workflow code shares with the worker instead of re-importing them per run: the
#: ``act_as`` context (``interlock_temporal``) must be the interceptor's own, not a copy
PASSTHROUGH = ("interlock_temporal", "rfc8785", "pydantic", "pydantic_core")
#: the workflows every Interlock worker runs
WORKFLOWS: tuple[type, ...] = (EffectReview, Reconciler)

#: what a worker built with a bare interceptor is told to add
BARE = (
    "InterlockInterceptor alone does not install the gate on this worker: the EffectReview "
    "workflow and its activity (a person's decision is never recorded without them), the "
    "reconciler, each gated activity's target and the sandbox passthrough that lets act_as "
    "reach activities are missing. Register the plugin instead: Client.connect(..., "
    "plugins=[InterlockPlugin(...)]) or Worker(..., plugins=[InterlockPlugin(...)]) (a "
    "Replayer too: Replayer(..., plugins=[InterlockPlugin(...)])). Where plugins are not "
    "supported, build the worker from the interceptor: Worker(**interceptor.worker_options("
    "client, task_queue=..., workflows=[...], activities=[...]))"
)


# -- closing what the worker leaves cached -----------------------------------------------------


class LiveRuns:
    """The workflow runs a runner created and that may still be cached, by run id (weakly: a
    run the worker evicted and dropped is gone from here too)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: weakref.WeakValueDictionary[str, WorkflowInstance] = (
            weakref.WeakValueDictionary()
        )
        self._local = threading.local()

    @contextmanager
    def validating(self) -> Iterator[None]:
        """``prepare_workflow`` makes a throwaway instance to validate a definition: not a run."""
        self._local.validating = True
        try:
            yield
        finally:
            self._local.validating = False

    def add(self, run_id: str, instance: WorkflowInstance) -> None:
        if not getattr(self._local, "validating", False):
            with self._lock:
                self._runs[run_id] = instance

    async def close_all(self) -> int:
        """Evict every run still cached, as the worker would on a cache eviction: its tasks are
        cancelled and unwind inside the workflow, in their own context. Without it they are
        garbage collected at interpreter exit, in another context, where OpenTelemetry's
        span context cannot be detached ("Failed to detach context")."""
        with self._lock:
            runs = list(self._runs.items())
            self._runs.clear()
        for run_id, instance in runs:
            activation = WorkflowActivation(
                run_id=run_id,
                jobs=[
                    WorkflowActivationJob(
                        remove_from_cache=RemoveFromCache(
                            message="the worker shut down",
                            reason=RemoveFromCache.EvictionReason.LANG_REQUESTED,
                        )
                    )
                ],
            )
            try:
                # in a thread, as the SDK runs activations: workflow code has its own loop
                await asyncio.to_thread(instance.activate, activation)
            except Exception as err:  # activate() reports failures in its completion
                log.debug("closing workflow run %s at shutdown: %r", run_id, err)
        return len(runs)


@dataclasses.dataclass(frozen=True)
class ClosingSandboxRunner(SandboxedWorkflowRunner):
    """The sandboxed runner, remembering the runs it creates so that the worker's plugin can
    close the ones still cached when the worker stops (the SDK leaves them to the garbage
    collector). A ``dataclasses.replace`` by another plugin keeps the class and its runs."""

    live: LiveRuns = dataclasses.field(default_factory=LiveRuns, compare=False, repr=False)

    def prepare_workflow(self, defn: Any) -> None:
        with self.live.validating():
            super().prepare_workflow(defn)

    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        instance = super().create_instance(det)
        self.live.add(det.info.run_id, instance)
        return instance


def with_passthrough(runner: WorkflowRunner | None) -> WorkflowRunner:
    """The worker's runner with the passthrough ``act_as`` needs; a sandboxed one also closes
    its cached runs at shutdown. Any other runner is kept as it is."""
    if runner is None:
        raise ValueError("InterlockPlugin needs the worker's workflow runner")
    if not isinstance(runner, SandboxedWorkflowRunner):
        return runner
    restrictions = runner.restrictions.with_passthrough_modules(*PASSTHROUGH)
    if isinstance(runner, ClosingSandboxRunner):
        return dataclasses.replace(runner, restrictions=restrictions)
    return ClosingSandboxRunner(restrictions=restrictions, runner_class=runner.runner_class)


async def close_cached_runs(runner: object) -> None:
    """After a worker stopped: close the workflow runs it left cached (see ``LiveRuns``)."""
    if isinstance(runner, ClosingSandboxRunner):
        closed = await runner.live.close_all()
        if closed:
            log.debug("closed %d cached workflow run(s) at worker shutdown", closed)


# -- the worker's configuration ------------------------------------------------------------------


class Installable(Protocol):
    """What ``install`` adds to a worker: the interceptor (``InterlockInterceptor``), with the
    worker's runtime and review desk. It is told it is ``installed`` once the worker has all
    the gate needs (a bare interceptor refuses the worker)."""

    runtime: WorkerRuntime
    desk: ReviewDesk
    installed: bool


def install(config: Any, interceptor: Installable) -> None:
    """Add what the gate needs to a worker's configuration (a ``WorkerConfig``): each gated
    activity bound to its target (a gated activity with none refuses the worker, naming it),
    the policy's argument names checked, the journal opened (a bad URL or key fails the worker,
    not its first activity), the interceptor, and the review and reconciler activities."""
    runtime = interceptor.runtime
    arguments: dict[str, frozenset[str] | None] = {}
    user: list[tuple[str, Callable[..., Any]]] = []
    bound: dict[str, GateSpec] = {}
    for fn in config.get("activities") or []:
        # _Definition is private to the SDK: the Worker reads an activity's registered name
        # through it, and no public API gives it (see the note in workflow.py)
        name = _Definition.must_from_callable(fn).name or ""
        arguments[name] = argument_names(fn)
        user.append((name, fn))
        spec = spec_of(fn)
        if spec is not None:
            bound[name] = runtime.runs(name, spec)
    # a rule naming an argument no activity has is a typo: refuse it now (and on reload); a
    # rule naming no activity of this worker is warned of (or refused, if the file says so)
    policy = runtime.source.policy
    # what escapes the gate (the start line, `interlock doctor`): again with each policy loaded
    runtime.coverage = classify(user, bound, None)

    def check(p: Policy) -> None:
        check_arguments(p, arguments)
        check_activities(p, arguments)
        runtime.coverage = classify(user, bound, p)

    if isinstance(policy, PolicySource):
        policy.on_load(check)
    elif isinstance(policy, Policy):
        check(policy)
    gate = runtime.gate
    runtime.check_transactional()
    _warn_without_roster(gate.journal)
    _name_the_journal(config, runtime)
    reconciler = ReconcileActivity(runtime, interceptor.desk)
    config["interceptors"] = [*(config.get("interceptors") or []), interceptor]
    own: list[Callable[..., Any]] = [
        interceptor.desk.record_decision,
        interceptor.desk.check_review,
        interceptor.desk.committed,
        reconciler.reconcile,
        NotifyDesk(runtime).notify,
    ]
    # the gate's own activities are not an agent's calls: the policy does not decide them (a
    # rule that denies unknown activities would otherwise stop people deciding reviews); each
    # checks its caller itself
    runtime.own_activities = frozenset(_Definition.must_from_callable(fn).name or "" for fn in own)
    config["activities"] = [*(config.get("activities") or []), *own]
    interceptor.installed = True


def _name_the_journal(config: Any, runtime: WorkerRuntime) -> None:
    """One task queue, one journal (``journal_check``): the worker's Temporal identity names
    its journal (``"<identity> interlock-journal:<id>"``, the user's identity kept, else the
    client's ``pid@hostname``), and its runtime gets the check of its task queue's pollers."""
    client = config.get("client")
    journal_id = runtime.journal_id
    identity = config.get("identity") or (client.identity if client is not None else "")
    config["identity"] = identity_with_journal(identity, journal_id)
    task_queue = config.get("task_queue")
    if client is not None and task_queue:
        runtime.queue_check = QueueJournalCheck(journal_id, client, task_queue)


_told_without_roster: set[str] = set()


def _warn_without_roster(journal: Journal) -> None:
    """Once per journal and process, at a worker's start: a journal without an operator roster
    cannot tell one person from another, so anyone with namespace access can decide."""
    if journal.url in _told_without_roster or roster_of(journal).exists:
        return
    _told_without_roster.add(journal.url)
    log.warning(
        "journal %s has no operator roster: operator names on review votes are not checked, and "
        "anyone with access to this Temporal namespace can decide a review under any name "
        "(`interlock operators add NAME --public-key FILE` sets one up)",
        redacted(journal.url),
    )


def _check_converter(client: temporalio.client.Client) -> None:
    converter = client.data_converter.payload_converter_class
    # a custom converter is the user's: it is kept as it is, as InterlockPlugin keeps it
    if converter is DefaultPayloadConverter:
        raise WorkerSetupError(
            "the worker's client uses Temporal's default data converter, which cannot decode "
            "the review workflow's pydantic models: connect it with "
            "Client.connect(..., data_converter=pydantic_data_converter) (from "
            "temporalio.contrib.pydantic), or register InterlockPlugin, which does it for you"
        )


def worker_options(
    interceptor: Installable,
    client: temporalio.client.Client,
    options: dict[str, Any],
    *,
    runner: Callable[[WorkflowRunner | None], WorkflowRunner] = with_passthrough,
) -> dict[str, Any]:
    """``Worker(**interceptor.worker_options(client, task_queue=..., workflows=[...],
    activities=[...]))``: the worker's options with everything ``InterlockPlugin`` would add."""
    if "client" in options or "plugins" in options:
        raise WorkerSetupError(
            "worker_options(client, ...) takes the client first and no plugins (with "
            "InterlockPlugin, build the Worker as usual)"
        )
    _check_converter(client)
    interceptor.runtime.client = client
    config: dict[str, Any] = {**options, "client": client}
    install(config, interceptor)
    config["workflows"] = [*(config.get("workflows") or []), *WORKFLOWS]
    config["workflow_runner"] = runner(config.get("workflow_runner") or SandboxedWorkflowRunner())
    interceptor.runtime.source.announce()
    coverage = interceptor.runtime.coverage
    log.log(coverage.level, "%s", coverage.line(), extra=START_LINE)
    return config
