"""The journal's configuration chains (``config:<name>``): signed ``CONFIG`` entries the roster
(``operators``) and the review rules (``review_config``) are kept in. Each change is one entry
appended after the chain's head; the chain is read and verified like any other, so a change
made by writing the database without the journal's keys fails the read."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .errors import HeadConflict, InterlockError
from .journal import CONFIG_CHAIN_TYPE, Journal
from .models import Draft, Entry, Kind

#: how often a change is tried again when another landed first
ATTEMPTS = 8


def append_config(journal: Journal, chain: str, data: Mapping[str, Any]) -> Entry:
    """Append one change to ``chain``, after whatever its head is when it is written."""
    for _ in range(ATTEMPTS):
        row = journal.row(chain)
        try:
            (entry,) = journal.append(
                chain,
                row.head if row is not None else "",
                [Draft(kind=Kind.CONFIG, data=dict(data))],
                effect_type=CONFIG_CHAIN_TYPE,
            )
        except HeadConflict:
            continue  # another change landed first: read the head again
        return entry
    raise InterlockError(f"{chain} kept changing under this change: try again")


def config_data(entry: Entry) -> dict[str, Any] | None:
    """What a ``CONFIG`` entry sets (its data without the effect type a chain's first entry
    also signs); None for an entry of another kind."""
    if entry.kind is not Kind.CONFIG:
        return None
    return {k: v for k, v in entry.data.items() if k != "effect_type"}
