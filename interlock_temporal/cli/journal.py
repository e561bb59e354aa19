"""``interlock journal``: verify, export, archive, keygen, public-key, head, id."""

from __future__ import annotations

import argparse
import contextlib
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..core.errors import JournalConfigError, JournalCorrupt
from ..core.journal import export_line, keyring_for, read_export, verify_entries
from ..core.journal.archiving import archive_chain, read_archive, verify_archive
from ..core.journal.signing import ED25519_PREFIX, ED25519_PUBLIC_PREFIX, Ed25519Key, Keyring
from ..core.journal.verify_jobs import MIN_PER_JOB, default_jobs
from ..core.journal_identity import journal_id_of
from ..core.models import JournalHead, Kind
from ..core.vote_proofs import ProofCheck, recheck
from ._args import Groups, command, journal_options, json_flag, parse_age
from ._render import render_proofs
from ._render import render_verify as _render_verify
from ._shared import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    CliError,
    emit,
    emit_json,
    open_for,
    open_for_verify,
    warn,
)


def _jobs(text: str) -> int:
    try:
        jobs = int(text)
    except ValueError:
        jobs = 0
    if jobs < 1:
        raise argparse.ArgumentTypeError(f"invalid --jobs {text!r}: use a whole number, 1 or more")
    return jobs


def _head(text: str) -> JournalHead:
    try:
        return JournalHead.parse(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid head {text!r}: use SEQ:HASH as printed by `interlock journal head`"
        ) from None


def _public_keys(args: argparse.Namespace) -> list[str]:
    """``--public-key``: a key as text, or a file holding one."""
    keys = []
    for given in getattr(args, "public_key", None) or []:
        path = Path(given)
        text = given
        if path.is_file():
            try:
                text = path.read_text().strip()
            except OSError as err:
                raise CliError(EXIT_USAGE, f"{given}: cannot be read: {err.strerror}") from None
        if not text.startswith(ED25519_PUBLIC_PREFIX):
            raise CliError(
                EXIT_USAGE,
                f"--public-key {given}: expected {ED25519_PUBLIC_PREFIX}<64 hex> (as `interlock "
                "journal public-key` prints it), or a file holding it",
            )
        keys.append(text)
    return keys


def cmd_journal_verify(args: argparse.Namespace) -> int:
    public = _public_keys(args)
    proofs: ProofCheck | None = None
    if args.archive is not None:
        return _verify_archive(args, public)
    if args.export is not None:
        keyring = _verify_keyring(args, public)
        try:
            with open(args.export, encoding="utf-8") as lines:
                report = verify_entries(read_export(lines), keyring, args.head)
        except OSError as err:
            raise CliError(EXIT_USAGE, f"{args.export}: cannot be read: {err.strerror}") from None
        except JournalCorrupt as err:
            raise CliError(EXIT_FAILED, f"{args.export}: {err}") from None
        where = str(args.export)
    else:
        with open_for_verify(args, public_keys=public) as journal:
            report = journal.verify(args.head, jobs=args.jobs)
            where = journal.url
            # the proofs recorded with people's decisions, against the roster of their time
            proofs = recheck(journal) if report.ok and args.head is None else None
    if args.json:
        doc = report.model_dump(mode="json")
        if args.export is None and proofs is not None:
            doc["vote_proofs"] = proofs.model_dump(mode="json")
        emit_json(doc)
    else:
        emit(_render_verify(report, journal=where))
        if args.export is None and proofs is not None and (proofs.checked or proofs.problems):
            emit(render_proofs(proofs))
    failed = proofs is not None and bool(proofs.problems)
    return EXIT_OK if report.ok and not failed else EXIT_FAILED


def _verify_archive(args: argparse.Namespace, public: list[str]) -> int:
    """``verify --archive FILE``: the archive alone; with ``--journal``, also against the
    anchor that journal keeps of it."""
    try:
        text = args.archive.read_text(encoding="utf-8")
    except OSError as err:
        raise CliError(EXIT_USAGE, f"{args.archive}: cannot be read: {err.strerror}") from None
    lines = text.splitlines()
    try:
        archive_id = str(read_archive(lines)[0]["archive"].get("archive_id"))
        if getattr(args, "journal", None) is None:
            report = verify_archive(lines, _verify_keyring(args, public))
            where = f"{args.archive} (alone: give --journal to check it against its anchor)"
        else:
            with open_for_verify(args, public_keys=public) as journal:
                anchor = journal.read(archive_chain(archive_id))
                if not anchor or anchor[0].kind is not Kind.ANCHOR:
                    raise CliError(
                        EXIT_FAILED,
                        f"{args.archive}: journal {journal.url} has no anchor of archive "
                        f"{archive_id}: the archive took nothing from it (a run that stopped "
                        "before its commit), or it was taken from another journal",
                    )
                report = verify_archive(lines, journal.keyring, anchor[0].data)
                where = f"{args.archive} (against the anchor in {journal.url})"
    except JournalCorrupt as err:
        raise CliError(EXIT_FAILED, f"{args.archive}: {err}") from None
    if args.json:
        emit_json({**report.model_dump(mode="json"), "archive_id": archive_id})
    else:
        verdict = "ok" if report.ok else f"FAILED at seq {report.first_bad_seq}: {report.problem}"
        emit(f"archive  {where}\nid       {archive_id}\nresult   {verdict}")
        if report.ok:
            emit(f"entries  {report.entries}\neffects  {report.effects}")
    return EXIT_OK if report.ok else EXIT_FAILED


def _date(text: str) -> datetime:
    """``--before``: an ISO date (``2026-01-31``, midnight UTC) or date and time (UTC unless
    it names its offset)."""
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid date {text!r}: use YYYY-MM-DD or YYYY-MM-DDTHH:MM[:SS][+HH:MM]"
        ) from None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def cmd_journal_archive(args: argparse.Namespace) -> int:
    from ..core.retention import DEFAULT_MIN_AGE, archive

    min_age = DEFAULT_MIN_AGE if args.min_age is None else args.min_age
    with open_for(args) as journal:
        try:
            run = archive(
                journal,
                before=args.before,
                to=args.to,
                min_age=min_age,
                allow_short_min_age=args.allow_short_min_age,
            )
        except ValueError as err:
            raise CliError(EXIT_USAGE, str(err)) from None
        except OSError as err:
            raise CliError(
                EXIT_USAGE, f"--to {args.to}: cannot be written: {err.strerror}"
            ) from None
    left = ", ".join(f"{why} {n}" for why, n in sorted(run.skipped.items())) or "none"
    if args.json:
        emit_json(
            {
                "archive_id": run.archive_id,
                "file": None if run.path is None else str(run.path),
                "effects": run.effects,
                "entries": run.entries,
                "ranges": run.ranges,
                "root": run.root,
                "anchor": None if run.anchor is None else str(run.anchor),
                "skipped": run.skipped,
            }
        )
    elif run.archive_id is None:
        emit(f"nothing to archive before {args.before.isoformat()} (left: {left}); no file written")
    else:
        emit(
            f"archived {run.effects} effects ({run.entries} entries) to {run.path}\n"
            f"archive  {run.archive_id}\nanchor   {run.anchor}\nleft     {left}\n"
            f"check it: interlock journal verify --archive {run.path} --journal {journal.url}"
        )
    return EXIT_OK


def _verify_keyring(args: argparse.Namespace, public: list[str]) -> Keyring:
    """The keys to verify an export with: the public keys given, else the configured key."""
    try:
        return keyring_for(None, args.signing_key or None, public_keys=public)
    except JournalConfigError as err:
        raise CliError(
            EXIT_USAGE, f"{err}: give --public-key (Ed25519) or the HMAC key to verify an export"
        ) from None


def cmd_journal_export(args: argparse.Namespace) -> int:
    with open_for_verify(args) as journal, contextlib.ExitStack() as stack:
        out: Any = sys.stdout
        if args.output is not None:
            try:
                out = stack.enter_context(open(args.output, "w", encoding="utf-8"))
            except OSError as err:
                raise CliError(
                    EXIT_USAGE, f"{args.output}: cannot be written: {err.strerror}"
                ) from None
        count = 0
        for raw in journal.iter_raw():
            out.write(export_line(raw) + "\n")
            count += 1
    if args.output is not None:
        warn(f"exported {count} entries to {args.output}")
    return EXIT_OK


def cmd_journal_keygen(args: argparse.Namespace) -> int:
    key = Ed25519Key.generate()
    private = ED25519_PREFIX + key.seed_hex()
    if args.json:
        emit_json({"signing_key": private, "public_key": key.public_text, "key_id": key.key_id})
    else:
        emit(f"signing key (secret: INTERLOCK_SIGNING_KEY or the key file): {private}")
        emit(f"public key (give it to auditors: journal verify --public-key): {key.public_text}")
    return EXIT_OK


def cmd_journal_public_key(args: argparse.Namespace) -> int:
    with open_for(args) as journal:
        key = journal.keyring.signing
    if not isinstance(key, Ed25519Key):
        warn(
            f"the journal signs with {key.key_id} (HMAC): it has no public key; sign with an "
            "Ed25519 key (`interlock journal keygen`) so auditors can verify without the secret"
        )
        return EXIT_FAILED
    emit(key.public_text)
    return EXIT_OK


def cmd_journal_head(args: argparse.Namespace) -> int:
    with open_for(args) as journal:
        head = journal.head()
        if head is None:
            warn(f"journal {journal.url} is empty: it has no head yet")
            return EXIT_FAILED
        if args.json:
            emit_json(head.model_dump(mode="json"))
        else:
            emit(str(head))
    return EXIT_OK


def cmd_journal_id(args: argparse.Namespace) -> int:
    with open_for(args) as journal:
        found = journal_id_of(journal, create=False)
        if args.json:
            emit_json({"journal_id": found, "journal": journal.url})
        elif found is None:
            warn(
                f"journal {journal.url} has no id yet: the first worker to start on it gives it "
                "one (workers put it in their Temporal identity: one task queue, one journal)"
            )
        else:
            emit(found)
    return EXIT_OK if found is not None else EXIT_FAILED


def register(groups: Groups) -> None:
    journal = groups.add_parser("journal", help="verify the journal, print its head")
    journal_options(journal, top=False)
    journal_sub = journal.add_subparsers(dest="command", metavar="COMMAND", required=True)
    verify = command(
        journal_sub,
        "verify",
        cmd_journal_verify,
        "check every entry's hash, signature and place in its chain; exit 1 if any fails",
        example=[
            "interlock journal verify",
            'interlock journal verify --head "$(tail -n 1 heads.txt)"',
            "interlock journal verify --export journal.jsonl --public-key journal.pub",
        ],
    )
    verify.add_argument(
        "--head",
        type=_head,
        metavar="SEQ:HASH",
        help="a head recorded earlier (`interlock journal head`): also detects a cut tail",
    )
    verify.add_argument(
        "--public-key",
        action="append",
        metavar="K",
        help="verify with this Ed25519 public key alone (ed25519-public:<hex>, or a file "
        "holding it); repeat for rotated keys. No secret is needed",
    )
    verify.add_argument(
        "--export",
        type=Path,
        metavar="FILE",
        help="verify a `journal export` file instead of the database",
    )
    verify.add_argument(
        "--archive",
        type=Path,
        metavar="FILE",
        help="verify an archive file (`journal archive`); with --journal, also against the "
        "anchor the journal keeps of it",
    )
    verify.add_argument(
        "--jobs",
        type=_jobs,
        default=default_jobs(),
        metavar="N",
        help="check the entries on N processes (default: the cores this process may use); "
        f"a journal under {MIN_PER_JOB:,} entries per process is checked by fewer",
    )
    json_flag(verify)
    _register_archive(journal_sub)
    export = command(
        journal_sub,
        "export",
        cmd_journal_export,
        "write every entry as one JSON line (its signed bytes, hash and signature), verifiable "
        "alone with `journal verify --export FILE`",
        example=["interlock journal export -o journal.jsonl"],
    )
    export.add_argument("--output", "-o", metavar="FILE", help="write here (default: stdout)")
    keygen = command(
        journal_sub,
        "keygen",
        cmd_journal_keygen,
        "print a new Ed25519 signing key and its public key (nothing is written)",
        example=["interlock journal keygen", "interlock journal keygen --json"],
    )
    json_flag(keygen)
    command(
        journal_sub,
        "public-key",
        cmd_journal_public_key,
        "print the public key of the journal's Ed25519 signing key, for auditors",
        example=["interlock journal public-key > journal.pub"],
    )
    head = command(
        journal_sub,
        "head",
        cmd_journal_head,
        "print the last entry as SEQ:HASH, to record elsewhere",
        example=["interlock journal head >> heads.txt", "interlock journal head --json"],
    )
    json_flag(head)
    journal_id = command(
        journal_sub,
        "id",
        cmd_journal_id,
        "print the journal's id (signed; workers name it in their Temporal identity and refuse "
        "gated work beside a worker of another journal on their task queue)",
        example=["interlock journal id", "interlock journal id --json"],
    )
    json_flag(journal_id)


def _register_archive(journal_sub: Any) -> None:
    archive = command(
        journal_sub,
        "archive",
        cmd_journal_archive,
        "move settled effects (COMMITTED, REFUSED, RESOLVED happened) last updated before a "
        "date to a signed archive file, leaving tombstones and a signed anchor",
        example=[
            "interlock journal archive --before 2026-01-01 --to archive-2025.jsonl",
            "interlock journal archive --before 2026-06-01 --to a.jsonl --min-age 90d --json",
        ],
    )
    archive.add_argument(
        "--before", type=_date, required=True, metavar="DATE", help="archive what settled before"
    )
    archive.add_argument(
        "--to", type=Path, required=True, metavar="FILE", help="the archive file (must not exist)"
    )
    archive.add_argument(
        "--min-age",
        type=parse_age,
        metavar="DURATION",
        help="never archive an effect younger than this (default 30d; at least the longest "
        "schedule_to_close_timeout of your gated activities)",
    )
    archive.add_argument(
        "--allow-short-min-age",
        action="store_true",
        help="accept a --min-age under 1d (you know no activity runs that long)",
    )
    json_flag(archive)
