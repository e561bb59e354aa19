"""What a proof costs per decision: ``count_votes`` (what the record activity runs for every
decision) on one AMBIGUOUS effect, in a journal without a roster, and in one with a roster and
a vote proven by a key or by a one-time code, measured side by side in alternating rounds on
one machine (the ratios are the figures; the machine is shared and noisy).

    python -m benchmarks.decision_proofs [--rounds 7] [--calls 200]

Prints each case's median microseconds per decision and its ratio to the case without a
roster. Not part of ``make bench``'s report: a decision is a person's, a few a day, far from
the gate's path; this answers "what does a proof add", recorded in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import tempfile
import time
from pathlib import Path

from interlock_temporal.core.errors import Ambiguous
from interlock_temporal.core.journal import Journal
from interlock_temporal.core.journal.signing import Ed25519Key
from interlock_temporal.core.operators import add_operator, roster_of
from interlock_temporal.core.protocol import Gate, Ticket
from interlock_temporal.core.review import ReviewRules, Vote, count_votes
from interlock_temporal.core.vote_codes import VoteCodes
from interlock_temporal.core.vote_proofs import ballot_of, sign_vote

from .gate_cost import TrivialTarget, make_call, open_bench_journal
from .machine import machine


async def in_doubt(journal: Journal) -> str:
    """An effect dispatched whose worker died, found AMBIGUOUS by the last attempt (the bench's
    trivial target can be asked nothing: tier 3)."""
    call = make_call("decide", 0)
    ticket = await Gate(journal).begin(call, TrivialTarget())
    assert isinstance(ticket, Ticket)
    ticket.release()
    try:
        await Gate(journal).begin(dataclasses.replace(call, last_attempt=True), TrivialTarget())
    except Ambiguous:
        return ticket.effect_id
    raise AssertionError("the effect should be AMBIGUOUS")


async def cases(directory: Path) -> dict[str, tuple[Journal, str, Vote]]:
    plain = open_bench_journal(directory / "plain.db")
    proven = open_bench_journal(directory / "roster.db")
    carol = Ed25519Key.generate()
    add_operator(proven, "carol", carol.public_text)
    add_operator(proven, "dave", Ed25519Key.generate().public_text)
    plain_id, proven_id = await in_doubt(plain), await in_doubt(proven)
    ballot = ballot_of(proven, roster_of(proven), "ambiguous", proven_id)
    assert ballot is not None
    vote = Vote(decision="happened", operator="carol")
    keyed = sign_vote(ballot, vote, carol, int(time.time()) + 3600)
    code = VoteCodes(proven.keyring).code(ballot, "carol", "happened")
    return {
        "no roster": (plain, plain_id, vote),
        "key proof": (proven, proven_id, keyed),
        "one-time code": (proven, proven_id, vote.model_copy(update={"code": code})),
    }


def per_decision(journal: Journal, effect_id: str, vote: Vote, calls: int) -> float:
    started = time.perf_counter()
    for _ in range(calls):
        count_votes(journal, "ambiguous", effect_id, [vote], ReviewRules())
    return (time.perf_counter() - started) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="interlock-proofs-") as tmp:
        measured = asyncio.run(cases(Path(tmp)))
        seen: dict[str, list[float]] = {name: [] for name in measured}
        for _ in range(args.rounds):
            for name, (journal, effect_id, vote) in measured.items():
                seen[name].append(per_decision(journal, effect_id, vote, args.calls))
        for journal, _, _ in measured.values():
            journal.close()
    base = statistics.median(seen["no roster"])
    print(f"machine: {machine()}")
    for name, times in seen.items():
        median = statistics.median(times)
        print(f"{name:<14} {median:8.0f} us per decision  x{median / base:.2f}")


if __name__ == "__main__":
    main()
