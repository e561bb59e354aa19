"""The journal's interface: what every backend implements and the conformance suite checks
(tests/journal_conformance.py). How entries are signed and verified is ``entries``; the
backends, and ``open_journal`` that picks one by URL (``opening``), are never imported here."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import os
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol, TypeVar
from urllib.parse import parse_qs, unquote, urlparse, urlunparse

from ..errors import JournalConfigError, JournalCorrupt
from ..leases import LeaseStore
from ..models import Draft, EffectRow, Entry, JournalHead, Kind, Lease, VerifyReport
from ..notifications import NotificationLog
from ..policy import PolicyStore
from ..row_seals import RowSeals
from ..vote_codes import CodeUses
from .claims import Claim
from .control_check import ChargeFold, ControlRows, check_control_plane, fold_entries
from .entries import RawEntry, check_entry
from .signing import Keyring
from .verify_jobs import EntrySource, verify_in_jobs
from .verifying import verify_stored

SCHEMA_VERSION = 14
#: the effect type of policy chains (``policy:<session>``)
POLICY_CHAIN_TYPE = "interlock.policy"
#: the effect type of archive anchors' chains (``archive:<archive id>``)
ARCHIVE_CHAIN_TYPE = "interlock.archive"
#: the effect type of the journal's configuration chains (``config:<name>``: the roster)
CONFIG_CHAIN_TYPE = "interlock.config"
#: the effect type of leases' chains (``lease:<lease id>``: issued, revoked)
LEASE_CHAIN_TYPE = "interlock.lease"
#: the journal's own chains' types: they record no effect
OWN_CHAIN_TYPES = (POLICY_CHAIN_TYPE, ARCHIVE_CHAIN_TYPE, CONFIG_CHAIN_TYPE, LEASE_CHAIN_TYPE)


def policy_chain(session: str) -> str:
    """The journal chain that records a session's policy events."""
    return f"policy:{session}"


def lease_chain(lease_id: str) -> str:
    """The journal chain that records a lease's changes (its row is their product)."""
    return f"lease:{lease_id}"


#: a password given as a query parameter of a PostgreSQL URL (libpq reads both)
_SECRET_PARAMETER = re.compile(r"(?i)(^|&)((?:ssl)?password)=[^&]*")


def redacted(url: str) -> str:
    """``url`` as a message may show it: a password, in ``user:PASSWORD@host`` or as a
    ``password=`` (``sslpassword=``) parameter, becomes ``***``."""
    parsed = urlparse(url)
    netloc, query = parsed.netloc, parsed.query
    if parsed.password is not None:
        userinfo, _, host = netloc.rpartition("@")
        netloc = f"{userinfo.partition(':')[0]}:***@{host}"
    query = _SECRET_PARAMETER.sub(r"\1\2=***", query)
    if (netloc, query) == (parsed.netloc, parsed.query):
        return url
    return urlunparse(parsed._replace(netloc=netloc, query=query))


Build = Sequence[Draft] | Callable[[Lease | None], Sequence[Draft]]


T = TypeVar("T")


def database_of(url: str) -> tuple[str, ...]:
    """Which database ``url`` names, comparable across spellings: ``("sqlite", resolved
    path)``, or ``("postgresql", host, port, database)`` (libpq's defaults filled in: port
    5432, the database named after the user). Two URLs that give the same tuple are the same
    database; hosts are compared as written (``localhost`` is not ``127.0.0.1``)."""
    parsed = urlparse(url)
    if parsed.scheme in ("postgresql", "postgres"):
        query = {k: v[-1] for k, v in parse_qs(parsed.query).items()}
        host = parsed.hostname or query.get("host") or "localhost"
        port = str(parsed.port or query.get("port") or 5432)
        user = parsed.username or query.get("user") or ""
        name = unquote(parsed.path.lstrip("/")) or query.get("dbname") or user
        return ("postgresql", host, port, name)
    text = url[len("sqlite://") :] if parsed.scheme == "sqlite" else url
    path = text.split("?", 1)[0]
    if parsed.scheme == "sqlite" and path.startswith("/"):
        path = path[1:]
    return ("sqlite", os.path.realpath(path))


class JournalTx(Protocol):
    """One write transaction of the journal, handed to ``Journal.transact_async``'s function:
    ``append`` as ``Journal.append`` does it, inside this transaction; ``db`` the connection
    the transaction runs on (what a tier-0 target writes the effect with)."""

    @property
    def db(self) -> Any: ...

    def append(
        self,
        effect_id: str,
        expected_head: str,
        build: Build,
        *,
        effect_type: str | None = None,
        lease_id: str | None = None,
        blobs: Mapping[str, Any] | None = None,
    ) -> list[Entry]: ...


@dataclasses.dataclass(frozen=True, slots=True)
class AppendTiming:
    """Where one ``append_async`` of a group commit spent its time (``time.perf_counter()``
    seconds), given to ``Journal.observe_appends`` on the loop once its coroutine resumed.
    ``written`` is 0.0 where the batch never reached the writer thread (every append in it
    failed on its own)."""

    effect_id: str
    #: queued; its batch begun (after ``commit_delay`` and the batch before it); the batch's
    #: work on the writer thread ended; the awaiting coroutine running again
    submitted: float
    started: float
    written: float
    resumed: float
    #: appends in its batch
    batch: int

    @property
    def loop_wait(self) -> float:
        """Seconds from the writer thread's end of the batch to the awaiting coroutine
        running again: the time the append's result waited for the event loop."""
        return self.resumed - self.written if self.written else 0.0


#: measured on a 2-core machine, 64 activities in flight on one worker: batches of 3.3 to 4.2
#: appends without the wait, about 8 with 4 ms and 11 to 12 with 8 ms, and with 8 ms about 0.2
#: to 0.4 ms less worker CPU per activity (docs/benchmarks.md sets it beside no wait each run)
DEFAULT_COMMIT_DELAY = 0.008


class Journal(ABC):
    """The interface every backend implements, and the conformance suite checks."""

    #: where the journal is, as messages show it (no password: see ``redacted``)
    url: str
    keyring: Keyring
    #: the event loop of this journal's coroutines runs other work too (a Temporal worker's
    #: pollers and workflows): ``append_async`` must never hold it for a flush to disk, even
    #: for an append that has nothing to share the flush with
    loop_shared: bool = False
    #: seconds a batch of ``append_async`` waits, when other effects of this process are under
    #: way and have not queued their appends, so they share its transaction and its flush. A
    #: lone effect never waits; 0 turns the wait off (see ``open_journal``)
    commit_delay: float = DEFAULT_COMMIT_DELAY
    #: a measurement's hook, None (the default) in normal use: called on the loop with an
    #: ``AppendTiming`` for each ``append_async`` of a SQL journal's group commit once its
    #: coroutine resumed (where its time went: the queue, the writer thread, the loop)
    observe_appends: Callable[[AppendTiming], None] | None = None
    #: how this journal's effect ids are made: None, sha256 of the decision (the default); or
    #: ``hmac-sha256:<key id>``, keyed with a key derived from that journal key (set once, on
    #: a journal with no entries: ``key_effect_ids``)
    effect_ids: str | None = None

    @property
    @abstractmethod
    def leases(self) -> LeaseStore: ...

    @property
    @abstractmethod
    def policy(self) -> PolicyStore:
        """The policy layer's shared state (sessions, spend, admitted executions)."""

    @property
    @abstractmethod
    def notifications(self) -> NotificationLog:
        """Notifications that failed to reach people (not in any effect's chain)."""

    @property
    @abstractmethod
    def code_uses(self) -> CodeUses:
        """What happened to one-time codes: wrong ones counted, used ones consumed."""

    @abstractmethod
    def read(self, effect_id: str) -> list[Entry]:
        """The effect's entries in order (empty if unknown)."""

    @abstractmethod
    def check(self, effect_id: str) -> None:
        """Raise ``JournalCorrupt`` unless the effect's chain holds as ``read`` checks it, without
        decoding its entries: what an outcome folded into a view it read earlier (instead of
        reading the chain again) still asks of the chain it was appended to."""

    @abstractmethod
    def row(self, effect_id: str) -> EffectRow | None:
        """The effect's index row: status and head, without reading its entries."""

    @abstractmethod
    def append(
        self,
        effect_id: str,
        expected_head: str,
        build: Build,
        *,
        effect_type: str | None = None,
        lease_id: str | None = None,
        blobs: Mapping[str, Any] | None = None,
    ) -> list[Entry]:
        """Append entries atomically, durably, if the effect's head is still ``expected_head``
        ("" for a new effect); raise ``HeadConflict`` otherwise. A new effect's origin (see
        ``by_origin``) is what its first entry signs of its delivery and input.

        When ``build`` is callable it is called inside the transaction with the lease
        ``lease_id`` as read there, and returns the drafts: authority is checked and the
        dispatch recorded in one step. ``blobs`` (argument and result values; the signed entries
        hold only their digests) are stored with the append's last entry, outside its signed
        bytes, in the same transaction; a value given as ``bytes`` is taken to be its
        canonical JSON already.
        """

    async def append_async(
        self,
        effect_id: str,
        expected_head: str,
        build: Build,
        *,
        effect_type: str | None = None,
        lease_id: str | None = None,
        blobs: Mapping[str, Any] | None = None,
    ) -> list[Entry]:
        """``append`` for a coroutine. A backend may commit the appends of concurrent
        coroutines together, one transaction and one flush to disk for all of them; each call
        still gets its own entries or its own error, exactly as ``append`` would give it, and
        returns only once its entries are durable. A caller cancelled while its append is being
        written may find it written, as after a crash at that point."""
        write = functools.partial(
            self.append,
            effect_id,
            expected_head,
            build,
            effect_type=effect_type,
            lease_id=lease_id,
            blobs=blobs,
        )
        return await asyncio.to_thread(write) if self.loop_shared else write()

    async def transact_async(self, fn: Callable[[JournalTx], T]) -> T:
        """Run ``fn(tx)``, a synchronous function, in one durable write transaction of this
        journal, and return what it returns once committed; if it raises, nothing it wrote is
        kept. It runs beside the coroutines' appends, never interleaved with them (they wait
        for it), so keep it short. Tier 0 (a write in the journal's own database) needs it."""
        raise JournalConfigError(
            f"journal {self.url} cannot run an effect inside its own transaction: tier 0 needs "
            "a SQL journal (sqlite:/// or postgresql://)"
        )

    def database(self) -> tuple[str, ...]:
        """Which database holds the journal (``database_of``)."""
        return database_of(self.url)

    @abstractmethod
    def effects(
        self,
        *,
        status: Kind | None = None,
        in_doubt: bool = False,
        older_than: float | None = None,
        limit: int | None = None,
        since: float | None = None,
    ) -> list[EffectRow]:
        """Index rows, newest first. ``in_doubt``: dispatched and never confirmed; ``since``:
        updated at or after this time (epoch seconds)."""

    def in_doubt(self, *, older_than: float | None = None) -> list[EffectRow]:
        """What was started and never confirmed (an indexed query)."""
        return self.effects(in_doubt=True, older_than=older_than)

    @abstractmethod
    def by_origin(self, origin: str) -> list[str]:
        """The effects first proposed by this origin (an indexed query)."""

    @abstractmethod
    def blob(self, effect_id: str, name: str) -> Any:
        """The value last stored under ``name`` with one of the effect's appends (``proposed``,
        ``approved``, ``result``), or None."""

    @abstractmethod
    def claim(self, effect_id: str) -> Claim | None:
        """The effect's exclusive claim, or None while a live holder has it."""

    async def claim_reading(self, effect_id: str) -> tuple[Claim | None, list[Entry] | None]:
        """``claim`` for a coroutine, and the effect's entries as ``read`` gives them, read after
        the claim was granted where the backend reads them in the same round trip (None: not
        read, the caller reads under the claim). ``(None, None)`` while a live holder has it."""
        return self.claim(effect_id), None

    async def release_async(self, claim: Claim) -> None:
        """``claim.release()`` for a coroutine: done when the claim is free, even if the caller
        is cancelled meanwhile."""
        claim.release()

    async def read_async(self, effect_id: str) -> list[Entry]:
        """``read`` for a coroutine."""
        return self.read(effect_id)

    async def by_origin_async(self, origin: str) -> list[str]:
        """``by_origin`` for a coroutine."""
        return self.by_origin(origin)

    @abstractmethod
    def is_claimed(self, effect_id: str) -> bool: ...

    @abstractmethod
    def iter_raw(self) -> Iterator[RawEntry]:
        """Every stored entry in seq order, as stored."""

    def iter_raw_batches(self) -> Iterator[Iterable[Sequence[Any]]]:
        """Every stored entry in seq order, as the values of its ``RawEntry`` (in field order),
        a batch at a time: what ``verify`` reads."""
        for r in self.iter_raw():
            yield ((r.seq, r.effect_id, r.kind, r.prev, r.hash, r.key_id, r.sig, r.body, r.vals),)

    @abstractmethod
    def iter_rows(self) -> Iterator[EffectRow]:
        """Every effect's index row (policy chains included), for ``verify``."""

    def row_values(self) -> Sequence[Sequence[Any]]:
        """Every effect's index row as its values (in ``EffectRow``'s field order), read now."""
        return [
            (
                r.effect_id,
                r.effect_type,
                r.status.value,
                r.head,
                r.head_seq,
                r.updated_ts,
                r.first_dispatch_ts,
                r.last_dispatch_ts,
                r.origin,
            )
            for r in self.iter_rows()
        ]

    @abstractmethod
    def head(self) -> JournalHead | None:
        """The last entry's seq and hash."""

    @abstractmethod
    def schema_version(self) -> int: ...

    @abstractmethod
    def key_effect_ids(self, scheme: str) -> None:
        """Key this journal's effect ids with ``scheme`` for good (only before its first
        entry); see ``effect_ids``."""

    @abstractmethod
    def close(self) -> None: ...

    def verify(self, head: JournalHead | str | None = None, *, jobs: int = 1) -> VerifyReport:
        """Check every entry's hash, signature, place in its chain and in the sequence, the
        values stored beside it, and every effect's index row against its entries; then the
        rows the gate reads to allow something against the signed entries (``control_check``,
        fed by the same pass). ``jobs`` > 1: on that many processes (``verify_jobs``), where
        the journal is large enough to gain from them."""
        if isinstance(head, str):
            head = JournalHead.parse(head)
        anchors = self.anchor_entries()
        stored = self.control_rows()
        fold = self._charge_fold(stored)
        source = self.entry_source() if jobs > 1 else None
        last = self.head() if source is not None else None
        if source is not None and last is not None:
            report = verify_in_jobs(
                source, self.keyring, head, last.seq, self.row_values, anchors, fold, jobs
            )
        else:
            rows = self.row_values()
            feed = None if fold is None else fold.feed
            report = verify_stored(
                self.iter_raw_batches(), self.keyring, head, rows, anchors, feed=feed
            )
        if report.ok:
            try:
                self.check_effect_ids()
            except JournalCorrupt as err:
                update = {"ok": False, "first_bad_seq": err.seq, "problem": err.problem}
                report = report.model_copy(update=update)
        if report.ok:
            if fold is None:  # a lease's chain did not read before the pass: read it now
                fold = fold_entries(self.iter_raw(), self._lease_chains(stored))
            control = check_control_plane(stored, fold, RowSeals(self.keyring))
            report = report.model_copy(update={"control": control})
            if control.problems:
                more = len(control.problems) - 1
                problem = control.problems[0] + (f" (and {more} more)" if more else "")
                report = report.model_copy(update={"ok": False, "problem": problem})
        return report

    def _lease_chains(self, stored: ControlRows) -> dict[str, list[Entry]]:
        """Each lease's chain (read and checked: ``JournalCorrupt`` if one is not sound)."""
        return {row[0]: self.read(lease_chain(row[0])) for row in stored.leases}

    def _charge_fold(self, stored: ControlRows) -> ChargeFold | None:
        """The fold the verify pass feeds, its leases' chains read first; None if one of them
        does not read (the pass names what is wrong)."""
        try:
            return ChargeFold(self._lease_chains(stored))
        except JournalCorrupt:
            return None

    def entry_source(self) -> EntrySource | None:
        """Where another process reads this journal's entries from (``verify --jobs``); None:
        nowhere, it is verified in this process."""
        return None

    @abstractmethod
    def control_rows(self) -> ControlRows:
        """The rows the gate reads to allow something, as stored (``control_check``)."""

    @abstractmethod
    def check_effect_ids(self) -> None:
        """Refuse (``JournalCorrupt``) a journal whose effect-id setting disagrees with its
        signed entries."""

    def anchor_entries(self) -> list[RawEntry]:
        """The anchors of the archives taken from this journal (``Kind.ANCHOR``), as stored."""
        return [raw for raw in self.iter_raw() if raw.kind == Kind.ANCHOR.value]

    def check_tail(self) -> None:
        """Refuse to use a journal whose last entry is torn or not ours (checked at open)."""
        raw = self.last_raw()
        if raw is None:
            return
        if self.keyring.get(raw.key_id) is None:
            raise JournalConfigError(
                f"journal {self.url}: its last entry (seq {raw.seq}) is signed with key "
                f"{raw.key_id}, which is not configured (keys: {', '.join(self.keyring.key_ids)}); "
                "configure that key (INTERLOCK_SIGNING_KEY or the key file), or pass it as an "
                "older key after a rotation"
            )
        problem = check_entry(raw, self.keyring)
        if problem is not None:
            raise JournalCorrupt(
                f"journal {self.url}: the last entry (seq {raw.seq}) is unusable: {problem}. "
                "Nothing was appended. Run `interlock journal verify` and restore from a copy."
            )

    @abstractmethod
    def last_raw(self) -> RawEntry | None: ...

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
