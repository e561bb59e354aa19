"""``interlock operators``: the roster of people who may decide reviews, and their keys."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from ..core.journal.signing import ED25519_PREFIX, ED25519_PUBLIC_PREFIX, Ed25519Key
from ..core.operators import RosterError, add_operator, revoke_operator, roster_of
from ..core.review_config import journal_rules, set_review_rules
from ._args import Groups, command, json_flag, positive
from ._shared import EXIT_OK, EXIT_USAGE, CliError, emit, emit_json, open_for, warn


def _public_text(value: str) -> str:
    """``--public-key``: the key's text, or a file holding it (``keygen`` writes NAME.pub)."""
    if value.strip().startswith(ED25519_PUBLIC_PREFIX):
        return value.strip()
    path = Path(value)
    if not path.is_file():
        raise CliError(
            EXIT_USAGE,
            f"--public-key {value}: no such file, and not a key ({ED25519_PUBLIC_PREFIX}<64 hex>)",
        )
    return path.read_text().strip()


def cmd_operators_keygen(args: argparse.Namespace) -> int:
    private, public = Path(args.out), Path(args.out + ".pub")
    if private.exists():
        raise CliError(EXIT_USAGE, f"{private} exists: a key is never overwritten")
    key = Ed25519Key.generate()
    fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, f"{ED25519_PREFIX}{key.seed_hex()}\n".encode())
    finally:
        os.close(fd)
    public.write_text(key.public_text + "\n")
    emit(f"private key: {private} (keep it to yourself; mode 600)")
    emit(f"public key:  {public}  {key.public_text}")
    emit(f"add it:      interlock operators add {private.name} --public-key {public}")
    return EXIT_OK


def cmd_operators_add(args: argparse.Namespace) -> int:
    with open_for(args, create=True) as journal:
        first = not roster_of(journal).exists
        try:
            roster = add_operator(
                journal,
                args.name,
                _public_text(args.public_key),
                notify=args.notify or [],
                attests_for=[n.strip() for n in (args.attests_for or "").split(",") if n.strip()],
                by=args.by,
                note=args.note,
            )
        except RosterError as err:
            raise CliError(EXIT_USAGE, f"not added: {err}") from None
    added = roster.operators[args.name]
    role = f"attester for {', '.join(added.attests_for)}" if added.is_attester else "operator"
    emit(f"added {args.name} ({role}), key {added.key_id}")
    if first:
        warn(
            "this journal now has an operator roster: from now on a vote counts only with its "
            "operator's proof (a key's signature, an attester's, or a one-time code)"
        )
    return EXIT_OK


def cmd_operators_revoke(args: argparse.Namespace) -> int:
    with open_for(args) as journal:
        try:
            revoke_operator(journal, args.name, by=args.by, note=args.note)
        except RosterError as err:
            raise CliError(EXIT_USAGE, f"not revoked: {err}") from None
    emit(f"revoked {args.name}: their key proves nothing from now on")
    return EXIT_OK


def cmd_operators_list(args: argparse.Namespace) -> int:
    with open_for(args) as journal:
        roster = roster_of(journal)
    rows: list[dict[str, Any]] = [
        {
            "name": o.name,
            "key_id": o.key_id,
            "public_key": o.key.public_text,
            "notify": list(o.notify),
            "attests_for": list(o.attests_for),
        }
        for o in sorted(roster.operators.values(), key=lambda o: o.name)
    ]
    if args.json:
        emit_json(
            {"roster": roster.id or None, "operators": rows, "revoked": sorted(roster.revoked)}
        )
        return EXIT_OK
    if not roster.exists:
        warn(
            "no operator roster: names on votes are not checked, and anyone with access to the "
            "Temporal namespace can decide a review (`interlock operators add` sets one up)"
        )
        return EXIT_OK
    for row in rows:
        role = f"attests for {', '.join(row['attests_for'])}" if row["attests_for"] else "operator"
        emit(f"{row['name']:<20} {row['key_id']}  {role}  {' '.join(row['notify'])}".rstrip())
    if roster.revoked:
        emit(f"revoked: {', '.join(sorted(roster.revoked))}")
    return EXIT_OK


def cmd_operators_rules(args: argparse.Namespace) -> int:
    changing = args.min_approvals is not None or args.allowed is not None
    with open_for(args, create=changing) as journal:
        if changing:
            current = journal_rules(journal)
            allowed = current.allowed_operators if current is not None else None
            if args.allowed is not None:
                allowed = [n.strip() for n in args.allowed.split(",") if n.strip()] or None
            minimum = args.min_approvals or (current.min_approvals if current is not None else 1)
            set_review_rules(
                journal,
                allowed_operators=allowed,
                min_approvals=minimum,
                by=args.by,
                note=args.note,
            )
        rules = journal_rules(journal)
    if rules is None:
        warn(
            "the journal sets no review rules: each worker counts votes under its own "
            "(InterlockPlugin(review=ReviewRules(...)))"
        )
        return EXIT_OK
    shown = {
        "allowed_operators": rules.allowed_operators,
        "min_approvals": rules.min_approvals,
    }
    if args.json:
        emit_json(shown)
    else:
        who = ", ".join(rules.allowed_operators) if rules.allowed_operators else "any operator"
        emit(f"min approvals  {rules.min_approvals}\nwho may decide {who}")
    return EXIT_OK


def _recorded_with(parser: argparse.ArgumentParser) -> None:
    """A roster or rules change's ``--by`` and ``--note``, signed into its entry."""
    parser.add_argument("--by", default="", metavar="WHO", help="who makes the change (recorded)")
    parser.add_argument("--note", default="", metavar="N", help="why, for the record")


def register(groups: Groups) -> None:
    operators = groups.add_parser(
        "operators", help="the people who may decide reviews, and the keys that prove it"
    )
    sub = operators.add_subparsers(dest="command", metavar="COMMAND", required=True)
    keygen = command(
        sub,
        "keygen",
        cmd_operators_keygen,
        "make an operator's Ed25519 key pair: FILE (private, mode 600) and FILE.pub",
        example=["interlock operators keygen ~/.interlock/carol"],
    )
    keygen.add_argument("out", metavar="FILE", help="where the private key goes")
    add = command(
        sub,
        "add",
        cmd_operators_add,
        "add an operator (or replace their key and channels) to the journal's signed roster; "
        "with --attests-for, a backend key that signs the votes of the operators it names",
        example=[
            "interlock operators add carol --public-key carol.pub --notify mailto:carol@acme.org",
            "interlock operators add review-app --public-key app.pub --attests-for carol,dave",
        ],
    )
    add.add_argument("name", metavar="NAME", help="the name the operator's votes carry")
    add.add_argument(
        "--public-key",
        required=True,
        metavar="KEY",
        help="ed25519-public:<hex>, or a file holding it (keygen's FILE.pub)",
    )
    add.add_argument(
        "--notify",
        action="append",
        metavar="CHANNEL",
        help="how the operator is reached (mailto:ADDRESS or an https:// webhook); repeat",
    )
    add.add_argument(
        "--attests-for",
        metavar="NAMES",
        help="comma-separated operators whose votes this key signs (an attester)",
    )
    _recorded_with(add)
    revoke = command(
        sub,
        "revoke",
        cmd_operators_revoke,
        "revoke an operator or attester: their key proves nothing from now on",
        example=["interlock operators revoke carol --note 'left the team'"],
    )
    revoke.add_argument("name", metavar="NAME")
    _recorded_with(revoke)
    listing = command(
        sub,
        "list",
        cmd_operators_list,
        "list the roster: operators, attesters, their key ids and channels",
        example=["interlock operators list", "interlock operators list --json"],
    )
    json_flag(listing)
    rules = command(
        sub,
        "rules",
        cmd_operators_rules,
        "show, or set, the review rules every worker of the journal counts votes under "
        "(signed journal configuration; a worker's own rules apply where it sets none)",
        example=[
            "interlock operators rules",
            "interlock operators rules --min-approvals 2 --allowed carol,dave",
        ],
    )
    rules.add_argument(
        "--min-approvals", type=positive, metavar="N", help="distinct operators who must agree"
    )
    rules.add_argument(
        "--allowed",
        metavar="NAMES",
        help="comma-separated operators who may decide (an empty string: any operator)",
    )
    _recorded_with(rules)
    json_flag(rules)
