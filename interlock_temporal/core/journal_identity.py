"""A journal's id: one task queue, one journal.

The problem: an effect's record lives in one journal, and Temporal delivers an activity's
attempts to whichever worker of its task queue polls first. Two workers on one task queue with
different journals (the default ``sqlite:///interlock.db`` on two hosts, one shared key) send
a tier-3 effect twice: attempt 1 sends on worker A and dies in doubt, attempt 2 lands on
worker B, whose journal never heard of it and sends it as new. Nothing in either journal is
wrong; the deployment is.

The mechanism: each journal has an id, a random 128-bit hex string kept as the one signed
``CONFIG`` entry of the chain ``config:journal``, written once by the first writer that needs
it (a worker, when it starts) and read and verified like any chain: an edit of its row fails
the read (``JournalCorrupt``), so whoever can write the database but holds no key cannot make
a journal pose as another. Two writers racing to create it both append conditionally on an
empty chain; the loser's append meets ``HeadConflict`` and reads the winner's id, so every
process ends with one id. Workers carry the id in their Temporal identity
(``interlock-journal:<id>``, see ``_worker.journal_check``), in the heartbeat details of a
send, in the reviews they open and in receipts.

Cost: one chain read (one entry, verified) the first time a process asks, and one append the
first time a journal is used by a worker; after that the id is kept in memory with the open
journal (it never changes), so nothing is added to the gate's path.
"""

from __future__ import annotations

import contextlib
import re
import uuid
import weakref
from collections.abc import Sequence

from .errors import HeadConflict, JournalCorrupt
from .journal import CONFIG_CHAIN_TYPE, Journal
from .models import Draft, Entry, Kind

#: the journal chain that holds the journal's id (one entry)
JOURNAL_CHAIN = "config:journal"
#: the data key of that entry
FIELD = "journal_id"
#: what a journal id looks like: 32 lowercase hex digits (128 random bits)
JOURNAL_ID = re.compile(r"[0-9a-f]{32}")
#: how a worker names its journal in its Temporal identity
IDENTITY_TAG = "interlock-journal:"
#: the tag, as found in any identity (a poller's, a heartbeat's)
TAG_PATTERN = re.compile(re.escape(IDENTITY_TAG) + r"([0-9a-f]{32})")

#: ids already read (verified) per open journal: an id never changes once written
_known: weakref.WeakKeyDictionary[Journal, str] = weakref.WeakKeyDictionary()


def _id_in(entries: Sequence[Entry]) -> str:
    """The id the chain's first entry (verified by the read) sets."""
    first = entries[0]
    found = first.data.get(FIELD) if first.kind is Kind.CONFIG else None
    if not isinstance(found, str) or not JOURNAL_ID.fullmatch(found):
        raise JournalCorrupt(
            f"entry {first.seq} on {JOURNAL_CHAIN} does not hold a journal id: the journal's "
            "identity cannot be read"
        )
    return found


def journal_id_of(journal: Journal, *, create: bool = True) -> str | None:
    """The journal's id, verified. With ``create`` (the default) a journal that has none gets
    one now; without it, None for such a journal (what read-only commands ask). A race between
    two creators ends with one id: the winner's."""
    try:
        return _known[journal]
    except KeyError:
        pass
    entries = journal.read(JOURNAL_CHAIN)
    if not entries and create:
        # another writer that created it first wins: its id is the journal's
        with contextlib.suppress(HeadConflict):
            journal.append(
                JOURNAL_CHAIN,
                "",
                [Draft(kind=Kind.CONFIG, data={FIELD: uuid.uuid4().hex})],
                effect_type=CONFIG_CHAIN_TYPE,
            )
        entries = journal.read(JOURNAL_CHAIN)
    if not entries:
        return None
    found = _id_in(entries)
    _known[journal] = found
    return found


def identity_with_journal(identity: str, journal_id: str) -> str:
    """A worker's Temporal identity naming its journal: the identity it had (the user's, or
    Temporal's ``pid@hostname``) with ``interlock-journal:<id>`` appended, once."""
    tag = IDENTITY_TAG + journal_id
    if tag in identity.split():
        return identity
    return f"{identity} {tag}".strip()


def journal_named_by(identity: str) -> str | None:
    """The journal id a worker's identity names; None for a worker without the tag (a plain,
    ungated worker)."""
    found = TAG_PATTERN.search(identity or "")
    return None if found is None else found.group(1)


def mismatch_message(ours: str, theirs: str, where: str) -> str:
    """What a worker that refuses gated work says: both journals, and what to fix."""
    return (
        f"one task queue, one journal: this worker's journal is {ours}, but {where} names "
        f"journal {theirs}. An effect's record lives in one journal, so a retry on a worker of "
        "another journal could send it again: nothing was sent. Point both workers at the same "
        "journal URL (PostgreSQL when workers span hosts), or give each journal its own task "
        "queue"
    )
