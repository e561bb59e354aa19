"""The guard: a call's rules, then the breaker, against the state a ``PolicyStore`` shares.

``PolicyGuard.check`` runs the rules and gathers the call's facts outside the store's
transaction; ``_Check.evaluate`` is what the store runs inside it (the breaker on the state it
read, the approval that covers the call, what to write and journal). In monitor mode
``_observe`` takes its place: every call runs, and what would have happened is recorded.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..identity import UnserializableInput, jsonable
from .approvals import Approval, call_binding
from .breaker import CallFacts, admit, decide, has_error_signal
from .call import CallEvent, cost_in, input_digest, redact
from .config import Policy, PolicyFollower
from .flow import MAX_PER_SCOPE, candidates, fingerprint, fragments, labels_of, origins_for
from .rules import evaluate_rules
from .state import PolicyState
from .store import Accounts, Evaluation, PolicyStore
from .verdicts import Decision, Reason, Verdict

log = logging.getLogger("interlock_temporal.policy")


def shown(event: CallEvent, secret: frozenset[str]) -> Any:
    """The call's input as a person deciding sees it: the arguments named in ``secret``
    masked."""
    try:
        data = jsonable(list(event.args))
    except UnserializableInput:
        return None
    masked = redact(data, secret)
    return masked[0] if len(masked) == 1 else masked


@dataclass(frozen=True, slots=True)
class _Check:
    """One call under one policy: what the rules decided and the breaker's facts, gathered
    before the store's transaction, and what the store asks inside it (``evaluate``)."""

    policy: Policy
    event: CallEvent
    accounts: Accounts
    facts: CallFacts
    #: the Temporal delivery (the store's nonce), "" when there is none
    delivery: str
    ruled: Decision
    rewritten: CallEvent
    rng: float

    @property
    def nonce(self) -> str | None:
        """What a call that runs records as seen (SP/1.0: only an ALLOW records it)."""
        return self.delivery or None

    def evaluate(
        self, state: PolicyState, admitted: bool, approval: Approval | None, replayed: bool
    ) -> Evaluation:
        """The outcome on the state the store read (``PolicyStore.evaluate``'s ``fn``)."""
        facts = self.facts
        covered = approval is not None and (
            approval.covers(
                digest=facts.digest,
                principal=self.accounts.principal,
                epoch=self.policy.epoch,
                session=self.accounts.session,
                now=facts.now,
            )
            is None
        )
        f = dataclasses.replace(facts, admitted=admitted, approved=covered, replayed=replayed)
        cost = None if admitted else f.cost_usd
        if self.policy.mode == "monitor":
            return _observe(self, state, f, cost)
        if self.ruled.denies:
            denied = dataclasses.replace(self.ruled, state=state)
            return Evaluation(denied, state, None, self.note(self.ruled, "deny"))
        if approval is not None and approval.rejects(
            digest=facts.digest, principal=self.accounts.principal, epoch=self.policy.epoch
        ):
            return self._rejected(approval, state)
        d = decide(state, f, self.policy.limits, self.rng)
        after = d.state or state
        if d.verdict is not Verdict.ALLOW:
            return self._refused(d, after)
        d, consumed = self._allowed(d, state, f, approval)
        if consumed is not None:
            note = self.note(d, "approval_used")
            return Evaluation(d, after, cost, note, consumed=consumed, nonce=self.nonce)
        return Evaluation(d, after, cost, nonce=self.nonce)

    def _rejected(self, approval: Approval, state: PolicyState) -> Evaluation:
        """A person rejected this very request (same input, principal and policy epoch): the
        call is denied ``APPROVAL_REJECTED``, naming who rejected it, and nobody is asked again
        (the store would otherwise overwrite the rejection with a new pending request, and a
        waiting workflow would loop through reviews). Checked before the breaker, so a person's
        no holds even where the breaker would now let the call through. The denial carries the
        state it read: a person's answer says nothing about the agent's behaviour, so, like the
        breaker's ``CIRCUIT_OPEN`` and ``REPLAY``, it trips nothing and counts no call. A
        changed input, principal or epoch (an edited policy) is a new question: it is asked.
        Costs one comparison on a call whose binding has an approval on file."""
        who = ", ".join(approval.operators) or "-"
        why = f"a person rejected this call (rejected by {who}" + (
            f": {approval.note})" if approval.note else ")"
        )
        d = Decision(
            Verdict.DENY,
            Reason.APPROVAL_REJECTED.value,
            why,
            policy_id=self.policy.policy_id,
            state=state,
            rejected_by=tuple(approval.operators),
        )
        return Evaluation(d, state, None, self.note(d, "deny"))

    def _refused(self, d: Decision, after: PolicyState) -> Evaluation:
        """The breaker's DENY or ESCALATE (a rule's escalation in its own words), journaled;
        an escalation asks a person."""
        policy, ruled = self.policy, self.ruled
        d = dataclasses.replace(d, policy_id=d.policy_id or policy.policy_id)
        if ruled.verdict is Verdict.ESCALATE and d.code == Reason.HITL_REQUIRED.value:
            d = dataclasses.replace(
                d, code=ruled.code, reason=ruled.reason, policy_id=ruled.policy_id
            )
        if d.verdict is Verdict.ESCALATE:
            return Evaluation(d, after, None, self.note(d, "escalate"), request=self.request(d))
        return Evaluation(d, after, None, self.note(d, "deny"))

    def _allowed(
        self, d: Decision, state: PolicyState, f: CallFacts, approval: Approval | None
    ) -> tuple[Decision, Approval | None]:
        """The breaker's ALLOW as an approval that met an escalation, and a rule's rewrite,
        make it; and the approval it uses up (None: none)."""
        consumed = None
        if f.approved and not f.admitted:
            unapproved = decide(
                state, dataclasses.replace(f, approved=False), self.policy.limits, self.rng
            )
            if unapproved.verdict is Verdict.ESCALATE:
                assert approval is not None
                consumed = approval
                d = dataclasses.replace(
                    d,
                    code="APPROVED",
                    reason=f"{unapproved.code} met by an approval",
                    policy_id=self.policy.policy_id,
                    approvers=tuple(approval.operators),
                )
        ruled = self.ruled
        if ruled.verdict is Verdict.MODIFY:
            d = dataclasses.replace(
                d,
                verdict=Verdict.MODIFY,
                code="MODIFIED" if consumed is None else d.code,
                args=self.rewritten.args,
                policy_id=ruled.policy_id if consumed is None else d.policy_id,
            )
        return d, consumed

    def note(self, d: Decision, event_name: str) -> dict[str, Any]:
        """What the journal signs of a decision."""
        accounts = self.accounts
        return {
            "event": event_name,
            "verdict": d.verdict.value,
            "code": d.code,
            "reason": d.reason,
            "policy_id": d.policy_id or self.policy.policy_id,
            "epoch": self.policy.epoch,
            "argument": d.argument,
            "activity": self.event.activity,
            "digest": self.facts.digest,
            "principal": self.event.principal,
            "session": accounts.session,
            "execution": accounts.execution,
            "binding": accounts.binding,
            "delivery": self.delivery,
            "approvers": list(d.approvers),
            "tripped": d.state is not None and d.state.session.circuit is not None,
            "probabilistic": d.probabilistic,
        }

    def request(self, d: Decision) -> Approval:
        """The approval an escalation asks a person for."""
        accounts = self.accounts
        return Approval(
            binding=accounts.binding,
            activity=self.event.activity,
            principal=accounts.principal,
            session=accounts.session,
            payload_digest=self.facts.digest,
            epoch=self.policy.epoch,
            policy_id=d.policy_id,
            code=d.code,
            reason=d.reason,
            proposal=shown(self.event, self.policy.secret_arguments),
            requested_at=self.facts.now,
        )


def _observe(check: _Check, state: PolicyState, f: CallFacts, cost: float | None) -> Evaluation:
    """Monitor mode: the call runs and is counted and charged; what the rules or the breaker
    would have done is recorded (``observed``) and never enforced."""
    policy = check.policy
    d = decide(state, f, policy.limits, check.rng)
    would = check.ruled if check.ruled.denies else d
    after = admit(state, f, policy.limits)
    if would.verdict in (Verdict.DENY, Verdict.ESCALATE):
        seen = dataclasses.replace(would, policy_id=would.policy_id or policy.policy_id)
        observed = Decision(
            Verdict.ALLOW,
            seen.code,
            seen.reason,
            policy_id=seen.policy_id,
            argument=seen.argument,
            observed=True,
        )
        return Evaluation(observed, after, cost, check.note(seen, "observed"), nonce=check.nonce)
    return Evaluation(Decision(Verdict.ALLOW), after, cost, nonce=check.nonce)


class PolicyGuard:
    """Checks calls against a ``Policy`` with state in a ``PolicyStore``."""

    def __init__(
        self,
        policy: Policy | PolicyFollower,
        store: PolicyStore,
        *,
        clock: Callable[[], float] | None = None,
        rng: Callable[[], float] | None = None,
        on_decision: Callable[[Decision, str], None] | None = None,
    ) -> None:
        #: told of every decision with the activity's name (telemetry counts them)
        self.on_decision = on_decision
        self._source = policy
        self.store = store
        self.clock = clock or time.time
        self.rng = rng or random.random

    @property
    def policy(self) -> Policy:
        """The policy in force now (a file-backed one is reloaded when its file changes)."""
        source = self._source
        return source if isinstance(source, Policy) else source.current(self.clock())

    async def refreshed(self) -> Policy:
        """``policy``, for a coroutine: a followed file's reload that is due (or running) is
        awaited on its thread, never on the event loop, so the call about to be decided sees
        the file as it is now (or the last good policy, if the file was refused)."""
        source = self._source
        if isinstance(source, Policy):
            return source
        refresh = getattr(source, "refresh", None)  # PolicySource's; a follower may have none
        if refresh is None:
            return source.current(self.clock())
        policy: Policy = await refresh(self.clock())
        return policy

    def facts(
        self, event: CallEvent, *, digest: str | None = None, policy: Policy | None = None
    ) -> CallFacts:
        """What the breaker reads of ``event``: its digest, its time, its estimated cost and
        whether its input carries an error signal."""
        policy = policy or self.policy
        try:
            data = jsonable(list(event.args))
        except UnserializableInput:
            data = None
        limits = policy.limits
        estimate = cost_in(event.input, policy.cost_field) if len(event.args) == 1 else None
        return CallFacts(
            activity=event.activity,
            digest=digest or input_digest(event.args),
            now=self.clock(),
            cost_usd=limits.cost_of(event.activity) if estimate is None else estimate,
            error_signal=data is not None and has_error_signal(data),
        )

    def check(
        self,
        event: CallEvent,
        accounts: Accounts,
        *,
        delivery: str = "",
        digest: str | None = None,
    ) -> Decision:
        """The policy's decision on a call about to run (or an effect about to be sent). One
        decision uses one policy from start to end, even if the file changes meanwhile."""
        policy = self.policy
        event = self.with_origins(event, policy)
        ruled, rewritten = evaluate_rules(policy.rules, event)
        facts = self.facts(event, digest=digest, policy=policy)
        if ruled.verdict is Verdict.ESCALATE:
            facts = dataclasses.replace(facts, escalate=True)
        if not accounts.binding:
            binding = call_binding(event.activity, facts.digest, accounts.principal)
            accounts = dataclasses.replace(accounts, binding=binding)
        one = _Check(policy, event, accounts, facts, delivery, ruled, rewritten, self.rng())
        decided = self.store.evaluate(accounts, one.evaluate, nonce=delivery)
        decision = dataclasses.replace(decided, epoch=policy.epoch)
        if self.on_decision is not None:
            self.on_decision(decision, event.activity)
        return decision

    # -- flow provenance (``flow``) -------------------------------------------------------------

    @staticmethod
    def flow_scope(event: CallEvent, policy: Policy) -> str:
        """Where ``event``'s flow marks are kept: ``run:<run id>`` under ``flow_scope: run``
        (the session's when the run is unknown), else ``session:<session>`` (as ``Accounts``
        names it: the workflow id unless ``act_as`` names one)."""
        if policy.flow_scope == "run" and event.run_id:
            return f"run:{event.run_id}"
        return f"session:{event.session or event.workflow_id or '-'}"

    def with_origins(self, event: CallEvent, policy: Policy | None = None) -> CallEvent:
        """``event`` with ``origins``: its argument strings looked up in its scope's flow
        marks, when a flow rule of ``policy`` may fire on it (else ``event`` as it is, at no
        cost). A store that cannot be read raises: the call is refused, never let through
        unlabelled."""
        policy = policy or self.policy
        if not policy.looks_up_flow(event.activity):
            return event
        found = candidates(self.store.flow_key, event)
        marks = self.store.flow_marks(self.flow_scope(event, policy), found)
        origins = types.MappingProxyType(origins_for(found, marks))
        return dataclasses.replace(event, origins=origins)

    def remember(self, event: CallEvent, result: Any) -> int:
        """Record what ``event``'s activity returned (``result``, as its caller receives it) as
        flow marks of its scope, under ``activity:<name>`` and ``principal:<id>``, when the
        policy has a flow rule; returns the number of fragments recorded. The oldest marks of
        the scope beyond ``MAX_PER_SCOPE`` are evicted, and the eviction is logged: a tool that
        floods the store pushes out what it fetched before."""
        policy = self.policy
        if not policy.flow_rules:
            return 0
        found = fragments(result)
        if not found:
            return 0
        key = self.store.flow_key
        scope = self.flow_scope(event, policy)
        evicted = self.store.mark_flow(
            scope,
            [fingerprint(key, f) for f in found],
            labels_of(event.activity, event.principal),
            now=self.clock(),
            cap=MAX_PER_SCOPE,
        )
        if evicted:
            log.warning(
                "flow marks of %s: %d oldest evicted (at most %d kept), after a result of %s",
                scope,
                evicted,
                MAX_PER_SCOPE,
                event.activity,
            )
        return len(found)

    def shown(self, event: CallEvent, policy: Policy | None = None) -> Any:
        """The call's input as a person deciding sees it: secrets masked."""
        return shown(event, (policy or self.policy).secret_arguments)

    def check_result(
        self, event: CallEvent, *, result_check: Callable[[Any], Any] | None = None
    ) -> Decision:
        """Result-phase rules on what an activity returned (no state). ``result_check``
        validates a rule's MODIFY into the activity's return type (``evaluate_rules``): a
        rewrite it refuses denies, naming the rule; None, where the return type is unknown,
        takes a rewrite as it is."""
        if not self.policy.result_rules:
            return Decision(Verdict.ALLOW)
        d, rewritten = evaluate_rules(self.policy.result_rules, event, result_check=result_check)
        if d.verdict is Verdict.MODIFY:
            return dataclasses.replace(d, args=(rewritten.result,))
        if self.policy.mode == "monitor" and d.verdict is not Verdict.ALLOW:
            return dataclasses.replace(d, verdict=Verdict.ALLOW, observed=True)
        return d

    def record_cost(self, accounts: Accounts, actual_usd: float) -> bool:
        """Charge the execution its actual cost in place of the estimate, once."""
        return self.store.record_cost(accounts, actual_usd)
