"""``InterlockInterceptor``, the gate on one worker. On the activity side it makes one decision
per activity: a gated one goes through the effect protocol (begin, send, commit), any other one
past the worker's policy, or straight to its body when there is none; an error a person must
answer opens its review (``review_for``) before the workflow sees it. On the workflow side it
carries ``act_as`` to activities, child workflows and the next run, in a signed header.

The activity's declaration, and the ``Call`` one attempt of it makes, are ``gated``'s; the span
records what the gate's steps returned (``telemetry.Attempt``)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any, NoReturn

import temporalio.activity
import temporalio.client
import temporalio.worker
import temporalio.workflow
from temporalio.exceptions import ApplicationError

from .._reviews.desk import ReviewDesk
from .._reviews.notifying import review_settings
from ..core.authority import (
    ActivityBinding,
    AnyBinding,
    AuthorityInvalid,
    AuthorityKeys,
    ChildBinding,
    ContinueAsNewBinding,
    for_activity,
    for_start,
)
from ..core.errors import (
    Denied,
    JournalUnavailable,
)
from ..core.journal import Journal, KeyLike
from ..core.models import Kind
from ..core.policy import (
    Accounts,
    CallEvent,
    Policy,
    PolicyFollower,
    PolicyGuard,
    Verdict,
    call_binding,
    cost_in,
    enforce,
    input_digest,
)
from ..core.protocol import Call, Done, Gate, Ticket, to_the_end
from ..core.review import ReviewKind, ReviewRules
from ..core.targets import EffectTarget, capabilities
from ..notify import DEFAULT, DefaultType, Notifier
from .context import HEADER, Authority, current_authority, open_header, signed_header
from .errors import (
    AmbiguousEffect,
    ApprovalRequired,
    AuthorityRejected,
    EffectRefused,
    InterlockDenied,
    TargetNotBound,
    UnstableEffectKeyError,
    as_temporal_errors,
)
from .gated import (
    GateSpec,
    call_of,
    check_executor,
    effect_of,
    metering,
    parameter_names,
    result_check,
    return_type_of,
    running,
    sent_in_begin,
    spec_of,
)
from .install import BARE, worker_options
from .journal_check import heartbeat_details
from .logs import LeaseRefusals
from .runtime import GateSource, JournalArg, WorkerRuntime, WorkerSetupError
from .sticky import finish_release, start_release
from .telemetry import REASON, VERDICT, Attempt, Telemetry

log = logging.getLogger("interlock_temporal")


def delivery_nonce(info: temporalio.activity.Info) -> str:
    """The policy's nonce for this delivery of an activity: its run, activity id and attempt,
    and the time the attempt was scheduled. Delivered twice, one attempt is a replay; but an
    operator's ``temporal activity reset`` starts the attempts again at 1, and that new
    attempt 1 (scheduled anew) is not a replay of the first."""
    scheduled = info.current_attempt_scheduled_time
    stamp = f"@{round(scheduled.timestamp() * 1_000_000)}" if scheduled is not None else ""
    return f"{info.workflow_run_id}/{info.activity_id}/{info.attempt}{stamp}"


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


def review_for(error: ApplicationError, *, gated: bool) -> tuple[ReviewKind, str] | None:
    """The review a person must answer after an attempt failed with ``error``: its kind, and
    what it is about (what ``ReviewDesk.open`` takes). None: nobody needs to.

    - an effect the gate left AMBIGUOUS (only an attempt the gate ran: the doubt is in its
      journal), or whose key changed while it was in doubt: that effect's review;
    - a call the policy wants a person to approve: the review of what the approval binds to;
    - a session whose circuit opened: a person resets it, from this review in the Web UI or
      the command line.
    """
    if gated and isinstance(error, AmbiguousEffect):
        return "ambiguous", error.receipt.effect_id
    if gated and isinstance(error, UnstableEffectKeyError):
        receipt = error.receipt
        if receipt is not None and receipt.final == Kind.AMBIGUOUS.value:
            return "ambiguous", receipt.effect_id
        return None
    if isinstance(error, ApprovalRequired):
        return "approval", error.binding
    if isinstance(error, InterlockDenied) and error.circuit_open and error.session:
        return "circuit", error.session
    return None


class InterlockInterceptor(temporalio.worker.Interceptor):
    """The gate on one worker. ``InterlockPlugin`` makes one per worker with everything else a
    worker needs; where plugins are not supported, build the worker with
    ``Worker(**interceptor.worker_options(client, task_queue=..., workflows=[...],
    activities=[...]))``. Passed bare in ``Worker(interceptors=[...])``, it refuses the worker
    (with workflows) when it is built, saying what to add. Gated activities run the effect
    protocol; other activities pass through untouched.

    ``journal`` and ``targets`` as ``InterlockPlugin`` takes them. ``older_keys``: journal
    keys retired by a rotation, kept so that the entries and the authority headers they signed
    still verify. ``notify``, ``review_deadline``, ``reminder_every``: as the plugin's."""

    def __init__(
        self,
        journal: JournalArg = None,
        *,
        targets: Mapping[str, EffectTarget] | None = None,
        signing_key: str | bytes | None = None,
        older_keys: Sequence[KeyLike] = (),
        on_point: Callable[[str, str], None] | None = None,
        client: temporalio.client.Client | None = None,
        review_rules: ReviewRules | None = None,
        policy: Policy | PolicyFollower | None = None,
        telemetry: Telemetry | None = None,
        notify: Sequence[Notifier] = (),
        review_deadline: timedelta | DefaultType | None = DEFAULT,
        reminder_every: timedelta | DefaultType | None = DEFAULT,
    ) -> None:
        source = GateSource(
            journal,
            signing_key=signing_key,
            older_keys=older_keys,
            on_point=on_point,
            policy=policy,
            telemetry=telemetry,
            targets=targets,
        )
        review = review_settings(review_rules, notify, review_deadline, reminder_every)
        self._bind(WorkerRuntime(source, client=client, **review))

    @classmethod
    def of(cls, runtime: WorkerRuntime) -> InterlockInterceptor:
        """The interceptor of one worker's ``runtime`` (``InterlockPlugin`` makes one per
        worker, and installs the rest of what the worker needs)."""
        interceptor = cls.__new__(cls)
        interceptor._bind(runtime)
        interceptor.installed = True
        return interceptor

    def _bind(self, runtime: WorkerRuntime) -> None:
        self.runtime = runtime
        self.desk = ReviewDesk(runtime)
        #: a lease's refusals, logged at INFO once per lease and reason
        self.lease_refusals = LeaseRefusals()
        #: whether the worker got the rest of what the gate needs (the plugin, or
        #: ``worker_options``); a bare interceptor refuses the worker
        self.installed = False

    def worker_options(self, client: temporalio.client.Client, **options: Any) -> dict[str, Any]:
        """Where plugins are not supported: ``Worker(**interceptor.worker_options(client,
        task_queue=..., workflows=[...], activities=[...]))`` gives the worker what
        ``InterlockPlugin`` would (this interceptor, the review and reconciler workflows and
        activities, the targets bound, the sandbox passthrough). The client must carry the
        pydantic data converter. A gated activity bound to no target refuses here."""
        return worker_options(self, client, options)

    @property
    def telemetry(self) -> Telemetry:
        return self.runtime.telemetry

    @property
    def client(self) -> temporalio.client.Client | None:
        """The worker's client, for thread-pool activities (they have no activity.client())."""
        return self.runtime.client

    @client.setter
    def client(self, client: temporalio.client.Client | None) -> None:
        self.runtime.client = client

    @property
    def replay_only(self) -> bool:
        """A Replayer's interceptor: no journal is opened (or created) for it."""
        return self.runtime.replay_only

    @replay_only.setter
    def replay_only(self, replay_only: bool) -> None:
        self.runtime.replay_only = replay_only

    @property
    def journal(self) -> Journal:
        return self.gate.journal

    @property
    def gate(self) -> Gate:
        return self.runtime.gate

    @property
    def guard(self) -> PolicyGuard | None:
        return self.gate.policy

    @property
    def authority_keys(self) -> AuthorityKeys:
        """The keys that sign and verify ``act_as`` headers (see ``GateSource``)."""
        return self.runtime.authority_keys

    def intercept_activity(
        self, next: temporalio.worker.ActivityInboundInterceptor
    ) -> temporalio.worker.ActivityInboundInterceptor:
        return _ActivityInbound(next, self)

    def workflow_interceptor_class(
        self, input: temporalio.worker.WorkflowInterceptorClassInput
    ) -> type[temporalio.worker.WorkflowInboundInterceptor]:
        # the SDK asks for this while it builds a worker that runs workflows: the moment to
        # refuse a bare interceptor, before any workflow or activity runs half-installed
        if not self.installed:
            raise WorkerSetupError(BARE)
        return type("_WorkflowInbound", (_WorkflowInbound,), {"keys": self.authority_keys})

    def authority(self, input: temporalio.worker.ExecuteActivityInput) -> Authority | None:
        """The verified authority an activity's header grants; None without a header. A header
        that does not verify, or was made for another workflow run, is ``AuthorityRejected``."""
        if HEADER not in (input.headers or {}):
            return None
        info = temporalio.activity.info()
        try:
            claim = open_header(input.headers, self.authority_keys)
            assert claim is not None
            return for_activity(
                claim,
                namespace=info.workflow_namespace,
                workflow_id=info.workflow_id,
                run_id=info.workflow_run_id,
            )
        except AuthorityInvalid as err:
            raise AuthorityRejected(err.code, err.reason) from None


class _ActivityInbound(temporalio.worker.ActivityInboundInterceptor):
    def __init__(
        self, next: temporalio.worker.ActivityInboundInterceptor, root: InterlockInterceptor
    ) -> None:
        super().__init__(next)
        self._root = root
        self._outbound: temporalio.worker.ActivityOutboundInterceptor | None = None

    def init(self, outbound: temporalio.worker.ActivityOutboundInterceptor) -> None:
        self._outbound = outbound
        super().init(outbound)

    async def execute_activity(self, input: temporalio.worker.ExecuteActivityInput) -> Any:
        """One decision per activity; an error a person must answer opens its review first."""
        spec = spec_of(input.fn)
        with metering() as spent:  # what the call says it cost (report_cost)
            try:
                guard = self._root.guard
                if guard is not None:  # an edited policy file: parsed off the loop, then decides
                    await guard.refreshed()
                if spec is not None:  # gated: the gate
                    return await self._through_gate(spec, input, spent)
                own = temporalio.activity.info().activity_type in self._root.runtime.own_activities
                if guard is None or own:  # not gated, no policy (or the gate's own): untouched
                    return await self.next.execute_activity(input)
                return await self._policed(guard, input, spent)  # not gated: the policy decides
            except ApplicationError as err:
                review = review_for(err, gated=spec is not None)
                if review is not None:
                    await self._open_review(*review)
                raise

    # -- a gated activity: the gate ----------------------------------------------------------

    async def _through_gate(
        self, spec: GateSpec, input: temporalio.worker.ExecuteActivityInput, spent: list[float]
    ) -> Any:
        """Refused where the gate cannot run it; else its target bound, and the attempt run
        through the effect protocol inside its span."""
        info = temporalio.activity.info()
        runtime = self._root.runtime
        # a retry: the workflow's next task must not wait on a dead worker's sticky queue
        release = start_release(runtime.temporal_client(), info) if runtime.release_sticky else None
        try:
            # one task queue, one journal: refused before the gate reads or writes anything
            refusal = await runtime.journal_refusal(info)
            if refusal is not None:
                raise refusal
            check_executor(spec, input.executor, info.activity_type)
            spec = self._bound(spec, info)
            target = spec.require_target()
            gate = self._root.gate
            with self._root.telemetry.attempt(
                info.activity_type, capabilities(target).tier, gate.receipt_or_none
            ) as traced:
                return await self._attempt(gate, spec, target, info, input, spent, traced)
        finally:
            await finish_release(release)

    def _bound(self, spec: GateSpec, info: temporalio.activity.Info) -> GateSpec:
        """The gate this worker runs for the activity: its target bound. Workers refuse to
        start with a gated activity bound nowhere; one that got here anyway (a worker built
        with no setup) fails once, naming what to add."""
        try:
            spec = self._root.runtime.runs(info.activity_type, spec)
        except WorkerSetupError as err:
            raise TargetNotBound(str(err)) from None
        self._root.runtime.check_heartbeat(info)
        return spec

    async def _attempt(
        self,
        gate: Gate,
        spec: GateSpec,
        target: EffectTarget,
        info: temporalio.activity.Info,
        input: temporalio.worker.ExecuteActivityInput,
        spent: list[float],
        traced: Attempt,
    ) -> Any:
        """The effect protocol for one attempt: ``begin`` (the gate decides: send now, or done
        already), the body sent as the effect, ``commit`` (to the end, even if the attempt is
        cancelled meanwhile); a result this attempt committed then goes past the policy. The
        span records what each step returned."""
        call = call_of(spec, info, input.args, self._root.authority(input))
        step = await self._begin(gate, call, target, info)
        traced.began(call, step)
        if isinstance(step, Done) and not sent_in_begin(call, step):
            # done before: replayed from the journal, or resolved by a person. Its flow marks
            # are recorded again for this caller (an attempt that sent it may have failed to)
            guard = gate.policy
            if guard is not None:
                with as_temporal_errors():
                    guard.remember(
                        self._result_event(call, info, step.effect_id, call.args), step.result
                    )
            return step.result
        if isinstance(step, Done):  # tier 0: begin sent and committed it, in one transaction
            args, result = call.args, step.result
        else:
            effect = effect_of(call, step)
            with running(spec, effect):
                task = asyncio.ensure_future(self._send_and_record(gate, step, input, info))
            result, done = await to_the_end(task)
            traced.committed(done)
            args = step.args
            self._root.runtime.check_effect_read(info.activity_type, target, effect)
        return self._policed_result(
            gate, call, info, step.effect_id, args, spent, result, spec.return_type
        )

    async def _begin(
        self, gate: Gate, call: Call, target: EffectTarget, info: temporalio.activity.Info
    ) -> Ticket | Done:
        # tier 0 runs the body inside begin's transaction: heartbeat for it meanwhile
        beat = None if call.transaction is None else self._heartbeat_while_sending(info)
        try:
            with as_temporal_errors(self._root.runtime.journal_id):
                return await gate.begin(call, target)
        except EffectRefused as refused:
            self._root.lease_refusals.tell(call.activity, call.lease_id, refused)
            raise
        finally:
            if beat is not None:
                beat.cancel()

    async def _send_and_record(
        self,
        gate: Gate,
        step: Ticket,
        input: temporalio.worker.ExecuteActivityInput,
        info: temporalio.activity.Info,
    ) -> tuple[Any, Done]:
        heartbeat = self._heartbeat_while_sending(info)
        try:
            try:
                result = await self.next.execute_activity(
                    dataclasses.replace(input, args=list(step.args))
                )
            except Exception as err:
                last = step.call.last_attempt or is_non_retryable(err, info)
                with as_temporal_errors(self._root.runtime.journal_id):
                    await gate.fail(step, err, last_attempt=last)
                raise
            except BaseException:
                step.release()
                raise
            with as_temporal_errors(self._root.runtime.journal_id):
                done = await gate.commit(step, result)
            if done.after is Kind.AMBIGUOUS:
                await self._root.desk.late_commit(step.effect_id)
            return result, done
        finally:
            if heartbeat is not None:
                heartbeat.cancel()

    def _heartbeat_while_sending(self, info: temporalio.activity.Info) -> asyncio.Task[None] | None:
        """Heartbeat on the body's behalf, so ``heartbeat_timeout`` finds a dead worker fast.
        The details name this worker's journal: a later attempt on a worker of another journal
        refuses (``journal_check``; throttled and lossy, so defence in depth only)."""
        if info.heartbeat_timeout is None or self._outbound is None:
            return None
        outbound = self._outbound
        details = heartbeat_details(self._root.runtime.journal_id)
        period = max(0.05, info.heartbeat_timeout.total_seconds() / 4)

        async def beat() -> None:
            while True:
                with contextlib.suppress(Exception):
                    outbound.heartbeat(details)
                await asyncio.sleep(period)

        return asyncio.ensure_future(beat())

    # -- an activity that is not gated: the policy -------------------------------------------

    async def _policed(
        self,
        guard: PolicyGuard,
        input: temporalio.worker.ExecuteActivityInput,
        spent: list[float],
    ) -> Any:
        """An activity that is not gated: the policy decides whether its body runs at all."""
        authority = self._root.authority(input)
        info = temporalio.activity.info()
        event = CallEvent(
            activity=info.activity_type,
            args=tuple(input.args),
            principal=authority.principal if authority else None,
            session=(authority.session if authority else None) or info.workflow_id,
            namespace=info.workflow_namespace,
            attempt=info.attempt,
            workflow_id=info.workflow_id,
            param_names=parameter_names(input.fn),
            run_id=info.workflow_run_id,
        )
        digest = input_digest(event.args)
        accounts = Accounts.of(event, f"{info.workflow_run_id}/{info.activity_id}")
        accounts = dataclasses.replace(
            accounts, binding=call_binding(event.activity, digest, accounts.principal)
        )
        with self._root.telemetry.policy_span(event.activity) as span, as_temporal_errors():
            checked = guard.check(event, accounts, delivery=delivery_nonce(info), digest=digest)
            span.set_attributes({VERDICT: checked.verdict.value, REASON: checked.code or "-"})
            decision = enforce(checked, session=accounts.session, binding=accounts.binding)
        if decision.verdict is Verdict.MODIFY and decision.args is not None:
            input = dataclasses.replace(input, args=list(decision.args))
        result = await self.next.execute_activity(input)
        self._record_cost(guard, accounts, spent, result)
        return self._after_result(guard, event, result, return_type_of(input.fn))

    def _policed_result(
        self,
        gate: Gate,
        call: Call,
        info: temporalio.activity.Info,
        effect_id: str,
        args: Sequence[Any],
        spent: list[float],
        result: Any,
        return_type: Any,
    ) -> Any:
        """A result this attempt committed: its actual cost recorded, the result rules run
        (a rewrite validated into ``return_type``, the body's declared return type)."""
        guard = gate.policy
        if guard is None:
            return result
        event = self._result_event(call, info, effect_id, args)
        self._record_cost(guard, Accounts.of(event, f"effect:{effect_id}"), spent, result)
        return self._after_result(guard, event, result, return_type)

    @staticmethod
    def _result_event(
        call: Call, info: temporalio.activity.Info, effect_id: str, args: Sequence[Any]
    ) -> CallEvent:
        """The call a gated activity's result answers, as the result rules see it."""
        return CallEvent(
            activity=call.activity,
            args=tuple(args),
            principal=call.principal,
            session=call.session,
            namespace=call.namespace,
            attempt=info.attempt,
            workflow_id=info.workflow_id,
            effect_id=effect_id,
            run_id=info.workflow_run_id,
        )

    @staticmethod
    def _record_cost(
        guard: PolicyGuard, accounts: Accounts, spent: list[float], result: Any
    ) -> None:
        """Charge the budgets with what the call actually cost, when it said."""
        actual = spent[-1] if spent else cost_in(result, guard.policy.cost_field)
        if actual is None:
            return
        try:
            guard.record_cost(accounts, actual)
        except JournalUnavailable as err:
            # the estimate stays charged: the budget errs on the side of having spent more
            log.warning("could not record the actual cost of %s: %s", accounts.execution, err)

    @staticmethod
    def _after_result(guard: PolicyGuard, event: CallEvent, result: Any, return_type: Any) -> Any:
        """What the result rules make of ``result``: it, their rewrite (validated into
        ``return_type``, as a call's rewrite is into the body's parameter types; unchecked
        where it is unknown: no annotation, or ``Any``), or ``InterlockDenied`` (a deny, or a
        rewrite the activity does not return, naming the rule). The effect, if any, is
        already committed: a denial withholds its result, never undoes it. What the caller
        receives is then recorded as flow marks (``PolicyGuard.remember``; a denied result is
        not: nobody sees it); a store that cannot record them withholds the result too."""
        if guard.policy.result_rules:
            decision = guard.check_result(
                dataclasses.replace(event, phase="result", result=result),
                result_check=result_check(return_type),
            )
            if decision.verdict is Verdict.DENY:
                raise InterlockDenied(
                    Denied(decision.code, decision.reason, decision.policy_id, decision.argument)
                )
            if decision.verdict is Verdict.MODIFY and decision.args:
                result = decision.args[0]
        with as_temporal_errors():
            guard.remember(event, result)
        return result

    # -- a person in the loop ----------------------------------------------------------------

    async def _open_review(self, kind: ReviewKind, about: str) -> None:
        """Make sure the review exists and this workflow hears of its outcome (a denied
        workflow does not wait for its circuit's reset); failing to reach Temporal must not
        hide the error."""
        info = temporalio.activity.info()
        try:
            await self._root.desk.open(
                about,
                task_queue=info.task_queue,
                subscriber=info.workflow_id if kind != "circuit" else None,
                kind=kind,
            )
        except Exception as err:
            log.warning("could not open the %s review of %s: %s", kind, about[:21], err)


class _WorkflowInbound(temporalio.worker.WorkflowInboundInterceptor):
    """Trusts a start header only as its parent's or its previous run's, signed by a worker's
    key and bound to this workflow; anything else (a client's header, one copied from history)
    gives no authority. It never raises: a key retired since the run began must not break a
    replay, so a header that no longer verifies only leaves the run without authority."""

    #: set on the class ``InterlockInterceptor.workflow_interceptor_class`` makes per worker
    keys: AuthorityKeys = AuthorityKeys(None)

    def init(self, outbound: temporalio.worker.WorkflowOutboundInterceptor) -> None:
        self._outbound = _WorkflowOutbound(outbound, self.keys)
        super().init(self._outbound)

    async def execute_workflow(self, input: temporalio.worker.ExecuteWorkflowInput) -> Any:
        if HEADER in (input.headers or {}):
            info = temporalio.workflow.info()
            try:
                claim = open_header(input.headers, self.keys)
                assert claim is not None
                inherited = for_start(
                    claim,
                    workflow_id=info.workflow_id,
                    first_execution_run_id=info.first_execution_run_id,
                    parent=(info.parent.workflow_id, info.parent.run_id) if info.parent else None,
                )
            except AuthorityInvalid as err:
                self._outbound.refused = err
                temporalio.workflow.logger.warning(
                    "the authority header this workflow was started with is refused (%s): %s",
                    err.code,
                    err.reason,
                )
            except Exception as err:  # never fail a workflow task (or a replay) over it
                self._outbound.refused = AuthorityInvalid(
                    "malformed", f"the authority header could not be checked: {err!r}"
                )
                temporalio.workflow.logger.warning("%s", self._outbound.refused)
            else:
                current_authority.set(inherited)
        return await super().execute_workflow(input)


class _WorkflowOutbound(temporalio.worker.WorkflowOutboundInterceptor):
    """Signs ``act_as``'s authority for each destination: an activity to this run, a child to
    its id and this run, the next run to this workflow's chain."""

    def __init__(
        self, next: temporalio.worker.WorkflowOutboundInterceptor, keys: AuthorityKeys
    ) -> None:
        super().__init__(next)
        self.keys = keys
        #: why the start header gave no authority, told to activities started without act_as
        self.refused: AuthorityInvalid | None = None

    def _sign(self, headers: Any, binding: AnyBinding) -> Any:
        return signed_header(headers, self.keys, current_authority.get(), binding, self.refused)

    def _this_run(self) -> ActivityBinding:
        info = temporalio.workflow.info()
        return ActivityBinding(
            namespace=info.namespace, workflow_id=info.workflow_id, run_id=info.run_id
        )

    def start_activity(self, input: temporalio.worker.StartActivityInput) -> Any:
        input.headers = self._sign(input.headers, self._this_run())
        return super().start_activity(input)

    def start_local_activity(self, input: temporalio.worker.StartLocalActivityInput) -> Any:
        input.headers = self._sign(input.headers, self._this_run())
        return super().start_local_activity(input)

    async def start_child_workflow(self, input: temporalio.worker.StartChildWorkflowInput) -> Any:
        info = temporalio.workflow.info()
        binding = ChildBinding(
            workflow_id=input.id, parent_workflow_id=info.workflow_id, parent_run_id=info.run_id
        )
        input.headers = self._sign(input.headers, binding)
        return await super().start_child_workflow(input)

    def continue_as_new(self, input: temporalio.worker.ContinueAsNewInput) -> NoReturn:
        info = temporalio.workflow.info()
        binding = ContinueAsNewBinding(
            workflow_id=info.workflow_id, first_execution_run_id=info.first_execution_run_id
        )
        input.headers = self._sign(input.headers, binding)
        super().continue_as_new(input)


def runtime_of(worker: temporalio.worker.Worker) -> WorkerRuntime | None:
    """The runtime of the gate installed on ``worker`` (by ``InterlockPlugin`` or
    ``worker_options``), or None when it runs no gate."""
    for interceptor in worker.config(active_config=True).get("interceptors") or []:
        if isinstance(interceptor, InterlockInterceptor):
            return interceptor.runtime
    return None
