"""The sweep: thousands of seeded cases against the core protocol, in process, each checking
the invariants that must hold whatever happens.

A case draws, from its seed: the target's tier; where the first attempt dies (any of the
gate's journal-write boundaries, or not at all), or whether it hangs on instead, alive, holding
its claim, its send landed and its result not yet recorded (a zombie, which records it at the
very end); whether a second attempt dies too, and where; a world event while nobody holds the
effect (the lease revoked or expired, the order made ineligible, a manual refund, the clock
moved just short of the dedupe window's end or past it, another effect taking the lease's
budget, the journal edited by its operator, the owning workflow cancelled and the reconciler
run); the next attempts (a retry, a duplicate submission from the same workflow or another,
the agent re-deciding another amount) and whether two of them recover at once; and, from a
random stream of its own (every other draw of a seed is unchanged), whether an outsider's
decision arrives once the owner's attempts have left the effect AMBIGUOUS: ``not_happened``,
voted by the agent's own principal, by an operator not on the worker's list, or both, and
recorded as the record activity records one (``outsider``), after which the owner, woken,
runs once more. A death is an attempt unwinding at that point without recording anything
more, its claim released, as a killed process leaves it; the next attempt runs on a fresh
``Gate``.

    python -m workers.sweep [--cases 2000] [--seed 1]
    python -m workers.sweep --replay SEED        # one case, its story printed

The invariants, read from the payments service, the lease store and the journal, never from
what the gate returned (``judge``): the effect landed at most once; COMMITTED means it landed,
REFUSED that it did not; a receipt's ``executed`` is the truth or "unknown"; AMBIGUOUS only
where the target can neither dedupe nor be asked; a re-decided payload sends nothing; no
DISPATCHED after its lease was revoked or had expired; no DISPATCHED on facts that no longer
held when they were captured; a resend only where the target dedupes it (inside the window,
less settle time and margin) or was asked, or after a confirmed absence (a send that never
left, a person's not_happened, a reopen); no DISPATCHED by anyone but the owning workflow, and
none after it was cancelled; nothing sent once the journal was edited; a late result never
lost; the lease's budget never exceeded; every chain verifies; and once the last attempt (and
the reconciler) is done, nothing is left in doubt.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from interlock_temporal.core.errors import Ambiguous, GateOutcome, InFlight, Refused
from interlock_temporal.core.journal import Journal, open_journal
from interlock_temporal.core.models import Kind
from interlock_temporal.core.protocol import Call, Gate, Ticket
from interlock_temporal.core.receipts import fold, receipt_of
from interlock_temporal.targets.payments import RefundRequest, RefundResult, SimulatedPayments
from workflows.support_case import PRINCIPAL, CaseFile

from . import invariants, outsider
from .inprocess_world import refund_call
from .sweep_case import (
    AMOUNT,
    BUDGET_CENTS,
    ORDER,
    OTHER_ORDER,
    OTHER_WORKFLOW,
    OWNER,
    PAID_CENTS,
    Case,
    Ledger,
    Story,
    effect_of,
    world_event,
)

KEY = "5e" * 32


class Killed(BaseException):
    """The attempt's process died here: nothing after this point runs or is recorded."""


#: what the zombie holds: its ticket, and its send's result (None: its request is on its way)
Held = tuple[Ticket, RefundResult | None]


class Attempt:
    """One attempt at the refund on a fresh gate (whose clock is the world's), dying at
    ``dies_at`` if given."""

    def __init__(
        self,
        journal: Journal,
        payments: SimulatedPayments,
        request: RefundRequest,
        case: CaseFile,
        number: int,
        *,
        dies_at: str | None = None,
        last: bool = False,
        workflow_id: str = OWNER,
    ) -> None:
        self.payments = payments
        self.dies_at = dies_at
        self.gate = Gate(journal, on_point=self._point, clock=payments.clock)
        call = refund_call(request, case, workflow_id, number)
        self.call = call if not last else Call(**{**call.__dict__, "last_attempt": True})

    def _point(self, name: str, effect_id: str) -> None:
        if name == self.dies_at:
            raise Killed(name)

    async def _send(self, ticket: Ticket) -> RefundResult:
        r = ticket.input
        return await self.payments.refund(
            r.order_id, r.amount_cents, idempotency_key=ticket.effect_id
        )

    async def run(self) -> str:
        """How it ended: ``died``, ``in_flight``, or the outcome's name."""
        try:
            result = await self.gate.run(self.call, self.payments, self._send)
        except Killed as k:
            return f"died at {k}"
        except InFlight:
            return "in_flight"
        except Refused as r:
            return f"refused {r.code}"
        except Ambiguous:
            return "ambiguous"
        except GateOutcome as g:
            return f"outcome {type(g).__name__}"
        except Exception as err:  # JournalCorrupt and its kin: the attempt stops there
            return f"error {type(err).__name__}"
        refund = result if isinstance(result, dict) else result.model_dump()
        return f"result {refund.get('refund_id')}"

    async def hang_on(self, stalled: bool) -> Held | str:
        """The zombie: dispatch, send (unless its request is ``stalled`` on its way), then
        hold the claim without recording anything."""
        try:
            step = await self.gate.begin(self.call, self.payments)
        except GateOutcome as g:
            return f"outcome {type(g).__name__}"
        if not isinstance(step, Ticket):
            return "done"
        return step, None if stalled else await self._send(step)


def _lease_for(case: Case, journal: Journal) -> str:
    return journal.leases.issue(
        "refund-bot",
        activities=["refund"],
        max_amount_cents=5_000,
        budget_cents=BUDGET_CENTS,
        ttl=timedelta(hours=1) if case.event == "expire_lease" else None,
    )


class CaseRun:
    """One case's stores, its request, and the attempts made on them, numbered as Temporal
    numbers them; each step below is one part of the case's story."""

    def __init__(
        self, case: Case, story: Story, journal: Journal, payments: SimulatedPayments
    ) -> None:
        self.case, self.story, self.journal, self.payments = case, story, journal, payments
        payments.open_order(ORDER, PAID_CENTS)
        payments.open_order(OTHER_ORDER, PAID_CENTS)
        lease = _lease_for(case, journal)
        self.ledger = Ledger(lease)
        self.case_file = CaseFile(
            case_id="sweep", order_id=ORDER, amount_cents=AMOUNT, lease_id=lease
        )
        self.request = RefundRequest(
            case_id="sweep",
            order_id=ORDER,
            amount_cents=AMOUNT,
            reason="sweep",
            premises=payments.order_facts(ORDER),
        )
        self.n = 0

    def attempt(
        self,
        dies_at: str | None = None,
        *,
        last: bool = False,
        amount: int = AMOUNT,
        workflow_id: str = OWNER,
    ) -> Attempt:
        self.n += 1
        req = (
            self.request
            if amount == AMOUNT
            else self.request.model_copy(update={"amount_cents": amount})
        )
        return Attempt(
            self.journal,
            self.payments,
            req,
            self.case_file,
            self.n,
            dies_at=dies_at,
            last=last,
            workflow_id=workflow_id,
        )

    async def first_attempts(self) -> Held | None:
        """Attempt 1 dies where the case says, or hangs on (the zombie, whose claim is
        returned); attempt 2 dies too if the case says where."""
        case, story = self.case, self.story
        zombie: Held | None = None
        if case.zombie:
            held = await self.attempt().hang_on(case.stalled)
            what = held if isinstance(held, str) else "stalled" if case.stalled else "sent"
            story.say(f"attempt 1: hangs on ({what})")
            zombie = None if isinstance(held, str) else held
        else:
            story.say(f"attempt 1: {await self.attempt(case.first_dies_at).run()}")
        if case.second_dies_at:
            story.say(f"attempt 2: {await self.attempt(case.second_dies_at).run()}")
        return zombie

    async def redecide(self, zombie_alive: bool) -> None:
        """The agent re-decides $30: refused, and nothing sent."""
        payments, ledger, story = self.payments, self.ledger, self.story
        before = payments.calls(ORDER)
        effect_known = self.journal.read(effect_of(self.request)) if not ledger.tampered_at else [1]
        outcome = await self.attempt(amount=AMOUNT + 1_000).run()
        story.say(f"re-decided $30: {outcome}")
        if effect_known:
            # refused; or, while a live attempt holds the effect, told to wait
            story.check(
                outcome == "refused conflicting_payload"
                or (outcome == "in_flight" and zombie_alive)
                # an edited journal (its entries, or a lease's row put back): nothing decided
                or (outcome in _CORRUPT and ledger.tampered_at is not None),
                f"a re-decided payload was not refused: {outcome}",
            )
            story.check(payments.calls(ORDER) == before, "a re-decided payload was sent")

    async def owner_goes_on(self) -> None:
        """The owning workflow's next attempts: two at once if the case says so, up to three
        recoveries, the last attempt, and a duplicate submission if the case says so."""
        case, story = self.case, self.story
        if case.concurrent:
            outcomes = await asyncio.gather(self.attempt().run(), self.attempt().run())
            story.say(f"two at once: {list(outcomes)}")
        for _ in range(3):
            outcome = await self.attempt().run()
            story.say(f"recovery: {outcome}")
            if outcome != "in_flight":
                break
        story.say(f"last attempt: {await self.attempt(last=True).run()}")
        if case.then == "duplicate":
            before = self.payments.calls(ORDER)
            again = await self.attempt().run()
            story.say(f"duplicate: {again}")
            story.check(self.payments.calls(ORDER) == before, "a duplicate reached the service")

    async def outsider_decides(self) -> None:
        """While the effect is AMBIGUOUS, an outsider's decision arrives: ``not_happened``, in
        votes the worker's rules refuse (the agent's own principal, an operator not on the
        allow-list), recorded as the record activity records one (``outsider.decide``). Then
        the owner, woken as a review's signal wakes ``execute_effect``, runs its activity once
        more: the gate believes only the journal, so it waits again unless a decision was
        recorded (a not_happened recorded lets it send again)."""
        eid = effect_of(self.request)
        who = self.case.outsider
        if who is None or self.ledger.tampered_at is not None:
            return
        entries = self.journal.read(eid)
        if not entries or fold(eid, entries).status is not Kind.AMBIGUOUS:
            return
        said = outsider.decide(self.journal, eid, outsider.outsider_votes(who, PRINCIPAL))
        self.story.say(f"an outsider decides not_happened ({who}): {said}")
        self.story.say(f"the owner, woken: {await self.attempt().run()}")

    async def zombie_ends(self, ticket: Ticket, result: RefundResult | None) -> None:
        """The zombie ends: its request, if it stalled, lands at last, and it records its
        result."""
        payments, story = self.payments, self.story
        late = Gate(self.journal, clock=payments.clock)
        try:
            if result is None:  # the stalled request reaches the target at last
                self.ledger.zombie_sent_late = True
                try:
                    result = await payments.refund(
                        ORDER, ticket.input.amount_cents, idempotency_key=ticket.effect_id
                    )
                except Exception as err:  # what the adapter does with a failed send
                    story.say(f"the zombie's request fails: {type(err).__name__}")
                    await late.fail(ticket, err, last_attempt=True)
            if result is not None:
                done = await late.commit(ticket, result)
                self.ledger.zombie_committed = True
                story.say(f"the zombie records its result: {done.via}, after {done.after}")
        except Exception as err:
            story.say(f"the zombie's outcome: {type(err).__name__}")


#: what an attempt on an edited journal ends in: its entries, or a row the gate reads
_CORRUPT = ("error JournalCorrupt", "error RowCorrupt")


async def run_case(case: Case, workdir: Path) -> Story:
    story = Story(case)
    journal = open_journal(f"sqlite:///{workdir / 'journal.db'}", signing_key=KEY)
    payments = SimulatedPayments(workdir / "payments.db", tier=case.tier)
    try:
        run = CaseRun(case, story, journal, payments)
        ledger, request = run.ledger, run.request
        zombie = await run.first_attempts()
        await world_event(case.event, payments, journal, ledger, story, request)
        owner_runs = ledger.cancelled_at is None
        if case.then == "redecide" and owner_runs:
            await run.redecide(zombie_alive=zombie is not None)
        if case.then == "duplicate_other":
            # another workflow submits the same effect: it may commit it by asking, never send
            other = await run.attempt(workflow_id=OTHER_WORKFLOW).run()
            story.say(f"another workflow: {other}")
        if owner_runs:
            await run.owner_goes_on()
            await run.outsider_decides()
        if zombie is not None:
            await run.zombie_ends(*zombie)
        if ledger.cancelled_at is not None:
            await reconcile(journal, payments, ledger, story, request)
        judge(story, journal, payments, effect_of(request), ledger)
    finally:
        journal.close()
        payments.close()
    return story


async def reconcile(
    journal: Journal,
    payments: SimulatedPayments,
    ledger: Ledger,
    story: Story,
    request: RefundRequest,
) -> None:
    """What the reconciler does once the owning workflow is cancelled: close out, never send."""
    eid = effect_of(request)
    if not journal.read(eid):
        return
    gate = Gate(journal, clock=payments.clock)
    try:
        shown = await gate.close_out(
            eid,
            payments,
            owner_ended="cancelled",
            decode_args=lambda blob: (RefundRequest.model_validate(blob[0]),),
        )
        story.say(f"reconciler: {shown.final} ({shown.via or shown.code})")
    except Exception as err:
        story.say(f"reconciler: {type(err).__name__}")
    ledger.reconciled = True


def judge(
    story: Story,
    journal: Journal,
    payments: SimulatedPayments,
    eid: str,
    ledger: Ledger | None = None,
) -> None:
    """The invariants, read from the service, the lease store and the journal."""
    records = payments.refund_records(ORDER)
    # the one effect of the case is the only refund sent through the API for its order (a
    # tier-3 service keeps no key to tell it by)
    ours = [r for r in records if r.source == "api"]
    manual = [r for r in records if r.source != "api"]
    story.check(len(ours) <= 1, f"the effect landed {len(ours)} times")
    story.check(sum(r.amount_cents for r in records) <= PAID_CENTS, "more was refunded than paid")
    tampered = ledger is not None and ledger.tampered_at is not None
    if tampered:
        assert ledger is not None
        story.check(
            payments.calls(ORDER) == ledger.calls_at_tamper + ledger.zombie_sent_late,
            "the service was called after the journal was edited",
        )
        story.check(not journal.verify().ok, "an edited journal verifies")
        return  # nothing may be decided on it: what it says cannot be trusted
    report = journal.verify()
    story.check(report.ok, f"the journal does not verify: {report}")
    if ledger is not None:
        _judge_the_lease_budget(story, journal, ledger)
    entries = journal.read(eid)
    if not entries:
        story.check(not ours, "the effect landed with nothing in the journal")
        return
    view = fold(eid, entries)
    shown = receipt_of(view)
    status = view.status
    story.say(
        f"final: {status} ({shown.via or shown.code}), landed {len(ours)}, manual {len(manual)}"
    )
    story.check(
        status in (Kind.COMMITTED, Kind.REFUSED, Kind.AMBIGUOUS),
        f"left {status} after the last attempt",
    )
    approved = RefundRequest.model_validate(journal.blob(eid, "approved")[0])
    story.check(
        all(r.amount_cents == approved.amount_cents for r in ours),
        "the amount sent is not the one the journal approved",
    )
    if status is Kind.COMMITTED:
        story.check(len(ours) == 1, "COMMITTED, but the service has no such refund")
        story.check(shown.executed is True, "COMMITTED with executed not true")
    if status is Kind.REFUSED:
        story.check(not ours, "REFUSED, but the refund landed")
        story.check(shown.executed is False, "REFUSED with executed not false")
    if status is Kind.AMBIGUOUS:
        story.check(shown.executed == "unknown", "AMBIGUOUS with executed known")
        story.check(
            story.case.tier == 3, f"AMBIGUOUS at tier {story.case.tier}, which can be asked"
        )
    if ledger is None:
        return
    if ledger.zombie_committed:
        story.check(status is Kind.COMMITTED, f"the late result was lost: left {status}")
    _judge_the_dispatches(story, journal, payments, view, entries, ledger)


def _judge_the_lease_budget(story: Story, journal: Journal, ledger: Ledger) -> None:
    lease = journal.leases.get(ledger.lease)
    assert lease is not None
    for problem in invariants.budget_problems(lease):
        story.check(False, problem)


def _judge_the_dispatches(
    story: Story,
    journal: Journal,
    payments: SimulatedPayments,
    view: Any,
    entries: list[Any],
    ledger: Ledger,
) -> None:
    lease = journal.leases.get(ledger.lease)
    assert lease is not None
    approved = RefundRequest.model_validate(journal.blob(view.effect_id, "approved")[0])
    around = invariants.Circumstances(lease, ledger.offset_at, ledger.cancelled_at, OWNER)
    for problem in invariants.dispatch_problems(entries, around, payments, approved):
        story.check(False, problem)


def replay_command(seed: int, server: bool = False) -> str:
    return f"python -m workers.sweep --replay {seed}" + (" --on-server" if server else "")


#: where a first attempt's worker can die on a real server (a first attempt never recovers)
SERVER_POINTS = (
    "claimed",
    "before_dispatch_tx",
    "after_dispatch_tx",
    "after_send",
    "after_commit_tx",
)


#: the world events a server case draws (the others need the world's clock in the gate, or a
#: second effect, which the server's worker processes do not share)
SERVER_EVENTS = ("none", "revoke_lease", "ineligible", "manual_refund", "window_passes")


def server_case(seed: int) -> Case:
    """A case for the real server: its first attempt always dies, by a real SIGKILL."""
    case = Case.draw(seed)
    rng = random.Random(seed * 7919)
    return Case(
        seed=seed,
        tier=case.tier,
        first_dies_at=rng.choice(SERVER_POINTS),
        second_dies_at=None,
        event=case.event if case.event in SERVER_EVENTS else rng.choice(SERVER_EVENTS),
        then="duplicate" if case.then == "duplicate" else "retry",
        concurrent=False,
    )


async def run_on_server(case: Case, client: Any, workdir: Path) -> Story:
    """The case with real worker processes: the first dies by SIGKILL at its point (the
    journal is SQLite on this disk), the world changes while none runs, a fresh worker
    recovers, and a duplicate submission follows if the case asks."""
    from .server_world import ServerWorld

    story = Story(case)
    world = ServerWorld(client, workdir, case.tier, "gated")
    world.order_id = ORDER
    try:
        world.setup()
        marker = workdir / "killed"
        await world.spawn("--kill-at", str(case.first_dies_at), "--kill-marker", str(marker))
        run = await world.start(world.case(amount_cents=AMOUNT))
        await world.crashed(run)
        story.say(f"attempt 1: killed at {case.first_dies_at} (SIGKILL)")
        ledger = Ledger(world.lease_id)
        await world_event(case.event, world.simulated, world.journal, ledger, story)
        await world.restart()
        outcome = await world.result(run)
        story.say(f"workflow: {outcome.status}")
        if case.then == "duplicate":
            before = world.simulated.calls(ORDER)
            again = await world.submit(world.case(amount_cents=AMOUNT))
            story.say(f"duplicate: {again.status}")
            story.check(world.simulated.calls(ORDER) == before, "a duplicate reached the service")
        story.check(world.kills == 1, f"{world.kills} workers died, expected 1")
        judge(story, world.journal, world.simulated, world.effect_id, ledger)
    finally:
        await world.close()
    return story


async def sweep_on_server(seeds: list[int], jobs: int) -> list[Story]:
    from temporalio.client import Client
    from temporalio.contrib.pydantic import pydantic_data_converter

    from interlock_temporal.testing import DevServer

    root = Path(tempfile.mkdtemp(prefix="interlock-sweep-server-"))
    server = await DevServer(ui_port=None).start()
    try:
        client = await Client.connect(server.target, data_converter=pydantic_data_converter)
        limit = asyncio.Semaphore(jobs)

        async def one(seed: int) -> Story:
            async with limit:
                workdir = root / str(seed)
                workdir.mkdir()
                try:
                    story = await run_on_server(server_case(seed), client, workdir)
                except Exception as err:  # a case that cannot run is a failed case
                    story = Story(server_case(seed))
                    story.problems.append(f"{type(err).__name__}: {err}")
                mark = "FAIL" if story.problems else "ok  "
                print(f"{mark} seed {seed} {server_case(seed)}", flush=True)
                if story.problems:
                    print(f"     {story.problems}; replay: {replay_command(seed, True)}")
                return story

        return list(await asyncio.gather(*[one(s) for s in seeds]))
    finally:
        await server.stop()


async def sweep(cases: int, first_seed: int) -> tuple[int, list[Story]]:
    failed: list[Story] = []
    root = Path(tempfile.mkdtemp(prefix="interlock-sweep-"))
    for i in range(cases):
        seed = first_seed + i
        workdir = root / str(seed)
        workdir.mkdir()
        story = await run_case(Case.draw(seed), workdir)
        if story.problems:
            failed.append(story)
            print(f"FAIL seed {seed}: {story.problems}; replay: {replay_command(seed)}")
    return cases, failed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m workers.sweep",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--cases", type=int, default=2000)
    p.add_argument("--seed", type=int, default=1, help="the first case's seed")
    p.add_argument("--replay", type=int, help="run this one seed and print its story")
    p.add_argument(
        "--on-server",
        type=int,
        nargs="?",
        const=-1,
        metavar="N",
        help="run N cases (or, with --replay, that one) with real worker processes and "
        "real SIGKILLs on a real Temporal server",
    )
    p.add_argument("--jobs", type=int, default=3, help="server cases run at once")
    args = p.parse_args(argv)
    if args.replay is not None and args.on_server is not None:
        (story,) = asyncio.run(sweep_on_server([args.replay], 1))
        print("\n".join(f"  {line}" for line in story.lines))
        print("problems:", story.problems or "none")
        return 1 if story.problems else 0
    if args.on_server is not None:
        started = time.monotonic()
        seeds = list(range(args.seed, args.seed + max(args.on_server, 1)))
        stories = asyncio.run(sweep_on_server(seeds, args.jobs))
        bad = [s for s in stories if s.problems]
        print(
            f"sweep on a real server: {len(stories)} cases with real SIGKILLs, "
            f"{len(bad)} failed, {time.monotonic() - started:.1f} s"
        )
        return 1 if bad else 0
    if args.replay is not None:
        case = Case.draw(args.replay)
        story = asyncio.run(run_case(case, Path(tempfile.mkdtemp(prefix="interlock-replay-"))))
        print(case)
        print("\n".join(f"  {line}" for line in story.lines))
        print("problems:", story.problems or "none")
        return 1 if story.problems else 0
    started = time.monotonic()
    total, failed = asyncio.run(sweep(args.cases, args.seed))
    print(
        f"sweep: {total} cases (seeds {args.seed}..{args.seed + total - 1}), "
        f"{len(failed)} failed, {time.monotonic() - started:.1f} s"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
