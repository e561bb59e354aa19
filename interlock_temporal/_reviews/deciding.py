"""Sending a person's vote to a review and reading back what it did: the one path that the CLI
(``interlock reviews resolve``) and a web backend (``ReviewClient``) both take.

The problem: a vote reaches a review as the Update ``decide``, and what can go wrong on the way
has several shapes that a person must be told apart: the review refuses the vote (its validator,
or the worker that records it: no proof, a proof for someone else, a result of the wrong type),
no review was ever opened for the effect, the review has already ended, or no worker answers.
Two callers handling those each in their own way would drift apart (one would say "refused" where
the other says "no review").

The mechanism: ``send_vote`` signs the vote when given a key (an operator's own, or an attester's
for the operator it authenticated) over the ballot it is given or, failing that, the one the review
shows; the worker that records the vote builds the ballot again from the journal and checks the
signature against that one, so a review that shows a false ballot gets a vote that counts nowhere.
It then sends the Update to the canonical review id (``review_id``) and returns the review's
status, or raises ``NotDecided`` with a ``code`` a caller can branch on and a message a person can
read. Temporal is imported inside the functions, so a command that never talks to a server never
loads it.

Cost: one Update round trip (the review records the decision through an activity before it
answers: one journal append), plus one status query when the vote is signed and no ballot is
given, and one describe when the Update finds no review.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal

from ..core.errors import InterlockError
from ..core.journal.signing import Ed25519Key
from ..core.review_rules import Ballot, ReviewKind, Vote, review_id
from ..core.vote_proofs import sign_vote

if TYPE_CHECKING:
    from temporalio.client import Client, WorkflowHandle
    from temporalio.service import RPCError

    from .workflow import ReviewStatus

#: why a vote was not decided:
#: ``refused``: the review or the worker that records votes refused it (the message says why);
#: ``no_review``: no review was ever opened for the effect (of this kind);
#: ``ended``: the effect's review has ended (decided, closed or expired);
#: ``no_ballot``: a signed vote was asked for, and the review shows no ballot to sign;
#: ``timeout``: the review did not answer in time (no worker polls its task queue?)
NotDecidedCode = Literal[
    "refused",
    "no_review",
    "ended",
    "no_ballot",
    "timeout",
    # ``ReviewClient.decide``'s own checks, before anything is sent
    "unknown_effect",
    "not_waiting",
    "invalid_decision",
    "no_roster",
    "not_attester",
    "not_genuine",
]

#: how long a vote's signature stays valid, unless the caller says otherwise
DEFAULT_EXPIRES = timedelta(minutes=10)
#: how long ``send_vote`` waits for the review to answer, unless the caller says otherwise
DEFAULT_TIMEOUT = timedelta(seconds=60)


class NotDecided(InterlockError):
    """A vote that decided nothing: ``code`` says which way (``NotDecidedCode``), the message
    says it to a person. Nothing was recorded."""

    def __init__(self, code: NotDecidedCode, message: str) -> None:
        super().__init__(message)
        self.code: NotDecidedCode = code


def is_not_found(err: RPCError) -> bool:
    """The workflow does not exist (or has ended), as opposed to the namespace."""
    from temporalio.service import RPCStatusCode

    return err.status == RPCStatusCode.NOT_FOUND and "namespace" not in err.message.lower()


def failure_message(err: BaseException) -> str:
    """The message a workflow, an Update handler or its validator failed with, on one line."""
    from temporalio.exceptions import FailureError

    text = err.message if isinstance(err, FailureError) else str(err)
    return " ".join((text or type(err).__name__).split())


async def shown_ballot(client: Client, kind: ReviewKind, effect_id: str) -> Ballot:
    """The ballot the effect's review shows (its status query). What a caller without the
    journal signs; the recording worker checks the signature against the journal's own."""
    from temporalio.service import RPCError

    from .workflow import ReviewStatus

    handle = client.get_workflow_handle(review_id(kind, effect_id))
    try:
        status: ReviewStatus = await handle.query("status", result_type=ReviewStatus)
    except RPCError as err:
        if is_not_found(err):
            raise await _no_open_review(client, kind, effect_id) from None
        said = f"the review did not show its ballot: {err.message}"
        raise NotDecided("no_ballot", said) from None
    if status.ballot is None:
        raise NotDecided(
            "no_ballot",
            "the review shows no ballot to sign: the journal has no operator roster, or the "
            "review was opened before it had one",
        )
    return status.ballot


async def send_vote(
    client: Client,
    kind: ReviewKind,
    effect_id: str,
    vote: Vote,
    *,
    key: Ed25519Key | None = None,
    ballot: Ballot | None = None,
    expires: timedelta = DEFAULT_EXPIRES,
    timeout: timedelta = DEFAULT_TIMEOUT,
) -> ReviewStatus:
    """Send ``vote`` to the review of ``kind`` on ``effect_id`` (the Update ``decide``) and return
    the review's status once it has counted the vote (and, when the vote decides, once the worker
    has recorded the decision or refused it).

    ``key``: sign the vote with it (an operator's private key, or an attester's for the operator
    it authenticated), over ``ballot`` (by default the one the review shows), valid for
    ``expires``. Without ``key`` the vote is sent as given (with the proof or code it carries).
    ``timeout``: how long to wait for the review to answer.

    Raises ``NotDecided`` (``code``: refused, no_review, ended, no_ballot, timeout); nothing was
    recorded then. A vote that counted without deciding (more approvals needed) returns a status
    whose ``state`` is ``open``; one that a late COMMITTED overtook returns ``closed``."""
    from temporalio.client import WorkflowUpdateFailedError
    from temporalio.service import RPCError

    from .workflow import ReviewStatus

    if key is not None:
        if not key.can_sign:
            raise ValueError("key must be a private key (it signs the vote)")
        if ballot is None:
            ballot = await shown_ballot(client, kind, effect_id)
        vote = sign_vote(ballot, vote, key, int(time.time() + expires.total_seconds()))
    workflow_id = review_id(kind, effect_id)
    handle: WorkflowHandle[Any, Any] = client.get_workflow_handle(workflow_id)
    payload = vote.model_dump(mode="json", exclude_none=True)
    # one id per vote: sent again (below), the server counts it once
    sent = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    update_id = "vote-" + hashlib.sha256(sent).hexdigest()[:32]
    try:
        for attempt in range(NOT_FOUND_RETRIES + 1):
            try:
                return await asyncio.wait_for(
                    handle.execute_update(
                        "decide", payload, id=update_id, result_type=ReviewStatus
                    ),
                    timeout.total_seconds(),
                )
            except RPCError as err:
                if not is_not_found(err):
                    raise
                # the server can answer "not found" for an Update to a running workflow it
                # was reloading (seen under load): the review is open, so the vote goes again
                if attempt == NOT_FOUND_RETRIES or not await _running(handle):
                    raise await _no_open_review(client, kind, effect_id) from None
                await asyncio.sleep(0.2 * (attempt + 1))
        raise AssertionError("unreachable")  # the loop returns or raises
    except WorkflowUpdateFailedError as err:
        # the validator's refusal, or the recording worker's: its reason
        raise NotDecided("refused", f"refused: {failure_message(err.cause)}") from None
    except TimeoutError:
        raise NotDecided(
            "timeout",
            f"review {workflow_id} did not answer within {timeout}: is a worker with "
            "InterlockPlugin polling its task queue? The decision may still be applied when one "
            "does",
        ) from None


#: how many times a vote is sent again to a running review that answered "not found"
NOT_FOUND_RETRIES = 3


async def _running(handle: WorkflowHandle[Any, Any]) -> bool:
    """Whether the review's workflow is still running (False if it cannot be described)."""
    from temporalio.client import WorkflowExecutionStatus
    from temporalio.service import RPCError

    try:
        description = await handle.describe()
    except RPCError:
        return False
    return description.status == WorkflowExecutionStatus.RUNNING


async def _no_open_review(client: Client, kind: ReviewKind, effect_id: str) -> NotDecided:
    """Why no open review answered: none was ever started, or it has ended (and how)."""
    from temporalio.client import WorkflowExecutionStatus
    from temporalio.exceptions import TemporalError
    from temporalio.service import RPCError

    from .workflow import ReviewStatus

    workflow_id = review_id(kind, effect_id)
    handle = client.get_workflow_handle(workflow_id, result_type=ReviewStatus)
    try:
        description = await handle.describe()
    except RPCError as err:
        if not is_not_found(err):
            raise
        return NotDecided(
            "no_review",
            f"no open review for effect {effect_id} (no workflow {workflow_id} in namespace "
            f"{client.namespace})",
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
    return NotDecided(
        "ended", f"no open review for effect {effect_id[:16]}: its review is already {ended}"
    )
