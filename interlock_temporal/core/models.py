"""The data that crosses the core's boundaries: journal entries, leases, facts, receipts."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

M = TypeVar("M", bound=BaseModel)
_new = object.__new__
_set = object.__setattr__


def built(model: type[M], fields: dict[str, Any]) -> M:
    """An instance of ``model`` made of ``fields``, which the core built itself with the types
    the model declares (no validation): what ``model_construct`` makes, without its loop over
    the fields, for the few models the gate makes on every effect. ``fields`` becomes the
    instance's own (pass a dict no one else holds); it must name every field without a default.
    Anything read from outside (the journal's rows, a caller's input) is validated instead."""
    m = _new(model)
    _set(m, "__dict__", fields)
    _set(m, "__pydantic_fields_set__", set(fields))
    _set(m, "__pydantic_extra__", None)
    _set(m, "__pydantic_private__", None)
    return m


class Kind(StrEnum):
    """Journal entry kinds. Most move an effect's state; annotations only add to its record."""

    PROPOSED = "PROPOSED"
    AUTHORIZED = "AUTHORIZED"
    DISPATCHED = "DISPATCHED"
    COMMITTED = "COMMITTED"
    REFUSED = "REFUSED"
    AMBIGUOUS = "AMBIGUOUS"
    NOT_SENT = "NOT_SENT"
    RESOLVED = "RESOLVED"
    REOPENED = "REOPENED"
    #: a policy event on a session's policy chain (``policy:<session>``): a denial, an
    #: escalation, an observed verdict, a circuit reset
    POLICY = "POLICY"
    #: a tombstone: the first live entry of an effect whose earlier entries moved to an
    #: archive (``interlock journal archive``). It signs what a later attempt reads of them
    #: (the effect's folded state, its final status), its ``prev`` is their head
    ARCHIVED = "ARCHIVED"
    #: an archive's anchor, alone on its chain (``archive:<id>``): the seq ranges the archive
    #: took from the journal and the root over their hashes
    ANCHOR = "ANCHOR"
    #: a change to the journal's configuration, on a chain of its own (``config:<name>``):
    #: an operator added to or revoked from the roster (``core.operators``)
    CONFIG = "CONFIG"
    # annotations: recorded on the effect's chain, never change its state
    REJECTED_PROPOSAL = "REJECTED_PROPOSAL"
    CONFIRMED = "CONFIRMED"
    #: binds, by digest, values an effect stored before entries signed them (schema 4)
    VALUES_BOUND = "VALUES_BOUND"


ANNOTATIONS = frozenset({Kind.REJECTED_PROPOSAL, Kind.CONFIRMED, Kind.VALUES_BOUND})
FINAL_STATES = frozenset({Kind.COMMITTED, Kind.REFUSED, Kind.AMBIGUOUS, Kind.RESOLVED})


class Entry(BaseModel):
    """One signed journal entry. ``body`` holds the exact bytes that were hashed and signed;
    ``values``, the values stored beside it (read back, and verified against its digest)."""

    model_config = ConfigDict(frozen=True)

    seq: int
    ts: float
    effect_id: str
    kind: Kind
    prev: str
    data: dict[str, Any]
    hash: str
    key_id: str
    sig: str
    body: bytes
    values: dict[str, Any] | None = None


class Draft(BaseModel):
    """An entry to append: the journal assigns seq, ts, prev, hash and signature."""

    model_config = ConfigDict(frozen=True)

    kind: Kind
    data: dict[str, Any] = Field(default_factory=dict)

    @classmethod
    def of(cls, kind: Kind, data: dict[str, Any]) -> Draft:
        """A draft the gate built: ``data`` (a dict with string keys that no one else holds)
        becomes its own, unvalidated (``built``)."""
        return built(cls, {"kind": kind, "data": data})


class Change(BaseModel):
    """A premise that no longer holds: which fact, and what it was and is."""

    model_config = ConfigDict(frozen=True)

    fact: str
    recorded: Any = None
    current: Any = None
    rule: str = "equal"


class Found(BaseModel):
    """What a queryable target knows of an effect that happened."""

    model_config = ConfigDict(frozen=True)

    result: Any = None
    confirmation: str | None = None


class Lease(BaseModel):
    """Authority a principal holds, checked inside the dispatch transaction.

    ``max_amount_cents`` caps one effect; ``budget_cents`` caps all of them together: each
    effect reserves its approved amount once, when it is dispatched, and gets it back only if
    it ends without executing. ``reserved_cents`` is what the lease's effects hold reserved
    when it was read (not stored in the lease itself).

    A lease is kept as a chain of signed entries (``lease_chain``: issued, revoked), and its
    row is their product, sealed (``row_seals``).

    A lease issued from another (``LeaseStore.issue(..., parent=...)``) is *delegated*: its
    ``ancestors`` (its parent first, its root last) are fixed when it is issued and signed with
    it in its ``issued`` entry, and it can only narrow each of them (``leases.narrowed``). A
    dispatch under it checks every ancestor too, and reserves on each budgeted one
    (``delegators``: the ancestors as the dispatch transaction read them)."""

    model_config = ConfigDict(frozen=True)

    lease_id: str
    principal: str
    activities: list[str] | None = None
    max_amount_cents: int | None = None
    budget_cents: int | None = None
    resources: list[str] | None = None
    issued_at: float
    expires_at: float | None = None
    revoked_at: float | None = None
    reserved_cents: int | None = None
    #: the lease's chain head when it was read, ``SEQ:HASH`` of its latest signed entry (not
    #: stored in the lease itself): every DISPATCHED signs it with the lease, so ``interlock
    #: journal verify`` can tell a dispatch made against an older document
    head: str | None = None
    #: the leases this one was delegated from, its parent first, its root last (None: a root
    #: lease; documents written before delegation read as roots). Fixed at issue, signed.
    ancestors: list[str] | None = None
    #: the ancestors as the transaction that read this lease read and checked them, in the
    #: order of ``ancestors``, each with what its budget has reserved (not stored: a dispatch's
    #: read only)
    delegators: list[Lease] | None = Field(default=None, exclude=True)

    @property
    def parent(self) -> str | None:
        """The lease this one was issued from (None: a root lease)."""
        return self.ancestors[0] if self.ancestors else None

    def dumped_without(self) -> set[str]:
        """What the lease's dumps leave out besides what a read adds: a root lease's empty
        ``ancestors``, so a root lease's stored document, its chain's entries and its
        snapshots keep the bytes they had before delegation."""
        return {"ancestors"} if self.ancestors is None else set()

    def chain(self) -> list[str]:
        """The lease ids from the root down to this lease (just this one for a root lease)."""
        return [*reversed(self.ancestors or []), self.lease_id]

    def snapshot(self) -> dict[str, Any]:
        """The lease as JSON data (``model_dump(mode="json")``, less ``dumped_without``),
        recorded in every AUTHORIZED. Its fields are JSON data as they stand (strings, whole
        numbers, floats, lists of strings, None), so they are copied as they are; anything else
        takes the serializer."""
        out: dict[str, Any] = {}
        for name, value in self.__dict__.items():
            if value is None and name == "ancestors":
                continue  # a root lease's snapshot is the one it was before delegation
            if name == "delegators":
                continue  # never dumped: the ancestors' ids are in ``ancestors``
            t = type(value)
            if t is list:
                value = list(value)
            elif not (t is str or t is int or value is None or t is float):
                return self.model_dump(mode="json", exclude=self.dumped_without())
            out[name] = value
        return out


class EffectRow(BaseModel):
    """The journal's index row for one effect: its current state and head."""

    model_config = ConfigDict(frozen=True)

    effect_id: str
    effect_type: str
    status: Kind
    head: str
    head_seq: int
    updated_ts: float
    first_dispatch_ts: float | None = None
    last_dispatch_ts: float | None = None
    #: the Temporal activity and input that proposed it (``identity.origin_of``)
    origin: str | None = None


class JournalHead(BaseModel):
    """The last entry of a journal: record it somewhere else to detect a cut tail later."""

    model_config = ConfigDict(frozen=True)

    seq: int
    hash: str

    def __str__(self) -> str:
        return f"{self.seq}:{self.hash}"

    @classmethod
    def parse(cls, text: str) -> JournalHead:
        seq, _, digest = text.strip().partition(":")
        if (
            not seq.isdigit()
            or len(digest) != 64
            or any(c not in "0123456789abcdef" for c in digest)
        ):
            raise ValueError("a journal head looks like SEQ:SHA256HEX")
        return cls(seq=int(seq), hash=digest)


class ControlCheck(BaseModel):
    """What ``journal.control_check`` found of the rows the gate reads to allow something:
    how many it compared with the signed entries, and each that disagrees."""

    leases: int = 0
    budgets: int = 0
    #: the dispatches whose signed lease head it compared with the lease's chain
    dispatches: int = 0
    #: the policy's rows it checked (sessions, approvals, spend, admissions)
    policy: int = 0
    problems: list[str] = Field(default_factory=list)


class VerifyReport(BaseModel):
    ok: bool
    entries: int
    effects: int
    head: JournalHead | None = None
    first_bad_seq: int | None = None
    problem: str | None = None
    #: the rows the gate reads to allow something, checked against the entries (None: not
    #: checked, the entries did not verify)
    control: ControlCheck | None = None
    #: how many processes checked the entries (``verify(jobs=...)``; 1: one pass)
    jobs: int = 1

    def __str__(self) -> str:
        if self.ok:
            return f"ok: {self.entries} entries, {self.effects} chains, head {self.head}"
        if self.first_bad_seq is None:
            return f"FAILED: {self.problem}"
        return f"FAILED at entry seq={self.first_bad_seq}: {self.problem}"


Executed = bool | Literal["unknown"]


class Receipt(BaseModel):
    """What happened to one effect, in the terms an auditor asks about.

    ``executed`` is what the target confirmed (or a person attested), never what was attempted.
    Argument values never appear: only digests and names.
    """

    effect_id: str
    effect_type: str
    final: str
    via: str | None = None
    proposed: bool
    authorized: bool
    executed: Executed
    recorded: bool
    code: str | None = None
    reason: str | None = None
    changed_facts: list[str] = Field(default_factory=list)
    premises_held: bool | None = None
    principal: str | None = None
    lease_id: str | None = None
    #: the leases the effect acted under, its root lease first and ``lease_id`` last (a root
    #: lease: just its id; a delegated one: its ancestors as its signed document names them)
    lease_chain: list[str] = Field(default_factory=list)
    authority_at_send: dict[str, Any] | None = None
    decided_by: list[str] = Field(default_factory=list)
    payload_digest: str | None = None
    approved_digest: str | None = None
    result_digest: str | None = None
    confirmation: str | None = None
    dispatches: int = 0
    target: str | None = None
    tier: int | None = None
    operator: str | None = None
    #: for each operator of a person's decision whose vote reached the review through Temporal:
    #: the client identity Temporal recorded for its signal or Update ("" when the client set
    #: none), read from the review's history by the recording worker. Temporal recorded this
    #: client identity; a client sets it, so it is evidence, not proof of who decided
    sent_by: dict[str, str] = Field(default_factory=dict)
    proposed_at: datetime | None = None
    finished_at: datetime | None = None
    #: the policy's verdict when it did not simply allow: observed (monitor mode) or met by
    #: an approval; and the policy epoch that decided
    policy_code: str | None = None
    policy_epoch: str | None = None
    observed: bool = False
    #: the lease's cumulative budget, and what this effect holds reserved of it (0 once it
    #: ended without executing and gave its reservation back)
    lease_budget_cents: int | None = None
    lease_charged_cents: int | None = None
    journal_seq: int
    journal_hash: str
    #: the id of the journal that holds the effect (``core.journal_identity``); None in a
    #: receipt made before journals had ids, or read from a journal that has none yet
    journal_id: str | None = None
