"""The sweep: thousands of seeded cases against the core protocol, in process, each checking
the invariants that must hold whatever happens.

A case draws, from its seed: the target's tier; where the first attempt dies (any of the
gate's journal-write boundaries, or not at all); whether a second attempt dies too, and where;
a world event while nobody holds the effect (the lease revoked, the order made ineligible, a
manual refund, the dedupe window passing); the next attempts (a retry, a duplicate submission,
the agent re-deciding another amount) and whether two of them recover at once. A death is an
attempt unwinding at that point without recording anything more, its claim released, as a
killed process leaves it; the next attempt runs on a fresh ``Gate``.

    python -m workers.sweep [--cases 2000] [--seed 1]
    python -m workers.sweep --replay SEED        # one case, its story printed

The invariants, read from the payments service and the journal, never from what the gate
returned: the effect landed at most once; COMMITTED means it landed, REFUSED that it did not;
a receipt's ``executed`` is the truth or "unknown"; AMBIGUOUS only where the target can neither
dedupe nor be asked; a re-decided payload sends nothing; every chain verifies; and once the
last attempt is done, nothing is left in doubt.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from interlock_temporal.core.errors import Ambiguous, GateOutcome, InFlight, Refused
from interlock_temporal.core.journal import Journal, open_journal
from interlock_temporal.core.models import Kind
from interlock_temporal.core.protocol import POINTS, Gate, Ticket
from interlock_temporal.core.receipts import fold, receipt_of
from interlock_temporal.targets.payments import RefundRequest, RefundResult, SimulatedPayments
from workflows.support_case import CaseFile

from .inprocess_world import refund_call

ORDER = "A-7731"
PAID_CENTS = 10_000
AMOUNT = 2_000
EVENTS = ("none", "revoke_lease", "ineligible", "manual_refund", "window_passes")
NEXT = ("retry", "duplicate", "redecide")
KEY = "5e" * 32


class Killed(BaseException):
    """The attempt's process died here: nothing after this point runs or is recorded."""


@dataclass(frozen=True)
class Case:
    seed: int
    tier: int
    first_dies_at: str | None
    second_dies_at: str | None
    event: str
    then: str
    concurrent: bool

    @classmethod
    def draw(cls, seed: int) -> Case:
        rng = random.Random(seed)
        points: list[str | None] = [*POINTS, None]
        return cls(
            seed=seed,
            tier=rng.choice((1, 2, 3)),
            first_dies_at=rng.choice(points),
            second_dies_at=rng.choice([None, None, *POINTS]),
            event=rng.choice(EVENTS),
            then=rng.choice(NEXT),
            concurrent=rng.random() < 0.3,
        )


@dataclass
class Story:
    case: Case
    lines: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def say(self, text: str) -> None:
        self.lines.append(text)

    def check(self, ok: bool, problem: str) -> None:
        if not ok:
            self.problems.append(problem)


class Attempt:
    """One attempt at the refund on a fresh gate, dying at ``dies_at`` if given."""

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
    ) -> None:
        self.payments = payments
        self.dies_at = dies_at
        self.gate = Gate(journal, on_point=self._point)
        call = refund_call(request, case, "wf-sweep", number)
        self.call = call if not last else type(call)(**{**call.__dict__, "last_attempt": True})

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
        refund = result if isinstance(result, dict) else result.model_dump()
        return f"result {refund.get('refund_id')}"


async def run_case(case: Case, workdir: Path) -> Story:
    story = Story(case)
    journal = open_journal(f"sqlite:///{workdir / 'journal.db'}", signing_key=KEY)
    payments = SimulatedPayments(workdir / "payments.db", tier=case.tier)
    try:
        payments.open_order(ORDER, PAID_CENTS)
        lease = journal.leases.issue("refund-bot", activities=["refund"], max_amount_cents=5_000)
        case_file = CaseFile(case_id="sweep", order_id=ORDER, amount_cents=AMOUNT, lease_id=lease)
        request = RefundRequest(
            case_id="sweep",
            order_id=ORDER,
            amount_cents=AMOUNT,
            reason="sweep",
            premises=payments.order_facts(ORDER),
        )
        n = 0

        def attempt(
            dies_at: str | None = None, *, last: bool = False, amount: int = AMOUNT
        ) -> Attempt:
            nonlocal n
            n += 1
            req = (
                request if amount == AMOUNT else request.model_copy(update={"amount_cents": amount})
            )
            return Attempt(journal, payments, req, case_file, n, dies_at=dies_at, last=last)

        story.say(f"attempt 1: {await attempt(case.first_dies_at).run()}")
        if case.second_dies_at:
            story.say(f"attempt 2: {await attempt(case.second_dies_at).run()}")
        await world_event(case.event, payments, journal, lease, story)
        if case.then == "redecide":
            before = payments.calls(ORDER)
            effect_known = journal.read(effect_of(request))
            outcome = await attempt(amount=AMOUNT + 1_000).run()
            story.say(f"re-decided $30: {outcome}")
            if effect_known:
                story.check(
                    outcome == "refused conflicting_payload",
                    f"a re-decided payload was not refused: {outcome}",
                )
                story.check(payments.calls(ORDER) == before, "a re-decided payload was sent")
        if case.concurrent:
            outcomes = await asyncio.gather(attempt().run(), attempt().run())
            story.say(f"two at once: {list(outcomes)}")
        for _ in range(3):
            outcome = await attempt().run()
            story.say(f"recovery: {outcome}")
            if outcome != "in_flight":
                break
        final = await attempt(last=True).run()
        story.say(f"last attempt: {final}")
        if case.then == "duplicate":
            before = payments.calls(ORDER)
            again = await attempt().run()
            story.say(f"duplicate: {again}")
            story.check(payments.calls(ORDER) == before, "a duplicate reached the service")
        judge(story, journal, payments, effect_of(request))
    finally:
        journal.close()
        payments.close()
    return story


def effect_of(request: RefundRequest) -> str:
    from interlock_temporal.core.identity import effect_id
    from workflows.activities import refund_key

    return effect_id("refund", refund_key(request))


async def world_event(
    event: str, payments: SimulatedPayments, journal: Journal, lease: str, story: Story
) -> None:
    if event == "revoke_lease":
        journal.leases.revoke(lease)
    elif event == "ineligible":
        payments.set_eligible(ORDER, False)
    elif event == "manual_refund":
        payments.manual_refund(ORDER, AMOUNT)
    elif event == "window_passes":
        payments.advance_clock(timedelta(hours=25).total_seconds())
    story.say(f"world: {event}")


def judge(story: Story, journal: Journal, payments: SimulatedPayments, eid: str) -> None:
    records = payments.refund_records(ORDER)
    # the one effect of the case is the only refund sent through the API (a tier-3 service
    # keeps no key to tell it by)
    ours = [r for r in records if r.source == "api"]
    manual = [r for r in records if r.source != "api"]
    entries = journal.read(eid)
    story.check(len(ours) <= 1, f"the effect landed {len(ours)} times")
    story.check(sum(r.amount_cents for r in records) <= PAID_CENTS, "more was refunded than paid")
    report = journal.verify()
    story.check(report.ok, f"the journal does not verify: {report}")
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


def server_case(seed: int) -> Case:
    """A case for the real server: its first attempt always dies, by a real SIGKILL."""
    case = Case.draw(seed)
    rng = random.Random(seed * 7919)
    return Case(
        seed=seed,
        tier=case.tier,
        first_dies_at=rng.choice(SERVER_POINTS),
        second_dies_at=None,
        event=case.event,
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
        await world_event(case.event, world.simulated, world.journal, world.lease_id, story)
        await world.restart()
        outcome = await world.result(run)
        story.say(f"workflow: {outcome.status}")
        if case.then == "duplicate":
            before = world.simulated.calls(ORDER)
            again = await world.submit(world.case(amount_cents=AMOUNT))
            story.say(f"duplicate: {again.status}")
            story.check(world.simulated.calls(ORDER) == before, "a duplicate reached the service")
        story.check(world.kills == 1, f"{world.kills} workers died, expected 1")
        judge(story, world.journal, world.simulated, world.effect_id)
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
