"""The policy's shared state (sessions, spend, admitted executions, approvals), kept in the
journal's database (``JournalAccess``); its notes are signed entries of each session's policy
chain (``policy:<session>``).

Every row here can make the policy allow something (a closed circuit, a lower spend, an
execution already charged, an approval), so each is sealed (``row_seals``) and checked when
read: a row written without the journal's keys is refused (``RowCorrupt``), and the call with
it. A session's row is sealed with its policy chain's head, which moves with every note (a
circuit tripped, reset, an approval decided), and a read compares the two: the session's row
as it stood before its circuit tripped, put back, is refused too. Spend, admissions and
approvals are sealed alone: an older one put back is a rollback, which ``journal verify``
names for approvals (their state against the notes that decided it) and cannot for spend (the
policy's USD budgets are soft limits; a lease's are the money's). Cost: a keyed BLAKE2b per row
read or written (two to six per check), and one read of the session chain's head."""

from __future__ import annotations

import dataclasses
import functools
import json
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from ..derived_keys import DerivedKeys
from ..errors import JournalConfigError, RowCorrupt
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
from ..row_seals import RowSeals
from .interface import POLICY_CHAIN_TYPE, policy_chain
from .sql_access import JournalAccess


def _proven(
    proofs: Sequence[Mapping[str, Any]], ballot: Mapping[str, Any] | None
) -> dict[str, Any]:
    """What a decision's note adds for its proofs: each proof, and the ballot they signed (added
    only where there are proofs: notes without a roster are as before)."""
    if not proofs:
        return {}
    return {"proofs": [dict(p) for p in proofs], "ballot": dict(ballot or {})}


def _usd(value: float | None) -> str | None:
    """A USD amount as a seal covers it (its shortest exact text)."""
    return None if value is None else repr(float(value))


#: an admission's columns after its execution, in the order its seal covers them
_ADMISSION = "session, principal, namespace, estimate_usd, actual_usd, ts, seal"
#: the label of the key flow fingerprints are made with (``flow_key``)
FLOW_LABEL = b"interlock-flow-fingerprint-v1"
#: a fresh session's document
_FRESH = dump_session(SessionState()).decode()


class SqlPolicy(PolicyStore):
    """The policy's state in the journal's database. Each evaluation locks the rows it reads
    (its session, the principal's and namespace's spend, the approval) and only then, if it
    has a note to sign, the journal's sequence."""

    def __init__(self, access: JournalAccess) -> None:
        self._access = access

    @functools.cached_property
    def seals(self) -> RowSeals:
        """The seals of the policy's rows (made once the journal's keyring is known)."""
        return RowSeals(self._access.keyring)

    # -- spend --------------------------------------------------------------------------------

    def _spent(self, db: Any, account: str, *, lock: bool = True) -> float:
        access = self._access
        if lock and access.for_update:
            # a row that does not exist yet cannot be locked: make it first, so two first
            # charges to one account wait for each other instead of both reading nothing
            access.execute(
                db,
                "INSERT INTO policy_spend (scope, spent_usd, seal) VALUES (?, 0.0, ?) "
                "ON CONFLICT (scope) DO NOTHING",
                (account, self.seals.seal("policy_spend", account, _usd(0.0))),
            )
        suffix = access.for_update if lock else ""
        row = access.execute(
            db, f"SELECT spent_usd, seal FROM policy_spend WHERE scope = ?{suffix}", (account,)
        ).fetchone()
        if row is None:
            return 0.0
        self.seals.check("policy_spend", account, row[1], _usd(row[0]))
        return float(row[0])

    def _set_spend(self, db: Any, account: str, spent: float) -> None:
        spent = max(0.0, spent)
        self._access.execute(
            db,
            "INSERT INTO policy_spend (scope, spent_usd, seal) VALUES (?, ?, ?) "
            "ON CONFLICT (scope) DO UPDATE SET spent_usd = excluded.spent_usd, "
            "seal = excluded.seal",
            (account, spent, self.seals.seal("policy_spend", account, _usd(spent))),
        )

    # -- sessions -----------------------------------------------------------------------------

    def _load(self, db: Any, session: str, *, lock: bool = True) -> tuple[SessionState, str | None]:
        """The session's state, checked: its seal, and the chain head it was sealed with
        against its policy chain's head now; with that head (None: no note yet)."""
        access = self._access
        if lock and access.for_update:
            access.execute(
                db,
                "INSERT INTO policy_sessions (session, doc, head, seal) VALUES (?, ?, NULL, ?) "
                "ON CONFLICT (session) DO NOTHING",
                (session, _FRESH, self.seals.seal("policy_sessions", session, _FRESH, None)),
            )
        suffix = access.for_update if lock else ""
        row = access.execute(
            db, f"SELECT doc, head, seal FROM policy_sessions WHERE session = ?{suffix}", (session,)
        ).fetchone()
        chain = access.execute(
            db, "SELECT head FROM effects WHERE effect_id = ?", (policy_chain(session),)
        ).fetchone()
        head = None if chain is None else str(chain[0])
        if row is None:
            if head is not None:
                raise RowCorrupt.of(
                    "policy_sessions",
                    session,
                    "its row is missing, and its policy chain holds notes (deleted?)",
                )
            return SessionState(), None
        doc, sealed_head, seal = row
        self.seals.check("policy_sessions", session, seal, doc, sealed_head)
        if sealed_head != head:
            raise RowCorrupt.of(
                "policy_sessions",
                session,
                "it is not the latest of its policy chain's notes (an older row put back, or "
                "one deleted and made afresh)",
            )
        return load_session(doc), head

    def _save(self, db: Any, session: str, state: SessionState, head: str | None) -> None:
        doc = dump_session(state).decode()
        self._access.execute(
            db,
            "INSERT INTO policy_sessions (session, doc, head, seal) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (session) DO UPDATE SET doc = excluded.doc, head = excluded.head, "
            "seal = excluded.seal",
            (session, doc, head, self.seals.seal("policy_sessions", session, doc, head)),
        )

    def _note(self, db: Any, session: str, data: dict[str, Any]) -> str:
        """Sign ``data`` onto the session's policy chain; the chain's new head (the caller
        seals the session's row with it)."""
        (entry,) = self._access.append_within(
            db,
            policy_chain(session),
            [Draft(kind=Kind.POLICY, data=data)],
            effect_type=POLICY_CHAIN_TYPE,
        )
        return entry.hash

    # -- admissions and approvals ---------------------------------------------------------------

    def _admission(self, db: Any, execution: str, lock: bool = False) -> tuple[Any, ...] | None:
        """An admitted execution's row (``_ADMISSION``), checked; None: not admitted."""
        access = self._access
        row = access.execute(
            db,
            f"SELECT {_ADMISSION} FROM policy_admissions WHERE execution = ?"
            + (access.for_update if lock else ""),
            (execution,),
        ).fetchone()
        if row is None:
            return None
        session, principal, namespace, estimate, actual, ts, seal = row
        self.seals.check(
            "policy_admissions",
            execution,
            seal,
            session,
            principal,
            namespace,
            _usd(estimate),
            _usd(actual),
            _usd(ts),
        )
        return tuple(row[:6])

    def _admit(self, db: Any, accounts: Accounts, cost: float) -> None:
        now = time.time()
        seal = self.seals.seal(
            "policy_admissions",
            accounts.execution,
            accounts.session,
            accounts.principal,
            accounts.namespace,
            _usd(cost),
            None,
            _usd(now),
        )
        self._access.execute(
            db,
            "INSERT INTO policy_admissions (execution, session, principal, namespace, "
            "estimate_usd, ts, seal) VALUES (?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (execution) DO NOTHING",
            (
                accounts.execution,
                accounts.session,
                accounts.principal,
                accounts.namespace,
                cost,
                now,
                seal,
            ),
        )

    def _approval(self, db: Any, binding: str, lock: bool = False) -> Approval | None:
        if not binding:
            return None
        access = self._access
        row = access.execute(
            db,
            "SELECT doc, seal FROM policy_approvals WHERE binding = ?"
            + (access.for_update if lock else ""),
            (binding,),
        ).fetchone()
        if row is None:
            return None
        self.seals.check("policy_approvals", binding, row[1], row[0])
        return Approval.model_validate_json(row[0])

    def _put_approval(self, db: Any, approval: Approval) -> None:
        doc = approval.model_dump_json()
        self._access.execute(
            db,
            "INSERT INTO policy_approvals (binding, doc, seal) VALUES (?, ?, ?) "
            "ON CONFLICT (binding) DO UPDATE SET doc = excluded.doc, seal = excluded.seal",
            (approval.binding, doc, self.seals.seal("policy_approvals", approval.binding, doc)),
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
            session, head = self._load(db, accounts.session)
            principal = self._spent(db, "principal:" + accounts.principal)
            namespace = self._spent(db, "namespace:" + accounts.namespace)
            admitted = self._admission(db, accounts.execution) is not None
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
            # the note first: the session's row is sealed with the chain's head after it
            noted = out.note is not None
            if out.note is not None:
                head = self._note(db, accounts.session, out.note)
            if after.session != session or noted:
                self._save(db, accounts.session, after.session, head)
            if after.principal_spent_usd != principal:
                self._set_spend(db, "principal:" + accounts.principal, after.principal_spent_usd)
            if after.namespace_spent_usd != namespace:
                self._set_spend(db, "namespace:" + accounts.namespace, after.namespace_spent_usd)
            if out.cost is not None:
                self._admit(db, accounts, out.cost)
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
            return out.decision

        return access.writing(run)

    def record_cost(self, accounts: Accounts, actual_usd: float) -> bool:
        if not actual_usd >= 0 or actual_usd == float("inf"):
            raise ValueError("a cost must be a finite, non-negative number of USD")
        access = self._access

        def run(db: Any) -> bool:
            row = self._admission(db, accounts.execution, lock=True)
            if row is None or row[4] is not None:
                return False
            session_id, principal, namespace, estimate, _, ts = row
            delta = actual_usd - float(estimate)
            state, head = self._load(db, session_id)
            spent = dataclasses.replace(state, spent_usd=max(0.0, state.spent_usd + delta))
            self._save(db, session_id, spent, head)
            for account in ("principal:" + principal, "namespace:" + namespace):
                self._set_spend(db, account, self._spent(db, account) + delta)
            seal = self.seals.seal(
                "policy_admissions",
                accounts.execution,
                session_id,
                principal,
                namespace,
                _usd(estimate),
                _usd(actual_usd),
                _usd(ts),
            )
            access.execute(
                db,
                "UPDATE policy_admissions SET actual_usd = ?, seal = ? WHERE execution = ?",
                (actual_usd, seal, accounts.execution),
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
            asked = self._approval(db, binding)
            if asked is None:
                raise KeyError(f"no approval was requested for {binding}")
            # the session's row first, as an evaluation locks it (then the approval's)
            state, _ = self._load(db, asked.session)
            found = self._approval(db, binding, lock=True)
            assert found is not None
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
            head = self._note(
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
            self._save(db, found.session, state, head)
            return True, decided

        return self._access.writing(run)

    def session(self, session: str) -> SessionState | None:
        def run(db: Any) -> SessionState | None:
            found = self._access.execute(
                db, "SELECT 1 FROM policy_sessions WHERE session = ?", (session,)
            ).fetchone()
            return None if found is None else self._load(db, session, lock=False)[0]

        return self._access.reading(run)

    def approvals(self, status: ApprovalStatus | None = None) -> list[Approval]:
        def run(db: Any) -> list[Approval]:
            sql = "SELECT binding FROM policy_approvals"
            bindings = [str(r[0]) for r in self._access.execute(db, sql).fetchall()]
            return [a for b in bindings if (a := self._approval(db, b)) is not None]

        found = self._access.reading(run)
        found = [a for a in found if status is None or a.status == status]
        return sorted(found, key=lambda a: a.requested_at)

    def open_circuits(self) -> dict[str, SessionState]:
        # the circuit is part of each session's document: a scan, for tools, never the hot path
        def run(db: Any) -> dict[str, SessionState]:
            rows = self._access.execute(
                db,
                "SELECT session FROM policy_sessions WHERE doc NOT LIKE ?",
                ('%"circuit":null%',),
            ).fetchall()
            return {str(r[0]): self._load(db, str(r[0]), lock=False)[0] for r in rows}

        states = self._access.reading(run)
        return {k: v for k, v in states.items() if v.circuit is not None}

    def spent(self, account: str) -> float:
        return self._access.reading(lambda db: self._spent(db, account, lock=False))

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
            state, _ = self._load(db, session)
            if state.circuit is None:
                return False
            head = self._note(
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
            self._save(db, session, reset_circuit(state), head)
            return True

        return self._access.writing(run)

    def sealed_rows(self, db: Any) -> list[tuple[str, str, Any, tuple[Any, ...]]]:
        """The spend's and the admissions' rows as ``journal verify`` checks their seals:
        (table, key, seal, the values the seal covers)."""
        access = self._access
        rows: list[tuple[str, str, Any, tuple[Any, ...]]] = [
            ("policy_spend", str(scope), seal, (_usd(spent),))
            for scope, spent, seal in access.execute(
                db, "SELECT scope, spent_usd, seal FROM policy_spend ORDER BY scope"
            ).fetchall()
        ]
        admitted = access.execute(
            db, f"SELECT execution, {_ADMISSION} FROM policy_admissions ORDER BY execution"
        ).fetchall()
        for execution, session, principal, namespace, estimate, actual, ts, seal in admitted:
            values = (session, principal, namespace, _usd(estimate), _usd(actual), _usd(ts))
            rows.append(("policy_admissions", str(execution), seal, values))
        return rows

    # -- the schema's upgrade ---------------------------------------------------------------------

    def seal_rows_tx(self, db: Any, url: str, schema: int) -> None:
        """The schema's upgrade to sealed policy rows (11): every row as it stands is sealed
        (a session's with its policy chain's head; a chain whose session has no row gets a
        fresh one), which blesses an edit made before the upgrade (the operator guide says so)."""
        access = self._access
        tables = ("policy_sessions", "policy_spend", "policy_admissions", "policy_approvals")
        counts = [access.execute(db, f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in tables]
        chains = access.execute(
            db, "SELECT effect_id, head FROM effects WHERE effect_type = ?", (POLICY_CHAIN_TYPE,)
        ).fetchall()
        if (any(counts) or chains) and not access.keyring.can_sign:
            raise JournalConfigError(
                f"journal {url} must be upgraded to schema {schema}, which seals the policy's "
                "rows as they stand: open it once with its signing key"
            )
        heads = {str(c).removeprefix("policy:"): str(h) for c, h in chains}
        sessions = access.execute(db, "SELECT session, doc FROM policy_sessions").fetchall()
        for session, doc in sessions:
            head = heads.pop(str(session), None)
            seal = self.seals.seal("policy_sessions", session, doc, head)
            access.execute(
                db,
                "UPDATE policy_sessions SET head = ?, seal = ? WHERE session = ?",
                (head, seal, session),
            )
        for session, head in heads.items():
            self._save(db, session, SessionState(), head)
        spends = access.execute(db, "SELECT scope, spent_usd FROM policy_spend").fetchall()
        for scope, spent in spends:
            access.execute(
                db,
                "UPDATE policy_spend SET seal = ? WHERE scope = ?",
                (self.seals.seal("policy_spend", scope, _usd(spent)), scope),
            )
        admitted = access.execute(
            db, f"SELECT execution, {_ADMISSION} FROM policy_admissions"
        ).fetchall()
        for execution, session, principal, namespace, estimate, actual, ts, _ in admitted:
            seal = self.seals.seal(
                "policy_admissions",
                execution,
                session,
                principal,
                namespace,
                _usd(estimate),
                _usd(actual),
                _usd(ts),
            )
            access.execute(
                db,
                "UPDATE policy_admissions SET seal = ? WHERE execution = ?",
                (seal, execution),
            )
        approvals = access.execute(db, "SELECT binding, doc FROM policy_approvals").fetchall()
        for binding, doc in approvals:
            access.execute(
                db,
                "UPDATE policy_approvals SET seal = ? WHERE binding = ?",
                (self.seals.seal("policy_approvals", binding, doc), binding),
            )

    # -- flow marks -----------------------------------------------------------------------------

    @functools.cached_property
    def flow_key(self) -> bytes:
        """The fingerprints' key: HKDF of the journal's signing key under its own label, so it
        fingerprints nothing else and a fingerprint is worthless without the keyring. A rotated
        journal key makes a new one: the marks made under the old key are no longer found (the
        flow rules forget what was fetched before the rotation)."""
        signing = DerivedKeys.of(self._access.keyring, FLOW_LABEL, "flow").signing
        if signing is None:
            raise JournalConfigError("flow provenance needs the journal's signing key")
        return signing.secret

    def flow_marks(self, scope: str, fingerprints: Collection[str]) -> dict[str, frozenset[str]]:
        """The marks of ``scope`` among ``fingerprints``: one statement through the primary key,
        the fingerprints as one JSON parameter."""
        if not fingerprints:
            return {}
        access = self._access
        rows = access.reading(
            lambda db: access.execute(
                db,
                "SELECT fp, label FROM flow_marks WHERE scope = ? AND fp IN "
                f"(SELECT f.value FROM {access.json_texts.format('f')})",
                (scope, json.dumps(sorted(fingerprints))),
            ).fetchall()
        )
        found: dict[str, set[str]] = {}
        for fp, label in rows:
            found.setdefault(str(fp), set()).add(str(label))
        return {fp: frozenset(labels) for fp, labels in found.items()}

    def mark_flow(
        self,
        scope: str,
        fingerprints: Sequence[str],
        labels: Sequence[str],
        *,
        now: float,
        cap: int,
    ) -> int:
        """Unsealed, unlike the policy's other rows, because of whom a seal would stop: a mark
        only ever adds an origin, so a forged one can only make a flow rule refuse, and a mark
        deleted (which no seal shows) makes it allow what it would have refused. Whoever can
        write the database can do the second whatever is sealed: provenance trusts the
        database's writers, as the journal's readers trust its disk. Cost: one upsert of every
        mark (fingerprints x labels, as two JSON parameters), a count through the scope's
        index and at most one delete."""
        if not fingerprints or not labels:
            return 0
        access = self._access

        def run(db: Any) -> int:
            texts = access.json_texts
            access.execute(
                db,
                "INSERT INTO flow_marks (scope, fp, label, ts) "
                f"SELECT ?, f.value, l.value, ? FROM {texts.format('f')}, {texts.format('l')} "
                "WHERE true ON CONFLICT (scope, fp, label) DO UPDATE SET ts = excluded.ts",
                (
                    scope,
                    now,
                    json.dumps(list(dict.fromkeys(fingerprints))),
                    json.dumps(list(dict.fromkeys(labels))),
                ),
            )
            (count,) = access.execute(
                db, "SELECT COUNT(*) FROM flow_marks WHERE scope = ?", (scope,)
            ).fetchone()
            excess = int(count) - cap
            if excess <= 0:
                return 0
            access.execute(
                db,
                "DELETE FROM flow_marks WHERE scope = ? AND (fp, label) IN ("
                "SELECT fp, label FROM flow_marks WHERE scope = ? "
                "ORDER BY ts, fp, label LIMIT ?)",
                (scope, scope, excess),
            )
            return excess

        return access.writing(run)

    def events(self, since: float | None = None) -> list[Entry]:
        rows = self._access.reading(
            lambda db: self._access.execute(
                db, "SELECT effect_id FROM effects WHERE effect_type = ?", (POLICY_CHAIN_TYPE,)
            ).fetchall()
        )
        entries = [e for (chain,) in rows for e in self._access.read(chain)]
        entries = [e for e in entries if since is None or e.ts >= since]
        return sorted(entries, key=lambda e: e.seq)
