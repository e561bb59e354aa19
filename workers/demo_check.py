"""What each story of ``make demo`` must show, and the check that holds it to that.

The money is read from the payments service itself: the refunds that landed on the story's
order, each with its amount (the simulated payments db, or the Stripe fake's API through the
real ``stripe`` SDK), never from what the gate believes. Then how the workflow ended, and, for
a gated story, what the journal recorded. ``python -m workers.demo`` checks every story as it
ends and exits 1, naming the story and what was expected against what was found, if any story
did not show what it must. ``make faults`` runs both variants of the demo exactly as
``make demo`` does (``run_demos``) and fails when either exits non-zero.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from interlock_temporal.core.journal import Journal
from interlock_temporal.core.receipts import receipt
from interlock_temporal.targets.payments import RefundRecord

from .world import REFUND_CENTS, Payments, World

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Expected:
    """What one story must end with."""

    #: how many refunds must have landed on the story's order, each of ``each_cents``
    refunds: int
    #: the support-case workflow's status (``CaseOutcome.status``)
    ends: str
    #: the effect's final state in the journal; ``None``: the journal holds no record of it
    #: (no gate ran)
    gate: str | None = None
    via: str | None = None
    each_cents: int = REFUND_CENTS
    #: the refund that landed carries the effect id, and the receipt's confirmation is its id
    #: (a service the gate can ask)
    tagged: bool = False


NAIVE = Expected(refunds=2, ends="REFUNDED")
RECOVERED = Expected(
    refunds=1, ends="REFUNDED", gate="COMMITTED", via="recovery-query", tagged=True
)

#: every story of the demo, by the name ``workers.demo.ACTS`` and ``STRIPE_ACTS`` give it: the
#: refund lands and the worker is SIGKILLed before the result comes back, then
EXPECTED: dict[str, Expected] = {
    # Temporal retries the activity, which sends the refund again: $40 in two refunds
    "naive": NAIVE,
    # the gate asks the service first and finds the refund: $20, once
    "gated-t2": RECOVERED,
    # the refund landed ($20, once), and the gate says AMBIGUOUS rather than guess
    "gated-t3": Expected(refunds=1, ends="AMBIGUOUS", gate="AMBIGUOUS"),
    # the SDK gives the retry's POST a fresh key: Stripe refunds again, $40
    "stripe-naive": NAIVE,
    # the effect id is the key and is in the refund's metadata: found, $20 once
    "stripe-gated": RECOVERED,
}


@dataclass(frozen=True)
class Found:
    """What a story left behind, read back after it ended."""

    order_id: str
    #: the refunds the payments service holds on the order
    refunds: tuple[RefundRecord, ...]
    #: the workflow's status
    ended: str
    #: the effect's final state in the journal (``None``: no record), how, and the
    #: confirmation it names
    gate: str | None
    via: str | None
    confirmation: str | None
    effect_id: str
    #: workers that died by SIGKILL during the story
    kills: int


def observe(
    payments: Payments,
    journal: Journal,
    *,
    order_id: str,
    effect_id: str,
    ended: str,
    kills: int,
) -> Found:
    """Read what a story left: the refunds from the payments service, the effect's record
    from the journal."""
    records = tuple(payments.refund_records(order_id))
    try:
        shown = receipt(effect_id, journal=journal)
    except KeyError:
        return Found(order_id, records, ended, None, None, None, effect_id, kills)
    return Found(
        order_id, records, ended, shown.final, shown.via, shown.confirmation, effect_id, kills
    )


def observe_world(world: World, result: Mapping[str, Any]) -> Found:
    """``observe`` a story's world as its row ended (``result``: the row's outcome)."""
    return observe(
        world.payments,
        world.journal,
        order_id=world.order_id,
        effect_id=world.effect_id,
        ended=result["workflow_status"],
        kills=world.kills,
    )


def _dollars(cents: int) -> str:
    return f"${cents / 100:.0f}" if cents % 100 == 0 else f"${cents / 100:.2f}"


def _expected_money(e: Expected) -> str:
    plural = "refund" if e.refunds == 1 else "refunds"
    total = _dollars(e.refunds * e.each_cents)
    return f"{e.refunds} {plural} of {_dollars(e.each_cents)} ({total})"


def _found_money(records: Sequence[RefundRecord]) -> str:
    if not records:
        return "no refund"
    amounts = [r.amount_cents for r in records]
    if len(amounts) == 1:
        return f"1 refund ({_dollars(amounts[0])})"
    listed = " + ".join(_dollars(a) for a in amounts)
    return f"{len(amounts)} refunds ({listed} = {_dollars(sum(amounts))})"


def check(story: str, found: Found) -> list[str]:
    """What ``story`` did not show of what it must (empty: all of it). Each problem names the
    story and what was expected against what was found."""
    e = EXPECTED[story]
    problems: list[str] = []
    amounts = [r.amount_cents for r in found.refunds]
    if amounts != [e.each_cents] * e.refunds:
        problems.append(
            f"{story}: expected {_expected_money(e)} on order {found.order_id}; "
            f"the payments service holds {_found_money(found.refunds)}"
        )
    if found.ended != e.ends:
        problems.append(f"{story}: expected the workflow to end {e.ends}; it ended {found.ended}")
    if found.gate != e.gate or (e.via is not None and found.via != e.via):
        want = f"to record {e.gate}" if e.gate else "to hold no record of the effect (no gate)"
        got = f"records {found.gate}" if found.gate else "holds no record of the effect"
        want += f" via {e.via}" if e.via else ""
        got += f" via {found.via}" if found.via else ""
        problems.append(f"{story}: expected the journal {want}; it {got}")
    if e.tagged and len(found.refunds) == 1:
        landed = found.refunds[0]
        if landed.effect_id != found.effect_id:
            problems.append(
                f"{story}: expected the refund that landed ({landed.refund_id}) to carry the "
                f"effect id {found.effect_id}; it carries {landed.effect_id or 'none'}"
            )
        if found.confirmation != landed.refund_id:
            problems.append(
                f"{story}: expected the receipt to confirm the refund that landed "
                f"({landed.refund_id}); it confirms {found.confirmation or 'nothing'}"
            )
    if found.kills < 1:
        problems.append(f"{story}: expected the worker to be SIGKILLed; no worker died")
    return problems


def verdict(checked: Sequence[tuple[str, Sequence[str]]]) -> int:
    """Print each story's check and return the exit code: 1 if any story failed it."""
    failed = [(story, problems) for story, problems in checked if problems]
    print("== checked against the payments service ==", flush=True)
    for story, problems in checked:
        if problems:
            for problem in problems:
                print(f"  FAILED {problem}", flush=True)
        else:
            print(f"  ok     {story}: {summary(story)}", flush=True)
    if failed:
        print(
            f"demo FAILED: {len(failed)} of {len(checked)} stories did not show what they "
            f"must ({', '.join(story for story, _ in failed)})",
            file=sys.stderr,
            flush=True,
        )
        return 1
    return 0


# -- make demo DEMO_ARGS=--agent: the agent's stories -------------------------------------


@dataclass(frozen=True)
class AgentExpected:
    """What one of the agent's stories must end with (its workflow completes in each)."""

    #: the refunds that must have landed on the order, in cents
    refunds: tuple[int, ...]
    #: what each tool call must have returned to the agent, in order (a part of the text)
    told: tuple[str, ...]
    #: the effect's final state in the journal (``None``: no effect recorded), and how
    gate: str | None
    via: str | None = None
    #: workers that must have died by SIGKILL
    kills: int = 0


#: every story of ``workers.agent_demo.AGENT_ACTS`` and ``workers.mcp_demo.MCP_ACTS``
AGENT_EXPECTED: dict[str, AgentExpected] = {
    # no gate: SIGKILLed after the send, Temporal runs the tool's activity again: $40 in two
    "agent-naive": AgentExpected((REFUND_CENTS, REFUND_CENTS), ("refund_id",), None, kills=1),
    # SIGKILLed after the send; a fresh worker asks the service and finds it: $20 once
    "agent-t2": AgentExpected(
        (REFUND_CENTS,), ('"refund_id":',), "COMMITTED", "recovery-query", kills=1
    ),
    # the answer lost at tier 3: the agent is told it is unknown, re-decides $30: refused
    "agent-redecide": AgentExpected(
        (REFUND_CENTS,),
        ("error: refund outcome unknown", "error: refund refused (conflicting_payload)"),
        "AMBIGUOUS",
    ),
    # $50 denied by the policy rule (the agent is told), then $20 lands
    "agent-policy": AgentExpected(
        (REFUND_CENTS,),
        ("error: refund denied by policy (OVER_LIMIT)", '"refund_id":'),
        "COMMITTED",
        "dispatch",
    ),
    # the answer lost at tier 3: a person resolves the review, the agent goes on
    "agent-t3": AgentExpected(
        (REFUND_CENTS,), ("done: a person attested that it happened",), "RESOLVED"
    ),
    # --agent=mcp (workers.mcp_demo): the MCP server SIGKILLs its caller after the refund
    # temporalio-mcp alone: its call-tool activity runs again: $40 in two
    "mcp-naive": AgentExpected((REFUND_CENTS, REFUND_CENTS), ('"refund_id"',), None, kills=1),
    # gated, the server dedupes by the _meta effect id: the resend is answered with the first
    "mcp-t1": AgentExpected(
        (REFUND_CENTS,), ('"refund_id"',), "COMMITTED", "retry-idempotent", kills=1
    ),
    # tier 3, the model re-decides $30: unknown, then refused
    "mcp-redecide": AgentExpected(
        (REFUND_CENTS,),
        ("error: refund outcome unknown", "error: refund refused (conflicting_payload)"),
        "AMBIGUOUS",
        kills=1,
    ),
    # $50 denied by the policy rule (an isError result), then $20 lands
    "mcp-policy": AgentExpected(
        (REFUND_CENTS,),
        ("error: refund denied by policy (OVER_LIMIT)", '"refund_id"'),
        "COMMITTED",
        "dispatch",
    ),
    # tier 3: a person resolves the review, the workflow goes on
    "mcp-t3": AgentExpected(
        (REFUND_CENTS,), ("done: a person attested that it happened",), "RESOLVED", kills=1
    ),
}


#: the Pydantic AI agent's stories (``workers.pydantic_ai_demo.PYDANTIC_AI_ACTS``)
AGENT_EXPECTED.update(
    {
        # no gate: SIGKILLed after the send, Temporal runs the toolset's activity again: $40
        "pai-naive": AgentExpected((REFUND_CENTS, REFUND_CENTS), ("refund_id",), None, kills=1),
        # SIGKILLed after the send; a fresh worker asks the service and finds it: $20 once
        "pai-t2": AgentExpected(
            (REFUND_CENTS,), ('"refund_id":',), "COMMITTED", "recovery-query", kills=1
        ),
        # $20 lands; the agent re-decides $30 for the same case: refused, the tool's error
        "pai-redecide": AgentExpected(
            (REFUND_CENTS,),
            ('"refund_id":', "error: refund refused (conflicting_payload)"),
            "COMMITTED",
            "dispatch",
        ),
        # $50 denied by the policy rule (the agent is told), then $20 lands
        "pai-policy": AgentExpected(
            (REFUND_CENTS,),
            ("error: refund denied by policy (OVER_LIMIT)", '"refund_id":'),
            "COMMITTED",
            "dispatch",
        ),
        # the answer lost at tier 3: a deferred call; a person resolves the review, the agent
        # is given the result
        "pai-t3": AgentExpected(
            (REFUND_CENTS,), ("done: a person attested that it happened",), "RESOLVED"
        ),
    }
)


@dataclass(frozen=True)
class AgentFound:
    order_id: str
    refunds: tuple[int, ...]
    told: tuple[str, ...]
    gate: str | None
    via: str | None
    kills: int


def observe_agent(
    payments: Payments,
    journal: Journal,
    order_id: str,
    effect_id: str | None,
    told: Sequence[str],
    kills: int,
) -> AgentFound:
    """What an agent story left: the refunds from the payments service, what the agent was
    told (the run's tool outputs), the effect's record from the journal."""
    refunds = tuple(r.amount_cents for r in payments.refund_records(order_id))
    shown = receipt(effect_id, journal=journal) if effect_id is not None else None
    gate = shown.final if shown else None
    return AgentFound(order_id, refunds, tuple(told), gate, shown.via if shown else None, kills)


def check_agent(story: str, found: AgentFound) -> list[str]:
    """What the agent's ``story`` did not show of what it must (empty: all of it)."""
    e = AGENT_EXPECTED[story]
    problems = []
    if found.refunds != e.refunds:
        want = " + ".join(map(_dollars, e.refunds)) or "no refund"
        got = " + ".join(map(_dollars, found.refunds)) or "no refund"
        problems.append(
            f"{story}: expected {want} on order {found.order_id}; the payments service holds {got}"
        )
    if len(found.told) != len(e.told) or any(
        want not in got for want, got in zip(e.told, found.told, strict=False)
    ):
        problems.append(
            f"{story}: expected the agent to be told {list(e.told)}; it was told {list(found.told)}"
        )
    if (found.gate, found.via if e.via else None) != (e.gate, e.via):
        problems.append(
            f"{story}: expected the journal to record {e.gate} via {e.via or 'any'}; "
            f"it records {found.gate or 'nothing'} via {found.via or '-'}"
        )
    if found.kills < e.kills:
        problems.append(f"{story}: expected a worker to be SIGKILLed; none died")
    return problems


def summary(story: str) -> str:
    """What a story that passed its check showed."""
    if story in AGENT_EXPECTED:
        a = AGENT_EXPECTED[story]
        money = " + ".join(map(_dollars, a.refunds)) or "no refund"
        ending = f"journal {a.gate}" if a.gate else "no journal record (no gate)"
        return f"{money} landed, the agent told {len(a.told)} tool result(s), {ending}"
    e = EXPECTED[story]
    ending = f"journal {e.gate}" if e.gate else "no journal record (no gate)"
    if e.via:
        ending += f" via {e.via}"
    return f"{_expected_money(e)} landed, workflow {e.ends}, {ending}"


# -- make faults: the demo as a newcomer runs it --------------------------------------------

#: the variants of ``make demo``: ``make demo``, ``make demo DEMO_ARGS=--stripe`` and
#: ``make demo DEMO_ARGS=--agent=openai``, ``--agent=mcp``, ``--agent=pydantic-ai`` and
#: ``--agent=langgraph``
VARIANTS: tuple[tuple[str, ...], ...] = (
    (),
    ("--stripe",),
    ("--agent=openai",),
    ("--agent=mcp",),
    ("--agent=pydantic-ai",),
    ("--agent=langgraph",),
)
#: a demo that has not ended by then has hung (it takes well under a minute)
DEMO_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class DemoRun:
    args: tuple[str, ...]
    returncode: int
    seconds: float

    @property
    def command(self) -> str:
        return " ".join(["python -m workers.demo", *self.args])

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def run_demo(args: Sequence[str], timeout: float = DEMO_TIMEOUT_S) -> DemoRun:
    """``python -m workers.demo ARGS`` from the repository's root, as ``make demo`` runs it,
    its output passed through; a run past ``timeout`` is killed (with the dev server it
    started) and fails."""
    started = time.monotonic()
    print(f"$ {' '.join(['python -m workers.demo', *args])}", flush=True)
    process = subprocess.Popen(
        [sys.executable, "-m", "workers.demo", *args],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        code = process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        print(f"the demo had not ended after {timeout:.0f} s: killed", file=sys.stderr)
        code = -int(signal.SIGKILL)
    return DemoRun(tuple(args), code, round(time.monotonic() - started, 1))


def run_demos(variants: Sequence[Sequence[str]] = VARIANTS) -> list[DemoRun]:
    runs = [run_demo(args) for args in variants]
    for run in runs:
        state = "ok" if run.ok else f"FAILED (exit {run.returncode})"
        print(f"demo {state}: {run.command}, {run.seconds:.0f} s", flush=True)
    return runs


def demo_section(runs: Sequence[DemoRun]) -> list[str]:
    """The fault table's note on the demo runs."""
    typed = [
        "`make demo" + (f" DEMO_ARGS={' '.join(run.args)}" if run.args else "") + "`"
        for run in runs
    ]
    named = ", ".join(typed[:-1]) + f" and {typed[-1]}" if len(typed) > 1 else "".join(typed)
    lines = [
        "## make demo",
        "",
        f"{named}, run as a newcomer types them (each "
        "starts its own dev server): every story is checked against the money the payments "
        "service holds on its order (the count and amount of the refunds that landed), how "
        "its workflow ended and what the journal recorded (`workers/demo_check.py`); a story "
        "that does not show what it must makes the demo exit 1, and `make faults` with it.",
        "",
    ]
    for run in runs:
        state = "ok" if run.ok else f"**FAILED** (exit {run.returncode})"
        lines.append(f"- `{run.command}`: {state}, {run.seconds:.0f} s")
    return lines
