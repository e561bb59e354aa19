"""What every command shares: exit codes, the one-line error, output, opening the journal."""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
from collections.abc import Callable, Sequence
from typing import Any

from ..core.errors import JournalConfigError, JournalCorrupt, JournalUnavailable
from ..core.extras import MissingExtra
from ..core.journal import Journal, open_journal
from ..core.journal.opening import configured_journal

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_JOURNAL = 3
#: the Temporal server cannot be reached (the same code as a journal that cannot be opened)
EXIT_SERVER = 3

DEFAULT_ADDRESS = "localhost:7233"
DEFAULT_NAMESPACE = "default"
#: the shortest effect id prefix ``effects show`` accepts
MIN_PREFIX = 8

EPILOG = """\
exit codes (every command):
  0    done; a listing that finds nothing is done too
  1    a check failed, or there was nothing to do: the journal does not verify, the lease
       or the circuit was not live or open, the effect is not REFUSED, the review refused
       the decision or did not answer, the reconciler left an effect with no outcome and
       no person; also an unexpected error
  2    a usage error, or what the command names does not exist (no such effect, lease or
       review)
  3    the journal cannot be opened, or the Temporal server cannot be reached
  130  interrupted

Durations take a unit: 45s, 30m, 1h, 2d, or 1h30m (a bare number is refused).
Listings take --json, and so does `leases issue`.

The journal defaults to $INTERLOCK_JOURNAL, else sqlite:///interlock.db. The signing key comes
from --signing-key, else $INTERLOCK_SIGNING_KEY, else the key file beside the SQLite database
(<database>.key). Commands on Temporal (reviews, reconcile) connect to --address, else
$TEMPORAL_ADDRESS, else localhost:7233, in --namespace, else $TEMPORAL_NAMESPACE, else default.

examples:
  interlock effects list --in-doubt --older-than 5m
  interlock leases issue refund-bot --activity refund --max-amount-cents 5000 --ttl 8h
  interlock journal verify
"""

#: what each subcommand's epilog ends with: the exit codes and defaults are said once, above
SEE_TOP = "exit codes, defaults and durations: interlock --help"


class CliError(Exception):
    """A failure the command reports as one line on stderr, with its exit code."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


Handler = Callable[[argparse.Namespace], int]


# -- opening the journal ----------------------------------------------------------------------


def journal_url(args: argparse.Namespace) -> str:
    """``--journal``, else ``$INTERLOCK_JOURNAL``, else ``sqlite:///interlock.db``."""
    return configured_journal(getattr(args, "journal", None) or None)[0]


def _open(
    args: argparse.Namespace,
    *,
    create: bool,
    check_tail: bool = True,
    public_keys: Sequence[str] = (),
) -> Journal:
    url = journal_url(args)
    try:
        return open_journal(
            url,
            signing_key=args.signing_key or None,
            create=create,
            check_tail=check_tail,
            public_keys=public_keys,
        )
    except (OSError, sqlite3.Error) as err:
        raise CliError(EXIT_JOURNAL, f"journal {url} cannot be opened: {err}") from None
    except MissingExtra as err:  # the URL may hold a password: the message names the extra
        raise CliError(EXIT_JOURNAL, f"the journal cannot be opened: {err}") from None


def open_for(args: argparse.Namespace, *, create: bool = False) -> Journal:
    """Open the journal the arguments name. Unless ``create``, a SQLite journal must already
    exist, with its key: reading commands never create a database or a new signing key."""
    return _open(args, create=create)


def open_for_verify(args: argparse.Namespace, *, public_keys: Sequence[str] = ()) -> Journal:
    """Open the journal even when its last entry is unusable: verify reports what is wrong."""
    return _open(args, create=False, check_tail=False, public_keys=public_keys)


def try_open(args: argparse.Namespace) -> tuple[Journal | None, str]:
    """The journal, or None and why it cannot be opened (for commands that can do without)."""
    try:
        return open_for(args), ""
    except CliError as err:
        return None, err.message
    except (JournalConfigError, JournalCorrupt, JournalUnavailable, sqlite3.Error) as err:
        return None, f"journal {journal_url(args)} cannot be opened: {err}"


def resolve_effect(journal: Journal, text: str) -> str:
    """The effect id ``text`` names: a full id, or a unique prefix of at least 8 characters."""
    wanted = text.strip()
    if not wanted:
        raise CliError(EXIT_USAGE, "an effect id is required")
    if journal.row(wanted) is not None:
        return wanted
    if journal.row(wanted.lower()) is not None:
        return wanted.lower()
    if len(wanted) < MIN_PREFIX:
        raise CliError(
            EXIT_USAGE,
            f"no effect {wanted} (a prefix needs at least {MIN_PREFIX} characters)",
        )
    prefixes = {wanted, wanted.lower()}
    matches = sorted(
        row.effect_id
        for row in journal.effects()
        if any(row.effect_id.startswith(p) for p in prefixes)
    )
    if not matches:
        raise CliError(EXIT_USAGE, f"no effect {wanted} in {journal.url}")
    if len(matches) > 1:
        shown = ", ".join(m[:20] for m in matches[:5]) + (", ..." if len(matches) > 5 else "")
        raise CliError(
            EXIT_USAGE,
            f"effect prefix {wanted} is ambiguous: {len(matches)} effects match ({shown})",
        )
    return matches[0]


# -- output ---------------------------------------------------------------------------------


def emit(text: str) -> None:
    sys.stdout.write(text if text.endswith("\n") else text + "\n")


def warn(text: str) -> None:
    sys.stderr.write(f"interlock: {text}\n")


def emit_json(value: Any) -> None:
    emit(json.dumps(value, indent=2, sort_keys=False, ensure_ascii=False))
