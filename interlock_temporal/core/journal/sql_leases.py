"""Leases and their budgets, kept in the journal's database (``JournalAccess``). The dispatch
transaction checks a lease and reserves its budget through the ``*_tx`` methods, inside that
transaction.

A lease is a chain of signed entries (``lease:<lease id>``: ``issued``, ``revoked``, each
with the whole lease after it); its ``leases`` row is their product, sealed with the chain's
head (``row_seals``), and ``lease_spend`` (what its budget has reserved) is sealed too. A read
checks both seals and that the head the row was sealed with is the chain's head now: an edited
row, or an older one put back, is refused (``RowCorrupt``) and nothing is sent on it."""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from typing import Any

from ..errors import JournalConfigError, RowCorrupt
from ..leases import LeaseStore, delegated, lease_from_doc
from ..models import Draft, Kind, Lease
from ..row_seals import RowSeals
from .interface import LEASE_CHAIN_TYPE, lease_chain
from .sql_access import JournalAccess

#: an effect's reservation as its index row keeps it (``charge_lease_id``, ``charge_cents``,
#: ``charge_active``): the lease, the cents and whether they are held now (False: given back).
#: None: the effect never reserved anything. At most one per effect.
Held = tuple[str, int, bool] | None
#: the effects row's columns that keep its reservation (named ``charge_*`` in the schema)
RESERVATION_COLUMNS = "charge_lease_id, charge_cents, charge_active"
#: a ``leases`` row as read alone
_ROW = "doc, head_seq, head_hash, seal"

#: a lease's row as a read checks it (``LeaseRead``): its document, the chain head it was
#: sealed with and its seal, the chain's head as the journal indexes it, and what its budget
#: has reserved with that row's seal; for a backend whose write transaction holds the whole
#: database: joined onto a row (``LEASE_JOIN``, its parameter: the lease id) or read alone
LEASE_COLUMNS = "l.doc, l.head_seq, l.head_hash, l.seal, c.head, s.reserved_cents, s.seal"
LEASE_JOIN = (
    "LEFT JOIN leases l ON l.lease_id = ? "
    "LEFT JOIN effects c ON c.effect_id = 'lease:' || l.lease_id "
    "LEFT JOIN lease_spend s ON s.lease_id = l.lease_id"
)
#: the same, for a backend with row locks (PostgreSQL), as laterals the dispatch transaction's
#: read of the effect's row adds (parameters: the lease id, twice): the lease is kept from
#: changing (a revoke waits for the dispatch to be recorded) and its budget's row locked till
#: the transaction ends (appends already take turns on the seq's lock; this one also holds
#: against any other writer of the row). The chain's head needs no lock: a change of the
#: lease appends to its chain, which waits for the seq's lock the dispatch holds.
LEASE_LATERALS = (
    " LEFT JOIN LATERAL (SELECT lease_id, doc, head_seq, head_hash, seal FROM leases "
    "WHERE lease_id = ? "
    "FOR SHARE) l ON true"
    " LEFT JOIN LATERAL (SELECT head FROM effects WHERE effect_id = 'lease:' || l.lease_id) c "
    "ON true"
    " LEFT JOIN LATERAL (SELECT reserved_cents, seal FROM lease_spend WHERE lease_id = ? "
    "FOR UPDATE) s ON true"
)
#: how many values ``LEASE_COLUMNS`` reads
LEASE_WIDTH = 7
# the statements above name a lease's chain as ``lease_chain`` does: 'lease:' || lease_id
assert lease_chain("x") == "lease:x"


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


def _as_read(lease: Lease, head: str, reserved: Any, own: Any) -> Lease:
    """The lease as a read gives it (one copy): with its chain's ``head``, and, if it has a
    budget, what its *other* effects hold reserved (its reservations, less this effect's own
    active reservation)."""
    update: dict[str, Any] = {"head": head}
    if lease.budget_cents is not None:
        update["reserved_cents"] = int(reserved or 0) - (int(own) if own is not None else 0)
    return lease.model_copy(update=update)


#: what a read adds to a lease, never stored: its reservations, its chain's head
_UNSTORED = frozenset({"reserved_cents", "head"})


def _lease_doc(lease: Lease) -> str:
    """A lease as stored: its reservations live in ``lease_spend``, its head in the row's own
    columns, never in the document."""
    return lease.model_dump_json(exclude={*_UNSTORED, *lease.dumped_without()})


def _lease_data(lease: Lease) -> dict[str, Any]:
    """A lease as its chain's entries sign it (what ``journal verify`` derives its row from)."""
    return lease.model_dump(mode="json", exclude={*_UNSTORED, *lease.dumped_without()})


class SqlLeases(LeaseStore):
    """Leases, and their budgets: ``lease_spend`` holds what each budgeted lease has reserved,
    each effect's index row its reservation (``Held``: at most one per effect, active or
    given back). The dispatch transaction reads a lease with ``lease_in`` and calls the
    ``*_tx`` methods with its own connection: they move ``lease_spend``, and return the
    reservation the append writes on the effect's row, with the statement that writes the row
    anyway."""

    def __init__(self, access: JournalAccess) -> None:
        self._access = access

    @functools.cached_property
    def seals(self) -> RowSeals:
        """The seals of the leases' rows (made once the journal's keyring is known)."""
        return RowSeals(self._access.keyring)

    # -- issuing and revoking: a signed entry, and the row that is its product ---------------

    def _insert(self, lease: Lease, parent: str | None = None) -> None:
        access = self._access

        def run(db: Any) -> None:
            nonlocal lease
            if parent is not None:
                # the seq's lock first, as a revoke takes it: the parent cannot change until
                # the child is written, and the two never wait on each other
                access.hold_seq(db)
                row = access.execute(
                    db,
                    f"SELECT {_ROW} FROM leases WHERE lease_id = ?{access.for_update}",
                    (parent,),
                ).fetchone()
                read = None if row is None else self._checked(db, parent, row)
                lease = delegated(read, lease, lease.issued_at)
            found = access.execute(
                db, "SELECT 1 FROM leases WHERE lease_id = ?", (lease.lease_id,)
            ).fetchone()
            if found is not None:
                raise ValueError("a lease with this lease_id already exists")
            doc = _lease_doc(lease)
            head = self._append(db, lease.lease_id, "issued", lease)
            access.execute(
                db,
                "INSERT INTO leases (lease_id, doc, head_seq, head_hash, seal) "
                "VALUES (?, ?, ?, ?, ?)",
                (lease.lease_id, doc, *head, self._lease_seal(lease.lease_id, doc, *head)),
            )
            if lease.budget_cents is not None:
                access.execute(
                    db,
                    "INSERT INTO lease_spend (lease_id, reserved_cents, seal) VALUES (?, 0, ?)",
                    (lease.lease_id, self._spend_seal(lease.lease_id, 0)),
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
            # the seq's lock first, as every append takes it: a dispatch holds it, then the
            # lease; taking the lease first here could wait on a dispatch that waits on it
            access.hold_seq(db)
            row = access.execute(
                db,
                f"SELECT {_ROW} FROM leases WHERE lease_id = ?{access.for_update}",
                (lease_id,),
            ).fetchone()
            if row is None:
                return False
            lease = self._checked(db, lease_id, row)
            now = time.time()
            if lease.revoked_at is not None or (
                lease.expires_at is not None and lease.expires_at <= now
            ):
                return False
            revoked = lease.model_copy(update={"revoked_at": now})
            self._put(db, revoked, "revoked")
            return True

        return access.writing(run)

    def _append(self, db: Any, lease_id: str, event: str, lease: Lease) -> tuple[int, str]:
        """Sign ``event`` (with the whole lease after it) onto the lease's chain; its head."""
        (entry,) = self._access.append_within(
            db,
            lease_chain(lease_id),
            [Draft(kind=Kind.CONFIG, data={"event": event, "lease": _lease_data(lease)})],
            effect_type=LEASE_CHAIN_TYPE,
        )
        return entry.seq, entry.hash

    def _put(self, db: Any, lease: Lease, event: str) -> None:
        """A change of a lease: its signed entry, and its row sealed with the chain's head."""
        doc = _lease_doc(lease)
        head = self._append(db, lease.lease_id, event, lease)
        self._access.execute(
            db,
            "UPDATE leases SET doc = ?, head_seq = ?, head_hash = ?, seal = ? WHERE lease_id = ?",
            (doc, *head, self._lease_seal(lease.lease_id, doc, *head), lease.lease_id),
        )

    def seal_rows_tx(self, db: Any, url: str, schema: int) -> None:
        """The schema's upgrade to sealed leases (10): each lease as its row stands gets a
        chain of one signed ``migrated`` entry, and its row and its budget's are sealed. This
        blesses the rows as they are, an edit made before the upgrade included (``interlock
        journal verify`` cannot tell it apart): the operator guide says so."""
        access = self._access
        rows = access.execute(db, "SELECT lease_id, doc FROM leases ORDER BY lease_id").fetchall()
        spends = access.execute(db, "SELECT lease_id, reserved_cents FROM lease_spend").fetchall()
        if (rows or spends) and not access.keyring.can_sign:
            raise JournalConfigError(
                f"journal {url} must be upgraded to schema {schema}, which signs its leases as "
                "they stand: open it once with its signing key"
            )
        for lease_id, doc in rows:
            lease = lease_from_doc(doc)
            head = self._append(db, lease_id, "migrated", lease)
            access.execute(
                db,
                "UPDATE leases SET head_seq = ?, head_hash = ?, seal = ? WHERE lease_id = ?",
                (*head, self._lease_seal(lease_id, doc, *head), lease_id),
            )
        for lease_id, reserved in spends:
            access.execute(
                db,
                "UPDATE lease_spend SET seal = ? WHERE lease_id = ?",
                (self._spend_seal(lease_id, int(reserved)), lease_id),
            )

    # -- seals ----------------------------------------------------------------------------

    def _lease_seal(self, lease_id: str, doc: str, head_seq: int, head_hash: str) -> str:
        return self.seals.seal("leases", lease_id, doc, head_seq, head_hash)

    def _spend_seal(self, lease_id: str, reserved: int) -> str:
        return self.seals.seal("lease_spend", lease_id, reserved)

    def lease_in(self, found: Sequence[Any], own: Any) -> Lease | None:
        """The lease read as ``LEASE_COLUMNS``, checked (``RowCorrupt`` when a seal does not
        match or the row is older than its chain), with ``own``: what the effect that reads it
        holds reserved now (``own_cents``). None: there is no such lease."""
        doc, head_seq, head_hash, seal, chain_head, reserved, spend_seal = found
        if doc is None:
            return None
        lease = lease_from_doc(doc)
        lease_id = lease.lease_id
        self.seals.check_cached("leases", lease_id, seal, doc, head_seq, head_hash)
        if chain_head != head_hash:
            raise RowCorrupt.of(
                "leases",
                lease_id,
                "it is not the latest of its chain's signed entries (an older row put back)",
            )
        if lease.budget_cents is not None:
            if reserved is None:
                raise RowCorrupt.of("lease_spend", lease_id, "the budgeted lease has no row")
            self.seals.check("lease_spend", lease_id, spend_seal, int(reserved))
        return _as_read(lease, f"{head_seq}:{head_hash}", reserved, own)

    def _checked(self, db: Any, lease_id: str, row: Sequence[Any]) -> Lease:
        """A ``leases`` row read alone (``_ROW``), checked as ``lease_in`` checks it."""
        doc, head_seq, head_hash, seal = row
        chain = self._access.execute(
            db, "SELECT head FROM effects WHERE effect_id = ?", (lease_chain(lease_id),)
        ).fetchone()
        spend = self._access.execute(
            db, "SELECT reserved_cents, seal FROM lease_spend WHERE lease_id = ?", (lease_id,)
        ).fetchone()
        found = (
            doc,
            head_seq,
            head_hash,
            seal,
            chain[0] if chain else None,
            *(spend or (None, None)),
        )
        lease = self.lease_in(found, None)
        assert lease is not None
        return lease

    def get(self, lease_id: str) -> Lease | None:
        """The lease, checked; a delegated one with its ancestors as they are now
        (``delegators``), so ``check_lease`` can judge it whole."""

        def run(db: Any) -> Lease | None:
            sql = f"SELECT {_ROW} FROM leases WHERE lease_id = ?"
            row = self._access.execute(db, sql, (lease_id,)).fetchone()
            if row is None:
                return None
            lease = self._checked(db, lease_id, row)
            return self.delegators_tx(db, lease, None) if lease.ancestors else lease

        return self._access.reading(run)

    def list(self) -> list[Lease]:
        def run(db: Any) -> list[Lease]:
            sql = f"SELECT lease_id, {_ROW} FROM leases ORDER BY lease_id"
            rows = self._access.execute(db, sql).fetchall()
            return [self._checked(db, r[0], r[1:]) for r in rows]

        leases = self._access.reading(run)
        return sorted(leases, key=lambda lease: (lease.issued_at, lease.lease_id))

    # -- inside the journal's append transaction ------------------------------------------

    def delegators_tx(self, db: Any, lease: Lease, own: Any) -> Lease:
        """A delegated ``lease`` with its ancestors (``delegators``), read in one statement and
        each checked as ``lease_in`` checks a lease (its seals, its chain's head), with what
        their budgets have reserved less ``own`` (this effect's active reservation, which its
        moves put on every ancestor too). A root lease never comes here: a dispatch under one
        reads nothing more. On PostgreSQL the ancestors' rows are held ``FOR SHARE``; their
        chains and budgets change only in appends, which take turns on the seq's lock this
        transaction holds. An ancestor not found is left out, and ``check_lease`` refuses."""
        ancestors = lease.ancestors or []
        marks = ", ".join("?" for _ in ancestors)
        lock = " FOR SHARE OF l" if self._access.for_update else ""
        rows = self._access.execute(
            db,
            f"SELECT {LEASE_COLUMNS} FROM leases l "
            "LEFT JOIN effects c ON c.effect_id = 'lease:' || l.lease_id "
            "LEFT JOIN lease_spend s ON s.lease_id = l.lease_id "
            f"WHERE l.lease_id IN ({marks}){lock}",
            tuple(ancestors),
        ).fetchall()
        read = {}
        for found in rows:
            above = self.lease_in(found, own)
            assert above is not None
            read[above.lease_id] = above
        delegators = [read[a] for a in ancestors if a in read]
        return lease.model_copy(update={"delegators": delegators})

    def _above_tx(self, db: Any, lease_id: str) -> tuple[Lease, ...]:
        """The budgeted ancestors of ``lease_id`` (nearest first), read and checked, for a
        move of its budget in a transaction that did not read the lease (a REFUSED that gives
        a reservation back, a late COMMITTED): its document (its seal checked; its ancestors
        are fixed at issue, so any version of it names the same) and, if delegated, its
        ancestors' rows. One statement for a root lease."""
        row = self._access.execute(
            db, f"SELECT {_ROW} FROM leases WHERE lease_id = ?", (lease_id,)
        ).fetchone()
        if row is None:
            raise RowCorrupt.of("leases", lease_id, "an effect holds a reservation on it")
        doc, head_seq, head_hash, seal = row
        self.seals.check_cached("leases", lease_id, seal, doc, head_seq, head_hash)
        lease = lease_from_doc(doc)
        if not lease.ancestors:
            return ()
        read = self.delegators_tx(db, lease, None).delegators or []
        if len(read) != len(lease.ancestors):
            raise RowCorrupt.of("leases", lease_id, "an ancestor of the lease has no row")
        return tuple(a for a in read if a.budget_cents is not None)

    def spend_tx(self, db: Any, lease_id: str, cents: int, known: int | None = None) -> int:
        """Move what ``lease_id``'s budget has reserved by ``cents``, written back with a new
        seal; the total after. ``known``: the total as this transaction already read and
        checked it (``lease_in``, under the dispatch's lock); else the row is read and its seal
        checked here, under the append's lock."""
        access = self._access
        if known is None:
            row = access.execute(
                db,
                f"SELECT reserved_cents, seal FROM lease_spend WHERE lease_id = ?"
                f"{access.for_update}",
                (lease_id,),
            ).fetchone()
            if row is None:
                raise RowCorrupt.of("lease_spend", lease_id, "the budgeted lease has no row")
            self.seals.check("lease_spend", lease_id, row[1], int(row[0]))
            known = int(row[0])
        reserved = known + cents
        access.execute(
            db,
            "UPDATE lease_spend SET reserved_cents = ?, seal = ? WHERE lease_id = ?",
            (reserved, self._spend_seal(lease_id, reserved), lease_id),
        )
        return reserved

    def keep_tx(
        self, db: Any, held: Held, drafts: Sequence[Draft], read: Lease | None = None
    ) -> Held:
        """Budgets move with the entries that change them, in their transaction: a DISPATCHED
        that reserves (its ``budget`` note), a REFUSED (it never executed: give the reservation
        back), a late COMMITTED after a REFUSED (it did: reserve it again). The effect's reservation
        after ``drafts``, from ``held``, the one its row holds (read under the append's lock),
        for the append to write on the row. ``read``: the lease as this transaction read and
        checked it (``lease_in``), whose budget's total is then not read again."""
        budget = _Budget(self, db, read, held)
        now = held
        for draft in drafts:
            if draft.kind is Kind.DISPATCHED:
                note = draft.data.get("budget")
                if note is not None and not (now is not None and now[2]):
                    # at most one reservation per effect: one it holds already, it keeps
                    budget.move(note["lease_id"], note["cents"])
                    now = (note["lease_id"], note["cents"], True)
            elif draft.kind is Kind.REFUSED and now is not None and now[2]:
                # it ended without executing: given back
                budget.move(now[0], -now[1])
                now = (now[0], now[1], False)
            elif (
                draft.kind is Kind.COMMITTED
                and draft.data.get("after") == Kind.REFUSED.value
                and now is not None
                and not now[2]
            ):
                # it executed after all: reserved again, whatever the budget holds
                budget.move(now[0], now[1])
                now = (now[0], now[1], True)
        return now


class _Budget:
    """One append's moves of a lease's budget, and of each budgeted ancestor's by the same
    cents (a delegated lease's spend counts against every ancestor). The first move of a lease
    the transaction read (the lease and its ``delegators``) starts from the total it read and
    checked (``lease_in``); any other reads its row. The ancestors of a lease the transaction
    did not read are read once (``_above_tx``)."""

    def __init__(self, leases: SqlLeases, db: Any, read: Lease | None, held: Held) -> None:
        self._leases, self._db = leases, db
        self._totals: dict[str, int] = {}
        self._above: dict[str, list[str]] = {}
        if read is not None:
            # the lease as read holds its *other* effects' reservations: this one's too
            own = own_cents(held) or 0
            for lease in (read, *(read.delegators or ())):
                if lease.budget_cents is not None and lease.reserved_cents is not None:
                    self._totals[lease.lease_id] = lease.reserved_cents + own
            self._above[read.lease_id] = [
                a.lease_id for a in read.delegators or () if a.budget_cents is not None
            ]

    def move(self, lease_id: str, cents: int) -> None:
        above = self._above.get(lease_id)
        if above is None:
            found = self._leases._above_tx(self._db, lease_id)
            for a in found:
                assert a.reserved_cents is not None
                self._totals.setdefault(a.lease_id, a.reserved_cents)
            above = self._above[lease_id] = [a.lease_id for a in found]
        for each in (lease_id, *above):
            known = self._totals.get(each)
            self._totals[each] = self._leases.spend_tx(self._db, each, cents, known)
