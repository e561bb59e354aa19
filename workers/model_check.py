"""A small-scope exhaustive check: every interleaving of two attempts at one effect, each of
which may die at any step, with one world event at any moment, explored breadth-first over the
states the real core protocol reaches. The invariants are asserted in every reachable state.

The attempts are the real ``Gate`` (one per attempt, each with its own journal connection and
claims, as two worker processes have), run in threads that pause at every step: each of the
gate's named points (the journal-write boundaries) and every call into the target. A scheduler
lets exactly one attempt move to its next pause, kills a paused attempt (it unwinds there,
recording nothing more, its claim released, as a SIGKILL leaves it), or applies the world event.
An attempt paused at ``send`` is a request still on its way: the other attempt, or the event,
can go first, and its response arrives late. A state is what both attempts have done and where
each stands, the journal's record of the effect, what the target holds, the world's clock, and
the event; each is reached by replaying its choices from scratch on fresh stores, and a state
seen before is not expanded again.

The first attempt is the owning workflow's. The second, by ``variant``: its retry (``retry``),
its retry on the last attempt Temporal will make (``last``), the same effect submitted by
another workflow (``other``), the agent re-deciding another amount (``redecide``), or the
owner's retry against a target with a ``settle_time`` (``settling``): there, an attempt killed
as its request left leaves that request in flight, and it may still land until the settle time
has passed (before then, "not found" proves nothing). The world
events: the lease revoked, or past its expiry; the order made ineligible, or refunded by hand;
the clock moved to just short of the dedupe window's end (past its end less settle time and
margin); another effect taking the lease's budget; the journal edited by its operator; the
owning workflow cancelled (its attempts stop where they stand, and the reconciler may run); at
tier 3, while the effect is AMBIGUOUS, an outsider's decision (``not_happened``, voted by the
agent's own principal and by an operator not on the worker's list, counted and recorded as the
record activity does), after which the owner, woken, runs its activity once more at once.

    python -m workers.model_check [--tiers 1,2,3] [--variants retry,other,...]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .model_world import SHM, Replay

#: the events a tier's check draws from (near the window's end matters only with a window)
ALL_EVENTS = (
    "revoke_lease",
    "settle_time_passes",
    "expire_lease",
    "ineligible",
    "manual_refund",
    "near_window_end",
    "budget_taken",
    "tamper",
    "owner_cancelled",
    "outsider_decides",
)
VARIANTS = ("retry", "last", "other", "redecide", "settling")
_LARGEST_FIRST = ("retry", "settling", "last", "other", "redecide")


def events_for(tier: int) -> tuple[str, ...]:
    """A tier's events: near the window's end only with a window (tier 1); an outsider's
    decision only where an effect is left AMBIGUOUS for a person (tier 3)."""
    return tuple(
        e
        for e in ALL_EVENTS
        if (e != "near_window_end" or tier == 1)
        and (e != "outsider_decides" or tier == 3)
        and e != "settle_time_passes"
    )


def scope(tier: int, variant: str) -> tuple[str, ...]:
    """The events a (tier, second attempt) check explores, within ``make faults``' five
    minutes: all of the tier's for the owner's own retry; for its last attempt, the lease or
    the facts gone and the owner cancelled; for another workflow's submission, the owner
    cancelled or the facts gone; for a re-decided amount, whose conflict is caught before
    anything else, one; for a target that settles, the settle time passing and the lease
    revoked."""
    if variant == "retry":
        return events_for(tier)
    if variant == "last":
        return ("revoke_lease", "ineligible", "owner_cancelled")
    if variant == "other":
        return ("owner_cancelled", "ineligible")
    if variant == "settling":
        return ("settle_time_passes", "revoke_lease")
    return ("revoke_lease",)


@dataclass
class Result:
    tier: int
    states: int
    transitions: int
    terminal: int
    seconds: float
    violations: list[tuple[Sequence[str], list[str]]]
    finals: dict[str, int]
    variant: str = "retry"


def replay(tier: int, variant: str, events: Sequence[str], choices: Sequence[str]) -> Replay:
    directory = Path(tempfile.mkdtemp(prefix="interlock-mc-", dir=SHM))
    replayed = Replay(tier, variant, events, directory)
    for choice in choices:
        replayed.apply(choice)
    return replayed


def explore(
    tier: int,
    variant: str = "retry",
    events: Sequence[str] | None = None,
    *,
    limit: int = 200_000,
    stop_at_first: bool = False,
) -> Result:
    """Every state two attempts (the owner's, and the second ``variant``) and one of
    ``events`` (default: every event of the tier) reach; ``stop_at_first`` ends at the first
    violation (for a planted bug)."""
    events = scope(tier, variant) if events is None else tuple(events)
    started = time.monotonic()
    seen: set[tuple[Any, ...]] = set()
    frontier: deque[tuple[str, ...]] = deque([()])
    violations: list[tuple[Sequence[str], list[str]]] = []
    transitions = terminal = 0
    finals: dict[str, int] = {}
    while frontier and len(seen) < limit:
        path = frontier.popleft()
        replayed = replay(tier, variant, events, path)
        try:
            state = replayed.state()
            if state in seen:
                continue
            seen.add(state)
            problems = replayed.check()
            if problems:
                violations.append((path, problems))
                if stop_at_first:
                    break
            options = replayed.choices()
            if not any(c.startswith(("step", "kill")) for c in options):
                terminal += 1
                record = state[0]
                final = (
                    record[-1][0]
                    if record and record != ("edited",)
                    else ("edited" if record == ("edited",) else "nothing recorded")
                )
                finals[final] = finals.get(final, 0) + 1
            for choice in options:
                transitions += 1
                frontier.append((*path, choice))
        finally:
            replayed.close()
    return Result(
        tier=tier,
        states=len(seen),
        transitions=transitions,
        terminal=terminal,
        seconds=time.monotonic() - started,
        violations=violations,
        finals=finals,
        variant=variant,
    )


def _explore(job: tuple[int, str]) -> Result:
    return explore(*job)


def explore_all(
    tiers: Sequence[int], variants: Sequence[str] = VARIANTS, jobs: int = 2
) -> list[Result]:
    """Every (tier, second attempt) check in its scope, ``jobs`` processes at a time (each
    check is independent; the machines have two cores)."""
    from concurrent.futures import ProcessPoolExecutor

    # the largest checks first, so that the two processes end together
    work = [(t, v) for v in sorted(variants, key=_LARGEST_FIRST.index) for t in tiers]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(_explore, work))


def describe(r: Result) -> str:
    finals = ", ".join(f"{k} {v}" for k, v in sorted(r.finals.items()))
    return (
        f"tier {r.tier}, {r.variant}: {r.states} states, {r.transitions} transitions, "
        f"{r.terminal} end states ({finals}), {len(r.violations)} violations, {r.seconds:.1f} s"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m workers.model_check",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--tiers", default="1,2,3")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--jobs", type=int, default=2)
    args = p.parse_args(argv)
    started = time.monotonic()
    results = explore_all(
        [int(t) for t in args.tiers.split(",")], args.variants.split(","), args.jobs
    )
    for r in results:
        print(describe(r))
        for path, problems in r.violations[:5]:
            print(f"  VIOLATION {problems} after {list(path)}")
    bad = sum(len(r.violations) for r in results)
    print(
        f"model check: {sum(r.states for r in results):,} states, {bad} violations, "
        f"{time.monotonic() - started:.0f} s"
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
