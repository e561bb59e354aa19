"""``interlock``: the operator's view of a journal, and of the reviews and reconciler on Temporal.

    interlock [--journal URL] [--signing-key KEY] journal verify [--head SEQ:HASH] [--json]
    interlock journal head [--json]
    interlock effects list [--state KIND | --in-doubt] [--older-than AGE] [--limit N] [--json]
    interlock effects show EFFECT_ID [--json]
    interlock effects reopen EFFECT_ID --operator O [--note N]
    interlock leases issue PRINCIPAL [--activity A]... [--max-amount-cents N] [--budget-cents N]
                           [--resource R]... [--ttl 1h|30m|90s]
    interlock leases revoke LEASE_ID
    interlock leases list [--json]

On a Temporal server (``--address``, default ``$TEMPORAL_ADDRESS``, else ``localhost:7233``;
``--namespace``, default ``$TEMPORAL_NAMESPACE``, else ``default``):

    interlock reviews list [--all] [--limit N] [--json]
    interlock reviews resolve EFFECT_ID --decision D --operator O [--note N]
                              [--kind ambiguous|approval] [--result JSON] [--timeout AGE]
                              [--json]
    interlock reconcile --task-queue Q [--older-than AGE] [--limit N] [--timeout AGE] [--json]

Exit codes: 0 ok; 1 a check failed or there was nothing to do; 2 usage error or not found;
3 the journal cannot be opened, or the Temporal server cannot be reached. Errors are one line
on stderr, never a traceback (set ``INTERLOCK_DEBUG=1`` to see one for an unexpected error).
Temporal is imported only by the commands that talk to a server.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import re
import sqlite3
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from ._render import (
    ReviewLine,
    fmt_time,
    lease_state,
    reconcile_summary,
    render_effects,
    render_entries,
    render_leases,
    render_receipt,
    render_reconcile,
    render_report,
    render_review_status,
    render_reviews,
)
from ._render import render_verify as _render_verify
from .core.errors import InterlockError, JournalConfigError, JournalCorrupt, JournalUnavailable
from .core.journal import (
    Journal,
    export_line,
    keyring_for,
    open_journal,
    read_export,
    verify_entries,
)
from .core.journal.signing import ED25519_PREFIX, ED25519_PUBLIC_PREFIX, Ed25519Key, Keyring
from .core.models import ANNOTATIONS, JournalHead, Kind
from .core.receipts import receipt
from .core.report import build_report
from .core.review import DECISIONS, ReviewError, reopen, review_id

if TYPE_CHECKING:  # Temporal is imported by the commands that need a server, not at start
    from temporalio.client import Client, WorkflowExecution
    from temporalio.service import RPCError

    from ._review import ReconcileOutcome, ReviewStatus

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_JOURNAL = 3
#: the Temporal server cannot be reached (the same code as a journal that cannot be opened)
EXIT_SERVER = 3

DEFAULT_JOURNAL = "sqlite:///interlock.db"
DEFAULT_ADDRESS = "localhost:7233"
DEFAULT_NAMESPACE = "default"
#: the shortest effect id prefix ``effects show`` accepts
MIN_PREFIX = 8
#: a full effect id: 256 bits, hex
_FULL_ID = re.compile(r"[0-9a-f]{64}")
#: how long ``reviews list`` waits for one review to answer its status query
QUERY_TIMEOUT_S = 5.0
#: how many reviews ``reviews list`` asks at once
QUERY_CONCURRENCY = 16
#: the visibility query for open reviews; ``--all`` drops the status filter
REVIEWS_QUERY = "WorkflowType = 'EffectReview'"
OPEN_REVIEWS_QUERY = f"{REVIEWS_QUERY} AND ExecutionStatus = 'Running'"
#: the reconciler's note for an effect a live attempt holds (that attempt will settle it)
#: reconciler outcomes that need nobody: the effect is settled or in front of a person
_SETTLED = frozenset({Kind.COMMITTED.value, Kind.REFUSED.value, Kind.RESOLVED.value})

_EPILOG = """\
exit codes: 0 ok; 1 a check failed or nothing to do; 2 usage error or not found;
3 the journal cannot be opened, or the Temporal server cannot be reached.
The journal defaults to $INTERLOCK_JOURNAL, else sqlite:///interlock.db. The signing key comes
from --signing-key, else $INTERLOCK_SIGNING_KEY, else the key file beside the SQLite database
(<database>.key). Commands on Temporal (reviews, reconcile) connect to --address, else
$TEMPORAL_ADDRESS, else localhost:7233, in --namespace, else $TEMPORAL_NAMESPACE, else default.
"""


class CliError(Exception):
    """A failure the command reports as one line on stderr, with its exit code."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


Handler = Callable[[argparse.Namespace], int]


# -- argument types -------------------------------------------------------------------------

_DURATION = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")
_STATES = [k.value for k in Kind if k not in ANNOTATIONS]


def parse_duration(text: str) -> timedelta:
    """``90s``, ``30m``, ``1h``, ``2d``, combinations (``1h30m``) or plain seconds; positive."""
    value = text.strip().lower()
    if value.isdigit():
        duration = timedelta(seconds=int(value))
    else:
        match = _DURATION.fullmatch(value)
        if not value or match is None:
            raise argparse.ArgumentTypeError(
                f"invalid duration {text!r}: use e.g. 90s, 30m, 1h, 2d or 1h30m"
            )
        days, hours, minutes, seconds = (int(g) if g else 0 for g in match.groups())
        duration = timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
    if duration <= timedelta(0):
        raise argparse.ArgumentTypeError(f"invalid duration {text!r}: must be positive")
    return duration


def _head(text: str) -> JournalHead:
    try:
        return JournalHead.parse(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid head {text!r}: use SEQ:HASH as printed by `interlock journal head`"
        ) from None


def _state(text: str) -> Kind:
    value = text.strip().upper().replace("-", "_")
    if value not in _STATES:
        raise argparse.ArgumentTypeError(
            f"invalid state {text!r}: choose from {', '.join(_STATES)}"
        )
    return Kind(value)


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"invalid number {text!r}: must not be negative")
    return value


def _positive(text: str) -> int:
    value = _count(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"invalid number {text!r}: must be at least 1")
    return value


def _age(text: str) -> timedelta:
    """Like ``parse_duration``, and zero is allowed (``0s``: no minimum age)."""
    value = text.strip().lower()
    match = _DURATION.fullmatch(value)
    if value and (value.isdigit() or match is not None):
        numbers = [value] if value.isdigit() else [g for g in match.groups() if g] if match else []
        if numbers and all(int(n) == 0 for n in numbers):
            return timedelta(0)
    return parse_duration(text)


def _result_json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"--result is not JSON: {err}") from None


# -- opening the journal ----------------------------------------------------------------------


def journal_url(args: argparse.Namespace) -> str:
    """``--journal``, else ``$INTERLOCK_JOURNAL``, else ``sqlite:///interlock.db``."""
    given: str | None = getattr(args, "journal", None)
    return given or os.environ.get("INTERLOCK_JOURNAL") or DEFAULT_JOURNAL


def _open(
    args: argparse.Namespace,
    *,
    create: bool,
    check_tail: bool = True,
    public_keys: Sequence[str] = (),
) -> Journal:
    url = journal_url(args)
    try:
        return open_journal(
            url,
            signing_key=args.signing_key or None,
            create=create,
            check_tail=check_tail,
            public_keys=public_keys,
        )
    except (OSError, sqlite3.Error) as err:
        raise CliError(EXIT_JOURNAL, f"journal {url} cannot be opened: {err}") from None


def open_for(args: argparse.Namespace, *, create: bool = False) -> Journal:
    """Open the journal the arguments name. Unless ``create``, a SQLite journal must already
    exist, with its key: reading commands never create a database or a new signing key."""
    return _open(args, create=create)


def open_for_verify(args: argparse.Namespace) -> Journal:
    """Open the journal even when its last entry is unusable: verify reports what is wrong."""
    return _open(args, create=False, check_tail=False)


# -- output ---------------------------------------------------------------------------------


def _out(text: str) -> None:
    sys.stdout.write(text if text.endswith("\n") else text + "\n")


def _err(text: str) -> None:
    sys.stderr.write(f"interlock: {text}\n")


def _json(value: Any) -> None:
    _out(json.dumps(value, indent=2, sort_keys=False, ensure_ascii=False))


# -- journal ---------------------------------------------------------------------------------


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
        with _open(args, create=False, check_tail=False, public_keys=public) as journal:
            report = journal.verify(args.head)
            where = journal.url
    if args.json:
        _json(report.model_dump(mode="json"))
    else:
        _out(_render_verify(report, journal=where))
    return EXIT_OK if report.ok else EXIT_FAILED


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
        _err(f"exported {count} entries to {args.output}")
    return EXIT_OK


def cmd_journal_keygen(args: argparse.Namespace) -> int:
    key = Ed25519Key.generate()
    private = ED25519_PREFIX + key.seed_hex()
    if args.json:
        _json({"signing_key": private, "public_key": key.public_text, "key_id": key.key_id})
    else:
        _out(f"signing key (secret: INTERLOCK_SIGNING_KEY or the key file): {private}")
        _out(f"public key (give it to auditors: journal verify --public-key): {key.public_text}")
    return EXIT_OK


def cmd_journal_public_key(args: argparse.Namespace) -> int:
    with open_for(args) as journal:
        key = journal.keyring.signing
    if not isinstance(key, Ed25519Key):
        _err(
            f"the journal signs with {key.key_id} (HMAC): it has no public key; sign with an "
            "Ed25519 key (`interlock journal keygen`) so auditors can verify without the secret"
        )
        return EXIT_FAILED
    _out(key.public_text)
    return EXIT_OK


def cmd_journal_head(args: argparse.Namespace) -> int:
    with open_for(args) as journal:
        head = journal.head()
        if head is None:
            _err(f"journal {journal.url} is empty: it has no head yet")
            return EXIT_FAILED
        if args.json:
            _json(head.model_dump(mode="json"))
        else:
            _out(str(head))
    return EXIT_OK


# -- effects ---------------------------------------------------------------------------------


def _dispatches(journal: Journal, effect_id: str) -> int:
    return sum(1 for e in journal.read(effect_id) if e.kind is Kind.DISPATCHED)


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
        _json(
            [{**row.model_dump(mode="json"), "dispatches": counts[row.effect_id]} for row in rows]
        )
    elif rows:
        _out(render_effects(rows, counts))
    else:
        _err("no effects match")
    if more:
        _err(f"showing the newest {limit}; raise --limit to see more")
    return EXIT_OK


def resolve_effect(journal: Journal, text: str) -> str:
    """The effect id ``text`` names: a full id, or a unique prefix of at least 8 characters."""
    wanted = text.strip()
    if not wanted:
        raise CliError(EXIT_USAGE, "an effect id is required")
    if journal.row(wanted) is not None:
        return wanted
    if journal.row(wanted.lower()) is not None:
        return wanted.lower()
    if len(wanted) < MIN_PREFIX:
        raise CliError(
            EXIT_USAGE,
            f"no effect {wanted} (a prefix needs at least {MIN_PREFIX} characters)",
        )
    prefixes = {wanted, wanted.lower()}
    matches = sorted(
        row.effect_id
        for row in journal.effects()
        if any(row.effect_id.startswith(p) for p in prefixes)
    )
    if not matches:
        raise CliError(EXIT_USAGE, f"no effect {wanted} in {journal.url}")
    if len(matches) > 1:
        shown = ", ".join(m[:20] for m in matches[:5]) + (", ..." if len(matches) > 5 else "")
        raise CliError(
            EXIT_USAGE,
            f"effect prefix {wanted} is ambiguous: {len(matches)} effects match ({shown})",
        )
    return matches[0]


def cmd_effects_show(args: argparse.Namespace) -> int:
    with open_for(args) as journal:
        effect_id = resolve_effect(journal, args.effect_id)
        entries = journal.read(effect_id)
        try:
            found = receipt(effect_id, journal=journal)
        except KeyError:
            raise CliError(EXIT_USAGE, f"effect {effect_id} has no journal entries") from None
    if args.json:
        _out(found.model_dump_json(indent=2))
    else:
        _out(render_receipt(found))
        _out("")
        _out(render_entries(entries))
    return EXIT_OK


def cmd_effects_reopen(args: argparse.Namespace) -> int:
    with open_for(args) as journal:
        effect_id = resolve_effect(journal, args.effect_id)
        try:
            recorded = reopen(journal, effect_id, operator=args.operator, note=args.note)
        except ReviewError as err:
            raise CliError(EXIT_FAILED, str(err)) from None
    _out(
        f"reopened {effect_id} by {args.operator.strip()}: its next attempt dispatches under "
        "the lease and the facts current then"
    )
    _out("")
    assert recorded.receipt is not None
    _out(render_receipt(recorded.receipt))
    return EXIT_OK


# -- leases ----------------------------------------------------------------------------------


def cmd_leases_issue(args: argparse.Namespace) -> int:
    with open_for(args, create=True) as journal:
        try:
            lease_id = journal.leases.issue(
                args.principal,
                activities=args.activity,
                max_amount_cents=args.max_amount_cents,
                budget_cents=args.budget_cents,
                resources=args.resource,
                ttl=args.ttl,
            )
        except ValueError as err:
            raise CliError(EXIT_USAGE, f"cannot issue the lease: {err}") from None
    _out(lease_id)
    return EXIT_OK


def cmd_leases_revoke(args: argparse.Namespace) -> int:
    with open_for(args) as journal:
        lease = journal.leases.get(args.lease_id)
        if lease is None:
            raise CliError(EXIT_USAGE, f"no lease {args.lease_id} in {journal.url}")
        state = lease_state(lease, time.time())
        if state != "live":
            _err(f"lease {args.lease_id} was not live ({state}): nothing revoked")
            return EXIT_FAILED
        if not journal.leases.revoke(args.lease_id):
            _err(f"lease {args.lease_id} was revoked meanwhile: nothing revoked")
            return EXIT_FAILED
    _out(f"revoked {args.lease_id}")
    return EXIT_OK


def cmd_leases_list(args: argparse.Namespace) -> int:
    with open_for(args) as journal:
        leases = journal.leases.list()
    now = time.time()
    if args.json:
        _json(
            [
                {**lease.model_dump(mode="json"), "state": lease_state(lease, now)}
                for lease in leases
            ]
        )
    elif leases:
        _out(render_leases(leases, now))
    else:
        _err("no leases")
    return EXIT_OK


# -- the report -------------------------------------------------------------------------------


def cmd_report(args: argparse.Namespace) -> int:
    since = time.time() - args.since.total_seconds()
    with open_for(args) as journal:
        found = build_report(journal, since)
    if args.json:
        _json(found.model_dump(mode="json"))
    else:
        _out(render_report(found))
    return EXIT_OK


# -- the policy's circuit --------------------------------------------------------------------


def _circuit_doc(session: str, state: Any) -> dict[str, Any]:
    circuit = None if state is None else state.circuit
    return {
        "session": session,
        "known": state is not None,
        "open": circuit is not None,
        "code": circuit.code if circuit else None,
        "activity": circuit.activity if circuit else None,
        "opened_at": circuit.at if circuit else None,
        "calls": state.total if state else 0,
        "spent_usd": state.spent_usd if state else 0.0,
    }


def cmd_circuit_show(args: argparse.Namespace) -> int:
    with open_for(args) as journal:
        doc = _circuit_doc(args.session, journal.policy.session(args.session))
    if args.json:
        _json(doc)
    elif not doc["known"]:
        _out(f"session {args.session}: no calls checked by the policy")
    elif doc["open"]:
        _out(
            f"session {args.session}: circuit OPEN since "
            f"{fmt_time(doc['opened_at'])} on {doc['code']} ({doc['activity']}); "
            f"{doc['calls']} calls, ${doc['spent_usd']:.2f} spent"
        )
    else:
        _out(
            f"session {args.session}: circuit closed; {doc['calls']} calls, "
            f"${doc['spent_usd']:.2f} spent"
        )
    return EXIT_OK


def cmd_circuit_reset(args: argparse.Namespace) -> int:
    with open_for(args) as journal:
        try:
            reset = journal.policy.reset(args.session, operator=args.operator, note=args.note)
        except ValueError as err:
            raise CliError(EXIT_USAGE, str(err)) from None
    if not reset:
        _err(f"session {args.session}: the circuit is not open: nothing reset")
        return EXIT_FAILED
    _out(f"session {args.session}: circuit reset by {args.operator.strip()} (journaled)")
    return EXIT_OK


# -- Temporal ---------------------------------------------------------------------------------


def temporal_address(args: argparse.Namespace) -> str:
    """``--address``, else ``$TEMPORAL_ADDRESS``, else ``localhost:7233``."""
    given: str | None = getattr(args, "address", None)
    return given or os.environ.get("TEMPORAL_ADDRESS") or DEFAULT_ADDRESS


def temporal_namespace(args: argparse.Namespace) -> str:
    """``--namespace``, else ``$TEMPORAL_NAMESPACE``, else ``default``."""
    given: str | None = getattr(args, "namespace", None)
    return given or os.environ.get("TEMPORAL_NAMESPACE") or DEFAULT_NAMESPACE


def _reason(err: BaseException) -> str:
    """The telling part of a connection error, on one line."""
    text = str(err) or type(err).__name__
    found = re.search(r'message: "([^"]+)"', text) or re.search(r'error: "([^"]+)"', text)
    if found is not None:
        return found.group(1)
    return " ".join(text.split())[:200]


async def connect(args: argparse.Namespace) -> Client:
    """A client for ``--address`` and ``--namespace``, with the pydantic data converter."""
    from temporalio.client import Client
    from temporalio.contrib.pydantic import pydantic_data_converter

    address = temporal_address(args)
    try:
        return await Client.connect(
            address, namespace=temporal_namespace(args), data_converter=pydantic_data_converter
        )
    except Exception as err:  # RuntimeError when refused, ValueError for a malformed address
        raise CliError(
            EXIT_SERVER, f"Temporal at {address} cannot be reached: {_reason(err)}"
        ) from None


def _server_error(err: RPCError, args: argparse.Namespace) -> CliError:
    from temporalio.service import RPCStatusCode

    address = temporal_address(args)
    if err.status in (RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED):
        return CliError(EXIT_SERVER, f"Temporal at {address} cannot be reached: {err.message}")
    if err.status == RPCStatusCode.NOT_FOUND and "namespace" in err.message.lower():
        return CliError(
            EXIT_SERVER, f"namespace {temporal_namespace(args)} not found on Temporal at {address}"
        )
    return CliError(EXIT_FAILED, f"Temporal at {address}: {err.message or err.status.name}")


def _is_not_found(err: RPCError) -> bool:
    """The workflow does not exist (or has ended), as opposed to the namespace."""
    from temporalio.service import RPCStatusCode

    return err.status == RPCStatusCode.NOT_FOUND and "namespace" not in err.message.lower()


def _failure_message(err: BaseException) -> str:
    """The message a workflow, an Update handler or its validator failed with, on one line."""
    from temporalio.exceptions import FailureError

    text = err.message if isinstance(err, FailureError) else str(err)
    return " ".join((text or type(err).__name__).split())


ServerCommand = Callable[[argparse.Namespace, "Client"], Awaitable[int]]


def on_server(body: ServerCommand) -> Handler:
    """A handler that connects to Temporal, runs ``body`` and turns RPC failures into one line."""

    def handler(args: argparse.Namespace) -> int:
        failure: Exception | None = None
        code = EXIT_FAILED
        try:
            code = asyncio.run(_with_client(body, args))
        except Exception as err:
            if os.environ.get("INTERLOCK_DEBUG"):
                raise
            # without its traceback and chain: their frames hold the client
            failure = err.with_traceback(None)
            failure.__cause__ = failure.__context__ = None
        # Free the client now, not during interpreter shutdown: the SDK's native client dropped
        # while Python finalizes can abort the process after the command did its work
        # ("PyGILState_Release: thread state ... must be current", temporalio/sdk-python#300).
        gc.collect()
        if failure is not None:
            raise failure
        return code

    return handler


async def _with_client(body: ServerCommand, args: argparse.Namespace) -> int:
    from temporalio.service import RPCError

    client = await connect(args)
    try:
        return await body(args, client)
    except RPCError as err:
        raise _server_error(err, args) from None


def _try_open(args: argparse.Namespace) -> tuple[Journal | None, str]:
    """The journal, or None and why it cannot be opened (for commands that can do without)."""
    try:
        return open_for(args), ""
    except CliError as err:
        return None, err.message
    except (JournalConfigError, JournalCorrupt, JournalUnavailable, sqlite3.Error) as err:
        return None, f"journal {journal_url(args)} cannot be opened: {err}"


def review_of(workflow_id: str) -> tuple[str, str]:
    """(kind, effect id) named by a review's workflow id (``?`` for a kind it does not name)."""
    for kind in DECISIONS:
        prefix = review_id(kind, "")
        if workflow_id.startswith(prefix):
            return kind, workflow_id[len(prefix) :]
    return "?", workflow_id


# -- reviews ---------------------------------------------------------------------------------


async def _review_line(
    client: Client, execution: WorkflowExecution
) -> tuple[ReviewLine, ReviewStatus | None]:
    """Ask one review for its status (a running one by query, a finished one by its result)."""
    from temporalio.client import WorkflowExecutionStatus
    from temporalio.exceptions import TemporalError

    from ._review import ReviewStatus

    kind, effect_id = review_of(execution.id)
    handle = client.get_workflow_handle(
        execution.id, run_id=execution.run_id, result_type=ReviewStatus
    )
    running = execution.status == WorkflowExecutionStatus.RUNNING
    timeout = timedelta(seconds=QUERY_TIMEOUT_S)
    status: ReviewStatus | None = None
    note = ""
    try:
        if running:
            status = await handle.query("status", result_type=ReviewStatus, rpc_timeout=timeout)
        elif execution.status == WorkflowExecutionStatus.COMPLETED:
            status = await handle.result(follow_runs=False, rpc_timeout=timeout)
    except (TemporalError, ValueError) as err:
        note = (
            "no worker answered its status query"
            if running
            else f"its result cannot be read ({type(err).__name__})"
        )
    if status is None:
        state = "?" if running or execution.status is None else execution.status.name.lower()
        return (
            ReviewLine(
                workflow_id=execution.id,
                kind=kind,
                effect_id=effect_id,
                state=state,
                started=execution.start_time,
                note=note,
            ),
            None,
        )
    line = ReviewLine(
        workflow_id=execution.id,
        kind=status.kind,
        effect_id=status.effect_id,
        state=status.state,
        votes=status.votes,
        waiting=status.subscribers,
        started=execution.start_time,
    )
    return line, status


async def _is_running(client: Client, workflow_id: str) -> bool:
    from temporalio.client import WorkflowExecutionStatus
    from temporalio.service import RPCError

    try:
        description = await client.get_workflow_handle(workflow_id).describe()
    except RPCError as err:
        if _is_not_found(err):
            return False
        raise
    return description.status == WorkflowExecutionStatus.RUNNING


async def _without_review(client: Client, journal: Journal, running: set[str]) -> list[str]:
    """AMBIGUOUS effects with no running review. Visibility can lag a start: an effect whose
    review the listing missed is checked directly before it is reported."""
    missing = [
        row.effect_id
        for row in journal.effects(status=Kind.AMBIGUOUS)
        if review_id("ambiguous", row.effect_id) not in running
    ]
    found = await asyncio.gather(
        *(_is_running(client, review_id("ambiguous", eid)) for eid in missing)
    )
    return [eid for eid, is_running in zip(missing, found, strict=True) if not is_running]


async def reviews_list(args: argparse.Namespace, client: Client) -> int:
    journal, problem = _try_open(args)
    try:
        query = REVIEWS_QUERY if args.all else OPEN_REVIEWS_QUERY
        limit: int = args.limit
        executions = [e async for e in client.list_workflows(query, limit=limit + 1)]
        more = len(executions) > limit
        executions = executions[:limit]
        gate = asyncio.Semaphore(QUERY_CONCURRENCY)

        async def one(e: WorkflowExecution) -> tuple[ReviewLine, ReviewStatus | None]:
            async with gate:
                return await _review_line(client, e)

        found = await asyncio.gather(*(one(e) for e in executions))
        orphans: list[str] | None = None
        if journal is not None:
            if args.all or more:  # the listing is not every open review: list those alone
                running = {e.id async for e in client.list_workflows(OPEN_REVIEWS_QUERY)}
            else:
                running = {e.id for e in executions}
            orphans = await _without_review(client, journal, running)
    finally:
        if journal is not None:
            journal.close()
    if args.json:
        _json(
            {
                "reviews": [
                    {
                        "workflow_id": line.workflow_id,
                        "kind": line.kind,
                        "effect_id": line.effect_id,
                        "state": line.state,
                        "votes": list(line.votes),
                        "waiting": line.waiting,
                        "started": None if line.started is None else line.started.isoformat(),
                        "note": line.note,
                        "status": None if status is None else status.model_dump(mode="json"),
                    }
                    for line, status in found
                ],
                "ambiguous_without_review": orphans,
            }
        )
    else:
        if found:
            _out(render_reviews([line for line, _ in found]))
        else:
            _err("no reviews" if args.all else "no open reviews")
        if orphans:
            if found:
                _out("")
            for eid in orphans:
                _out(f"AMBIGUOUS with no open review: {eid}")
    if more:
        _err(f"showing the newest {limit} reviews; raise --limit to see more")
    if journal is None:
        _err(f"{problem}: listing reviews only, not AMBIGUOUS effects that have none")
    elif orphans:
        _err(
            f"{len(orphans)} AMBIGUOUS effect(s) have no open review: no one is asked about "
            "them; check the target and see `interlock effects show EFFECT_ID`"
        )
    return EXIT_OK


def _effect_for_review(args: argparse.Namespace) -> str:
    """A full effect id as given, or the one a prefix names in the journal."""
    text: str = args.effect_id.strip()
    if _FULL_ID.fullmatch(text.lower()):
        return text.lower()
    if text.startswith("call:") and _FULL_ID.fullmatch(text[5:].lower()):
        return text.lower()  # an approval of an ungated call: named by the call's digest
    journal, problem = _try_open(args)
    if journal is None:
        raise CliError(
            EXIT_USAGE,
            f"give the full effect id (64 hex characters): a prefix is looked up in the "
            f"journal, and {problem}",
        )
    with journal:
        return resolve_effect(journal, text)


async def _no_open_review(
    client: Client, args: argparse.Namespace, workflow_id: str, effect_id: str
) -> CliError:
    """Why an Update found no review: none was ever started (2), or it has ended (1)."""
    from temporalio.client import WorkflowExecutionStatus
    from temporalio.exceptions import TemporalError
    from temporalio.service import RPCError

    from ._review import ReviewStatus

    handle = client.get_workflow_handle(workflow_id, result_type=ReviewStatus)
    try:
        description = await handle.describe()
    except RPCError as err:
        if not _is_not_found(err):
            raise
        return CliError(
            EXIT_USAGE,
            f"no open review for effect {effect_id} (no workflow {workflow_id} in namespace "
            f"{temporal_namespace(args)})",
        )
    ended = description.status.name.lower() if description.status else "ended"
    if description.status == WorkflowExecutionStatus.COMPLETED:
        try:
            status = await handle.result(follow_runs=False)
        except (TemporalError, ValueError):
            pass
        else:
            ended = status.state
            if status.decision:
                ended += f": {status.decision} by {', '.join(status.operators)}"
    return CliError(
        EXIT_FAILED, f"no open review for effect {effect_id[:16]}: its review is already {ended}"
    )


async def reviews_resolve(args: argparse.Namespace, client: Client) -> int:
    from temporalio.client import WorkflowUpdateFailedError
    from temporalio.service import RPCError

    from ._review import ReviewStatus

    effect_id = _effect_for_review(args)
    workflow_id = review_id(args.kind, effect_id)
    payload: dict[str, Any] = {
        "decision": args.decision,
        "operator": args.operator,
        "note": args.note,
    }
    if args.result is not None:
        payload["result"] = args.result
    handle = client.get_workflow_handle(workflow_id)
    timeout: timedelta = args.timeout
    try:
        status = await asyncio.wait_for(
            handle.execute_update("decide", payload, result_type=ReviewStatus),
            timeout.total_seconds(),
        )
    except WorkflowUpdateFailedError as err:
        # the validator's refusal (or a decision the journal would not record): the reason
        raise CliError(EXIT_FAILED, f"refused: {_failure_message(err.cause)}") from None
    except RPCError as err:
        if _is_not_found(err):
            raise await _no_open_review(client, args, workflow_id, effect_id) from None
        raise
    except TimeoutError:
        raise CliError(
            EXIT_FAILED,
            f"review {workflow_id} did not answer within {timeout}: is a worker with "
            "InterlockPlugin polling its task queue? The decision may still be applied when one "
            "does",
        ) from None
    if args.json:
        _json({"workflow_id": workflow_id, **status.model_dump(mode="json")})
    else:
        _out(render_review_status(status, workflow_id))
    if status.state == "open":
        _err("vote counted: the review stays open until enough people agree")
    elif status.state == "closed":
        _err(f"not recorded: {status.reason or 'the effect was settled meanwhile'}")
        return EXIT_FAILED
    return EXIT_OK


# -- reconcile -------------------------------------------------------------------------------


def settled(outcome: ReconcileOutcome) -> bool:
    """The effect needs nobody now: it ended COMMITTED, REFUSED or RESOLVED, is AMBIGUOUS in
    front of a person (a review is open), or a live attempt or the workflow that owns it will
    settle it."""
    if outcome.final in _SETTLED:
        return True
    if outcome.final == Kind.AMBIGUOUS.value:
        return bool(outcome.review)
    return outcome.skipped in ("live_attempt", "owner_alive")


async def _has_pollers(client: Client, task_queue: str) -> bool:
    from temporalio.api.enums.v1 import TaskQueueType
    from temporalio.api.taskqueue.v1 import TaskQueue
    from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
    from temporalio.service import RPCError

    try:
        response = await client.workflow_service.describe_task_queue(
            DescribeTaskQueueRequest(
                namespace=client.namespace,
                task_queue=TaskQueue(name=task_queue),
                task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
            )
        )
    except RPCError:
        return True  # cannot tell: say nothing
    return bool(response.pollers)


async def reconcile(args: argparse.Namespace, client: Client) -> int:
    from temporalio.client import WorkflowFailureError
    from temporalio.exceptions import TimeoutError as WorkflowTimeout

    from ._review import ReconcileReport, ReconcileRequest

    task_queue: str = args.task_queue
    timeout: timedelta = args.timeout
    request = ReconcileRequest(older_than_s=args.older_than.total_seconds(), limit=args.limit)
    if not await _has_pollers(client, task_queue):
        _err(f"no worker has polled task queue {task_queue} lately: waiting up to {timeout}")
    workflow_id = f"interlock-reconcile-{uuid.uuid4().hex}"
    try:
        report = await client.execute_workflow(
            "InterlockReconciler",
            request,
            id=workflow_id,
            task_queue=task_queue,
            result_type=ReconcileReport,
            execution_timeout=timeout,
            static_summary="interlock reconcile (from the command line)",
        )
    except WorkflowFailureError as err:
        if isinstance(err.cause, WorkflowTimeout):
            raise CliError(
                EXIT_FAILED,
                f"the reconciler did not finish within {timeout}: is a worker with "
                f"InterlockPlugin and the gated activities polling task queue {task_queue}?",
            ) from None
        raise CliError(
            EXIT_FAILED, f"the reconciler failed: {_failure_message(err.cause)}"
        ) from None
    unsettled = [o.effect_id for o in report.outcomes if not settled(o)]
    beyond = max(report.in_doubt - len(report.outcomes), 0)
    needing = len(unsettled) + beyond
    if args.json:
        _json(
            {
                "workflow_id": workflow_id,
                **report.model_dump(mode="json"),
                "unsettled": unsettled,
                "not_reached": beyond,
                "ok": needing == 0,
            }
        )
    else:
        if report.outcomes:
            _out(render_reconcile(report))
        _out(reconcile_summary(report, needing))
    if beyond:
        _err(f"{beyond} effect(s) in doubt beyond --limit {args.limit}: run again")
    return EXIT_OK if needing == 0 else EXIT_FAILED


cmd_reviews_list = on_server(reviews_list)
cmd_reviews_resolve = on_server(reviews_resolve)
cmd_reconcile = on_server(reconcile)


# -- the parser ------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """Usage errors print the usage and one line, and exit 2 (argparse's own convention)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"interlock: error: {message}\n")


def _temporal_options(parser: argparse.ArgumentParser, *, top: bool) -> None:
    # like the journal options: accepted on the group and on the subcommand
    default = None if top else argparse.SUPPRESS
    parser.add_argument(
        "--address",
        metavar="HOST:PORT",
        default=default,
        help=f"the Temporal frontend (default: $TEMPORAL_ADDRESS, else {DEFAULT_ADDRESS})",
    )
    parser.add_argument(
        "--namespace",
        metavar="NS",
        default=default,
        help=f"the Temporal namespace (default: $TEMPORAL_NAMESPACE, else {DEFAULT_NAMESPACE})",
    )


def _journal_options(parser: argparse.ArgumentParser, *, top: bool) -> None:
    # on subcommands the options default to SUPPRESS, so `interlock journal verify --journal X`
    # and `interlock --journal X journal verify` both work and neither resets the other
    default = None if top else argparse.SUPPRESS
    parser.add_argument(
        "--journal",
        metavar="URL",
        default=default,
        help="the journal (default: $INTERLOCK_JOURNAL, else sqlite:///interlock.db)",
    )
    parser.add_argument(
        "--signing-key",
        metavar="KEY",
        default=default,
        help="the journal's signing key, hex or text (prefer $INTERLOCK_SIGNING_KEY: "
        "arguments are visible to other users in the process list)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="interlock",
        description="Inspect and verify an interlock journal, manage leases, decide reviews "
        "and run the reconciler on Temporal.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _journal_options(parser, top=True)
    groups = parser.add_subparsers(dest="group", metavar="COMMAND", required=True)

    def command(sub: Any, name: str, handler: Handler, help_text: str) -> argparse.ArgumentParser:
        cmd: argparse.ArgumentParser = sub.add_parser(
            name,
            help=help_text,
            description=help_text,
            epilog=_EPILOG,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        _journal_options(cmd, top=False)
        cmd.set_defaults(handler=handler)
        return cmd

    def json_flag(cmd: argparse.ArgumentParser) -> None:
        cmd.add_argument("--json", action="store_true", help="print JSON for machines")

    # journal
    journal = groups.add_parser("journal", help="verify the journal, print its head")
    _journal_options(journal, top=False)
    journal_sub = journal.add_subparsers(dest="command", metavar="COMMAND", required=True)
    verify = command(
        journal_sub,
        "verify",
        cmd_journal_verify,
        "check every entry's hash, signature and place in its chain; exit 1 if any fails",
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
    json_flag(verify)
    export = command(
        journal_sub,
        "export",
        cmd_journal_export,
        "write every entry as one JSON line (its signed bytes, hash and signature), verifiable "
        "alone with `journal verify --export FILE`",
    )
    export.add_argument("--output", "-o", metavar="FILE", help="write here (default: stdout)")
    keygen = command(
        journal_sub,
        "keygen",
        cmd_journal_keygen,
        "print a new Ed25519 signing key and its public key (nothing is written)",
    )
    json_flag(keygen)
    command(
        journal_sub,
        "public-key",
        cmd_journal_public_key,
        "print the public key of the journal's Ed25519 signing key, for auditors",
    )
    head = command(
        journal_sub,
        "head",
        cmd_journal_head,
        "print the last entry as SEQ:HASH, to record elsewhere",
    )
    json_flag(head)

    # effects
    effects = groups.add_parser(
        "effects", help="list effects, show one effect's receipt, reopen a refused one"
    )
    _journal_options(effects, top=False)
    effects_sub = effects.add_subparsers(dest="command", metavar="COMMAND", required=True)
    listing = command(effects_sub, "list", cmd_effects_list, "list effects, newest first")
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
    listing.add_argument("--limit", type=_positive, metavar="N", help="at most N effects")
    json_flag(listing)
    show = command(
        effects_sub,
        "show",
        cmd_effects_show,
        "show an effect's receipt and its journal entries",
    )
    show.add_argument(
        "effect_id",
        metavar="EFFECT_ID",
        help=f"the effect id, or a unique prefix of at least {MIN_PREFIX} characters",
    )
    json_flag(show)
    reopen_cmd = command(
        effects_sub,
        "reopen",
        cmd_effects_reopen,
        "reopen a REFUSED effect that never executed (journal only): its next attempt "
        "dispatches under the authority and facts current then; exit 1 if it is not REFUSED",
    )
    reopen_cmd.add_argument(
        "effect_id",
        metavar="EFFECT_ID",
        help=f"the effect id, or a unique prefix of at least {MIN_PREFIX} characters",
    )
    reopen_cmd.add_argument("--operator", required=True, metavar="O", help="who reopens it")
    reopen_cmd.add_argument("--note", default="", metavar="N", help="why, for the record")

    # leases
    leases = groups.add_parser("leases", help="issue, revoke and list leases")
    _journal_options(leases, top=False)
    leases_sub = leases.add_subparsers(dest="command", metavar="COMMAND", required=True)
    issue = command(
        leases_sub, "issue", cmd_leases_issue, "issue a lease to a principal; print its id"
    )
    issue.add_argument("principal", metavar="PRINCIPAL", help="who may act under the lease")
    issue.add_argument(
        "--activity",
        action="append",
        metavar="A",
        help="an activity (or glob) the lease allows; repeat for more (default: any)",
    )
    issue.add_argument(
        "--max-amount-cents",
        type=_count,
        metavar="N",
        help="the largest amount one effect may carry",
    )
    issue.add_argument(
        "--budget-cents",
        type=_count,
        metavar="N",
        help="the most all its effects together may carry: each reserves its amount when "
        "dispatched, and gets it back only if it ends without executing",
    )
    issue.add_argument(
        "--resource",
        action="append",
        metavar="R",
        help="a resource (or glob) the lease allows; repeat for more (default: any)",
    )
    issue.add_argument(
        "--ttl",
        type=parse_duration,
        metavar="AGE",
        help="how long the lease lives: 90s, 30m, 1h, 2d (default: until revoked)",
    )
    revoke = command(
        leases_sub,
        "revoke",
        cmd_leases_revoke,
        "revoke a live lease now; exit 1 if it was not live",
    )
    revoke.add_argument("lease_id", metavar="LEASE_ID")
    lease_list = command(leases_sub, "list", cmd_leases_list, "list leases and their state")
    json_flag(lease_list)

    # the report
    report_cmd = groups.add_parser(
        "report",
        help="what happened lately: effects by final state, what waits for a person, denials "
        "by reason, the gate's latency",
        description="What happened over a period, from the journal alone.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _journal_options(report_cmd, top=False)
    report_cmd.set_defaults(handler=cmd_report)
    report_cmd.add_argument(
        "--since",
        type=parse_duration,
        default=timedelta(hours=24),
        metavar="AGE",
        help="how far back: 90s, 30m, 24h, 7d (default 24h)",
    )
    json_flag(report_cmd)

    # the policy's circuit
    circuit = groups.add_parser(
        "circuit", help="show a session's circuit, reset it after the policy opened it"
    )
    _journal_options(circuit, top=False)
    circuit_sub = circuit.add_subparsers(dest="command", metavar="COMMAND", required=True)
    circuit_show = command(
        circuit_sub, "show", cmd_circuit_show, "show whether a session's circuit is open, and why"
    )
    circuit_show.add_argument("session", metavar="SESSION", help="the session (a workflow id)")
    json_flag(circuit_show)
    circuit_reset = command(
        circuit_sub,
        "reset",
        cmd_circuit_reset,
        "close a session's open circuit (journaled, with the operator); exit 1 if not open",
    )
    circuit_reset.add_argument("session", metavar="SESSION", help="the session (a workflow id)")
    circuit_reset.add_argument("--operator", required=True, metavar="O", help="who resets it")
    circuit_reset.add_argument("--note", default="", metavar="N", help="why, for the record")

    # reviews (on Temporal)
    reviews = groups.add_parser(
        "reviews", help="list the reviews people decide, and decide one (needs Temporal)"
    )
    _journal_options(reviews, top=False)
    _temporal_options(reviews, top=True)
    reviews_sub = reviews.add_subparsers(dest="command", metavar="COMMAND", required=True)
    review_list = command(
        reviews_sub,
        "list",
        cmd_reviews_list,
        "list open reviews (kind, effect, state, votes, workflows waiting, started) and, from "
        "the journal, AMBIGUOUS effects that have no open review",
    )
    _temporal_options(review_list, top=False)
    review_list.add_argument(
        "--all", action="store_true", help="also reviews that have ended (any status)"
    )
    review_list.add_argument(
        "--limit", type=_positive, default=100, metavar="N", help="at most N reviews (100)"
    )
    json_flag(review_list)
    resolve = command(
        reviews_sub,
        "resolve",
        cmd_reviews_resolve,
        "decide an effect's review (the Update `decide`) and print its status; exit 1 if the "
        "review refuses the decision, 2 if no review was ever opened for the effect",
    )
    _temporal_options(resolve, top=False)
    resolve.add_argument(
        "effect_id",
        metavar="EFFECT_ID",
        help=f"the effect id, or a unique prefix of at least {MIN_PREFIX} characters when the "
        "journal can be opened to look it up",
    )
    resolve.add_argument(
        "--decision",
        required=True,
        metavar="D",
        help="happened or not_happened (an ambiguous review); approve or reject (an approval)",
    )
    resolve.add_argument("--operator", required=True, metavar="O", help="who decides")
    resolve.add_argument("--note", default="", metavar="N", help="why, for the record")
    resolve.add_argument(
        "--kind",
        choices=list(DECISIONS),
        default="ambiguous",
        help="which review of the effect (default: ambiguous)",
    )
    resolve.add_argument(
        "--result",
        type=_result_json,
        metavar="JSON",
        help="with happened: what the effect returned, checked against the activity's return type",
    )
    resolve.add_argument(
        "--timeout",
        type=parse_duration,
        default=timedelta(seconds=60),
        metavar="AGE",
        help="how long to wait for the review to answer (default: 60s)",
    )
    json_flag(resolve)

    # reconcile (on Temporal)
    reconcile_help = (
        "run the reconciler once on a task queue: effects dispatched and never confirmed, with "
        "no live attempt, are recovered, and a review is opened for each that ends AMBIGUOUS; "
        "exit 1 if any is left without an outcome or a person"
    )
    reconcile_cmd = groups.add_parser(
        "reconcile",
        help="recover effects left in doubt, once, on a task queue (needs Temporal)",
        description=reconcile_help,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _temporal_options(reconcile_cmd, top=True)
    reconcile_cmd.set_defaults(handler=cmd_reconcile)
    reconcile_cmd.add_argument(
        "--task-queue",
        required=True,
        metavar="Q",
        help="where workers with InterlockPlugin and the gated activities run",
    )
    reconcile_cmd.add_argument(
        "--older-than",
        type=_age,
        default=timedelta(seconds=60),
        metavar="AGE",
        help="only effects dispatched at least this long ago (default: 60s; 0s for all)",
    )
    reconcile_cmd.add_argument(
        "--limit", type=_positive, default=200, metavar="N", help="at most N effects (200)"
    )
    reconcile_cmd.add_argument(
        "--timeout",
        type=parse_duration,
        default=timedelta(minutes=5),
        metavar="AGE",
        help="how long the reconciler may take (default: 5m)",
    )
    json_flag(reconcile_cmd)
    return parser


# -- main ------------------------------------------------------------------------------------


def _exit_code(code: object) -> int:
    if code is None:
        return EXIT_OK
    if isinstance(code, int):
        return code
    return EXIT_USAGE


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; return its exit code (never raises for an expected failure)."""
    parser = build_parser()
    try:
        args = parser.parse_args(list(argv) if argv is not None else None)
    except SystemExit as stop:  # --help, or a usage error argparse already reported
        return _exit_code(stop.code)
    handler: Handler = args.handler
    try:
        return handler(args)
    except CliError as err:
        _err(err.message)
        return err.code
    except (JournalConfigError, JournalCorrupt, JournalUnavailable) as err:
        _err(str(err) or type(err).__name__)
        return EXIT_JOURNAL
    except sqlite3.Error as err:
        _err(f"journal {journal_url(args)} cannot be read: {err}")
        return EXIT_JOURNAL
    except BrokenPipeError:
        # the reader went away (`interlock effects list | head`): not an error of ours
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return EXIT_OK
    except KeyboardInterrupt:
        return 130
    except InterlockError as err:
        _err(str(err) or type(err).__name__)
        return EXIT_FAILED
    except Exception as err:
        if os.environ.get("INTERLOCK_DEBUG"):
            raise
        _err(f"unexpected error: {type(err).__name__}: {err} (set INTERLOCK_DEBUG=1 for details)")
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
