"""Opening a journal by URL: the keys from configuration, the URL's backend, its options."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from ..errors import JournalConfigError
from .interface import DEFAULT_COMMIT_DELAY, Journal
from .signing import KeyLike, Keyring, as_key, load_or_create_key_file

#: the journal when none is named: ``interlock.db`` in the working directory
DEFAULT_JOURNAL = "sqlite:///interlock.db"
#: the variable that names the journal for the CLI, workers and ``receipt()`` alike
JOURNAL_ENV = "INTERLOCK_JOURNAL"


def configured_journal(given: str | os.PathLike[str] | None = None) -> tuple[str, str]:
    """The journal to open, and where that came from: ``given`` (``"given"``), else
    ``$INTERLOCK_JOURNAL`` (``"INTERLOCK_JOURNAL"``), else ``sqlite:///interlock.db``
    (``"default"``). The CLI's ``--journal``, ``InterlockPlugin(journal=...)`` and
    ``receipt()`` all choose this way, so a worker and the CLI started alike meet on one
    journal."""
    if given is not None and os.fspath(given):
        return os.fspath(given), "given"
    named = os.environ.get(JOURNAL_ENV)
    if named:
        return named, JOURNAL_ENV
    return DEFAULT_JOURNAL, "default"


def keyring_for(
    journal_path: Path | None,
    signing_key: KeyLike | None,
    older_keys: Sequence[KeyLike] = (),
    *,
    create: bool = True,
    public_keys: Sequence[KeyLike] = (),
) -> Keyring:
    """The signing key from configuration (argument, then ``INTERLOCK_SIGNING_KEY``), else the
    journal's key file (``<journal>.key``, created with mode 0600 when ``create``).

    With ``public_keys`` and no signing key, the keyring verifies only: an auditor needs no
    secret and no key file."""
    if public_keys and signing_key is None:
        return Keyring(None, [as_key(k) for k in (*public_keys, *older_keys)])
    if signing_key is None and os.environ.get("INTERLOCK_SIGNING_KEY"):
        signing_key = os.environ["INTERLOCK_SIGNING_KEY"]
    if signing_key is None:
        if journal_path is None:
            raise JournalConfigError("a signing key is required for this journal")
        key_file = journal_path.with_name(journal_path.name + ".key")
        if not create and not key_file.exists():
            raise JournalConfigError(
                f"no signing key: {key_file} does not exist and INTERLOCK_SIGNING_KEY is not set"
            )
        key = load_or_create_key_file(key_file)
    else:
        key = as_key(signing_key)
    return Keyring(key, [as_key(k) for k in (*older_keys, *public_keys)])


@dataclass(frozen=True)
class JournalLocation:
    """A parsed journal URL."""

    scheme: str
    path: Path
    options: dict[str, str]
    url: str = ""

    @property
    def busy_timeout_s(self) -> float:
        try:
            value = float(self.options.get("busy_timeout", 10))
        except ValueError:
            raise JournalConfigError("busy_timeout must be a number of seconds") from None
        if value <= 0:
            raise JournalConfigError("busy_timeout must be positive")
        return value


def parse_journal_url(url: str | os.PathLike[str]) -> JournalLocation:
    """``sqlite:///relative.db``, ``sqlite:////absolute.db`` (as SQLAlchemy spells them), or a
    plain path."""
    text = os.fspath(url)
    parsed = urlparse(text)
    if parsed.scheme in ("postgresql", "postgres"):
        return JournalLocation("postgresql", Path(), {}, text)
    if parsed.scheme in ("", "file"):
        path = Path(parsed.path if parsed.scheme == "file" else text)
    elif parsed.scheme == "sqlite":
        raw_path = text[len("sqlite://") :].split("?", 1)[0]
        if raw_path.startswith("/"):
            raw_path = raw_path[1:]
        if not raw_path:
            raise JournalConfigError("sqlite URL has no path: use sqlite:///interlock.db")
        path = Path(raw_path)
    else:
        raise JournalConfigError(
            f"unsupported journal URL scheme {parsed.scheme!r}: use sqlite:///path or "
            "postgresql://user@host/db"
        )
    options = {k: v[-1] for k, v in parse_qs(parsed.query).items()}
    return JournalLocation("sqlite", path, options, text)


def open_journal(
    url: str | os.PathLike[str],
    *,
    signing_key: KeyLike | None = None,
    older_keys: Sequence[KeyLike] = (),
    create: bool = True,
    check_tail: bool = True,
    public_keys: Sequence[KeyLike] = (),
    commit_delay: float = DEFAULT_COMMIT_DELAY,
) -> Journal:
    """Open a journal by URL: ``sqlite:///path/to/interlock.db`` (or a plain path), or
    ``postgresql://user@host:5432/db`` for workers on many hosts.

    ``signing_key``: hex or text (HMAC-SHA256), or ``ed25519:<hex seed>``; default
    ``INTERLOCK_SIGNING_KEY``, else the key file beside the database. ``public_keys``
    (``ed25519-public:<hex>``) without a signing key open it to verify only.
    ``create=False`` refuses to create a journal (or its key file) that does not exist, for
    tools that only read. ``check_tail=False`` skips the open-time check of the last entry, so
    ``verify`` can report on a journal that would otherwise refuse to open.
    ``commit_delay`` (seconds, 0 to 1): how long a worker's batch of appends waits for the
    appends of its other effects under way, trading that much latency, only when effects
    overlap, for fewer flushes; 0 writes every batch at once.
    """
    delay = _commit_delay(commit_delay)
    journal = _open(url, signing_key, older_keys, create, check_tail, public_keys)
    journal.commit_delay = delay
    return journal


def _commit_delay(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise JournalConfigError("commit_delay must be a number of seconds from 0 to 1")
    return float(value)


def _open(
    url: str | os.PathLike[str],
    signing_key: KeyLike | None,
    older_keys: Sequence[KeyLike],
    create: bool,
    check_tail: bool,
    public_keys: Sequence[KeyLike],
) -> Journal:
    where = parse_journal_url(url)
    if where.scheme == "postgresql":
        from .postgres import PostgresJournal

        if signing_key is None and not public_keys and not os.environ.get("INTERLOCK_SIGNING_KEY"):
            raise JournalConfigError(
                "a PostgreSQL journal has no key file: set INTERLOCK_SIGNING_KEY or pass "
                "signing_key= (every worker must sign with the same key)"
            )
        keyring = keyring_for(None, signing_key, older_keys, public_keys=public_keys)
        return PostgresJournal(where.url, keyring, check_tail=check_tail)
    from .sqlite import SqliteJournal

    if create:
        where.path.parent.mkdir(parents=True, exist_ok=True)
    elif not where.path.exists():
        raise JournalConfigError(f"no journal at {where.path}: no such database file")
    keyring = keyring_for(
        where.path, signing_key, older_keys, create=create, public_keys=public_keys
    )
    return SqliteJournal(
        where.path, keyring, busy_timeout_s=where.busy_timeout_s, check_tail=check_tail
    )
