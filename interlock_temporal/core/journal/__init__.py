"""The journal: append-only, one signed entry per transition, hash-chained per effect.

``interface`` is what every backend implements (``Journal``); ``entries`` signs, checks and
exports the entries, ``verifying`` checks a whole journal; ``opening`` opens a journal by URL;
``signing`` holds the keys that sign entries and ``claims`` the effects' exclusive claims.

``sql`` is what the SQL backends (``sqlite``, ``postgres``) share: ``SqlJournal``. The modules
beside it reach it only through the protocols of ``sql_access`` (``SqlAccess`` for the stores
kept in its database: ``sql_leases``, ``sql_policy``, ``sql_notify``; ``JournalAccess`` for
``sql_ids``, the effect-id setting, and ``sql_archive``, an archive run) and
``group_commit.BatchWriter`` (``group_commit``: coroutines' appends written in shared
batches). ``archiving`` is the archive file and its checks, ``checkpoints`` the SQLite WAL's
checkpointer, ``pg_server`` what a PostgreSQL server must promise before entries are written
to it.

Each name is imported on first use, so importing one module of this package loads only that
module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..exports import lender

if TYPE_CHECKING:
    from .entries import (
        ENTRY_VERSION,
        UNBOUND,
        ChainCheck,
        RawEntry,
        check_chain,
        check_entry,
        decode_entry,
        encode_entry,
        export_line,
        origin_in,
        read_export,
        state_kind,
        value_of,
        values_digest,
    )
    from .interface import (
        CONFIG_CHAIN_TYPE,
        DEFAULT_COMMIT_DELAY,
        LEASE_CHAIN_TYPE,
        POLICY_CHAIN_TYPE,
        SCHEMA_VERSION,
        Build,
        Journal,
        lease_chain,
        policy_chain,
        redacted,
    )
    from .opening import JournalLocation, keyring_for, open_journal, parse_journal_url
    from .signing import KeyLike, as_key
    from .verifying import verify_entries

__all__ = [
    "CONFIG_CHAIN_TYPE",
    "DEFAULT_COMMIT_DELAY",
    "ENTRY_VERSION",
    "LEASE_CHAIN_TYPE",
    "POLICY_CHAIN_TYPE",
    "SCHEMA_VERSION",
    "UNBOUND",
    "Build",
    "ChainCheck",
    "Journal",
    "JournalLocation",
    "KeyLike",
    "RawEntry",
    "as_key",
    "check_chain",
    "check_entry",
    "decode_entry",
    "encode_entry",
    "export_line",
    "keyring_for",
    "lease_chain",
    "open_journal",
    "origin_in",
    "parse_journal_url",
    "policy_chain",
    "read_export",
    "redacted",
    "state_kind",
    "value_of",
    "values_digest",
    "verify_entries",
]

__getattr__ = lender(
    __name__,
    {
        **dict.fromkeys(
            (
                "ChainCheck",
                "ENTRY_VERSION",
                "RawEntry",
                "UNBOUND",
                "check_chain",
                "check_entry",
                "decode_entry",
                "encode_entry",
                "export_line",
                "origin_in",
                "read_export",
                "state_kind",
                "value_of",
                "values_digest",
            ),
            ".entries",
        ),
        **dict.fromkeys(
            (
                "Build",
                "CONFIG_CHAIN_TYPE",
                "DEFAULT_COMMIT_DELAY",
                "Journal",
                "LEASE_CHAIN_TYPE",
                "POLICY_CHAIN_TYPE",
                "SCHEMA_VERSION",
                "lease_chain",
                "policy_chain",
                "redacted",
            ),
            ".interface",
        ),
        **dict.fromkeys(
            ("JournalLocation", "keyring_for", "open_journal", "parse_journal_url"), ".opening"
        ),
        **dict.fromkeys(("KeyLike", "as_key"), ".signing"),
        "verify_entries": ".verifying",
    },
)
