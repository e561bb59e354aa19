"""A simulated payments service: the reference target, and the money the fault tests read.

File-backed (SQLite), so several worker processes share it and a refund made by a worker that
was then killed is still there. Configurable to the three tiers:

- tier 1: dedupes a resend carrying the same idempotency key inside a window, and is queryable;
- tier 2: queryable by the effect id stored with the refund, no dedupe;
- tier 3: neither (the key is ignored; nothing can be looked up).

Fault hooks, armed in the file so the process that fires them may be any worker: kill the
calling process (SIGKILL) before the send or after the refund commits, stall, lose eligibility,
refund by hand; plus a clock offset to walk past the dedupe window.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import sqlite3
import threading
import time
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from ..core.identity import digest
from ..core.models import Change, Found
from ..core.targets import BaseTarget, Classification, default_validate
from ._faults import FaultAction, FaultPlan, FaultPoint, SimulatedCrash

__all__ = [
    "FaultAction",
    "FaultPoint",
    "IdempotencyConflict",
    "PaymentsUnavailable",
    "RefundRecord",
    "RefundRejected",
    "RefundRequest",
    "RefundResult",
    "SimulatedCrash",
    "SimulatedPayments",
]


class RefundRequest(BaseModel):
    """The approved decision: refund ``amount_cents`` of ``order_id`` for ``case_id``."""

    model_config = ConfigDict(frozen=True)

    case_id: str
    order_id: str
    amount_cents: int
    reason: str = ""
    premises: dict[str, Any] | None = None


class RefundResult(BaseModel):
    refund_id: str
    order_id: str
    amount_cents: int
    replayed: bool = False


class RefundRecord(BaseModel):
    refund_id: str
    order_id: str
    amount_cents: int
    source: str
    effect_id: str | None
    created_at: float


class RefundRejected(Exception):
    """The service refused the refund before doing anything (confirmed: nothing happened)."""


class IdempotencyConflict(Exception):
    """Tier 1: the key was used with a different request inside the window."""


class PaymentsUnavailable(Exception):
    """The request never reached the service (connection refused)."""


_SCHEMA = """
CREATE TABLE IF NOT EXISTS orders (
    order_id TEXT PRIMARY KEY, paid_cents INTEGER NOT NULL, eligible INTEGER NOT NULL,
    disputed INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS refunds (
    refund_id TEXT PRIMARY KEY, order_id TEXT NOT NULL, amount_cents INTEGER NOT NULL,
    source TEXT NOT NULL, effect_id TEXT, idempotency_key TEXT, request_digest TEXT,
    created_at REAL NOT NULL);
CREATE INDEX IF NOT EXISTS refunds_order ON refunds (order_id);
CREATE INDEX IF NOT EXISTS refunds_effect ON refunds (effect_id);
CREATE INDEX IF NOT EXISTS refunds_key ON refunds (idempotency_key);
CREATE TABLE IF NOT EXISTS calls (
    seq INTEGER PRIMARY KEY, order_id TEXT, amount_cents INTEGER, idempotency_key TEXT,
    outcome TEXT, pid INTEGER, ts REAL);
CREATE TABLE IF NOT EXISTS settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


class SimulatedPayments(BaseTarget):
    """The service and its target adapter in one object (a real adapter wraps a client). Its
    declared ``tier`` is the one it is configured to."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        tier: int = 2,
        *,
        name: str = "payments",
        settle_time: timedelta = timedelta(0),
        dedupe_window: timedelta = timedelta(hours=24),
    ) -> None:
        if tier not in (1, 2, 3):
            raise ValueError("tier must be 1, 2 or 3")
        self.path = Path(path)
        self.tier = tier
        self.name = name
        self.settle_time = settle_time
        self.dedupe_window: timedelta | None = dedupe_window if tier == 1 else None
        if tier <= 2:
            self.query = self._query
        self._lock = threading.Lock()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(
            self.path, isolation_level=None, check_same_thread=False, timeout=30
        )
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        with self._lock:
            self._db.executescript(_SCHEMA)
        self.faults = FaultPlan(self.path)

    def __repr__(self) -> str:
        return f"SimulatedPayments({str(self.path)!r}, tier={self.tier})"

    def _tx(self, fn: Any) -> Any:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                result = fn(self._db)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
            return result

    def _read(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._db.execute(sql, params).fetchall()

    # -- the world (operators, scenario scripts) --------------------------------------------

    def open_order(
        self, order_id: str, paid_cents: int, *, eligible: bool = True, disputed: bool = False
    ) -> str:
        """Record a paid order; returns its id (what refund requests name)."""
        self._tx(
            lambda db: db.execute(
                "INSERT OR REPLACE INTO orders (order_id, paid_cents, eligible, disputed) "
                "VALUES (?, ?, ?, ?)",
                (order_id, paid_cents, int(eligible), int(disputed)),
            )
        )
        return order_id

    def set_eligible(self, order_id: str, eligible: bool) -> None:
        self._tx(
            lambda db: db.execute(
                "UPDATE orders SET eligible = ? WHERE order_id = ?", (int(eligible), order_id)
            )
        )

    def manual_refund(self, order_id: str, amount_cents: int) -> str:
        """Support refunds by hand: no key, no effect id."""
        refund_id = "re_manual_" + secrets.token_hex(6)
        now = self.clock()
        self._tx(
            lambda db: db.execute(
                "INSERT INTO refunds (refund_id, order_id, amount_cents, source, created_at) "
                "VALUES (?, ?, ?, 'manual', ?)",
                (refund_id, order_id, amount_cents, now),
            )
        )
        return refund_id

    def advance_clock(self, seconds: float) -> None:
        """Move the service's clock (and the dedupe window measured on it) forward."""

        def run(db: sqlite3.Connection) -> None:
            row = db.execute("SELECT value FROM settings WHERE key = 'clock_offset'").fetchone()
            offset = float(row[0]) if row else 0.0
            db.execute(
                "INSERT OR REPLACE INTO settings (key, value) VALUES ('clock_offset', ?)",
                (str(offset + seconds),),
            )

        self._tx(run)

    def clock(self) -> float:
        row = self._read("SELECT value FROM settings WHERE key = 'clock_offset'")
        return time.time() + (float(row[0][0]) if row else 0.0)

    def arm(
        self, point: FaultPoint, action: FaultAction, *, arg: float | None = None, count: int = 1
    ) -> None:
        """Arm a fault that fires ``count`` times at ``point``, in whichever process gets there."""
        self.faults.arm(point, action, arg=arg, count=count)

    def disarm(self) -> None:
        self.faults.disarm()

    def _fire(self, point: str, order_id: str) -> float:
        """Run the faults armed at ``point``; returns how long to stall."""

        def unavailable(_: float | None) -> None:
            raise PaymentsUnavailable("connection refused")

        def by_hand(arg: float | None) -> None:
            self.manual_refund(order_id, int(arg or 0))

        return self.faults.fire(
            point,
            {
                "make_ineligible": lambda _: self.set_eligible(order_id, False),
                "manual_refund": by_hand,
                "unavailable": unavailable,
            },
        )

    # -- reading the money --------------------------------------------------------------------

    def refund_records(self, order_id: str) -> list[RefundRecord]:
        rows = self._read(
            "SELECT refund_id, order_id, amount_cents, source, effect_id, created_at FROM refunds "
            "WHERE order_id = ? ORDER BY created_at",
            (order_id,),
        )
        return [
            RefundRecord(
                refund_id=r[0],
                order_id=r[1],
                amount_cents=r[2],
                source=r[3],
                effect_id=r[4],
                created_at=r[5],
            )
            for r in rows
        ]

    def refunded_cents(self, order_id: str) -> int:
        return sum(r.amount_cents for r in self.refund_records(order_id))

    def calls(self, order_id: str | None = None) -> int:
        """How many refund requests reached the service (replays included)."""
        if order_id is None:
            return int(self._read("SELECT COUNT(*) FROM calls")[0][0])
        return int(self._read("SELECT COUNT(*) FROM calls WHERE order_id = ?", (order_id,))[0][0])

    def order_facts(self, order_id: str) -> dict[str, Any]:
        """What an agent reads when it decides (and records as the premises it relies on)."""
        return self._facts(order_id, exclude_effect=None)

    def _facts(self, order_id: str, exclude_effect: str | None) -> dict[str, Any]:
        rows = self._read(
            "SELECT paid_cents, eligible, disputed FROM orders WHERE order_id = ?", (order_id,)
        )
        if not rows:
            return {"order_id": order_id, "exists": False}
        paid, eligible, disputed = rows[0]
        refunded = self._read(
            "SELECT COALESCE(SUM(amount_cents), 0) FROM refunds WHERE order_id = ? "
            "AND (effect_id IS NULL OR effect_id != ?)",
            (order_id, exclude_effect or ""),
        )[0][0]
        return {
            "order_id": order_id,
            "exists": True,
            "paid_cents": paid,
            "refunded_cents": int(refunded),
            "eligible": bool(eligible),
            "disputed": bool(disputed),
        }

    # -- the send ---------------------------------------------------------------------------

    def refund_sync(
        self, order_id: str, amount_cents: int, *, idempotency_key: str | None = None
    ) -> RefundResult:
        stall = self._fire("before_send", order_id)
        if stall:
            time.sleep(stall)
        result, held = self._refund_and_fire(order_id, amount_cents, idempotency_key)
        if held:
            time.sleep(held)
        return result

    async def refund(
        self, order_id: str, amount_cents: int, *, idempotency_key: str | None = None
    ) -> RefundResult:
        stall = self._fire("before_send", order_id)
        if stall:
            await asyncio.sleep(stall)
        result, held = self._refund_and_fire(order_id, amount_cents, idempotency_key)
        if held:
            await asyncio.sleep(held)
        return result

    def _refund_and_fire(
        self, order_id: str, amount_cents: int, key: str | None
    ) -> tuple[RefundResult, float]:
        """The refund, then the faults armed after it commits: (its result, how long its
        response is held back)."""
        result = self._refund(order_id, amount_cents, key)
        return result, self._fire("after_commit", order_id)

    def _refund(self, order_id: str, amount_cents: int, key: str | None) -> RefundResult:
        request = digest({"order_id": order_id, "amount_cents": amount_cents})
        now = self.clock()
        window = self.dedupe_window.total_seconds() if self.dedupe_window else 0.0

        def run(db: sqlite3.Connection) -> RefundResult | Exception:
            def log(outcome: str) -> None:
                db.execute(
                    "INSERT INTO calls (order_id, amount_cents, idempotency_key, outcome, pid, ts) "
                    "VALUES (?, ?, ?, ?, ?, ?)",
                    (order_id, amount_cents, key, outcome, os.getpid(), now),
                )

            if self.tier == 1 and key:
                prior = db.execute(
                    "SELECT refund_id, amount_cents, request_digest, created_at FROM refunds "
                    "WHERE idempotency_key = ? ORDER BY created_at LIMIT 1",
                    (key,),
                ).fetchone()
                if prior is not None and now - prior[3] < window:
                    if prior[2] != request:
                        log("idempotency_conflict")
                        return IdempotencyConflict("key reused with a different request")
                    log("replayed")
                    return RefundResult(
                        refund_id=prior[0], order_id=order_id, amount_cents=prior[1], replayed=True
                    )
            order = db.execute(
                "SELECT paid_cents, eligible FROM orders WHERE order_id = ?", (order_id,)
            ).fetchone()
            if order is None or not order[1]:
                log("rejected")
                return RefundRejected("order not eligible for refunds")
            refunded = db.execute(
                "SELECT COALESCE(SUM(amount_cents), 0) FROM refunds WHERE order_id = ?", (order_id,)
            ).fetchone()[0]
            if amount_cents <= 0 or refunded + amount_cents > order[0]:
                log("rejected")
                return RefundRejected("amount exceeds the refundable remainder")
            refund_id = "re_" + secrets.token_hex(8)
            tag = key if self.tier <= 2 else None
            db.execute(
                "INSERT INTO refunds (refund_id, order_id, amount_cents, source, effect_id, "
                "idempotency_key, request_digest, created_at) VALUES (?, ?, ?, 'api', ?, ?, ?, ?)",
                (
                    refund_id,
                    order_id,
                    amount_cents,
                    tag,
                    key if self.tier == 1 else None,
                    request,
                    now,
                ),
            )
            log("created")
            return RefundResult(refund_id=refund_id, order_id=order_id, amount_cents=amount_cents)

        outcome = self._tx(run)
        if isinstance(outcome, Exception):
            raise outcome
        assert isinstance(outcome, RefundResult)
        return outcome

    # -- the target protocol ----------------------------------------------------------------

    def capture(self, args: Any, effect_id: str) -> Mapping[str, Any]:
        order_id = _order_of(args)
        self._fire("capture", order_id)
        # only a service that stores the effect id can leave this effect's own refund out
        return self._facts(order_id, exclude_effect=effect_id if self.tier <= 2 else None)

    def validate(
        self, recorded: Mapping[str, Any], current: Mapping[str, Any], payload: Any
    ) -> list[Change]:
        """Every recorded fact must still hold, and the refund must still fit."""
        changes = default_validate(recorded, current)
        amount = getattr(payload, "amount_cents", None)
        if current.get("exists") and isinstance(amount, int):
            remainder = int(current["paid_cents"]) - int(current["refunded_cents"])
            if remainder < amount:
                changes.append(
                    Change(
                        fact="refundable_remainder",
                        recorded=amount,
                        current=remainder,
                        rule="remainder >= amount",
                    )
                )
            if not current.get("eligible") and not any(c.fact == "eligible" for c in changes):
                changes.append(
                    Change(fact="eligible", recorded=True, current=False, rule="must be eligible")
                )
        return changes

    def _query(self, effect_id: str, args: Any) -> Found | None:
        rows = self._read(
            "SELECT refund_id, order_id, amount_cents FROM refunds WHERE effect_id = ? "
            "ORDER BY created_at LIMIT 1",
            (effect_id,),
        )
        if not rows:
            return None
        refund_id, order_id, amount = rows[0]
        return Found(
            result=RefundResult(
                refund_id=refund_id, order_id=order_id, amount_cents=amount
            ).model_dump(mode="json"),
            confirmation=refund_id,
        )

    def confirmation(self, result: Any) -> str | None:
        """The service's own reference for a refund it made: what a receipt cites."""
        refund_id = getattr(result, "refund_id", None)
        return refund_id if isinstance(refund_id, str) else None

    def classify(self, error: BaseException) -> Classification:
        if isinstance(error, RefundRejected):
            return "rejected"
        if isinstance(error, PaymentsUnavailable):
            return "not_sent"
        return "in_doubt"

    def close(self) -> None:
        self.faults.close()
        with self._lock:
            self._db.close()


def _order_of(args: Any) -> str:
    order_id = getattr(args, "order_id", None)
    if order_id is None and isinstance(args, Mapping):
        order_id = args.get("order_id")
    if not isinstance(order_id, str):
        raise TypeError("the payments target needs an input with an order_id")
    return order_id
