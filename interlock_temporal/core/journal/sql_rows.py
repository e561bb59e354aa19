"""Rows of a SQL journal as read: an entry as stored, an effect's index row."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..models import EffectRow, Kind
from .entries import RawEntry

ENTRY_COLUMNS = "seq, effect_id, kind, prev, hash, key_id, sig, body, vals"


def effect_row(values: Sequence[Any]) -> EffectRow:
    return EffectRow(
        effect_id=values[0],
        effect_type=values[1],
        status=Kind(values[2]),
        head=values[3],
        head_seq=values[4],
        updated_ts=values[5],
        first_dispatch_ts=values[6],
        last_dispatch_ts=values[7],
        origin=values[8],
    )


def raw_entry(values: Sequence[Any]) -> RawEntry:
    """A stored entry as read. A body an operator rewrote as text (SQLite keeps what it is given)
    is taken as its UTF-8 bytes, so the check names it as an edit instead of failing to read it."""
    seq, eid, kind, prev, hash_, key_id, sig, body, vals = values
    signed = body.encode() if isinstance(body, str) else bytes(body)
    return RawEntry(seq, eid, kind, prev, hash_, key_id, sig, signed, vals)
