"""Leases and their budgets, kept in the journal's database (``SqlAccess``). The dispatch
transaction checks a lease and reserves its budget through the ``*_tx`` methods, inside that
transaction."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ..leases import LeaseStore, lease_from_doc
from ..models import Lease
from .sql_access import SqlAccess

#: a lease, what its budget has reserved and this effect's own active charge (``lease_in``
#: reads them), for a backend whose write transaction holds the whole database: joined onto a
#: row (``LEASE_JOIN``, parameters: the lease id, the effect id) or read alone
LEASE_COLUMNS = "l.doc, s.reserved_cents, c.cents"
LEASE_JOIN = (
    "LEFT JOIN leases l ON l.lease_id = ? LEFT JOIN lease_spend s ON s.lease_id = l.lease_id "
    "LEFT JOIN lease_charges c ON c.effect_id = ? AND c.active = 1"
)
_LEASE_READ = f"SELECT {LEASE_COLUMNS} FROM (SELECT 1) {LEASE_JOIN}"


def lease_in(doc: Any, reserved: Any, own: Any) -> Lease | None:
    """The lease read as ``LEASE_COLUMNS`` (None: there is no such lease)."""
    return None if doc is None else _with_others(lease_from_doc(doc), reserved, own)


def _with_others(lease: Lease, reserved: Any, own: Any) -> Lease:
    """A budgeted lease with what its *other* effects hold reserved (its reservations, less
    this effect's own active charge); a lease without a budget as it is."""
    if lease.budget_cents is None:
        return lease
    others = int(reserved or 0) - (int(own) if own is not None else 0)
    return lease.model_copy(update={"reserved_cents": others})


def _lease_doc(lease: Lease) -> str:
    """A lease as stored: its reservations live in ``lease_spend``, never in the document."""
    return lease.model_dump_json(exclude={"reserved_cents"})


class SqlLeases(LeaseStore):
    """Leases, and their budgets: ``lease_spend`` holds what each budgeted lease has reserved,
    ``lease_charges`` each effect's reservation (at most one per effect, active or given
    back). The dispatch transaction calls the ``*_tx`` methods with its own connection."""

    def __init__(self, access: SqlAccess) -> None:
        self._access = access

    def _insert(self, lease: Lease) -> None:
        access = self._access

        def run(db: Any) -> None:
            access.execute(
                db,
                "INSERT INTO leases (lease_id, doc) VALUES (?, ?)",
                (lease.lease_id, _lease_doc(lease)),
            )
            if lease.budget_cents is not None:
                access.execute(
                    db,
                    "INSERT INTO lease_spend (lease_id, reserved_cents) VALUES (?, 0)",
                    (lease.lease_id,),
                )

        try:
            access.writing(run)
        except Exception as err:
            if access.is_unique_violation(err):
                raise ValueError("a lease with this lease_id already exists") from None
            raise

    def revoke(self, lease_id: str) -> bool:
        access = self._access

        def run(db: Any) -> bool:
            row = access.execute(
                db, f"SELECT doc FROM leases WHERE lease_id = ?{access.for_update}", (lease_id,)
            ).fetchone()
            if row is None:
                return False
            lease = Lease.model_validate_json(row[0])
            now = time.time()
            if lease.revoked_at is not None or (
                lease.expires_at is not None and lease.expires_at <= now
            ):
                return False
            revoked = lease.model_copy(update={"revoked_at": now})
            access.execute(
                db, "UPDATE leases SET doc = ? WHERE lease_id = ?", (_lease_doc(revoked), lease_id)
            )
            return True

        return access.writing(run)

    def _with_reserved(self, db: Any, lease: Lease) -> Lease:
        if lease.budget_cents is None:
            return lease
        row = self._access.execute(
            db, "SELECT reserved_cents FROM lease_spend WHERE lease_id = ?", (lease.lease_id,)
        ).fetchone()
        return lease.model_copy(update={"reserved_cents": int(row[0]) if row else 0})

    def get(self, lease_id: str) -> Lease | None:
        def run(db: Any) -> Lease | None:
            sql = "SELECT doc FROM leases WHERE lease_id = ?"
            row = self._access.execute(db, sql, (lease_id,)).fetchone()
            return None if row is None else self._with_reserved(db, lease_from_doc(row[0]))

        return self._access.reading(run)

    def list(self) -> list[Lease]:
        def run(db: Any) -> list[Lease]:
            rows = self._access.execute(db, "SELECT doc FROM leases ORDER BY lease_id").fetchall()
            return [self._with_reserved(db, lease_from_doc(r[0])) for r in rows]

        leases = self._access.reading(run)
        return sorted(leases, key=lambda lease: (lease.issued_at, lease.lease_id))

    # -- inside the journal's append transaction ------------------------------------------

    def read_tx(self, db: Any, lease_id: str, effect_id: str) -> Lease | None:
        """The lease as the dispatch transaction checks it. A budgeted lease's row in
        ``lease_spend`` is locked until the transaction ends, and read with what its *other*
        effects hold reserved, so concurrent dispatches under one budget take turns."""
        return self.ask_tx(db, lease_id, effect_id)()

    def ask_tx(self, db: Any, lease_id: str, effect_id: str) -> Callable[[], Lease | None]:
        """``read_tx``, its statements sent now and their rows read when the returned function
        is called. Where statements are pipelined, the reads a budget needs are sent at once
        with the lease's (one round trip with the statements around them); elsewhere they run
        only for a budgeted lease."""
        access = self._access
        if not (access.for_share or access.for_update):
            # the transaction holds the whole database (SQLite): one statement reads it all
            whole = lease_in(*access.execute(db, _LEASE_READ, (lease_id, effect_id)).fetchone())
            return lambda: whole
        doc = access.execute(
            db, f"SELECT doc FROM leases WHERE lease_id = ?{access.for_share}", (lease_id,)
        )
        asked = self._ask_budget(db, lease_id, effect_id) if access.pipelines else None

        def read() -> Lease | None:
            found = doc.fetchone()
            lease = None if found is None else lease_from_doc(found[0])
            if lease is None or lease.budget_cents is None:
                return lease
            spend, own = asked or self._ask_budget(db, lease_id, effect_id)
            (reserved,) = spend.fetchone() or (0,)
            held = own.fetchone()
            return _with_others(lease, reserved, None if held is None else held[0])

        return read

    def _ask_budget(self, db: Any, lease_id: str, effect_id: str) -> tuple[Any, Any]:
        """What a budgeted lease's check reads: its reserved total (locked until the
        transaction ends) and what this effect holds of it; the two cursors."""
        access = self._access
        spend = access.execute(
            db,
            f"SELECT reserved_cents FROM lease_spend WHERE lease_id = ?{access.for_update}",
            (lease_id,),
        )
        own = access.execute(
            db,
            "SELECT cents FROM lease_charges WHERE effect_id = ? AND active = 1",
            (effect_id,),
        )
        return spend, own

    def charge_tx(self, db: Any, effect_id: str, lease_id: str, cents: int) -> bool:
        """Reserve ``cents`` of ``lease_id`` for ``effect_id``, once: an effect that holds a
        reservation already keeps it. True when this reserved something."""
        access = self._access
        # one statement: a held reservation is left as it is (no row changes)
        taken = access.execute(
            db,
            "INSERT INTO lease_charges (effect_id, lease_id, cents, active) VALUES (?, ?, ?, 1) "
            "ON CONFLICT (effect_id) DO UPDATE SET lease_id = excluded.lease_id, "
            "cents = excluded.cents, active = 1 WHERE lease_charges.active <> 1",
            (effect_id, lease_id, cents),
        )
        if access.pipelines:
            access.settle(db)
        if taken.rowcount != 1:
            return False
        access.execute(
            db,
            "UPDATE lease_spend SET reserved_cents = reserved_cents + ? WHERE lease_id = ?",
            (cents, lease_id),
        )
        return True

    def release_tx(self, db: Any, effect_id: str) -> None:
        """Give back ``effect_id``'s reservation: it ended without executing."""
        access = self._access
        held = access.execute(
            db,
            f"SELECT lease_id, cents FROM lease_charges WHERE effect_id = ? AND active = 1"
            f"{access.for_update}",
            (effect_id,),
        ).fetchone()
        if held is None:
            return
        lease_id, cents = held
        access.execute(db, "UPDATE lease_charges SET active = 0 WHERE effect_id = ?", (effect_id,))
        access.execute(
            db,
            "UPDATE lease_spend SET reserved_cents = reserved_cents - ? WHERE lease_id = ?",
            (cents, lease_id),
        )

    def recharge_tx(self, db: Any, effect_id: str) -> bool:
        """A late COMMITTED of an effect that gave its reservation back: it executed after all,
        so it is charged again, budget or not. True when it was."""
        sql = "SELECT lease_id, cents, active FROM lease_charges WHERE effect_id = ?"
        held = self._access.execute(db, sql, (effect_id,)).fetchone()
        if held is None or int(held[2]) == 1:
            return False
        return self.charge_tx(db, effect_id, str(held[0]), int(held[1]))
