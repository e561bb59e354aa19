"""A SQL journal's effect-id setting (``Journal.effect_ids``): plain sha256 unless the journal
was keyed before its first effect; kept in ``meta`` as ``effect_ids``, and recorded again (signed)
in every ``PROPOSED`` entry as ``ids``, so an edit of the setting is caught.

Every process reads the setting from the journal, never from its own configuration: two
workers that named one decision two ways would each find nothing under their name and send it.
"""

from __future__ import annotations

import functools
from typing import Any

from ..errors import InFlight, JournalConfigError, JournalCorrupt
from .entries import ENTRY_COLUMNS, check_entry, decode_entries, raw_entry
from .interface import OWN_CHAIN_TYPES
from .sql_access import JournalAccess

#: seconds before the attempt that names its effect again, after the journal's ids were keyed
IDS_CHANGED_RETRY_S = 0.1


class EffectIdSetting:
    """The effect-id setting of one SQL journal, as this process knows it: the journal's
    ``effect_ids`` (read at open, and again when another process keyed them), and whether the
    setting can no longer change (``fixed``: it is set, or the journal has effects)."""

    def __init__(self, journal: JournalAccess) -> None:
        self._journal = journal
        #: the setting can no longer change: an append need not look at it again (``confirm``)
        self.fixed = False

    def recorded(self, db: Any) -> str | None:
        """The setting as the journal's ``meta`` holds it now (None: plain sha256)."""
        sql = "SELECT value FROM meta WHERE key = 'effect_ids'"
        row = self._journal.execute(db, sql).fetchone()
        return None if row is None else str(row[0])

    def key(self, scheme: str) -> None:
        """Make the journal's effect ids keyed with ``scheme`` (``hmac-sha256:<key id>``) for
        good. Only a journal that never had an entry can be keyed: an effect recorded before
        would get a new id, and a duplicate of it would be sent again. Holds the journal's seq,
        as an append does, so a first append cannot slip in beside it. Keying a journal keyed
        with ``scheme`` already does nothing."""
        journal = self._journal

        def key(db: Any) -> None:
            now = self.recorded(db)
            if now == scheme:
                return
            if now is not None:
                raise JournalConfigError(
                    f"journal {journal.url}: its effect ids are keyed with {now} for good"
                )
            journal.hold_seq(db)  # as an append holds it: no first effect slips in beside
            if self._has_effects(db):
                raise JournalConfigError(
                    f"journal {journal.url} has effects: keying its effect ids now would give "
                    "the effects it holds new ids, and a duplicate of one of them would be sent "
                    "again; key a new journal's ids before its first effect"
                )
            journal.execute(db, "INSERT INTO meta (key, value) VALUES ('effect_ids', ?)", (scheme,))

        journal.writing(key)
        journal.effect_ids = scheme

    def _has_effects(self, db: Any) -> bool:
        """Whether the journal records an effect (its own chains, a lease's or the roster's,
        name none: they may come before the keying)."""
        own = ", ".join("?" * len(OWN_CHAIN_TYPES))
        sql = f"SELECT 1 FROM effects WHERE effect_type NOT IN ({own}) LIMIT 1"
        return self._journal.execute(db, sql, OWN_CHAIN_TYPES).fetchone() is not None

    def confirm(self, db: Any, seq: int, effect_id: str, effect_type: str | None) -> None:
        """Inside an append's transaction (``seq``: the journal's last, held), until the
        setting is ``fixed``: refuse an effect named before the journal's ids were keyed by
        another process, after this one opened it. Nothing is written nor sent; the next
        attempt names the effect as the journal does now. An append to one of the journal's
        own chains (``effect_type`` one of ``OWN_CHAIN_TYPES``) names no effect: it passes."""
        if self.fixed or effect_type in OWN_CHAIN_TYPES:
            return
        journal = self._journal
        now = self.recorded(db)
        if now != journal.effect_ids:
            journal.effect_ids = now
            raise InFlight(
                effect_id,
                f"the journal's effect ids were keyed ({now}) after this process opened it: the "
                "next attempt names the effect with them",
                IDS_CHANGED_RETRY_S,
            )
        self.fixed = now is not None or (seq > 0 and self._has_effects(db))

    def _one(self, sql: str, db: Any) -> Any:
        return self._journal.execute(db, sql).fetchone()

    def check(self) -> None:
        """Refuse (``JournalCorrupt``) a journal whose setting disagrees with its signed
        entries. The setting is made before the first ``PROPOSED``, so the first and the last
        both record it; a removed or edited setting would name the next duplicate differently
        and send it again. An entry of a key this process lacks is not verified here
        (``verify`` judges it); a mismatch in it still counts."""
        journal = self._journal
        setting = journal.reading(self.recorded)
        for order in ("ASC", "DESC"):
            sql = (
                f"SELECT {ENTRY_COLUMNS} FROM entries WHERE (kind = 'PROPOSED' "
                "OR kind = 'DISPATCHED' AND prev = '') "
                f"ORDER BY seq {order} LIMIT 1"
            )
            found = journal.reading(functools.partial(self._one, sql))
            if found is None:
                return
            raw = raw_entry(found)
            held = journal.keyring.get(raw.key_id) is not None
            problem = check_entry(raw, journal.keyring) if held else None
            if problem is None:
                named = decode_entries(raw)[0].data.get("ids")
                if named != setting:
                    problem = (
                        f"it names its effect with ids {named or 'sha256'}, the journal's "
                        f"setting says {setting or 'sha256'}"
                    )
            if problem is not None:
                raise JournalCorrupt.at(raw.effect_id, raw.seq, problem)
