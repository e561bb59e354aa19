"""What a worker tells its logs about the gate: where its journal is (once, at start), a gated
activity scheduled without ``heartbeat_timeout``, a tier-1 or tier-2 body that never read
``current_effect()`` (each once per activity type), a refusal by a lease
(once per lease and reason, ``LeaseRefusals``), and an AMBIGUOUS effect as one line naming its
review instead of a traceback.

Everything goes to the package's logger, ``interlock_temporal``, except the AMBIGUOUS line,
which is the SDK's own "Completing activity as failed" record with its traceback taken out
(see ``AmbiguousLine``).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from ..core.review_rules import review_id
from .errors import AmbiguousEffect, EffectRefused

if TYPE_CHECKING:
    import temporalio.activity

    from ..core.journal import Journal

log = logging.getLogger("interlock_temporal")

#: the logger the SDK's activity worker reports an attempt's failure on
SDK_ACTIVITY_LOGGER = "temporalio.activity"


def journal_location(journal: Journal) -> str:
    """Where a journal is, for a person: a SQLite file's absolute path, else its URL (a
    PostgreSQL journal's URL carries no password)."""
    path = getattr(journal, "path", None)
    if isinstance(path, Path):
        return f"sqlite:///{path.resolve()}"
    return str(journal.url)


def announce_journal(journal: Journal, origin: str) -> None:
    """Say which journal the worker uses when nobody named it in code: every worker, and the
    ``interlock`` CLI, must meet on the same one (a relative path is relative to each
    process's working directory)."""
    if origin == "given":
        return
    where = journal_location(journal)
    if origin == "default":
        log.info(
            "interlock: journal %s (the default, sqlite:///interlock.db in the working "
            "directory; name it with INTERLOCK_JOURNAL or InterlockPlugin(journal=...), the "
            "same for every worker and the interlock CLI)",
            where,
        )
    else:
        log.info("interlock: journal %s (from %s)", where, origin)


def _seconds(value: timedelta) -> str:
    return f"{value.total_seconds():g}s"


def no_heartbeat_warning(info: temporalio.activity.Info) -> str:
    """Why a gated attempt with no ``heartbeat_timeout`` is slow to recover after a crash."""
    if info.start_to_close_timeout:
        wait = f"start_to_close_timeout ({_seconds(info.start_to_close_timeout)})"
    elif info.schedule_to_close_timeout:
        wait = f"schedule_to_close_timeout ({_seconds(info.schedule_to_close_timeout)})"
    else:
        wait = "its timeout"
    return (
        f"gated activity {info.activity_type!r} was scheduled without heartbeat_timeout: if "
        f"its worker dies mid-send, the next attempt (and its recovery) waits for {wait}. "
        "Pass heartbeat_timeout=timedelta(seconds=2) (or a few seconds) where the workflow "
        "schedules it; the gate heartbeats on the body's behalf"
    )


def unread_effect_warning(activity_type: str, target: str, tier: int) -> str:
    """Why a tier-1 or tier-2 body that never asked ``current_effect()`` double-sends after a
    crash: the effect id is how the target dedupes a resend (tier 1) or how the gate finds the
    first send (tiers 1 and 2)."""
    if tier == 1:
        lost = (
            "its idempotency key, so it cannot dedupe a resend nor find the first send: after "
            "a crash mid-send, the effect may be sent twice"
        )
    else:
        lost = (
            "the tag its query looks for, so recovery cannot find the first send: after a "
            "crash mid-send, the effect may be sent twice"
        )
    return (
        f"gated activity {activity_type!r} (target {target}, tier {tier}) returned without "
        f"reading current_effect(): the effect id never reached {target} as {lost}. Pass "
        "current_effect().effect_id to the target in the body (e.g. "
        "idempotency_key=current_effect().idempotency_key)"
    )


class AmbiguousLine(logging.Filter):
    """Turns the SDK's failure record of an attempt that ended AMBIGUOUS into one line naming
    the effect's review, without the traceback: the attempt did what it must (it recorded the
    doubt and opened the review), and the stack of the gate is no help to the person who must
    decide. The record keeps its level and its identifiers; every other record passes
    unchanged."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, AmbiguousEffect):
            effect_id = error.receipt.effect_id
            record.msg = (
                f"{record.getMessage()}: AmbiguousEffect: {error.message}. Effect "
                f"{effect_id[:16]} waits for a person: review {review_id('ambiguous', effect_id)}"
            )
            record.args = ()
            record.exc_info = None
            record.exc_text = None
        return True


_installed = threading.Lock()


def install_ambiguous_line() -> None:
    """Put ``AmbiguousLine`` on the SDK's activity logger, once per process."""
    logger = logging.getLogger(SDK_ACTIVITY_LOGGER)
    with _installed:
        if not any(isinstance(f, AmbiguousLine) for f in logger.filters):
            logger.addFilter(AmbiguousLine())


#: the refusal codes that are a lease's (at dispatch, its budget, at a resend)
LEASE_CODES = frozenset({"lease", "lease_budget", "lease_at_recovery"})


class LeaseRefusals:
    """Logs a lease's refusal at INFO once per lease and reason on a worker (the
    ``EffectRefused`` is BENIGN, which the SDK logs at DEBUG only), so a worker's log says why
    an activity is refused without a line per attempt. Later ones go to DEBUG. The line names
    the activity, the lease and the effect, and carries the refusal's message, which names no
    argument value. At most ``keep`` pairs are remembered (the oldest forgotten first)."""

    def __init__(self, keep: int = 1024) -> None:
        self.keep = keep
        self._told: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._lock = threading.Lock()

    def tell(self, activity: str, lease_id: str | None, error: EffectRefused) -> None:
        receipt = error.receipt
        if receipt is None or receipt.code not in LEASE_CODES:
            return
        key = (lease_id or "", receipt.reason or receipt.code or "")
        with self._lock:
            first = key not in self._told
            if first:
                self._told[key] = None
                if len(self._told) > self.keep:
                    self._told.popitem(last=False)
        log.log(
            logging.INFO if first else logging.DEBUG,
            "interlock: %s refused under %s (effect %s): %s",
            activity,
            f"lease {lease_id}" if lease_id else "no lease",
            receipt.effect_id[:16],
            error.message,
        )
