"""Faults armed in a file and fired by whichever process reaches the point first: how the
fault table kills a worker at an exact step of a send, whatever worker runs it. Test-only
machinery, shared by the simulated payments service and the Stripe test harness."""

from __future__ import annotations

import os
import signal
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Literal

FaultPoint = Literal["before_send", "after_commit", "capture"]
FaultAction = Literal[
    "kill", "crash", "stall", "make_ineligible", "manual_refund", "unavailable", "reset"
]


class SimulatedCrash(BaseException):
    """Raised in-process where a real run would SIGKILL the worker (the sweep's crash)."""


class FaultPlan:
    """A table of armed faults in a SQLite file (it may share the service's own file)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._lock = threading.Lock()
        self._db = sqlite3.connect(
            Path(path), isolation_level=None, check_same_thread=False, timeout=30
        )
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS faults (id INTEGER PRIMARY KEY, point TEXT NOT NULL, "
            "action TEXT NOT NULL, arg REAL, remaining INTEGER NOT NULL)"
        )

    def arm(
        self, point: FaultPoint, action: FaultAction, *, arg: float | None = None, count: int = 1
    ) -> None:
        """Fire ``action`` the next ``count`` times any process reaches ``point``."""
        with self._lock:
            self._db.execute(
                "INSERT INTO faults (point, action, arg, remaining) VALUES (?, ?, ?, ?)",
                (point, action, arg, count),
            )

    def disarm(self) -> None:
        with self._lock:
            self._db.execute("DELETE FROM faults")

    def take(self, point: str) -> list[tuple[str, float | None]]:
        """The faults armed at ``point``, each used up once (atomically across processes)."""
        with self._lock:
            db = self._db
            if not db.execute("SELECT 1 FROM faults WHERE remaining > 0 LIMIT 1").fetchone():
                return []
            db.execute("BEGIN IMMEDIATE")
            try:
                rows = db.execute(
                    "SELECT id, action, arg FROM faults WHERE point = ? AND remaining > 0 "
                    "ORDER BY id",
                    (point,),
                ).fetchall()
                for fid, _, _ in rows:
                    db.execute("UPDATE faults SET remaining = remaining - 1 WHERE id = ?", (fid,))
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        return [(action, arg) for _, action, arg in rows]

    def fire(
        self, point: str, actions: Mapping[str, Callable[[float | None], None]] | None = None
    ) -> float:
        """Run the faults armed at ``point``: the process dies (``kill``), an in-process crash
        unwinds (``crash``), the connection drops (``reset``: in doubt) or is refused
        (``unavailable``), or a service-specific action runs. Returns how long to stall."""
        stall = 0.0
        for action, arg in self.take(point):
            if action == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
                time.sleep(60)  # pragma: no cover - the signal arrives first
            elif action == "crash":
                raise SimulatedCrash(point)
            elif action == "stall":
                stall += float(arg or 0)
            elif actions and action in actions:
                actions[action](arg)
            elif action == "unavailable":
                raise ConnectionRefusedError("connection refused")
            elif action == "reset":
                raise ConnectionResetError("connection reset by peer")
            else:
                raise ValueError(f"fault action {action!r} is not supported at {point}")
        return stall

    def close(self) -> None:
        with self._lock:
            self._db.close()
