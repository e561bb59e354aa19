"""What a PostgreSQL journal requires of its server and of the path to it, checked when it opens.

- Durability: every session the journal opens sets ``synchronous_commit = on``, so a COMMIT
  returns only once its WAL is flushed, whatever the server's default; and a server running
  with ``fsync = off`` is refused (a crash of its host can lose or corrupt entries the journal
  already acknowledged) unless the URL says ``allow_unsafe_durability=true``.
- Standbys: a server that replicates asynchronously is accepted with a warning: a failover to
  such a standby can lose entries the primary acknowledged.
- Sessions: claims are session advisory locks, so the journal needs a real session per
  connection. A pooling proxy in transaction (or statement) mode, such as PgBouncer with
  ``pool_mode = transaction``, hands each statement to whichever server connection is free:
  locks taken there leak to other clients and outlive the worker that took them. Two
  connections held at once must each keep one server session of their own; if not, the journal
  is refused with the fix (session pooling, or a direct connection).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any
from urllib.parse import parse_qs, urlencode, urlparse, urlunparse

from ..errors import JournalConfigError

log = logging.getLogger("interlock_temporal.journal")

#: the journal URL's option that accepts a server running with ``fsync = off``
ALLOW_UNSAFE_DURABILITY = "allow_unsafe_durability"
_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")

POOLER_FIX = (
    "connect the journal directly to PostgreSQL, or through a pool in session mode "
    "(PgBouncer: pool_mode = session)"
)


def journal_options(url: str) -> tuple[str, bool]:
    """``url`` without the journal's own options (libpq refuses parameters it does not know),
    and whether it allows a server with durability off."""
    parsed = urlparse(url)
    pairs = [(k, v) for k, vs in parse_qs(parsed.query, keep_blank_values=True).items() for v in vs]
    allow = False
    for key, value in pairs:
        if key != ALLOW_UNSAFE_DURABILITY:
            continue
        if value.lower() in _TRUE:
            allow = True
        elif value.lower() in _FALSE:
            allow = False
        else:
            raise JournalConfigError(f"{ALLOW_UNSAFE_DURABILITY} must be true or false")
    rest = [(k, v) for k, v in pairs if k != ALLOW_UNSAFE_DURABILITY]
    return urlunparse(parsed._replace(query=urlencode(rest))), allow


def configure_session(conn: Any) -> None:
    """Run on every connection the journal opens: a COMMIT waits for its WAL to be flushed."""
    conn.execute("SET synchronous_commit = on")


def _show(conn: Any, setting: str) -> str:
    row = conn.execute(f"SHOW {setting}").fetchone()
    return str(row[0]) if row else ""


def check_durability(conn: Any, shown_url: str, *, allow_unsafe: bool) -> None:
    """Refuse a server running with ``fsync = off`` unless ``allow_unsafe``."""
    if _show(conn, "fsync") == "on":
        return
    why = (
        f"journal {shown_url}: the PostgreSQL server runs with fsync = off, so a crash of its "
        "host can lose or corrupt entries the journal has already acknowledged (a refund "
        "recorded as sent, then forgotten, is sent again)"
    )
    if not allow_unsafe:
        raise JournalConfigError(
            f"{why}. Turn fsync on in the server's configuration; for a throwaway test server "
            f"only, add {ALLOW_UNSAFE_DURABILITY}=true to the journal URL"
        )
    log.warning("%s; opened anyway: the URL says %s=true", why, ALLOW_UNSAFE_DURABILITY)


def warn_async_standbys(conn: Any, shown_url: str) -> list[str]:
    """Warn (and return their names) when the server streams to standbys that do not confirm
    commits: a failover to one of them can lose entries the primary acknowledged. A standby
    whose state this role cannot read counts as asynchronous."""
    rows = conn.execute(
        "SELECT coalesce(application_name, ''), coalesce(sync_state, 'unknown') "
        "FROM pg_stat_replication ORDER BY 1"
    ).fetchall()
    unsafe = [f"{name or '?'} ({state})" for name, state in rows if state not in ("sync", "quorum")]
    if unsafe:
        log.warning(
            "journal %s: the PostgreSQL server replicates asynchronously to %s: a failover to "
            "such a standby can lose journal entries the primary acknowledged. Make the "
            "standbys synchronous (synchronous_standby_names), or fail over only to a standby "
            "that has replayed everything",
            shown_url,
            ", ".join(unsafe),
        )
    return unsafe


def backend_pid(conn: Any) -> int:
    row = conn.execute("SELECT pg_backend_pid()").fetchone()
    return int(row[0])


def check_sessions(
    connection: Callable[[], AbstractContextManager[Any]], shown_url: str, rounds: int = 3
) -> None:
    """With two connections held at once, each must keep one server session of its own across
    statements; behind a transaction-mode pool they share or swap server connections."""
    with connection() as first, connection() as second:
        seen: list[tuple[int, int]] = []
        for _ in range(rounds):
            seen.append((backend_pid(first), backend_pid(second)))
    firsts, seconds = {a for a, _ in seen}, {b for _, b in seen}
    if len(firsts) == 1 and len(seconds) == 1 and firsts != seconds:
        return
    raise JournalConfigError(
        f"journal {shown_url}: the server session behind a connection changed between two "
        f"statements (backend pids {sorted(firsts)} and {sorted(seconds)} on two connections "
        "held at once): a pooling proxy in transaction or statement mode sits between the "
        "journal and PostgreSQL. Claims are session advisory locks: behind it they leak to "
        f"other workers and outlive dead ones. {POOLER_FIX}"
    )
