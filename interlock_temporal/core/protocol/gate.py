"""The gate: the protocol's top. ``Gate`` holds its parts and walks an attempt through them:
claim, read, decide; nothing recorded → ``Dispatch`` (proposed, authorised and dispatched in
one transaction; a tier-0 effect through ``Atomic``); reopened, or refused for the caller's own
configuration → ``Dispatch`` again, authorised afresh; in doubt → ``Recovery``; a recorded
outcome answered as it is. ``Admission`` has the policy's say and drafts the DISPATCHED entry;
``Recorder`` records what the send's outcome means and answers with stored values and
receipts."""

from __future__ import annotations

import functools
import hashlib
import os
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from ..errors import Ambiguous, HeadConflict, InFlight, Refused
from ..journal import Journal
from ..journal.claims import Claim
from ..models import Entry, Kind, Receipt
from ..policy import PolicyGuard
from ..receipts import EffectView, fold, receipt_of
from ..sealing import Values
from ..targets import EffectTarget
from .admission import Admission
from .atomic import Atomic
from .calls import (
    IN_FLIGHT_RETRY_S,
    Call,
    Done,
    OnPoint,
    OwnerEnded,
    Ticket,
    identify,
    identify_earlier,
)
from .dispatch import Dispatch
from .recorder import Recorder
from .recovery import Recovery


def _sha256_hex(data: bytes) -> str:
    """A digest in the plain scheme (``Values.digest(data, None)``)."""
    return hashlib.sha256(data).hexdigest()


def _worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _no_point(name: str, eid: str) -> None:
    """No crash points (``Gate(on_point=None)``)."""


class Gate:
    """Runs the protocol against one journal. Cheap to construct; holds no per-effect state.

    Its parts, each built here with what it needs: ``Recorder`` (outcomes), ``Admission`` (the
    policy, the DISPATCHED draft), ``Atomic`` (tier 0), ``Recovery`` (an effect in doubt,
    ``close_out``) and ``Dispatch`` (a new or reopened effect's dispatch). ``journal``,
    ``values``, ``clock`` and ``policy`` are handed to them here: set them by constructing
    another gate, not by assigning them afterwards."""

    def __init__(
        self,
        journal: Journal,
        *,
        clock: Callable[[], float] = time.time,
        on_point: OnPoint | None = None,
        policy: PolicyGuard | None = None,
        values: Values | None = None,
    ) -> None:
        self.journal = journal
        #: how values are stored (plain, or sealed by the user's codec) and digested
        self.values = values or Values(journal.keyring)
        self.clock = clock
        #: consulted when a new effect is about to be dispatched or one in doubt resent (a
        #: duplicate of a recorded outcome never reaches it)
        self.policy = policy
        self.worker = _worker_id()
        point = _no_point if on_point is None else on_point
        self._point = point
        # the parts, each with what it needs (tier 0 is reached through Dispatch alone)
        self._recorder = Recorder(self.journal, self.values, point, self.worker)
        self._admission = Admission(self.journal, self.policy, self.worker)
        self._recovery = Recovery(
            self.journal,
            self.values,
            self.clock,
            point,
            recorder=self._recorder,
            admission=self._admission,
        )
        self._dispatch = Dispatch(
            self.journal,
            self.values,
            self.clock,
            point,
            recorder=self._recorder,
            admission=self._admission,
            atomic=Atomic(self.journal, self.values, point, self._recorder),
            recovery=self._recovery,
        )

    @property
    def policy_id(self) -> str:
        return self._admission.policy_id

    @staticmethod
    def identify(call: Call) -> tuple[str, str]:
        """(effect id, proposed payload digest) in a journal whose ids are plain sha256 (the
        default): see ``calls.identify``."""
        return identify(call)

    # -- the attempt ---------------------------------------------------------------------------

    async def run(
        self, call: Call, target: EffectTarget, send: Callable[[Ticket], Awaitable[Any]]
    ) -> Any:
        step = await self.begin(call, target)
        if isinstance(step, Done):
            return step.result
        try:
            result = await send(step)
        except Exception as err:
            await self._recorder.fail(step, err, last_attempt=call.last_attempt)
            raise
        except BaseException:
            step.release()
            raise
        return (await self._recorder.commit(step, result)).result

    def _digest_in(self, scheme: str | None) -> Callable[[bytes], str]:
        if scheme is None:
            return _sha256_hex
        return functools.partial(self.values.digest, scheme=scheme)

    def _payload_digest(self, call: Call, view: EffectView, pdigest: str) -> str:
        """The call's payload digest in the scheme of the recorded effect (``pdigest`` is in
        the scheme a new effect would get): an effect recorded before a codec was configured
        keeps comparing on plain digests, and the other way round. An effect recorded before
        equal-meaning spelling may hold the digest of the proposal as that release spelled it
        (``Named.earlier_body``): that one is the call's digest for it. Taking either is safe:
        a call whose earlier spelling has the recorded digest proposed, byte for byte, what
        that release recorded."""
        digest = self._digest_in(view.digests)
        mine = pdigest if view.digests == self.values.scheme else digest(call.named.body)
        earlier = call.named.earlier_body
        if view.payload_digest == mine or earlier is None:
            return mine
        spelled_before = digest(earlier)
        return spelled_before if view.payload_digest == spelled_before else mine

    def _as_recorded(self, call: Call, eid: str, keyed: Callable[[bytes], str] | None) -> str:
        """The id of ``call``'s effect as the journal knows it: ``eid``, unless the journal
        holds nothing under it and holds an effect under the id the release before gave the
        call (its key spelled as that release spelled it: a Decimal as pydantic writes it,
        strings as given; ``identify_earlier``). So an effect recorded before the upgrade keeps
        its id: a retry of its activity recovers it (never ``UnstableEffectKey``), a duplicate
        spelled as it was returns its outcome. Costs one or two indexed row reads, only for a
        key that equal-meaning spelling changes."""
        if self.journal.row(eid) is not None:
            return eid
        earlier = identify_earlier(call, keyed_ids=keyed)[0]
        return earlier if self.journal.row(earlier) is not None else eid

    async def begin(self, call: Call, target: EffectTarget) -> Ticket | Done:
        keyed = self.values.ids(self.journal.effect_ids)
        eid, pdigest = identify(call, self._digest_in(self.values.scheme), keyed)
        if call.named.earlier_key is not None:
            eid = self._as_recorded(call, eid, keyed)
        started = time.perf_counter()
        claim, entries = await self.journal.claim_reading(eid)
        if claim is None:
            return await self._unclaimed(call, target, eid, pdigest)
        try:
            self._point("claimed", eid)
            for _ in range(3):
                try:
                    step = await self._decide(call, target, eid, pdigest, claim, entries)
                    break
                except HeadConflict:
                    entries = None  # another writer moved the chain: read again, decide again
            else:
                raise InFlight(eid, "the effect's record keeps moving", IN_FLIGHT_RETRY_S)
        except BaseException:
            claim.release()
            raise
        if isinstance(step, Done):
            await self.journal.release_async(claim)
        else:
            step.gate_s = time.perf_counter() - started
        return step

    async def _unclaimed(
        self, call: Call, target: EffectTarget, eid: str, pdigest: str
    ) -> Ticket | Done:
        """A live attempt holds the effect. Terminal records are stable and may be answered
        without the claim; anything else is in flight (or, on the last attempt, ambiguous)."""
        for _ in range(3):
            row = self.journal.row(eid)
            if row is not None and row.status in (Kind.COMMITTED, Kind.REFUSED, Kind.AMBIGUOUS):
                step = await self._decide(call, target, eid, pdigest, None)
                assert isinstance(step, Done)
                return step
            if not (call.last_attempt and row is not None and row.status is Kind.DISPATCHED):
                break
            view = fold(eid, await self.journal.read_async(eid))
            if view.payload_digest != (mine := self._payload_digest(call, view, pdigest)):
                await self._recorder.reject_conflict(view, mine, call)
            try:
                await self._recorder.ambiguous(
                    view,
                    "still in flight in another attempt when the last attempt ran",
                    "in_flight",
                )
            except HeadConflict:
                continue  # the holder recorded its outcome meanwhile: answer from that
        raise InFlight(eid, "another live attempt holds it", IN_FLIGHT_RETRY_S)

    async def _decide(
        self,
        call: Call,
        target: EffectTarget,
        eid: str,
        pdigest: str,
        claim: Claim | None,
        entries: list[Entry] | None = None,
    ) -> Ticket | Done:
        """Decide on the effect's entries: ``entries`` when read under this claim already."""
        if entries is None:
            entries = await self.journal.read_async(eid)
        if not entries:
            await self._dispatch.refuse_an_unstable_key(call, target, eid)
            return await self._dispatch.first(call, target, eid, pdigest, claim)
        view = fold(eid, entries)
        pdigest = self._payload_digest(call, view, pdigest)
        if view.payload_digest != pdigest:
            await self._recorder.reject_conflict(view, pdigest, call)
        status = view.status
        if status is Kind.COMMITTED:
            return Done(eid, await self._recorder.stored(eid, "result", entries), "duplicate")
        if status is Kind.REFUSED and view.configuration is not None:
            # refused for the caller's own configuration: decided again, under the claim
            if claim is None:
                raise InFlight(eid, "another live attempt holds it", IN_FLIGHT_RETRY_S)
            return await self._dispatch.redecide(call, target, view, claim)
        if status is Kind.REFUSED:
            # refused by an earlier attempt: say so, with when, instead of as if it were news
            raise Refused(
                view.code or "refused",
                view.reason or "",
                receipt_of(view),
                refused_at=view.finished_ts or view.proposed_ts or self.clock(),
            )
        if status is Kind.AMBIGUOUS:
            raise Ambiguous(view.reason or "ambiguous", receipt_of(view))
        if status is Kind.RESOLVED and view.resolution == "happened":
            return Done(eid, await self._recorder.stored(eid, "result", entries), "resolved")
        if claim is None:  # pragma: no cover - _unclaimed only passes terminal states
            raise InFlight(eid, "another live attempt holds it", IN_FLIGHT_RETRY_S)
        if status is Kind.REOPENED:
            return await self._dispatch.reopened(call, target, view, claim)
        return await self._recovery.recover(call, target, view, claim)

    # -- after the send, and the records ------------------------------------------------------

    async def commit(self, ticket: Ticket, result: Any, confirmation: str | None = None) -> Done:
        """Record that the target confirmed the effect, then release the claim."""
        return await self._recorder.commit(ticket, result, confirmation)

    async def fail(self, ticket: Ticket, error: BaseException, *, last_attempt: bool) -> None:
        """Record what a failed send means, release the claim, and raise the outcome (or return,
        so the caller re-raises ``error`` for Temporal to retry)."""
        await self._recorder.fail(ticket, error, last_attempt=last_attempt)

    async def close_out(
        self,
        effect_id: str,
        target: EffectTarget,
        *,
        owner_ended: OwnerEnded,
        why: str | None = None,
        decode_args: Callable[[list[Any]], tuple[Any, ...]] | None = None,
    ) -> Receipt:
        """Close out an effect its owner will never send again, without ever sending it: see
        ``Recovery.close_out``."""
        return await self._recovery.close_out(
            effect_id, target, owner_ended=owner_ended, why=why, decode_args=decode_args
        )

    async def stored(self, eid: str, name: str, entries: Sequence[Entry] | None = None) -> Any:
        """The value last stored under ``name`` for the effect, decoded if it is sealed."""
        return await self._recorder.stored(eid, name, entries)

    def receipt(self, eid: str) -> Receipt:
        return self._recorder.receipt(eid)

    def receipt_or_none(self, eid: str) -> Receipt | None:
        return self._recorder.receipt_or_none(eid)
