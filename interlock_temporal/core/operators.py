"""The operator roster: who may decide a review, and the key each one proves it with.

The problem: a vote names its operator, and anyone with Temporal namespace access can type any
name; ``min_approvals=2`` is met by one person typing two names. A name counts only when the
vote carries a proof by a key the journal knows for that name (``vote_proofs``).

The mechanism: the roster is a chain of signed ``CONFIG`` entries in the journal (chain
``config:operators``), one per change: an operator added with their Ed25519 public key and the
channels that reach them (``notify``), or revoked; an **attester** is a key added under its own
name that attests for named operators (a web backend that logged the person in signs their vote,
so no operator's private key sits on a server). The roster is what those entries fold to, read
and verified like any chain: whoever can write the database but not the journal's keys can
neither add a key nor un-revoke one. The roster's id is the hash of its first entry: proofs name
it, so a signature made for one journal's roster counts in no other.

Where no roster exists (the chain is empty), names are self-asserted: anyone with namespace
access can decide, and the worker says so. Where one exists, a vote without a valid proof does
not count; revoking everyone leaves a roster in which nobody can decide (closed, not open).

Cost: one chain read (a few entries, each verified) per recorded decision; nothing on the
gate's path.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .config_chain import append_config, config_data
from .errors import InterlockError
from .journal import Journal
from .journal.signing import ED25519_PUBLIC_PREFIX, Ed25519Key
from .models import Entry

#: the journal chain that holds the roster's changes
ROSTER_CHAIN = "config:operators"
#: a name an operator goes by: what a vote's ``operator`` says
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,127}")


class RosterError(InterlockError):
    """A roster change that cannot be made (the message says why)."""


class OperatorChange(BaseModel):
    """One change to the roster, as a ``CONFIG`` entry on ``config:operators`` signs it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    change: Literal["add", "revoke"]
    name: str = Field(pattern=NAME.pattern)
    #: ``ed25519-public:<64 hex>`` (add only)
    public_key: str | None = None
    #: how the operator is reached (``mailto:...``, ``https://...``): where one-time codes go
    notify: list[str] = Field(default_factory=list)
    #: an attester's operators: the names whose votes this key may sign (add only)
    attests_for: list[str] = Field(default_factory=list)
    #: who made the change, for the record
    by: str = ""
    note: str = ""


@dataclass(frozen=True)
class Operator:
    """An operator (or attester) the roster holds now."""

    name: str
    key: Ed25519Key
    notify: tuple[str, ...] = ()
    attests_for: tuple[str, ...] = ()

    @property
    def key_id(self) -> str:
        return self.key.key_id

    @property
    def is_attester(self) -> bool:
        return bool(self.attests_for)


@dataclass(frozen=True)
class Roster:
    """What the roster's entries fold to. ``id`` is the hash of its first entry ("" when the
    journal has none: no roster)."""

    id: str
    operators: dict[str, Operator]
    revoked: frozenset[str] = frozenset()

    @property
    def exists(self) -> bool:
        return bool(self.id)

    def by_key(self, key_id: str) -> Operator | None:
        return next((o for o in self.operators.values() if o.key_id == key_id), None)

    def may_sign(self, signer: Operator, operator: str) -> bool:
        """Whether ``signer``'s key proves a vote by ``operator``: their own key, or an
        attester's that attests for them (an attester never votes in its own name)."""
        if signer.is_attester:
            return operator in signer.attests_for and operator in self.operators
        return signer.name == operator

    def operator(self, name: str) -> Operator | None:
        found = self.operators.get(name)
        return None if found is None or found.is_attester else found


NO_ROSTER = Roster(id="", operators={})


def public_key(text: str) -> Ed25519Key:
    """An operator's public key from its text (``ed25519-public:<64 hex>``)."""
    text = text.strip()
    if not text.startswith(ED25519_PUBLIC_PREFIX):
        raise RosterError(
            f"an operator's public key is {ED25519_PUBLIC_PREFIX}<64 hex> (`interlock operators "
            "keygen` writes one)"
        )
    try:
        return Ed25519Key(public=bytes.fromhex(text[len(ED25519_PUBLIC_PREFIX) :]))
    except (ValueError, InterlockError):
        raise RosterError(
            f"an operator's public key is {ED25519_PUBLIC_PREFIX}<64 hex>: this one is not"
        ) from None


def fold_roster(entries: Sequence[Entry]) -> Roster:
    """The roster ``entries`` (the chain's, verified) fold to."""
    if not entries:
        return NO_ROSTER
    operators: dict[str, Operator] = {}
    revoked: set[str] = set()
    for entry in entries:
        data = config_data(entry)
        if data is None:
            raise RosterError(f"entry {entry.seq} on the roster's chain is not a CONFIG entry")
        try:
            change = OperatorChange.model_validate(data)
        except ValidationError:
            raise RosterError(f"entry {entry.seq} on the roster's chain is not a change") from None
        if change.change == "revoke":
            operators.pop(change.name, None)
            revoked.add(change.name)
            continue
        assert change.public_key is not None  # add_operator never writes one without
        operators[change.name] = Operator(
            name=change.name,
            key=public_key(change.public_key),
            notify=tuple(change.notify),
            attests_for=tuple(change.attests_for),
        )
        revoked.discard(change.name)
    return Roster(id=entries[0].hash, operators=operators, revoked=frozenset(revoked))


def roster_of(journal: Journal) -> Roster:
    """The journal's roster now (``NO_ROSTER`` when it has none)."""
    return fold_roster(journal.read(ROSTER_CHAIN))


def _change(journal: Journal, change: OperatorChange) -> Roster:
    append_config(journal, ROSTER_CHAIN, change.model_dump(mode="json"))
    return roster_of(journal)


def add_operator(
    journal: Journal,
    name: str,
    key: str,
    *,
    notify: Sequence[str] = (),
    attests_for: Sequence[str] = (),
    by: str = "",
    note: str = "",
) -> Roster:
    """Add ``name`` with the public key ``key`` (or replace their key and channels). With
    ``attests_for``, ``name`` is an attester: a key that signs the votes of those operators,
    never its own."""
    if not NAME.fullmatch(name):
        raise RosterError("an operator's name is letters, digits and . _ @ + - (at most 128)")
    public_key(key)
    current = roster_of(journal)
    if attests_for:
        if name in attests_for:
            raise RosterError(f"attester {name!r} cannot attest for itself")
        unknown = [n for n in attests_for if current.operator(n) is None]
        if unknown:
            raise RosterError(
                f"attester {name!r} attests for operators the roster does not hold: "
                + ", ".join(unknown)
                + " (add them first)"
            )
    taken = next((o for o in current.operators.values() if o.key.public_text == key.strip()), None)
    if taken is not None and taken.name != name:
        raise RosterError(f"that key is already {taken.name!r}'s: one key, one name")
    return _change(
        journal,
        OperatorChange(
            change="add",
            name=name,
            public_key=key.strip(),
            notify=list(notify),
            attests_for=list(attests_for),
            by=by,
            note=note,
        ),
    )


def revoke_operator(journal: Journal, name: str, *, by: str = "", note: str = "") -> Roster:
    """Revoke ``name``: their key proves nothing from now on (an attester's: for nobody)."""
    if name not in roster_of(journal).operators:
        raise RosterError(f"{name!r} is not on the roster")
    return _change(journal, OperatorChange(change="revoke", name=name, by=by, note=note))
