"""A small-scope exhaustive check: every interleaving of two attempts at one effect, each of
which may die at any step, with one world event at any moment, explored breadth-first over the
states the real core protocol reaches. The invariants are asserted in every reachable state.

The attempts are the real ``Gate`` (one per attempt, each with its own journal connection and
claims, as two worker processes have), run in threads that pause at every step: each of the
gate's named points (the journal-write boundaries) and every call into the target. A scheduler
lets exactly one attempt move to its next pause, kills a paused attempt (it unwinds there,
recording nothing more, its claim released, as a SIGKILL leaves it), or applies the world event
(the lease revoked, or the order made ineligible). A state is what both attempts have done and
where each stands, the journal's record of the effect, what the target holds, and whether the
event happened; each is reached by replaying its choices from scratch on fresh stores, and a
state seen before is not expanded again.

    python -m workers.model_check [--tiers 1,2,3]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from interlock_temporal.core.errors import GateOutcome
from interlock_temporal.core.journal import Journal, open_journal
from interlock_temporal.core.models import Change, Found, Kind
from interlock_temporal.core.protocol import Call, Delivery, Gate, Measure, Ticket
from interlock_temporal.core.receipts import fold, receipt_of

KEY = "4d" * 32
EVENTS = ("revoke_lease", "ineligible")
#: the shared memory where each state's stores live (fsync is free there)
SHM = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())


class Killed(BaseException):
    """The attempt dies where it stands."""


class Target:
    """In memory, at a tier: the effect lands at most as often as it is sent."""

    name = "model"
    settle_time = timedelta(0)

    def __init__(self, tier: int, pause: Any) -> None:
        self.tier = tier
        self.dedupe_window = timedelta(hours=24) if tier == 1 else None
        self.landed: dict[str, int] = {}
        self.eligible = True
        self._pause = pause
        if tier <= 2:
            self.query = self._query

    def capture(self, args: Any, effect_id: str) -> dict[str, Any]:
        self._pause("capture")
        return {"eligible": self.eligible}

    def validate(self, recorded: Any, current: Any, payload: Any) -> list[Change]:
        if not current.get("eligible"):
            return [Change(fact="eligible", recorded=True, current=False)]
        return []

    def _query(self, effect_id: str) -> Found | None:
        self._pause("query")
        return Found(result={"ok": True}) if self.landed.get(effect_id) else None

    def send(self, effect_id: str) -> dict[str, Any]:
        self._pause("send")
        if self.tier == 1 and self.landed.get(effect_id):
            return {"ok": True}  # deduplicated by key
        self.landed[effect_id] = self.landed.get(effect_id, 0) + 1
        return {"ok": True}


@dataclass
class Runner:
    """One attempt in a thread, pausing at every step until the scheduler lets it go on."""

    name: str
    go: threading.Event = field(default_factory=threading.Event)
    paused: threading.Event = field(default_factory=threading.Event)
    at: str = "start"
    kill: bool = False
    done: bool = False
    outcome: str = ""
    thread: threading.Thread | None = None

    def pause(self, where: str) -> None:
        self.at = where
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


class World:
    """The stores and the two attempts of one replay."""

    def __init__(self, tier: int, directory: Path) -> None:
        self.directory = directory
        self.journals: list[Journal] = []
        setup = open_journal(f"sqlite:///{directory / 'j.db'}", signing_key=KEY)
        self.journals.append(setup)
        self.lease = setup.leases.issue("bot", activities=["refund"], max_amount_cents=5_000)
        self.current: Runner | None = None
        self.target = Target(tier, self._pause)
        self.runners = [Runner("A"), Runner("B")]
        self.event: str | None = None
        for runner in self.runners:
            runner.thread = threading.Thread(target=self._attempt, args=(runner,), daemon=True)
            runner.thread.start()
            runner.paused.wait(timeout=30)

    def _pause(self, where: str) -> None:
        runner = getattr(self._local, "runner", None)
        if runner is not None:
            runner.pause(where)

    _local = threading.local()

    def _attempt(self, runner: Runner) -> None:
        self._local.runner = runner
        journal = open_journal(f"sqlite:///{self.directory / 'j.db'}", signing_key=KEY)
        self.journals.append(journal)
        gate = Gate(journal, on_point=lambda point, eid: runner.pause(point))
        call = Call(
            effect_type="refund",
            activity="refund",
            input={"order": "o-1", "amount": 20},
            args=({"order": "o-1", "amount": 20},),
            key={"order": "o-1"},
            principal="bot",
            lease_id=self.lease,
            measure=lambda args: Measure(20),
            delivery=Delivery(workflow_id="wf", activity_id=runner.name, attempt=1),
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
            out += [f"event {e}" for e in EVENTS]
        return out

    def apply(self, choice: str) -> None:
        verb, arg = choice.split(" ", 1)
        if verb == "event":
            self.event = arg
            if arg == "revoke_lease":
                self.journals[0].leases.revoke(self.lease)
            else:
                self.target.eligible = False
            return
        runner = self.runners[int(arg)]
        if verb == "kill":
            runner.kill = True
        runner.step()

    def effect_id(self) -> str:
        return Gate.identify(
            Call(
                effect_type="refund",
                activity="refund",
                input={"order": "o-1", "amount": 20},
                args=({"order": "o-1", "amount": 20},),
                key={"order": "o-1"},
            )
        )[0]

    def state(self) -> tuple[Any, ...]:
        eid = self.effect_id()
        entries = self.journals[0].read(eid)
        record = tuple((e.kind.value, e.data.get("via"), e.data.get("code")) for e in entries)
        return (
            record,
            self.target.landed.get(eid, 0),
            tuple((r.at, r.done, r.outcome) for r in self.runners),
            self.event,
        )

    def check(self) -> list[str]:
        """The invariants, in this state."""
        eid = self.effect_id()
        problems = []
        landed = self.target.landed.get(eid, 0)
        if landed > 1:
            problems.append(f"the effect landed {landed} times")
        entries = self.journals[0].read(eid)
        for r in self.runners:
            if r.outcome.startswith("ERROR"):
                problems.append(f"attempt {r.name}: {r.outcome}")
        if entries:
            view = fold(eid, entries)
            shown = receipt_of(view)
            if view.status is Kind.COMMITTED and landed != 1:
                problems.append("COMMITTED but the target does not have it")
            if view.status is Kind.REFUSED and landed:
                problems.append("REFUSED but the effect landed")
            if view.status is Kind.REFUSED and shown.executed is not False:
                problems.append("REFUSED with executed not false")
            if view.status is Kind.AMBIGUOUS and self.target.tier != 3:
                problems.append(f"AMBIGUOUS at tier {self.target.tier}")
        elif landed:
            problems.append("the effect landed with nothing in the journal")
        if all(r.done for r in self.runners):
            report = self.journals[0].verify()
            if not report.ok:
                problems.append(f"the journal does not verify: {report}")
        return problems

    def close(self) -> None:
        for r in self.runners:
            while not r.done:
                r.kill = True
                r.step()
        for j in self.journals:
            j.close()
        shutil.rmtree(self.directory, ignore_errors=True)


@dataclass
class Result:
    tier: int
    states: int
    transitions: int
    terminal: int
    seconds: float
    violations: list[tuple[Sequence[str], list[str]]]
    finals: dict[str, int]


def replay(tier: int, choices: Sequence[str]) -> World:
    world = World(tier, Path(tempfile.mkdtemp(prefix="interlock-mc-", dir=SHM)))
    for choice in choices:
        world.apply(choice)
    return world


def explore(tier: int, limit: int = 200_000) -> Result:
    started = time.monotonic()
    seen: set[tuple[Any, ...]] = set()
    frontier: deque[tuple[str, ...]] = deque([()])
    violations: list[tuple[Sequence[str], list[str]]] = []
    transitions = terminal = 0
    finals: dict[str, int] = {}
    while frontier and len(seen) < limit:
        path = frontier.popleft()
        world = replay(tier, path)
        try:
            state = world.state()
            if state in seen:
                continue
            seen.add(state)
            problems = world.check()
            if problems:
                violations.append((path, problems))
            options = world.choices()
            if not any(c.startswith(("step", "kill")) for c in options):
                terminal += 1
                record = state[0]
                final = record[-1][0] if record else "nothing recorded"
                finals[final] = finals.get(final, 0) + 1
            for choice in options:
                transitions += 1
                frontier.append((*path, choice))
        finally:
            world.close()
    return Result(
        tier=tier,
        states=len(seen),
        transitions=transitions,
        terminal=terminal,
        seconds=time.monotonic() - started,
        violations=violations,
        finals=finals,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m workers.model_check",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--tiers", default="1,2,3")
    args = p.parse_args(argv)
    bad = 0
    for tier in (int(t) for t in args.tiers.split(",")):
        r = explore(tier)
        bad += len(r.violations)
        print(
            f"tier {tier}: {r.states} states, {r.transitions} transitions, {r.terminal} end "
            f"states ({', '.join(f'{k} {v}' for k, v in sorted(r.finals.items()))}), "
            f"{len(r.violations)} violations, {r.seconds:.1f} s"
        )
        for path, problems in r.violations[:5]:
            print(f"  VIOLATION {problems} after {list(path)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
