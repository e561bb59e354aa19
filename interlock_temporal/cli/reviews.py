"""``interlock reviews`` (on Temporal): list the reviews people decide, and decide one."""

from __future__ import annotations

import argparse
import asyncio
import json
import re
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.journal import Journal
from ..core.journal_identity import journal_id_of
from ..core.models import Kind
from ..core.review import DECISIONS, review_id
from ._args import (
    Groups,
    command,
    journal_options,
    json_flag,
    operator_name,
    parse_duration,
    positive,
    temporal_options,
)
from ._render import ReviewLine, render_review_status, render_reviews
from ._shared import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    MIN_PREFIX,
    CliError,
    emit,
    emit_json,
    resolve_effect,
    try_open,
    warn,
)
from ._temporal import is_not_found, on_server

if TYPE_CHECKING:
    from temporalio.client import Client, WorkflowExecution

    from .._reviews.workflow import ReviewStatus
    from ..core.journal.signing import Ed25519Key

#: a full effect id: 256 bits, hex
_FULL_ID = re.compile(r"[0-9a-f]{64}")
#: how long ``reviews list`` waits for one review to answer its status query
QUERY_TIMEOUT_S = 5.0
#: how many reviews ``reviews list`` asks at once
QUERY_CONCURRENCY = 16
#: the visibility query for open reviews; ``--all`` drops the status filter
REVIEWS_QUERY = "WorkflowType = 'EffectReview'"
OPEN_REVIEWS_QUERY = f"{REVIEWS_QUERY} AND ExecutionStatus = 'Running'"


def _result_json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"--result is not JSON: {err}") from None


def review_of(workflow_id: str) -> tuple[str, str]:
    """(kind, effect id) named by a review's workflow id (``?`` for a kind it does not name)."""
    for kind in DECISIONS:
        prefix = review_id(kind, "")
        if workflow_id.startswith(prefix):
            return kind, workflow_id[len(prefix) :]
    return "?", workflow_id


#: one review as ``reviews list`` found it: its line, its status (None: it could not be asked)
#: and the id of the journal that opened it (None: unknown, or opened before journals had ids)
Listed = tuple[ReviewLine, "ReviewStatus | None", str | None]


async def _review_line(client: Client, execution: WorkflowExecution) -> Listed:
    """Ask one review for its status (a running one by query, a finished one by its result),
    and the journal that opened it: named in its status, or else read from the request it was
    started with (its first history event), so a review no worker answers for is still told
    apart by journal."""
    from temporalio.client import WorkflowExecutionStatus
    from temporalio.exceptions import TemporalError

    from .._reviews.desk import start_request
    from .._reviews.workflow import ReviewStatus

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
    except (TemporalError, ValueError, RuntimeError, KeyError) as err:
        if "payload encoding" in str(err):  # the converter's word for a codec's payload
            note = "its status is encoded by a payload codec: pass --codec"
        elif running:
            note = "no worker answered its status query"
        else:
            note = f"its result cannot be read ({type(err).__name__})"
    if status is None:
        state = "?" if running or execution.status is None else execution.status.name.lower()
        journal_id: str | None = None
        try:
            request = await start_request(client, execution.id, execution.run_id)
        except (TemporalError, ValueError, RuntimeError):
            request = None
        if request is not None and isinstance(request.get("journal_id"), str):
            journal_id = request["journal_id"]
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
            journal_id,
        )
    line = ReviewLine(
        workflow_id=execution.id,
        kind=status.kind,
        effect_id=status.effect_id,
        state=status.state + (" (escalated)" if status.escalated else ""),
        votes=status.votes,
        waiting=status.subscribers,
        started=execution.start_time,
    )
    return line, status, status.journal_id


async def _is_running(client: Client, workflow_id: str) -> bool:
    from temporalio.client import WorkflowExecutionStatus
    from temporalio.service import RPCError

    try:
        description = await client.get_workflow_handle(workflow_id).describe()
    except RPCError as err:
        if is_not_found(err):
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


def _of(journal_id: str | None, theirs: str | None) -> bool:
    """Whether ``reviews list`` shows a review opened by the journal ``theirs`` for the journal
    ``journal_id``: one of the same journal, and any whose journal is unknown (opened before
    journals had ids, its start event unreadable, or no journal to compare with), shown as
    before."""
    if journal_id is None or theirs is None:
        return True
    return theirs == journal_id


async def reviews_list(args: argparse.Namespace, client: Client) -> int:
    journal, problem = try_open(args)
    try:
        query = REVIEWS_QUERY if args.all else OPEN_REVIEWS_QUERY
        limit: int = args.limit
        executions = [e async for e in client.list_workflows(query, limit=limit + 1)]
        more = len(executions) > limit
        executions = executions[:limit]
        gate = asyncio.Semaphore(QUERY_CONCURRENCY)

        async def one(e: WorkflowExecution) -> Listed:
            async with gate:
                return await _review_line(client, e)

        every = await asyncio.gather(*(one(e) for e in executions))
        ours = None if journal is None else journal_id_of(journal, create=False)
        found = [f for f in every if args.all_journals or _of(ours, f[2])]
        hidden = len(every) - len(found)
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
        emit_json(
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
                        "journal_id": theirs,
                        "status": None if status is None else status.model_dump(mode="json"),
                    }
                    for line, status, theirs in found
                ],
                "ambiguous_without_review": orphans,
                "journal_id": ours,
                "other_journals_hidden": hidden,
            }
        )
    else:
        if found:
            emit(render_reviews([line for line, _, _ in found]))
        else:
            warn("no reviews" if args.all else "no open reviews")
        if orphans:
            if found:
                emit("")
            for eid in orphans:
                emit(f"AMBIGUOUS with no open review: {eid}")
    if hidden:
        warn(
            f"{hidden} review(s) of other journals not shown (this journal is {ours}); "
            "--all-journals shows them"
        )
    if more:
        warn(f"showing the newest {limit} reviews; raise --limit to see more")
    if journal is None:
        warn(f"{problem}: listing reviews only, not AMBIGUOUS effects that have none")
    elif orphans:
        warn(
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
    journal, problem = try_open(args)
    if journal is None:
        raise CliError(
            EXIT_USAGE,
            f"give the full effect id (64 hex characters): a prefix is looked up in the "
            f"journal, and {problem}",
        )
    with journal:
        return resolve_effect(journal, text)


def _operator_key(key_file: str) -> Ed25519Key:
    """The operator's private key in ``key_file`` (``interlock operators keygen``)."""
    from ..core.journal.signing import Ed25519Key, parse_key

    try:
        key = parse_key(Path(key_file).read_text())
    except OSError as err:
        raise CliError(EXIT_USAGE, f"--key {key_file}: cannot be read ({err.strerror})") from None
    if not isinstance(key, Ed25519Key) or not key.can_sign:
        raise CliError(
            EXIT_USAGE, "--key: not an operator's private key (`interlock operators keygen`)"
        )
    return key


async def reviews_resolve(args: argparse.Namespace, client: Client) -> int:
    from .._reviews.deciding import NotDecided, send_vote
    from ..core.review_rules import Vote

    effect_id = _effect_for_review(args)
    workflow_id = review_id(args.kind, effect_id)
    vote = Vote(decision=args.decision, operator=args.operator, note=args.note, result=args.result)
    key = None if args.key is None else _operator_key(args.key)
    try:
        status = await send_vote(
            client, args.kind, effect_id, vote, key=key, expires=args.expires, timeout=args.timeout
        )
    except NotDecided as err:
        message = str(err)
        if err.code == "no_ballot":
            message += " (decide without --key)"
        raise CliError(EXIT_USAGE if err.code == "no_review" else EXIT_FAILED, message) from None
    if args.json:
        emit_json({"workflow_id": workflow_id, **status.model_dump(mode="json")})
    else:
        emit(render_review_status(status, workflow_id))
    if status.state == "open":
        warn("vote counted: the review stays open until enough people agree")
    elif status.state == "closed":
        # the words as released: a late COMMITTED closed the review meanwhile
        warn(f"not recorded: {status.reason or 'the effect was settled meanwhile'}")
        return EXIT_FAILED
    return EXIT_OK


cmd_reviews_list = on_server(reviews_list)
cmd_reviews_resolve = on_server(reviews_resolve)


def register(groups: Groups) -> None:
    reviews = groups.add_parser(
        "reviews", help="list the reviews people decide, and decide one (needs Temporal)"
    )
    journal_options(reviews, top=False)
    temporal_options(reviews, top=True)
    reviews_sub = reviews.add_subparsers(dest="command", metavar="COMMAND", required=True)
    review_list = command(
        reviews_sub,
        "list",
        cmd_reviews_list,
        "list open reviews (kind, effect, state, votes, workflows waiting, started) and, from "
        "the journal, AMBIGUOUS effects that have no open review",
        example=["interlock reviews list", "interlock reviews list --all --json"],
    )
    temporal_options(review_list, top=False)
    review_list.add_argument(
        "--all", action="store_true", help="also reviews that have ended (any status)"
    )
    review_list.add_argument(
        "--limit", type=positive, default=100, metavar="N", help="at most N reviews (100)"
    )
    review_list.add_argument(
        "--all-journals",
        action="store_true",
        help="also reviews opened by workers of other journals (by default only this "
        "journal's, and those from before journals had ids)",
    )
    json_flag(review_list)
    resolve = command(
        reviews_sub,
        "resolve",
        cmd_reviews_resolve,
        "decide an effect's review (the Update `decide`) and print its status; exit 1 if the "
        "review refuses the decision, 2 if no review was ever opened for the effect",
        example=[
            "interlock reviews resolve 5819f792 --decision happened --operator carol "
            '--note "seen in the dashboard"',
            "interlock reviews resolve 77e0a9c1 --kind approval --decision reject --operator carol",
        ],
    )
    temporal_options(resolve, top=False)
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
    resolve.add_argument(
        "--operator", required=True, type=operator_name, metavar="O", help="who decides"
    )
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
        "--key",
        metavar="FILE",
        help="sign the vote with this operator's private key (`interlock operators keygen`); "
        "needed where the journal has an operator roster",
    )
    resolve.add_argument(
        "--expires",
        type=parse_duration,
        default=timedelta(minutes=10),
        metavar="AGE",
        help="how long the signature stays valid (default: 10m)",
    )
    resolve.add_argument(
        "--timeout",
        type=parse_duration,
        default=timedelta(seconds=60),
        metavar="AGE",
        help="how long to wait for the review to answer (default: 60s)",
    )
    json_flag(resolve)
