"""``interlock effects``: list, show (the receipt and the entries), reopen a refused one."""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from ..core.journal import Journal, value_of
from ..core.journal.signing import Keyring
from ..core.models import ANNOTATIONS, Entry, Kind
from ..core.receipts import fold, receipt
from ..core.review import ReviewError, reopen
from ..core.sealing import ENCRYPTED, Values, is_sealed
from ._args import (
    Groups,
    codec_option,
    command,
    journal_options,
    json_flag,
    operator_name,
    parse_duration,
    positive,
)
from ._render import render_effects, render_entries, render_receipt
from ._shared import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    MIN_PREFIX,
    CliError,
    emit,
    emit_json,
    open_for,
    resolve_effect,
    warn,
)
from ._temporal import payload_codec

#: an effect's row never has a tombstone's or an anchor's kind as its status
_STATES = [k.value for k in Kind if k not in ANNOTATIONS | {Kind.ARCHIVED, Kind.ANCHOR}]


def _state(text: str) -> Kind:
    value = text.strip().upper().replace("-", "_")
    if value not in _STATES:
        raise argparse.ArgumentTypeError(
            f"invalid state {text!r}: choose from {', '.join(_STATES)}"
        )
    return Kind(value)


def _dispatches(journal: Journal, effect_id: str) -> int:
    # folded: an archived effect's tombstone keeps the count its archived entries had
    return fold(effect_id, journal.read(effect_id)).dispatches


def cmd_effects_list(args: argparse.Namespace) -> int:
    older_than = None if args.older_than is None else args.older_than.total_seconds()
    limit: int | None = args.limit
    with open_for(args) as journal:
        rows = journal.effects(
            status=args.state,
            in_doubt=args.in_doubt,
            older_than=older_than,
            limit=None if limit is None else limit + 1,
        )
        more = limit is not None and len(rows) > limit
        rows = rows[:limit] if limit is not None else rows
        counts = {row.effect_id: _dispatches(journal, row.effect_id) for row in rows}
    if args.json:
        emit_json(
            [{**row.model_dump(mode="json"), "dispatches": counts[row.effect_id]} for row in rows]
        )
    elif rows:
        emit(render_effects(rows, counts))
    else:
        warn("no effects match")
    if more:
        warn(f"showing the newest {limit}; raise --limit to see more")
    return EXIT_OK


def cmd_effects_show(args: argparse.Namespace) -> int:
    with open_for(args) as journal:
        effect_id = resolve_effect(journal, args.effect_id)
        entries = journal.read(effect_id)
        try:
            found = receipt(effect_id, journal=journal)
        except KeyError:
            raise CliError(EXIT_USAGE, f"effect {effect_id} has no journal entries") from None
    values = asyncio.run(_values(args, entries))
    if args.json:
        if values is None:
            emit(found.model_dump_json(indent=2))
        else:
            emit_json({**found.model_dump(mode="json"), "values": values})
    else:
        emit(render_receipt(found))
        for name, value in (values or {}).items():
            shown = value if value == ENCRYPTED else json.dumps(value, ensure_ascii=False)
            emit(f"{name:<18}{shown}")
        emit("")
        emit(render_entries(entries))
    return EXIT_OK


async def _values(args: argparse.Namespace, entries: list[Entry]) -> dict[str, Any] | None:
    """The effect's approved input and result, shown only with ``--codec`` (decoded) or when
    they are sealed (then "encrypted" without it): a plaintext journal's output is as before."""
    stored = {name: value_of(entries, name) for name in ("approved", "result")}
    codec = payload_codec(args)
    if codec is None and not any(is_sealed(v) for v in stored.values()):
        return None
    from .._worker.codec import CodecSealer  # loads Temporal: only for a command that decodes

    values = Values(Keyring(None), None if codec is None else CodecSealer(codec))
    return {
        f"{name} value": await values.shown(value)
        for name, value in stored.items()
        if value is not None
    }


def cmd_effects_reopen(args: argparse.Namespace) -> int:
    with open_for(args) as journal:
        effect_id = resolve_effect(journal, args.effect_id)
        try:
            recorded = reopen(journal, effect_id, operator=args.operator, note=args.note)
        except ReviewError as err:
            raise CliError(EXIT_FAILED, str(err)) from None
    emit(
        f"reopened {effect_id} by {args.operator.strip()}: its next attempt dispatches under "
        "the lease and the facts current then"
    )
    emit("")
    assert recorded.receipt is not None
    emit(render_receipt(recorded.receipt))
    return EXIT_OK


def register(groups: Groups) -> None:
    effects = groups.add_parser(
        "effects", help="list effects, show one effect's receipt, reopen a refused one"
    )
    journal_options(effects, top=False)
    effects_sub = effects.add_subparsers(dest="command", metavar="COMMAND", required=True)
    listing = command(
        effects_sub,
        "list",
        cmd_effects_list,
        "list effects, newest first",
        example=[
            "interlock effects list --in-doubt --older-than 5m",
            "interlock effects list --state REFUSED --limit 20 --json",
        ],
    )
    which = listing.add_mutually_exclusive_group()
    which.add_argument(
        "--state",
        type=_state,
        metavar="KIND",
        help=f"only effects in this state ({', '.join(_STATES)})",
    )
    which.add_argument(
        "--in-doubt",
        action="store_true",
        help="only effects dispatched and never confirmed",
    )
    listing.add_argument(
        "--older-than",
        type=parse_duration,
        metavar="AGE",
        help="only effects not updated for this long (e.g. 5m)",
    )
    listing.add_argument("--limit", type=positive, metavar="N", help="at most N effects")
    json_flag(listing)
    show = command(
        effects_sub,
        "show",
        cmd_effects_show,
        "show an effect's receipt and its journal entries",
        example=["interlock effects show 5819f792", "interlock effects show 5819f792 --json"],
    )
    show.add_argument(
        "effect_id",
        metavar="EFFECT_ID",
        help=f"the effect id, or a unique prefix of at least {MIN_PREFIX} characters",
    )
    json_flag(show)
    codec_option(show, top=True)
    reopen_cmd = command(
        effects_sub,
        "reopen",
        cmd_effects_reopen,
        "reopen a REFUSED effect that never executed (journal only): its next attempt "
        "dispatches under the authority and facts current then; exit 1 if it is not REFUSED",
        example=['interlock effects reopen 5819f792 --operator carol --note "lease reissued"'],
    )
    reopen_cmd.add_argument(
        "effect_id",
        metavar="EFFECT_ID",
        help=f"the effect id, or a unique prefix of at least {MIN_PREFIX} characters",
    )
    reopen_cmd.add_argument(
        "--operator", required=True, type=operator_name, metavar="O", help="who reopens it"
    )
    reopen_cmd.add_argument("--note", default="", metavar="N", help="why, for the record")
