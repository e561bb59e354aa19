"""The model the exhaustive check (``model_check``) explores: the stores of one replay (a
journal holding the lease, and an in-memory ``Target`` at a tier on the world's clock) and its
two attempts, real ``Gate``s in threads that pause at every step (``Runner``). The ``Replay``
applies the scheduler's choices, names the state they reach, and checks the invariants in it."""

from __future__ import annotations

import asyncio
import functools
import shutil
import tempfile
import threading
import time
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from interlock_temporal.core.errors import GateOutcome, JournalCorrupt
from interlock_temporal.core.journal import Journal, open_journal
from interlock_temporal.core.models import Change, Found, Kind
from interlock_temporal.core.protocol import Call, Delivery, Gate, Measure, Ticket
from interlock_temporal.core.receipts import fold, receipt_of

from . import invariants, outsider
from .db_edit import raise_approved

KEY = "4d" * 32
OWNER = "wf"
#: the agent's principal, holding the lease
PRINCIPAL = "bot"
AMOUNT = 20
#: the lease's budget: this effect fits, it and another do not
BUDGET = 30
#: the lease lives past the dedupe window, so the window's end is not also the lease's
LEASE_TTL = timedelta(hours=30)
#: the settle time of the ``settling`` variant's target (the others' is 0: a request dies with
#: its sender)
SETTLE_TIME = timedelta(minutes=10)
#: the shared memory where each state's stores live (fsync is free there)
SHM = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())


#: the pauses an attempt reaches only after it has read the effect's journal
_READ_THE_JOURNAL = frozenset(
    {"query", "capture", "before_dispatch_tx", "before_recovery_tx", "after_dispatch_tx", "send"}
)
_TEMPLATE: list[tuple[Path, str]] = []


def _template() -> tuple[Path, str]:
    """A journal, migrated, holding the lease and nothing else: each replay starts from a
    copy instead of migrating and issuing."""
    if not _TEMPLATE:
        where = Path(tempfile.mkdtemp(prefix="interlock-mc-template-", dir=SHM)) / "j.db"
        journal = open_journal(f"sqlite:///{where}", signing_key=KEY)
        lease = journal.leases.issue(
            PRINCIPAL,
            activities=["refund"],
            max_amount_cents=50,
            budget_cents=BUDGET,
            ttl=LEASE_TTL,
        )
        journal.close()
        _TEMPLATE.append((where, lease))
    return _TEMPLATE[0]


class Killed(BaseException):
    """The attempt dies where it stands."""


class Target:
    """In memory, at a tier: the effect lands at most as often as it is sent. Its clock is the
    world's (``offset`` seconds ahead of real time)."""

    name = "model"

    def __init__(self, tier: int, pause: Any, settle_time: timedelta = timedelta(0)) -> None:
        self.tier = tier
        self.settle_time = settle_time
        self.dedupe_window = timedelta(hours=24) if tier == 1 else None
        self.landed: dict[str, int] = {}
        self.first_seen: dict[str, float] = {}
        self.eligible = True
        self.refunded_by_hand = 0
        self.offset = 0.0
        self.sends_after_tamper = 0
        self.tampered = False
        #: the attempts whose send was decided (their dispatch recorded) before the edit
        self.sent_before_tamper: set[str] = set()
        #: the attempts still running when the journal was edited
        self.running_at_tamper: set[str] = set()
        self._pause = pause
        self._who: Any = lambda: None
        if tier <= 2:
            self.query = self._query

    def clock(self) -> float:
        return time.time() + self.offset

    def capture(self, args: Any, effect_id: str) -> dict[str, Any]:
        self._pause("capture")
        return {"eligible": self.eligible, "refunded_by_hand": self.refunded_by_hand}

    def validate(self, recorded: Any, current: Any, payload: Any) -> list[Change]:
        changes = []
        if not current.get("eligible"):
            changes.append(Change(fact="eligible", recorded=True, current=False))
        if current.get("refunded_by_hand") != recorded.get("refunded_by_hand", 0):
            changes.append(Change(fact="refunded_by_hand"))
        return changes

    def _query(self, effect_id: str, args: Any) -> Found | None:
        self._pause("query")
        return Found(result={"ok": True}) if self.landed.get(effect_id) else None

    def send(self, effect_id: str) -> dict[str, Any]:
        self._pause("send")
        return self.land(effect_id)

    def land(self, effect_id: str) -> dict[str, Any]:
        """The request reaches the target: at once, or late (its sender killed)."""
        if self.tampered and self._who() not in self.sent_before_tamper:
            self.sends_after_tamper += 1
        now = self.clock()
        seen = self.first_seen.setdefault(effect_id, now)
        window = self.dedupe_window
        if window and self.landed.get(effect_id) and now < seen + window.total_seconds():
            return {"ok": True}  # deduplicated by key
        self.landed[effect_id] = self.landed.get(effect_id, 0) + 1
        return {"ok": True}


@dataclass
class Runner:
    """One attempt in a thread, pausing at every step until the scheduler lets it go on."""

    name: str
    workflow_id: str = OWNER
    go: threading.Event = field(default_factory=threading.Event)
    paused: threading.Event = field(default_factory=threading.Event)
    at: str = "start"
    #: every pause so far: where an attempt stands is its path through the code, not only its
    #: last pause (one pause name can be reached on two paths, e.g. ``capture`` on a first
    #: dispatch and on a recovery)
    trace: tuple[str, ...] = ()
    kill: bool = False
    done: bool = False
    outcome: str = ""
    thread: threading.Thread | None = None

    def pause(self, where: str) -> None:
        self.at = where
        self.trace = (*self.trace, where)
        self.paused.set()
        self.go.wait()
        self.go.clear()
        if self.kill:
            raise Killed(where)

    def step(self) -> None:
        """Let it run to its next pause (or its end)."""
        self.paused.clear()
        self.go.set()
        self.paused.wait(timeout=30)
        if not self.paused.is_set():
            raise RuntimeError(f"attempt {self.name} did not pause or end")


def _payload(amount: int = AMOUNT, order: str = "o-1") -> dict[str, Any]:
    return {"order": order, "amount": amount}


def _call(
    lease: str, amount: int, workflow_id: str, attempt: int, last: bool, order: str = "o-1"
) -> Call:
    p = _payload(amount, order)
    return Call(
        effect_type="refund",
        activity="refund",
        input=p,
        args=(p,),
        key={"order": order},
        principal=PRINCIPAL,
        lease_id=lease,
        measure=lambda args: Measure(args[0]["amount"]),
        delivery=Delivery(workflow_id=workflow_id, activity_id="1", attempt=attempt),
        last_attempt=last,
    )


@functools.cache
def _effect_id(lease: str) -> str:
    return Gate.identify(_call(lease, AMOUNT, OWNER, 1, False))[0]


class Replay:
    """The stores and the two attempts of one replay."""

    def __init__(self, tier: int, variant: str, events: Sequence[str], directory: Path) -> None:
        self.directory = directory
        self.variant = variant
        self.events = tuple(events)
        self.journals: list[Journal] = []
        template, self.lease = _template()
        shutil.copyfile(template, directory / "j.db")
        # the setup's, then each attempt's, opened now (before any event): a worker's journal
        # was opened when it started
        self.journals += [
            open_journal(f"sqlite:///{directory / 'j.db'}", signing_key=KEY) for _ in range(3)
        ]
        self.target = Target(
            tier, self._pause, SETTLE_TIME if variant == "settling" else timedelta(0)
        )
        self.target._who = lambda: getattr(getattr(self._local, "runner", None), "name", None)
        self.runners = [
            Runner("A"),
            Runner("B", workflow_id="wf-other" if variant == "other" else OWNER),
        ]
        self.event: str | None = None
        self.event_at: tuple[int, ...] = ()
        self.offsets: list[tuple[float, float]] = [(0.0, 0.0)]
        self.cancelled_at: float | None = None
        self.reconciled = False
        #: a request whose sender was killed as it left: it may land until the target settles
        self.in_flight: str = ""
        #: how the owner's attempt woken after an outsider's decision ended
        self.woken: str = ""

    def _started(self, runner: Runner) -> Runner:
        """An attempt's thread starts at its first step: most states never reach one of the
        two, and a thread's start is most of a replay's cost."""
        if runner.thread is None:
            journal = self.journals[1 + self.runners.index(runner)]
            runner.thread = threading.Thread(
                target=self._attempt, args=(runner, journal), daemon=True
            )
            runner.thread.start()
            runner.paused.wait(timeout=30)
        return runner

    def _pause(self, where: str) -> None:
        runner = getattr(self._local, "runner", None)
        if runner is not None:
            runner.pause(where)

    _local = threading.local()

    def _attempt(self, runner: Runner, journal: Journal) -> None:
        self._local.runner = runner
        gate = Gate(
            journal, on_point=lambda point, eid: runner.pause(point), clock=self.target.clock
        )
        second = runner.name == "B"
        call = _call(
            self.lease,
            AMOUNT + 10 if second and self.variant == "redecide" else AMOUNT,
            runner.workflow_id,
            attempt=2 if second and self.variant in ("retry", "last", "settling") else 1,
            last=second and self.variant == "last",
        )

        async def send(ticket: Ticket) -> dict[str, Any]:
            return self.target.send(ticket.effect_id)

        try:
            runner.pause("start")
            asyncio.run(gate.run(call, self.target, send))
            runner.outcome = "returned"
        except Killed as k:
            runner.outcome = f"died at {k}"
        except GateOutcome as g:
            runner.outcome = type(g).__name__
        except JournalCorrupt:
            runner.outcome = "JournalCorrupt"
        except Exception as err:  # an attempt that fails otherwise is a finding
            runner.outcome = f"ERROR {type(err).__name__}: {err}"
        runner.done = True
        runner.at = "done"
        runner.paused.set()

    def choices(self) -> list[str]:
        out = []
        for i, r in enumerate(self.runners):
            if not r.done:
                out += [f"step {i}", f"kill {i}"]
        if self.event is None:
            out += [
                f"event {e}"
                for e in self.events
                if e != "outsider_decides" or self._status() is Kind.AMBIGUOUS
            ]
        if self.cancelled_at is not None and not self.reconciled:
            out.append("reconcile")
        if self.in_flight == "in flight" and self.event != "settle_time_passes":
            out.append("late landing")
        return out

    def apply(self, choice: str) -> None:
        if choice == "reconcile":
            self._reconcile()
            return
        if choice == "late landing":
            self.in_flight = "landed late"
            self.target.land(self.effect_id())
            return
        verb, arg = choice.split(" ", 1)
        if verb == "event":
            self.event = arg
            # where each attempt stood when it happened: what each has read of the world
            # (an attempt not yet started stands at its start, as one paused there does)
            self.event_at = tuple(len(r.trace) or 1 for r in self.runners)
            self._happen(arg)
            return
        runner = self._started(self.runners[int(arg)])
        if verb == "kill":
            runner.kill = True
            if runner.at == "send" and self.target.settle_time:
                self.in_flight = "in flight"
        runner.step()

    def _happen(self, event: str) -> None:
        if event == "revoke_lease":
            self.journals[0].leases.revoke(self.lease)
        elif event == "settle_time_passes":
            self._advance(SETTLE_TIME + timedelta(minutes=1))
        elif event == "expire_lease":
            self._advance(LEASE_TTL + timedelta(hours=1))
        elif event == "ineligible":
            self.target.eligible = False
        elif event == "manual_refund":
            self.target.refunded_by_hand += AMOUNT
        elif event == "near_window_end":
            self._advance(timedelta(hours=24) - timedelta(minutes=2))
        elif event == "budget_taken":
            self._another_effect()
        elif event == "tamper":
            self._tamper()
        elif event == "outsider_decides":
            self._outsider_decides()
        elif event == "owner_cancelled":
            self.cancelled_at = time.time()
            for r in self.runners:  # the cancellation reaches the owner's attempts
                if r.workflow_id == OWNER and not r.done:
                    self._started(r).kill = True
                    r.step()

    def _advance(self, by: timedelta) -> None:
        self.target.offset += by.total_seconds()
        self.offsets.append((time.time(), self.target.offset))

    def offset_at(self, ts: float) -> float:
        return max((o for at, o in self.offsets if at <= ts), default=0.0)

    def _another_effect(self) -> None:
        """Another effect under the same lease, run to its end at once."""

        async def send(ticket: Ticket) -> dict[str, Any]:
            return {"ok": True}

        gate = Gate(self.journals[0], clock=self.target.clock)
        other = _call(self.lease, AMOUNT, "wf-budget", 1, False, "o-2")
        with suppress(GateOutcome):
            asyncio.run(gate.run(other, self.target, send))

    def _tamper(self) -> None:
        """The operator raises the approved amount stored beside the dispatch, and the digest
        the AUTHORIZED entry signed, to match."""
        eid = self.effect_id()

        def raised(values: dict[str, Any]) -> None:
            values["approved"][0]["amount"] = AMOUNT + 5

        if raise_approved(self.directory / "j.db", eid, raised) is None:
            return
        # an attempt past its first step read the journal before the edit: what it sends was
        # decided on verified entries
        self.target.sent_before_tamper = {
            r.name for r in self.runners if set(r.trace) & _READ_THE_JOURNAL
        }
        self.target.running_at_tamper = {r.name for r in self.runners if not r.done}
        self.target.tampered = True

    def _status(self) -> Kind | None:
        """The effect's status as the journal records it (None: nothing, or an edited one)."""
        entries = self._entries()
        return fold(self.effect_id(), entries).status if entries else None

    def _outsider_decides(self) -> None:
        """While the effect is AMBIGUOUS, an outsider decides ``not_happened`` in votes the
        worker's rules refuse (the agent's principal, and an operator not on the list),
        recorded as the record activity records one. Then the owner, woken as a review's
        signal wakes ``execute_effect``, runs its activity once more, to its end in this one
        step (not interleaved: both attempts are done once the effect is AMBIGUOUS)."""
        outsider.decide(
            self.journals[0], self.effect_id(), outsider.outsider_votes("both", PRINCIPAL)
        )

        async def send(ticket: Ticket) -> dict[str, Any]:
            return self.target.send(ticket.effect_id)

        gate = Gate(self.journals[0], clock=self.target.clock)
        try:
            asyncio.run(gate.run(_call(self.lease, AMOUNT, OWNER, 3, False), self.target, send))
            self.woken = "returned"
        except GateOutcome as g:
            self.woken = type(g).__name__
        except Exception as err:  # a woken attempt that fails otherwise is a finding
            self.woken = f"ERROR {type(err).__name__}: {err}"

    def _reconcile(self) -> None:
        """The reconciler, once the owner is cancelled: close out without a send, in one step."""
        self.reconciled = True
        eid = self.effect_id()
        if self.target.tampered or not self.journals[0].read(eid):
            return
        gate = Gate(self.journals[0], clock=self.target.clock)
        try:
            asyncio.run(gate.close_out(eid, self.target, owner_ended="cancelled"))
        except GateOutcome:
            self.reconciled = False  # a live attempt held it: the next run tries again

    def effect_id(self) -> str:
        return _effect_id(self.lease)

    def _entries(self) -> list[Any] | None:
        """The effect's entries; None once the journal was edited (they cannot be trusted)."""
        if self.target.tampered:
            return None
        return self.journals[0].read(self.effect_id())

    def state(self) -> tuple[Any, ...]:
        entries = self._entries()
        record = (
            ("edited",)
            if entries is None
            else tuple(
                (
                    e.kind.value,
                    e.data.get("via"),
                    e.data.get("code"),
                    str(e.data.get("premises_now")),
                )
                for e in entries
            )
        )
        return (
            record,
            self.target.landed.get(self.effect_id(), 0),
            tuple((r.trace, r.done, r.outcome) for r in self.runners),
            self.event,
            self.event_at,
            self.reconciled,
            self.in_flight,
            self.woken,
        )

    def check(self) -> list[str]:
        """The invariants, in this state."""
        eid = self.effect_id()
        problems = []
        landed = self.target.landed.get(eid, 0)
        if landed > 1:
            problems.append(f"the effect landed {landed} times")
        if self.variant == "redecide" and all(r.outcome == "returned" for r in self.runners):
            problems.append("two different payloads were both accepted under one effect id")
        if self.woken.startswith("ERROR"):
            problems.append(f"the owner, woken: {self.woken}")
        for r in self.runners:
            if r.outcome.startswith("ERROR"):
                problems.append(f"attempt {r.name}: {r.outcome}")
            if r.outcome == "JournalCorrupt" and not self.target.tampered:
                problems.append(f"attempt {r.name}: JournalCorrupt on an unedited journal")
            if r.outcome in ("Ambiguous", "Refused") and r.name in self.target.running_at_tamper:
                # an outcome's append after the edit must find it, as a read would
                problems.append(f"attempt {r.name}: {r.outcome} recorded on an edited journal")
        lease = self.journals[0].leases.get(self.lease)
        assert lease is not None
        problems += invariants.budget_problems(lease)
        if self.target.tampered:
            if self.target.sends_after_tamper:
                problems.append("the target was sent to after the journal was edited")
            return problems
        entries = self.journals[0].read(eid)
        if entries:
            view = fold(eid, entries)
            shown = receipt_of(view)
            if view.status is Kind.COMMITTED and landed != 1:
                problems.append("COMMITTED but the target does not have it")
            if view.status is Kind.REFUSED and landed:
                problems.append("REFUSED but the effect landed")
            if view.status is Kind.REFUSED and shown.executed is not False:
                problems.append("REFUSED with executed not false")
            if (
                view.status is Kind.AMBIGUOUS
                and self.target.tier != 3
                and view.code not in ("in_flight", "not_owner")
            ):
                problems.append(f"AMBIGUOUS at tier {self.target.tier} ({view.code})")
            returned = any(r.outcome == "returned" for r in self.runners)
            if (returned or self.woken == "returned") and view.status not in (
                Kind.COMMITTED,
                Kind.RESOLVED,
            ):
                problems.append(
                    f"an attempt returned its result, and the journal says {view.status}"
                )
            if (
                self.reconciled
                and view.status is Kind.DISPATCHED
                and view.owner == OWNER
                and all(r.done for r in self.runners)
            ):
                problems.append("left DISPATCHED after the reconciler ran")
            around = invariants.Circumstances(lease, self.offset_at, self.cancelled_at, OWNER)
            payload = self.journals[0].blob(eid, "approved")[0]
            problems += invariants.dispatch_problems(entries, around, self.target, payload)
        elif landed:
            problems.append("the effect landed with nothing in the journal")
        if all(r.done for r in self.runners):
            report = self.journals[0].verify()
            if not report.ok:
                problems.append(f"the journal does not verify: {report}")
        return problems

    def close(self) -> None:
        for r in self.runners:
            while r.thread is not None and not r.done:
                r.kill = True
                r.step()
        for j in self.journals:
            j.close()
        shutil.rmtree(self.directory, ignore_errors=True)
