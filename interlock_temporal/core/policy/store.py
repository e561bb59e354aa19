"""The accounts a call's policy state is kept under (``Accounts``), what one evaluation writes
(``Evaluation``) and the store that keeps it: the journal's database, so several worker
processes share one view."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .approvals import Approval, ApprovalScope, ApprovalStatus
from .call import CallEvent
from .state import PolicyState, SessionState
from .verdicts import Decision


@dataclass(frozen=True, slots=True)
class Accounts:
    """The accounts a call's policy state is kept under: its session's, principal's and
    namespace's (state, and spend against their budgets; the policy store's ``policy_spend``
    keeps them in a column named ``scope``), its execution's (admitted once) and the binding its
    approvals name."""

    session: str
    principal: str
    namespace: str
    #: the execution (``run_id/activity_id``) or the effect (``effect:<id>``) being admitted
    execution: str
    #: what an approval of this call names: the effect id, or ``call:<digest>`` when ungated
    binding: str = ""

    @classmethod
    def of(cls, event: CallEvent, execution: str, binding: str = "") -> Accounts:
        """The session defaults to the workflow id; "-" stands for an unknown principal."""
        return cls(
            session=event.session or event.workflow_id or "-",
            principal=event.principal or "-",
            namespace=event.namespace or "-",
            execution=execution,
            binding=binding,
        )


@dataclass(frozen=True, slots=True)
class Evaluation:
    """What one evaluation writes: the decision, the session's state after it, the estimated
    cost (USD) the execution is admitted at (None: not admitted now), and the journal note to
    sign."""

    decision: Decision
    state: PolicyState
    cost: float | None = None
    note: dict[str, Any] | None = None
    #: an approval to ask a person for (kept while the same request is pending)
    request: Approval | None = None
    #: the approval this call used up (only a once-approval is consumed)
    consumed: Approval | None = None
    #: the delivery to record as seen in the session (only a call that runs records its own)
    nonce: str | None = None


class PolicyStore(ABC):
    """Policy state in the journal's database, shared by every worker on it."""

    @abstractmethod
    def evaluate(
        self,
        accounts: Accounts,
        fn: Callable[[PolicyState, bool, Approval | None, bool], Evaluation],
        *,
        nonce: str = "",
    ) -> Decision:
        """In one transaction: read the state of ``accounts``, whether ``accounts.execution`` was
        admitted before, the approval of ``accounts.binding`` and whether ``nonce`` (a delivery)
        was recorded in the session before; call ``fn(state, admitted, approval, replayed)``;
        write the state after it, admit the execution at ``cost`` (when not None), record the
        outcome's ``nonce`` for the session (for as long as the session's state is kept), record
        the approval request or consumption, and sign ``note`` into the session's policy chain
        in the journal. Returns the outcome's decision."""

    @abstractmethod
    def approval(self, binding: str) -> Approval | None: ...

    @abstractmethod
    def decide_approval(
        self,
        binding: str,
        *,
        approve: bool,
        operators: Sequence[str],
        note: str = "",
        scope: ApprovalScope = "once",
        ttl_s: float | None = None,
        sent_by: Mapping[str, str] | None = None,
        proofs: Sequence[Mapping[str, Any]] = (),
        ballot: Mapping[str, Any] | None = None,
    ) -> tuple[bool, Approval]:
        """Record a person's decision on a pending approval (journaled): (recorded, approval).
        An approval already decided is returned unchanged with recorded False; an unknown
        binding raises ``KeyError``. ``sent_by``: the client identity Temporal recorded for
        each operator's vote, where one was read (evidence, not proof: a client sets it),
        kept with the approval and journaled beside the operators. ``proofs``: the deciding
        votes' proofs, journaled with the ``ballot`` they signed, so that ``interlock journal
        verify`` can check them again (``vote_proofs.recheck``)."""

    @abstractmethod
    def record_cost(self, accounts: Accounts, actual_usd: float) -> bool:
        """Replace the execution's estimated charge with its actual cost, once. False when its
        actual cost was recorded already (or it was never admitted)."""

    @abstractmethod
    def session(self, session: str) -> SessionState | None: ...

    @abstractmethod
    def reset(
        self,
        session: str,
        *,
        operator: str,
        note: str = "",
        sent_by: Mapping[str, str] | None = None,
        proofs: Sequence[Mapping[str, Any]] = (),
        ballot: Mapping[str, Any] | None = None,
    ) -> bool:
        """A person closes the session's circuit (journaled). False if it was not open.
        ``sent_by``, ``proofs`` and ``ballot``: as for ``decide_approval``."""

    @abstractmethod
    def approvals(self, status: ApprovalStatus | None = None) -> list[Approval]:
        """Approvals (requests and decisions), oldest request first."""

    @abstractmethod
    def open_circuits(self) -> dict[str, SessionState]:
        """Every session whose circuit is open, by session."""

    @abstractmethod
    def spent(self, account: str) -> float:
        """The spend of ``principal:<name>`` or ``namespace:<name>``."""

    @abstractmethod
    def events(self, since: float | None = None) -> list[Any]:
        """The signed policy entries (denials, escalations, observed verdicts, resets), in
        journal order."""

    # -- flow marks (``flow``) ------------------------------------------------------------------

    @property
    @abstractmethod
    def flow_key(self) -> bytes:
        """The key flow fingerprints are made with, derived from the journal's keyring (raises
        when the keyring cannot sign: nothing is fingerprinted under no key)."""

    @abstractmethod
    def flow_marks(self, scope: str, fingerprints: Collection[str]) -> dict[str, frozenset[str]]:
        """Fingerprint -> labels, of the marks of ``scope`` among ``fingerprints``: one indexed
        query, never the whole scope."""

    @abstractmethod
    def mark_flow(
        self,
        scope: str,
        fingerprints: Sequence[str],
        labels: Sequence[str],
        *,
        now: float,
        cap: int,
    ) -> int:
        """Keep each fingerprint under each label for ``scope`` (one that is there already is
        renewed), then evict the oldest marks of ``scope`` beyond ``cap``; returns how many were
        evicted. One transaction."""
