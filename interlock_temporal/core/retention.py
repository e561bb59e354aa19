"""Retention: effects in a final state older than a date move from the live journal to a signed
archive (``interlock journal archive``; the file's format is ``journal.archiving``'s).

What moves: effects COMMITTED, REFUSED, or RESOLVED as ``happened``, last updated before the
date and older than ``min_age``, that no attempt holds a claim on and no person's approval
waits for. Never anything in doubt (DISPATCHED), under review (AMBIGUOUS), resolved as not
happened (a person may still reopen it) or a policy chain.

Each archived effect leaves a tombstone that signs its folded state and keeps its result
value, so a duplicate submission gets the same result, a zombie attempt finds its outcome, a
changed payload is still a conflict, and its lease reservation (kept in the lease tables,
never in the entries) still counts. Its receipt reads as before, save its ``journal_seq`` and
``journal_hash``: the tombstone's."""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from .errors import JournalConfigError
from .journal import Journal
from .journal.archiving import ArchiveRun
from .models import Entry, Kind
from .receipts import final_view, fold, receipt_of

#: the default ``min_age``: 30 days. An attempt of a gated activity can still ask the journal
#: about its effect until the activity's schedule-to-close timeout, and a person may still read
#: its whole record in a review; 30 days covers any timeout this project's docs suggest
DEFAULT_MIN_AGE = timedelta(days=30)
#: a ``min_age`` below this is refused unless the caller says it knows (``allow_short_min_age``)
MIN_AGE_FLOOR = timedelta(days=1)


def check_request(
    before: datetime | float,
    min_age: timedelta,
    *,
    allow_short_min_age: bool = False,
    now: float | None = None,
) -> float:
    """The cutoff (epoch seconds) an archive run uses: the earlier of ``before`` and
    ``now - min_age``. ``ValueError`` naming the argument for a date in the future or a
    ``min_age`` under the floor (unless allowed)."""
    now = time.time() if now is None else now
    when = before.timestamp() if isinstance(before, datetime) else float(before)
    if when > now:
        raise ValueError("--before is in the future: only what is already settled is archived")
    if min_age < timedelta(0):
        raise ValueError("--min-age must not be negative")
    if min_age < MIN_AGE_FLOOR and not allow_short_min_age:
        raise ValueError(
            f"--min-age {_shown(min_age)} is under {_shown(MIN_AGE_FLOOR)}: it must be at least "
            "the longest schedule_to_close_timeout of your gated activities (default "
            f"{_shown(DEFAULT_MIN_AGE)}); pass --allow-short-min-age if you know it is"
        )
    return min(when, now - min_age.total_seconds())


def _shown(age: timedelta) -> str:
    seconds = int(age.total_seconds())
    if seconds and seconds % 86400 == 0:
        return f"{seconds // 86400}d"
    return f"{seconds}s"


def archive(
    journal: Journal,
    *,
    before: datetime | float,
    to: Path | str,
    min_age: timedelta = DEFAULT_MIN_AGE,
    allow_short_min_age: bool = False,
) -> ArchiveRun:
    """Archive the effects in a final state last updated before ``before`` (and older than
    ``min_age``) to the new file ``to``, in one transaction of ``journal``: see the module's
    docstring."""
    from .journal.sql import SqlJournal
    from .journal.sql_archive import archive_final

    now = time.time()
    cutoff = check_request(before, min_age, allow_short_min_age=allow_short_min_age, now=now)
    path = Path(to)
    if path.exists():
        raise ValueError(f"--to {path}: the file exists; an archive is never overwritten")
    if not isinstance(journal, SqlJournal):
        raise JournalConfigError(f"journal {journal.url} cannot be archived: it is not SQL")
    pending = journal.policy.approvals("pending")
    waiting = {a.binding for a in pending} | {a.payload_digest for a in pending}
    header = {
        "created": now,
        "before": before.timestamp() if isinstance(before, datetime) else float(before),
        "min_age_s": min_age.total_seconds(),
    }

    def judge(effect_id: str, entries: list[Entry]) -> dict[str, Any] | str:
        view = fold(effect_id, entries)
        if view.status is Kind.RESOLVED and view.resolution != "happened":
            return "not_happened"
        if view.status not in (Kind.COMMITTED, Kind.REFUSED, Kind.RESOLVED):
            # the index row said final, its chain did not (the reason's word as released)
            return "unsettled"
        if effect_id in waiting or view.payload_digest in waiting:
            return "under_review"
        return {
            "payload_digest": view.payload_digest,
            "final": view.status.value,
            "executed": receipt_of(view).executed,
            "lease_id": view.lease_id,
            "amount_cents": None if view.budget is None else view.budget.get("cents"),
            "result_digest": view.result_digest,
            "view": final_view(view),
        }

    return archive_final(journal, cutoff=cutoff, to=path, judge=judge, header=header)
