"""The policy's shared state (sessions, spend, admitted executions, approvals), kept in the
journal's database (``SqlAccess``); its notes are signed entries of each session's policy
chain."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..models import Draft, Entry, Kind
from ..policy import (
    Accounts,
    Approval,
    ApprovalScope,
    ApprovalStatus,
    Decision,
    Evaluation,
    PolicyState,
    PolicyStore,
    SessionState,
    dump_session,
    load_session,
    reset_circuit,
)
from .interface import POLICY_CHAIN_TYPE, policy_chain
from .sql_access import SqlAccess


def _proven(
    proofs: Sequence[Mapping[str, Any]], ballot: Mapping[str, Any] | None
) -> dict[str, Any]:
    """What a decision's note adds for its proofs: each proof, and the ballot they signed (added
    only where there are proofs: notes without a roster are as before)."""
    if not proofs:
        return {}
    return {"proofs": [dict(p) for p in proofs], "ballot": dict(ballot or {})}


class SqlPolicy(PolicyStore):
    """The policy's state in the journal's database. Each evaluation locks the rows it reads
    (its session, the principal's and namespace's spend, the approval) and only then, if it
    has a note to sign, the journal's sequence."""

    def __init__(self, access: SqlAccess) -> None:
        self._access = access

    def _spent(self, db: Any, account: str) -> float:
        access = self._access
        if access.for_update:
            # a row that does not exist yet cannot be locked: make it first, so two first
            # charges to one account wait for each other instead of both reading nothing
            access.execute(
                db,
                "INSERT INTO policy_spend (scope, spent_usd) VALUES (?, 0.0) "
                "ON CONFLICT (scope) DO NOTHING",
                (account,),
            )
        row = access.execute(
            db, f"SELECT spent_usd FROM policy_spend WHERE scope = ?{access.for_update}", (account,)
        ).fetchone()
        return 0.0 if row is None else float(row[0])

    def _load(self, db: Any, session: str) -> SessionState:
        access = self._access
        if access.for_update:
            access.execute(
                db,
                "INSERT INTO policy_sessions (session, doc) VALUES (?, ?) "
                "ON CONFLICT (session) DO NOTHING",
                (session, dump_session(SessionState()).decode()),
            )
        row = access.execute(
            db,
            f"SELECT doc FROM policy_sessions WHERE session = ?{access.for_update}",
            (session,),
        ).fetchone()
        return load_session(row[0] if row else None)

    def _save(self, db: Any, session: str, state: SessionState) -> None:
        self._access.execute(
            db,
            "INSERT INTO policy_sessions (session, doc) VALUES (?, ?) "
            "ON CONFLICT (session) DO UPDATE SET doc = excluded.doc",
            (session, dump_session(state).decode()),
        )

    def _add_spend(self, db: Any, account: str, delta: float) -> None:
        g = self._access.greatest
        self._access.execute(
            db,
            f"INSERT INTO policy_spend (scope, spent_usd) VALUES (?, {g}(0.0, ?)) "
            f"ON CONFLICT (scope) DO UPDATE SET spent_usd = {g}(0.0, policy_spend.spent_usd + ?)",
            (account, delta, delta),
        )

    def _note(self, db: Any, session: str, data: dict[str, Any]) -> None:
        self._access.append_within(
            db,
            policy_chain(session),
            [Draft(kind=Kind.POLICY, data=data)],
            effect_type=POLICY_CHAIN_TYPE,
        )

    def _approval(self, db: Any, binding: str, lock: bool = False) -> Approval | None:
        if not binding:
            return None
        access = self._access
        row = access.execute(
            db,
            "SELECT doc FROM policy_approvals WHERE binding = ?"
            + (access.for_update if lock else ""),
            (binding,),
        ).fetchone()
        return None if row is None else Approval.model_validate_json(row[0])

    def _put_approval(self, db: Any, approval: Approval) -> None:
        self._access.execute(
            db,
            "INSERT INTO policy_approvals (binding, doc) VALUES (?, ?) "
            "ON CONFLICT (binding) DO UPDATE SET doc = excluded.doc",
            (approval.binding, approval.model_dump_json()),
        )

    def evaluate(
        self,
        accounts: Accounts,
        fn: Callable[[PolicyState, bool, Approval | None, bool], Evaluation],
        *,
        nonce: str = "",
    ) -> Decision:
        access = self._access

        def run(db: Any) -> Decision:
            session = self._load(db, accounts.session)
            principal = self._spent(db, "principal:" + accounts.principal)
            namespace = self._spent(db, "namespace:" + accounts.namespace)
            admitted = (
                access.execute(
                    db, "SELECT 1 FROM policy_admissions WHERE execution = ?", (accounts.execution,)
                ).fetchone()
                is not None
            )
            approval = self._approval(db, accounts.binding, lock=True)
            # the session's row is locked (above): no other check of this session can record
            # the nonce between this read and the write below
            replayed = bool(nonce) and (
                access.execute(
                    db,
                    "SELECT 1 FROM policy_nonces WHERE session = ? AND nonce = ?",
                    (accounts.session, nonce),
                ).fetchone()
                is not None
            )
            out = fn(PolicyState(session, principal, namespace), admitted, approval, replayed)
            after = out.state
            if after.session != session:
                self._save(db, accounts.session, after.session)
            if after.principal_spent_usd != principal:
                self._add_spend(
                    db, "principal:" + accounts.principal, after.principal_spent_usd - principal
                )
            if after.namespace_spent_usd != namespace:
                self._add_spend(
                    db, "namespace:" + accounts.namespace, after.namespace_spent_usd - namespace
                )
            if out.cost is not None:
                access.execute(
                    db,
                    "INSERT INTO policy_admissions (execution, session, principal, namespace, "
                    "estimate_usd, ts) VALUES (?, ?, ?, ?, ?, ?) "
                    "ON CONFLICT (execution) DO NOTHING",
                    (
                        accounts.execution,
                        accounts.session,
                        accounts.principal,
                        accounts.namespace,
                        out.cost,
                        time.time(),
                    ),
                )
            if out.request is not None and not (
                approval is not None
                and approval.status == "pending"
                and approval.same_request(out.request)
            ):
                self._put_approval(db, out.request)
            if out.consumed is not None and out.consumed.scope == "once":
                self._put_approval(db, out.consumed.model_copy(update={"status": "consumed"}))
            if out.nonce:
                access.execute(
                    db,
                    "INSERT INTO policy_nonces (session, nonce) VALUES (?, ?) "
                    "ON CONFLICT (session, nonce) DO NOTHING",
                    (accounts.session, out.nonce),
                )
            if out.note is not None:
                self._note(db, accounts.session, out.note)
            return out.decision

        return access.writing(run)

    def record_cost(self, accounts: Accounts, actual_usd: float) -> bool:
        if not actual_usd >= 0 or actual_usd == float("inf"):
            raise ValueError("a cost must be a finite, non-negative number of USD")
        access = self._access

        def run(db: Any) -> bool:
            row = access.execute(
                db,
                "SELECT session, principal, namespace, estimate_usd, actual_usd "
                f"FROM policy_admissions WHERE execution = ?{access.for_update}",
                (accounts.execution,),
            ).fetchone()
            if row is None or row[4] is not None:
                return False
            session_id, principal, namespace, estimate, _ = row
            delta = actual_usd - estimate
            state = self._load(db, session_id)
            self._save(
                db,
                session_id,
                dataclasses.replace(state, spent_usd=max(0.0, state.spent_usd + delta)),
            )
            self._add_spend(db, "principal:" + principal, delta)
            self._add_spend(db, "namespace:" + namespace, delta)
            access.execute(
                db,
                "UPDATE policy_admissions SET actual_usd = ? WHERE execution = ?",
                (actual_usd, accounts.execution),
            )
            return True

        return access.writing(run)

    def approval(self, binding: str) -> Approval | None:
        return self._access.reading(lambda db: self._approval(db, binding))

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
        if not operators or not all(o.strip() for o in operators):
            raise ValueError("operators must name the people deciding")
        if ttl_s is not None and not ttl_s > 0:
            raise ValueError("ttl_s must be a positive number of seconds")

        def run(db: Any) -> tuple[bool, Approval]:
            found = self._approval(db, binding, lock=True)
            if found is None:
                raise KeyError(f"no approval was requested for {binding}")
            if found.status != "pending":
                return False, found
            now = time.time()
            decided = found.model_copy(
                update={
                    "status": "approved" if approve else "rejected",
                    "scope": "ttl" if ttl_s is not None else scope,
                    "expires_at": None if ttl_s is None else now + ttl_s,
                    "operators": [o.strip() for o in operators],
                    "note": note,
                    "decided_at": now,
                    "sent_by": dict(sent_by or {}),
                }
            )
            self._put_approval(db, decided)
            self._note(
                db,
                found.session,
                {
                    "event": "approval_granted" if approve else "approval_rejected",
                    "binding": binding,
                    "activity": found.activity,
                    "principal": found.principal,
                    "session": found.session,
                    "digest": found.payload_digest,
                    "epoch": found.epoch,
                    "scope": decided.scope,
                    "expires_at": decided.expires_at,
                    "operators": decided.operators,
                    "note": note,
                    # added beside the operators only when read (entries before had none)
                    **({"sent_by": decided.sent_by} if decided.sent_by else {}),
                    **_proven(proofs, ballot),
                },
            )
            return True, decided

        return self._access.writing(run)

    def session(self, session: str) -> SessionState | None:
        row = self._access.reading(
            lambda db: self._access.execute(
                db, "SELECT doc FROM policy_sessions WHERE session = ?", (session,)
            ).fetchone()
        )
        return None if row is None else load_session(row[0])

    def approvals(self, status: ApprovalStatus | None = None) -> list[Approval]:
        rows = self._access.reading(
            lambda db: self._access.execute(db, "SELECT doc FROM policy_approvals").fetchall()
        )
        found = [Approval.model_validate_json(r[0]) for r in rows]
        found = [a for a in found if status is None or a.status == status]
        return sorted(found, key=lambda a: a.requested_at)

    def open_circuits(self) -> dict[str, SessionState]:
        # the circuit is part of each session's document: a scan, for tools, never the hot path
        rows = self._access.reading(
            lambda db: self._access.execute(
                db,
                "SELECT session, doc FROM policy_sessions WHERE doc NOT LIKE ?",
                ('%"circuit":null%',),
            ).fetchall()
        )
        states = {session: load_session(doc) for session, doc in rows}
        return {k: v for k, v in states.items() if v.circuit is not None}

    def spent(self, account: str) -> float:
        return self._access.reading(lambda db: self._spent_unlocked(db, account))

    def _spent_unlocked(self, db: Any, account: str) -> float:
        row = self._access.execute(
            db, "SELECT spent_usd FROM policy_spend WHERE scope = ?", (account,)
        ).fetchone()
        return 0.0 if row is None else float(row[0])

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
        if not operator.strip():
            raise ValueError("operator must name the person resetting the circuit")

        def run(db: Any) -> bool:
            state = self._load(db, session)
            if state.circuit is None:
                return False
            self._save(db, session, reset_circuit(state))
            self._note(
                db,
                session,
                {
                    "event": "circuit_reset",
                    "session": session,
                    "operator": operator.strip(),
                    "note": note,
                    "code": state.circuit.code,
                    **({"sent_by": dict(sent_by)} if sent_by else {}),
                    **_proven(proofs, ballot),
                },
            )
            return True

        return self._access.writing(run)

    def events(self, since: float | None = None) -> list[Entry]:
        rows = self._access.reading(
            lambda db: self._access.execute(
                db, "SELECT effect_id FROM effects WHERE effect_type = ?", (POLICY_CHAIN_TYPE,)
            ).fetchall()
        )
        entries = [e for (chain,) in rows for e in self._access.read(chain)]
        entries = [e for e in entries if since is None or e.ts >= since]
        return sorted(entries, key=lambda e: e.seq)
