"""Tier 0: an effect that is a write to the journal's own database. PROPOSED, AUTHORIZED,
DISPATCHED (the lease read inside), the body's write (and its marker) and COMMITTED go in one
journal transaction: it commits whole or not at all, so no crash leaves the effect in doubt.

A body that raises rolls all of it back: nothing happened, which is exact. What the target
calls the error decides what is recorded: ``rejected`` (a constraint, a bug in the body)
records the proposal and its refusal (``target_rejected``, executed = false); anything else (a
time limit, a lock) records nothing and the next attempt runs the effect afresh, but on the
last attempt Temporal will make, it is refused ``not_sent``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from ..identity import canonical, jsonable
from ..journal import Journal
from ..journal.interface import JournalTx
from ..models import Draft, Entry, Kind, Lease
from ..receipts import EffectView
from ..sealing import Values
from ..targets import EffectTarget, classify, confirmation_of
from .calls import ATOMIC_POINTS, Call, Done, OnPoint, to_the_end
from .recorder import Recorder, refusal

T = TypeVar("T")
BEFORE_BODY, BEFORE_COMMIT = ATOMIC_POINTS


class BodyFailed(Exception):
    """The body raised inside the journal's transaction (which is rolled back)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


class Atomic:
    """The gate's tier-0 path: the dispatch, the body and the commit in one transaction."""

    def __init__(
        self, journal: Journal, values: Values, point: OnPoint, recorder: Recorder
    ) -> None:
        self.journal = journal
        self.values = values
        self._point = point
        self._recorder = recorder

    async def dispatch(
        self,
        call: Call,
        target: EffectTarget,
        eid: str,
        head: str,
        build: Callable[[Lease | None], list[Draft]],
        approved: tuple[Any, ...],
        approved_stored: bytes,
        via: str,
        before: EffectView | None = None,
    ) -> Done:
        """Write ``build``'s drafts after ``head``, run the body, write COMMITTED: one
        transaction. A refusal ``build`` decides (a lease, a stale premise) is written and
        raised, and the body never runs. ``approved_stored``: the approved input as stored
        (sealed when values are); the result is sealed on the loop, from the writer thread."""
        body = call.transaction
        assert body is not None
        drafted: list[Draft] = []
        scheme = self.values.scheme if before is None else before.digests

        def stored_result(result_json: bytes) -> bytes:
            if self.values.sealer is None:
                return result_json
            # on the writer thread, with the journal's write lock held: a loop of its own, never
            # the worker's (whose coroutines may be waiting for that lock)
            return asyncio.run(self.values.store_outcome(result_json))

        def drafts(lease: Lease | None) -> list[Draft]:
            drafted[:] = build(lease)
            return drafted

        def transaction(tx: JournalTx) -> tuple[list[Entry], Any]:
            written = tx.append(
                eid,
                head,
                drafts,
                effect_type=call.effect_type,
                lease_id=call.lease_id,
                blobs={"approved": approved_stored},
            )
            if written[-1].kind is Kind.REFUSED:
                return written, None
            self._point(BEFORE_BODY, eid)
            try:
                result = body(tx.db, approved, eid)
                result_json = canonical(jsonable(result))
            except Exception as err:
                raise BodyFailed(err) from err
            commit = self._recorder.commit_draft(
                via, result_json, confirmation_of(target, result), scheme=scheme
            )
            stored = stored_result(result_json)
            written += tx.append(eid, written[-1].hash, [commit], blobs={"result": stored})
            self._point(BEFORE_COMMIT, eid)
            return written, result

        try:
            written, result = await to_the_end(self.journal.transact_async(transaction))
        except BodyFailed as failed:
            await self._atomic_failed(call, target, eid, head, drafted, failed.error, before)
            raise failed.error from None
        self._recorder.raise_if_refused(eid, written, before)
        self._point("after_commit_tx", eid)
        return Done(eid, result, via)

    async def _atomic_failed(
        self,
        call: Call,
        target: EffectTarget,
        eid: str,
        head: str,
        drafted: list[Draft],
        error: Exception,
        before: EffectView | None,
    ) -> None:
        """The body raised and its transaction was rolled back: nothing happened. Record a
        refusal where no later attempt should run it (and raise it); else record nothing."""
        kind = type(error).__name__
        verdict = classify(target, error)
        if verdict == "rejected":
            draft = refusal(
                "target_rejected",
                f"the target rejected the request ({kind}); its transaction was rolled back",
            )
        elif call.last_attempt:
            draft = refusal(
                "not_sent",
                f"the transaction was rolled back ({kind}) "
                "and Temporal will make no further attempt",
            )
        else:
            return  # nothing is recorded: the next attempt runs the effect afresh
        # a first dispatch records its proposal beside the refusal; a reopened effect has one,
        # and one the gate decides again (refused for its configuration) its REOPENED
        proposal = [d for d in drafted if d.kind in (Kind.PROPOSED, Kind.REOPENED)]
        written = await self.journal.append_async(
            eid, head, [*proposal, draft], effect_type=call.effect_type
        )
        self._recorder.raise_if_refused(eid, written, before)
