"""The story in under a minute, on a real Temporal dev server with its Web UI.

A customer paid $100; support case 4471 approves one $20 partial refund; the refund lands and
the worker is killed (SIGKILL) before the result comes back. Three endings:

1. naive: Temporal retries the activity, which has no idea it already ran: $40 refunded.
2. gated, tier 2 (the service can be asked): recovery asks first, finds the refund: $20, once.
3. gated, tier 3 (the service can neither dedupe nor answer): AMBIGUOUS, said out loud.

Each story is checked as it ends against the money it must show, read from the payments service
(the refunds that landed on its order: how many, how much), how its workflow ended and what the
journal recorded (``demo_check.EXPECTED``); the demo exits 1, naming the story and what was
expected against what was found, if any story did not show what it must. ``make faults`` runs
both variants and fails with them.

    python -m workers.demo                 (what `make demo` runs)
    python -m workers.demo --stripe        the same crash, refunds on a Stripe fake (real SDK)
    python -m workers.demo --agent=openai  an agent (OpenAI Agents SDK) whose refund tool is gated
                                           (--agent alone: the same)
    python -m workers.demo --agent=mcp     the refund as an MCP server's tool (temporalio-mcp),
                                           gated
    python -m workers.demo --agent=pydantic-ai
                                           the same with Pydantic AI on Temporal (a GatedToolset)
    python -m workers.demo --agent=langgraph  the same stories told by a LangGraph agent
    STRIPE_API_KEY=sk_test_... python -m workers.demo --stripe-live
                                           the gate against real Stripe test mode
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import textwrap
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import stripe
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Worker

from interlock_temporal import InterlockPlugin
from interlock_temporal.cli._render import render_entries, render_receipt
from interlock_temporal.core.journal import open_journal
from interlock_temporal.core.receipts import receipt
from interlock_temporal.targets.payments import RefundResult
from interlock_temporal.targets.stripe import StripeRefunds
from interlock_temporal.testing import DevServer
from workflows.activities import support_activities
from workflows.support_case import PRINCIPAL, CaseFile, CaseOutcome, SupportCase

from . import agent_demo, langgraph_demo, mcp_demo, pydantic_ai_demo
from .demo_check import Found, check, observe_world, verdict
from .scenarios import run_in
from .server_world import ServerWorld
from .world import (
    CASE,
    LEASE_MAX_CENTS,
    ORDER,
    PAID_CENTS,
    REFUND_CENTS,
    World,
    the_effect_id,
)

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / ".demo"

ACTS: list[tuple[str, str, int, str]] = [
    ("naive", "naive", 2, "Temporal's retries, no gate"),
    ("gated-t2", "gated", 2, "the gate, against a service it can ask (tier 2)"),
    ("gated-t3", "gated", 3, "the gate, against a service that can neither dedupe nor answer"),
]

STRIPE_STORY = """\
The same crash against Stripe: the official `stripe` SDK, talking to stripe-stateful-mock (a
Stripe fake that dedupes idempotency keys and lists refunds like Stripe) on loopback. A customer
paid $100 by card (a charge); support case 4471 approves one $20 partial refund; Stripe commits
it and the worker is SIGKILLed before the result comes back. Two endings:

1. naive: Temporal retries the activity; the SDK gives every POST a fresh random key: $40.
2. gated, tier 1 (Idempotency-Key = the effect id for 24 h, then a lookup of the charge's
   refunds by metadata.effect_id): recovery finds the refund: $20, COMMITTED via
   recovery-query."""

STRIPE_ACTS: list[tuple[str, str, int, str]] = [
    ("stripe-naive", "naive", 1, "Stripe: Temporal's retries, no gate, no key of ours"),
    ("stripe-gated", "gated", 1, "Stripe: the gate (tier 1: dedupes by key, can be asked)"),
]


def say(text: str = "") -> None:
    print(text, flush=True)


def indent(text: str) -> str:
    return textwrap.indent(text, "    ")


def show_effect(journal_file: Path, eid: str) -> None:
    """The effect's journal and receipt, and how to explore the journal further."""
    with open_journal(journal_file, create=False) as journal:
        say("  journal:")
        say(indent(render_entries(journal.read(eid))))
        say("  receipt:")
        say(indent(render_receipt(receipt(eid, journal=journal))))
    shown = journal_file.relative_to(ROOT) if journal_file.is_relative_to(ROOT) else journal_file
    say(f"  explore: .venv/bin/interlock --journal sqlite:///{shown} effects list")


class StoryFailed(Exception):
    """A story that could not be told to its end (the server, a worker, the fake)."""


async def act(
    client: Client, name: str, mode: str, tier: int, title: str, *, stripe_fake: bool = False
) -> dict[str, Any]:
    """One story. Its result carries ``problems``: what it did not show of what it must
    (``demo_check.EXPECTED[name]``), read from the payments service and the journal."""
    workdir = DEMO / name
    workdir.mkdir(parents=True)
    say(f"== {title} ==")
    found: list[Found] = []

    def read(world: World, result: dict[str, Any]) -> None:
        found.append(observe_world(world, result))

    world: World
    try:
        if stripe_fake:
            from .stripe_harness import StripeServerWorld

            world = await StripeServerWorld.launch(client, workdir, mode)  # type: ignore[arg-type]
        else:
            world = await ServerWorld.create(client, workdir, tier, mode)  # type: ignore[arg-type]
        result = await run_in(world, "crash_before_ack", before_close=read)
    except Exception as err:
        why = f"{type(err).__name__}: {err}"
        raise StoryFailed(f"{name}: the story did not run to its end: {why}") from err
    result["problems"] = check(name, found[0])
    say(
        f"  the refund landed, then the worker was SIGKILLed ({result['kills']} kill); "
        "a freshly started worker took over"
    )
    where = f"Stripe: {{}} refunded on charge {world.order_id}"
    if not stripe_fake:
        where = f"payments service: {{}} refunded on order #{ORDER}"
    say(
        "  "
        + where.format(f"${result['refunded_cents'] / 100:.0f}")
        + f" in {result['refund_records']} refund(s)"
    )
    if mode == "gated":
        show_effect(workdir / "journal.db", result["effect_id"])
    say(f"  ({result['elapsed_s']:.1f} s)")
    say()
    return result


async def wait_for_enter() -> None:
    if sys.stdin.isatty():
        say("Press Enter to stop the server (the journals stay in .demo/).")
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)


async def story(*, stripe_fake: bool = False, agent: str | None = None) -> int:
    """The crash-before-ack story: three acts on the simulated service, or two on Stripe's fake;
    or an agent framework's (``AGENTS``)."""
    shutil.rmtree(DEMO, ignore_errors=True)
    DEMO.mkdir()
    server = await DevServer(db_file=DEMO / "temporal.db").start()
    say(f"Temporal dev server at {server.target}; Web UI at {server.ui_url}")
    if agent:
        told = AGENTS[agent].__doc__
        say(told.split("\n\n", 1)[0] if told else "")
    elif stripe_fake:
        say(STRIPE_STORY)
    else:
        say(__doc__.split("\n\n", 2)[1] if __doc__ else "")
    say()
    try:
        client = await Client.connect(server.target, data_converter=pydantic_data_converter)
        try:
            if agent:
                checked = await agent_stories(agent, client, server.target)
            else:
                results = await (stripe_acts(client) if stripe_fake else simulated_acts(client))
                checked = [(name, r["problems"]) for name, r in results]
        except StoryFailed as err:
            say(f"  FAILED {err}")
            print(f"demo FAILED: {err}", file=sys.stderr, flush=True)
            return 1
        say()
        code = verdict(checked)
        say()
        say(
            "Browse the workflows in the Temporal Web UI: "
            f"{server.ui_url}/namespaces/default/workflows"
        )
        await wait_for_enter()
        return code
    finally:
        await server.stop()


async def agent_stories(agent: str, client: Client, target: str) -> list[tuple[str, list[str]]]:
    acts: Callable[[Client, str, Path], Awaitable[list[tuple[str, list[str]]]]]
    acts = AGENTS[agent].agent_acts
    try:
        return await acts(client, target, DEMO)
    except Exception as err:
        why = f"{type(err).__name__}: {err}"
        raise StoryFailed(f"the agent's story did not run to its end: {why}") from err


async def simulated_acts(client: Client) -> list[tuple[str, dict[str, Any]]]:
    results = [await act(client, *spec) for spec in ACTS]
    naive, gated2, gated3 = results
    say("== what happened ==")
    say(
        f"  naive:    ${naive['refunded_cents'] / 100:.0f} in {naive['refund_records']} "
        "refunds: the retry paid again"
    )
    say(
        f"  tier 2:   ${gated2['refunded_cents'] / 100:.0f}, {gated2['final']} via "
        f"{gated2['via']}: asked the service first, found it"
    )
    say(
        f"  tier 3:   ${gated3['refunded_cents'] / 100:.0f}, {gated3['final']}: nobody can "
        "know if it landed, so the gate refuses to guess"
    )
    return [(spec[0], r) for spec, r in zip(ACTS, results, strict=True)]


async def stripe_acts(client: Client) -> list[tuple[str, dict[str, Any]]]:
    results = [await act(client, *spec, stripe_fake=True) for spec in STRIPE_ACTS]
    naive, gated = results
    say("== what happened at Stripe ==")
    say(
        f"  naive:    ${naive['refunded_cents'] / 100:.0f} in {naive['refund_records']} "
        "refunds: the retry's POST carried a new key, so Stripe refunded again"
    )
    say(
        f"  tier 1:   ${gated['refunded_cents'] / 100:.0f} in {gated['refund_records']} refund, "
        f"{gated['final']} via {gated['via']}: found by the effect id in the refund's metadata"
    )
    return [(spec[0], r) for spec, r in zip(STRIPE_ACTS, results, strict=True)]


# -- --stripe-live: the gate against real Stripe test mode --------------------------------


def _order_id(args: Any) -> str:
    value = args.get("order_id") if isinstance(args, dict) else getattr(args, "order_id", None)
    if not isinstance(value, str):
        raise ValueError("the refund input has no order_id")
    return value


class ChargeRefunds(StripeRefunds):
    """The adapter for the support case: its order is a Stripe charge, and a refund found by
    recovery comes back as the activity's ``RefundResult``."""

    def __init__(self, client: stripe.StripeClient) -> None:
        super().__init__(client, charge=_order_id)

    def found_result(self, refund: Any) -> Any:
        charge = refund.charge if isinstance(refund.charge, str) else refund.charge.id
        return RefundResult(
            refund_id=refund.id, order_id=charge, amount_cents=int(refund.amount)
        ).model_dump(mode="json")


class ChargeRefundService:
    """What the support activities call: the charge's facts, and a refund keyed by the effect."""

    def __init__(self, target: ChargeRefunds) -> None:
        self.target = target

    def order_facts(self, order_id: str) -> dict[str, Any]:
        return self.target.facts(order_id)

    async def refund(
        self, order_id: str, amount_cents: int, *, idempotency_key: str | None = None
    ) -> RefundResult:
        if idempotency_key is None:
            raise ValueError("this demo sends gated refunds only: every refund carries a key")
        sent = await self.target.refund_async(
            {"order_id": order_id, "amount_cents": amount_cents}, effect_id=idempotency_key
        )
        return RefundResult(
            refund_id=sent.refund_id, order_id=order_id, amount_cents=sent.amount_cents
        )


async def create_test_charge(client: stripe.StripeClient) -> str:
    """A $100 test charge, paid by card; its id is the order the case refunds."""
    charge = await asyncio.to_thread(
        client.v1.charges.create,
        params={
            "amount": PAID_CENTS,
            "currency": "usd",
            "source": "tok_visa",
            "description": "interlock-temporal demo",
            "metadata": {"demo": "interlock-temporal"},
        },
    )
    return str(charge.id)


async def refunds_at_stripe(client: stripe.StripeClient, charge_id: str) -> list[Any]:
    """Every refund Stripe holds on the charge, read back from Stripe itself."""
    listed = await asyncio.to_thread(
        client.v1.refunds.list, params={"charge": charge_id, "limit": 100}
    )
    return list(listed.auto_paging_iter())


async def live_story(target: str, client: stripe.StripeClient, workdir: Path) -> dict[str, Any]:
    """Create a $100 test charge, refund $20 through the gate (a SupportCase workflow on an
    in-process worker with the plugin), submit the same case again, and read back from Stripe
    what it holds. ``target`` is the Temporal frontend; ``client`` talks to Stripe."""
    workdir.mkdir(parents=True, exist_ok=True)
    journal_file = workdir / "journal.db"
    with open_journal(f"sqlite:///{journal_file}") as journal:
        lease_id = journal.leases.issue(
            PRINCIPAL, activities=["refund"], max_amount_cents=LEASE_MAX_CENTS
        )
    refunds = ChargeRefunds(client)
    charge_id = await create_test_charge(client)
    say(f"  a ${PAID_CENTS / 100:.0f} test charge: {charge_id}")

    case_id = f"{CASE}-live-{uuid.uuid4().hex[:8]}"
    case = CaseFile(
        case_id=case_id,
        order_id=charge_id,
        amount_cents=REFUND_CENTS,
        lease_id=lease_id,
    )
    temporal = await Client.connect(target, plugins=[InterlockPlugin(f"sqlite:///{journal_file}")])
    task_queue = f"stripe-live-{uuid.uuid4().hex[:8]}"
    worker = Worker(
        temporal,
        task_queue=task_queue,
        workflows=[SupportCase],
        activities=support_activities(ChargeRefundService(refunds), refunds),
    )
    outcomes: list[CaseOutcome] = []
    async with worker:
        for n, what in enumerate(["the case", "the same case again"], start=1):
            outcome = await temporal.execute_workflow(
                "SupportCase",
                case,
                id=f"case-{case_id}-{n}",
                task_queue=task_queue,
                result_type=CaseOutcome,
            )
            outcomes.append(outcome)
            got = outcome.refund.refund_id if outcome.refund else outcome.error
            say(f"  submitted {what}: {outcome.status}, refund {got}")

    at_stripe = await refunds_at_stripe(client, charge_id)
    refunded = sum(int(r.amount) for r in at_stripe)
    say(
        f"  Stripe holds {len(at_stripe)} refund(s) on {charge_id}, "
        f"${refunded / 100:.0f} in all: {', '.join(str(r.id) for r in at_stripe) or '-'}"
    )
    eid = the_effect_id(case_id, charge_id)
    show_effect(journal_file, eid)
    with open_journal(journal_file, create=False) as journal:
        shown = receipt(eid, journal=journal)
    refund_ids = [o.refund.refund_id if o.refund else None for o in outcomes]
    ok = (
        len(at_stripe) == 1
        and refunded == REFUND_CENTS
        and refund_ids == [at_stripe[0].id] * 2
        and shown.final == "COMMITTED"
        and shown.confirmation == at_stripe[0].id
    )
    return {
        "charge": charge_id,
        "effect_id": eid,
        "refund_ids": refund_ids,
        "refunds_at_stripe": len(at_stripe),
        "refunded_cents": refunded,
        "final": shown.final,
        "via": shown.via,
        "confirmation": shown.confirmation,
        "ok": ok,
    }


async def live(key: str) -> int:
    workdir = DEMO / "stripe-live"
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    server = await DevServer(db_file=workdir / "temporal.db").start()
    say(f"Temporal dev server at {server.target}; Web UI at {server.ui_url}")
    say("== the gate against Stripe test mode: one $20 refund, submitted twice ==")
    try:
        summary = await live_story(
            server.target, stripe.StripeClient(key, max_network_retries=0), workdir
        )
        say()
        if summary["ok"]:
            say(
                "One refund at Stripe for two submissions: the second got the recorded result "
                "and sent nothing. See it in the dashboard (test mode): "
                f"https://dashboard.stripe.com/test/payments/{summary['charge']}"
            )
        else:
            say(f"Unexpected: {summary}")
        await wait_for_enter()
        return 0 if summary["ok"] else 1
    finally:
        await server.stop()


#: the agent frameworks ``--agent`` tells the story with: each module's docstring opens the
#: story and its ``agent_acts(client, target, workdir)`` runs and checks it
AGENTS: dict[str, ModuleType] = {
    "openai": agent_demo,
    "mcp": mcp_demo,
    "pydantic-ai": pydantic_ai_demo,
    "langgraph": langgraph_demo,
}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m workers.demo",
        description="The crash-before-ack story on a real Temporal dev server.",
    )
    which = p.add_mutually_exclusive_group()
    which.add_argument(
        "--stripe",
        action="store_true",
        help="refund on a Stripe fake (stripe-stateful-mock) through the real SDK: naive $40, "
        "gated $20 (make demo installs the fake)",
    )
    which.add_argument(
        "--agent",
        nargs="?",
        const="openai",
        choices=sorted(AGENTS),
        help="an agent (scripted model, offline) whose refund tool is the gated activity: "
        "naive and gated after a SIGKILL, a re-decided amount, a policy denial, a person's "
        "review. openai (the default): the OpenAI Agents SDK on Temporal; mcp: an MCP "
        "server's refund tool through temporalio-mcp; langgraph: LangGraph on "
        "Temporal (temporalio-langgraph)",
    )
    which.add_argument(
        "--stripe-live",
        action="store_true",
        help="the gated happy path and a duplicate submission against real Stripe test mode "
        "(needs STRIPE_API_KEY=sk_test_...)",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.stripe_live:
        key = os.environ.get("STRIPE_API_KEY", "")
        if not key.startswith("sk_test_"):
            print(
                "--stripe-live needs STRIPE_API_KEY set to a Stripe test-mode secret key "
                "(sk_test_...); "
                + ("it is not set." if not key else "the key given is not one, so it is refused.")
                + " Live keys move real money and are never used.",
                file=sys.stderr,
            )
            return 2
        return asyncio.run(live(key))
    return asyncio.run(story(stripe_fake=args.stripe, agent=args.agent))


if __name__ == "__main__":
    sys.exit(main())
