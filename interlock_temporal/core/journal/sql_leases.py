"""Leases and their budgets, kept in the journal's database (``SqlAccess``). The dispatch
transaction checks a lease and reserves its budget through the ``*_tx`` methods, inside that
transaction."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from ..leases import LeaseStore, lease_from_doc
from ..models import Draft, Kind, Lease
from .sql_access import SqlAccess

#: an effect's reservation as its index row keeps it (``charge_lease_id``, ``charge_cents``,
#: ``charge_active``): the lease, the cents and whether they are held now (False: given back).
#: None: the effect never reserved anything. At most one per effect.
Held = tuple[str, int, bool] | None
#: the effects row's columns that keep its reservation (named ``charge_*`` in the schema)
RESERVATION_COLUMNS = "charge_lease_id, charge_cents, charge_active"

#: a lease and what its budget has reserved (``lease_in`` reads them with the effect's own
#: active reservation, from its row), for a backend whose write transaction holds the whole
#: database: joined onto a row (``LEASE_JOIN``, its parameter: the lease id) or read alone
LEASE_COLUMNS = "l.doc, s.reserved_cents"
LEASE_JOIN = (
    "LEFT JOIN leases l ON l.lease_id = ? LEFT JOIN lease_spend s ON s.lease_id = l.lease_id"
)
#: the same two, for a backend with row locks (PostgreSQL), as columns the dispatch
#: transaction's read of the effect's row adds (parameters: the lease id, twice): the lease is
#: kept from changing (a revoke waits for the dispatch to be recorded) and its budget's row
#: locked till the transaction ends (appends already take turns on the seq's lock; this one
#: also holds against any other writer of the row)
LEASE_LOCKED_COLUMNS = (
    "(SELECT doc FROM leases WHERE lease_id = ? FOR SHARE), "
    "(SELECT reserved_cents FROM lease_spend WHERE lease_id = ? FOR UPDATE)"
)


def held_in(columns: Sequence[Any] | None) -> Held:
    """The reservation read from an effect's row (its ``RESERVATION_COLUMNS``; None: no row)."""
    if columns is None or columns[0] is None:
        return None
    return (str(columns[0]), int(columns[1]), bool(columns[2]))


def held_columns(held: Held) -> tuple[str | None, int | None, int | None]:
    """``held`` as the effect's row keeps it (``RESERVATION_COLUMNS``)."""
    return (None, None, None) if held is None else (held[0], held[1], int(held[2]))


def own_cents(held: Held) -> int | None:
    """What ``held`` holds reserved now (None: nothing)."""
    return held[1] if held is not None and held[2] else None


def lease_in(doc: Any, reserved: Any, own: Any) -> Lease | None:
    """The lease read as ``LEASE_COLUMNS``, with ``own``: what the effect that reads it holds
    reserved now (``own_cents``). None: there is no such lease."""
    return None if doc is None else _with_others(lease_from_doc(doc), reserved, own)


def _with_others(lease: Lease, reserved: Any, own: Any) -> Lease:
    """A budgeted lease with what its *other* effects hold reserved (its reservations, less
    this effect's own active reservation); a lease without a budget as it is."""
    if lease.budget_cents is None:
        return lease
    others = int(reserved or 0) - (int(own) if own is not None else 0)
    return lease.model_copy(update={"reserved_cents": others})


def _lease_doc(lease: Lease) -> str:
    """A lease as stored: its reservations live in ``lease_spend``, never in the document."""
    return lease.model_dump_json(exclude={"reserved_cents"})


class SqlLeases(LeaseStore):
    """Leases, and their budgets: ``lease_spend`` holds what each budgeted lease has reserved,
    each effect's index row its reservation (``Held``: at most one per effect, active or
    given back). The dispatch transaction calls the ``*_tx`` methods with its own connection:
    they move ``lease_spend``, and return the reservation the append writes on the effect's row,
    with the statement that writes the row anyway."""

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

    def _spend(self, db: Any, lease_id: str, cents: int) -> None:
        self._access.execute(
            db,
            "UPDATE lease_spend SET reserved_cents = reserved_cents + ? WHERE lease_id = ?",
            (cents, lease_id),
        )

    def keep_tx(self, db: Any, held: Held, drafts: Sequence[Draft]) -> Held:
        """Budgets move with the entries that change them, in their transaction: a DISPATCHED
        that reserves (its ``budget`` note), a REFUSED (it never executed: give the reservation
        back), a late COMMITTED after a REFUSED (it did: reserve it again). The effect's reservation
        after ``drafts``, from ``held``, the one its row holds (read under the append's lock),
        for the append to write on the row."""
        now = held
        for draft in drafts:
            if draft.kind is Kind.DISPATCHED:
                note = draft.data.get("budget")
                if note is not None:
                    now = self.reserve_tx(db, now, note["lease_id"], note["cents"])
            elif draft.kind is Kind.REFUSED:
                now = self.release_tx(db, now)
            elif draft.kind is Kind.COMMITTED and draft.data.get("after") == Kind.REFUSED.value:
                now = self.reserve_again_tx(db, now)
        return now

    def reserve_tx(self, db: Any, held: Held, lease_id: str, cents: int) -> Held:
        """Reserve ``cents`` of ``lease_id`` for an effect whose row holds ``held``, once: an
        effect that holds a reservation already keeps it. The effect's reservation after it."""
        if held is not None and held[2]:
            return held
        self._spend(db, lease_id, cents)
        return (lease_id, cents, True)

    def release_tx(self, db: Any, held: Held) -> Held:
        """Give back an effect's reservation: it ended without executing."""
        if held is None or not held[2]:
            return held
        lease_id, cents, _ = held
        self._spend(db, lease_id, -cents)
        return (lease_id, cents, False)

    def reserve_again_tx(self, db: Any, held: Held) -> Held:
        """A late COMMITTED of an effect that gave its reservation back: it executed after all,
        so it is reserved again, budget or not."""
        if held is None or held[2]:
            return held
        return self.reserve_tx(db, held, held[0], held[1])
