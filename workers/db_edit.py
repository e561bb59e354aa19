"""An operator's edit of an effect's approved input in the journal's database: the tamper step
the sweep and the model check share.

Problem: an operator who can write the database, but holds no signing key, raises the amount
an effect was approved for: the values stored beside its dispatch, and the digest its
authorization signed of them, to match. The next attempt must refuse the effect
(``JournalCorrupt``), not send the edited amount.

Mechanism: plain SQL on the SQLite file. The authorization is an ``AUTHORIZED`` entry, or the
``authorization`` part of a dispatch written as one entry of format 3 (schema 14): the edit is
made wherever the journal keeps it, so the step runs on both formats.

Cost: one read of the effect's entries and two updates, outside the journal's own connections.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import rfc8785


def raise_approved(path: Path, eid: str, edit: Callable[[dict[str, Any]], None]) -> int | None:
    """Edit the approved values of ``eid``'s first dispatch with ``edit`` (in place), and the
    digest its authorization signed, to match. The seq of the entry that signed it, or None:
    the effect is not dispatched yet (nothing is changed)."""
    with closing(sqlite3.connect(path)) as db, db:
        rows = db.execute(
            "SELECT seq, kind, body, vals FROM entries WHERE effect_id = ? ORDER BY seq", (eid,)
        ).fetchall()
        dispatched = [(seq, vals) for seq, kind, _, vals in rows if kind == "DISPATCHED" and vals]
        authorized = [
            (seq, doc, doc["data"] if kind == "AUTHORIZED" else doc["data"]["authorization"])
            for seq, kind, body, _ in rows
            if kind in ("AUTHORIZED", "DISPATCHED")
            and ((doc := json.loads(body))["v"] == 3 or kind == "AUTHORIZED")
        ]
        if not dispatched or not authorized:
            return None
        seq_d, vals = dispatched[0]
        values = json.loads(vals)
        edit(values)
        db.execute(
            "UPDATE entries SET vals = ? WHERE seq = ?", (rfc8785.dumps(values).decode(), seq_d)
        )
        seq_a, doc, authorization = authorized[0]
        authorization["approved_digest"] = hashlib.sha256(
            rfc8785.dumps(values["approved"])
        ).hexdigest()
        db.execute("UPDATE entries SET body = ? WHERE seq = ?", (rfc8785.dumps(doc), seq_a))
        return int(seq_a)
