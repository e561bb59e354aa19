"""The fault table of ``scenarios.md``, as scripts that run against a world.

Two worlds run the same scripts: ``ServerWorld`` (a real Temporal dev server, real worker
processes, a real SIGKILL where the row says crash) and ``InProcessWorld`` (the core protocol
alone, a crash being an exception that unwinds like a death). Money is read from the payments
service, never from the gate.

    python -m workers.scenarios --list
    python -m workers.scenarios run --scenario crash_before_ack --tier 2 --json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from workflows.support_case import Mode

from .judge import Baseline, Expect, Scenario, judge
from .rows import (
    ambiguous_resolved_happened,
    ambiguous_resolved_not_happened,
    concurrent_submit,
    crash_before_ack,
    crash_before_send,
    duplicate_submit,
    happy_path,
    in_flight_race,
    key_expired,
    lease_revoked,
    lease_revoked_during_outage,
    model_redecides,
    refund_during_outage,
    stale_premise,
)
from .world import ORDER as ORDER
from .world import REFUND_CENTS as REFUND_CENTS
from .world import World
from .world import open_world_journal as open_world_journal
from .world import the_effect_id as the_effect_id

# ``ORDER``, ``REFUND_CENTS``, ``open_world_journal`` and ``the_effect_id`` live in ``world``;
# imported as themselves, they stay importable from here, where tests import them

T = TypeVar("T")


def _same(e: T) -> dict[int, T]:
    return {1: e, 2: e, 3: e}


#: what Temporal users do without the gate: retries with no idempotency key, and a key made of
#: the workflow and activity ids (stable across one activity's retries, not across a re-run)
BASELINES: tuple[Mode, ...] = ("naive", "activity_key")
#: how a baseline workflow that had not ended when the runner stopped waiting is reported: it
#: retries for ever (a refusal from the service is just another retryable error to it)
RETRYING = "still retrying"

#: the harms a baseline can show, each a departure from the row's unharmed money
DOUBLE_REFUND = "double refund"
REDECIDED_REFUND = "second refund after the re-decision"
REVOKED_LEASE = "refund under a revoked lease"
STALE_FACTS = "refund on stale facts"


def _clean(why: str, **kw: Any) -> Baseline:
    return Baseline(None, why, **kw)


def _harm(harm: str, why: str, cents: int, records: int, **kw: Any) -> Baseline:
    return Baseline(harm, why, refunded_cents=cents, records=records, **kw)


#: a key the service does not honour: the ungated retry refunds again
_KEY_IGNORED = _harm(DOUBLE_REFUND, "the retry's key is the same; the service ignores it", 4_000, 2)


def _both(
    e: Baseline, activity_key: dict[int, Baseline] | None = None
) -> dict[str, dict[int, Baseline]]:
    """The naive baseline shows ``e`` at every tier; the activity-id key too, unless given."""
    return {"naive": _same(e), "activity_key": activity_key or _same(e)}


COMMITTED_FIRST = Expect("COMMITTED", frozenset({"dispatch"}))
SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in [
        Scenario(
            1,
            "happy_path",
            "none",
            _same(COMMITTED_FIRST),
            happy_path,
            baselines=_both(_clean("no fault: one send, one refund")),
        ),
        Scenario(
            2,
            "crash_before_send",
            "killed after DISPATCHED, before the send",
            {
                1: Expect("COMMITTED", frozenset({"retry-idempotent", "recovery-reapply"})),
                2: Expect("COMMITTED", frozenset({"recovery-reapply"})),
                3: Expect("AMBIGUOUS", refunded_cents=0, records=0),
            },
            crash_before_send,
            crash=True,
            baselines=_both(
                _clean("the worker died before the send: the retry's send is the only one")
            ),
        ),
        Scenario(
            3,
            "crash_before_ack",
            "the refund lands, killed before the result returns",
            {
                1: Expect("COMMITTED", frozenset({"recovery-query", "retry-idempotent"})),
                2: Expect("COMMITTED", frozenset({"recovery-query"})),
                3: Expect("AMBIGUOUS"),
            },
            crash_before_ack,
            crash=True,
            baselines=_both(
                _harm(DOUBLE_REFUND, "the refund landed; the retry sends it again", 4_000, 2),
                {
                    1: _clean("the retry carries the same key, and the service dedupes it"),
                    2: _KEY_IGNORED,
                    3: _KEY_IGNORED,
                },
            ),
        ),
        Scenario(
            4,
            "duplicate_submit",
            "the same approved effect submitted twice",
            _same(COMMITTED_FIRST),
            duplicate_submit,
            baselines=_both(
                _harm(
                    DOUBLE_REFUND,
                    "a second workflow is a second send: nothing ties it to the first decision",
                    4_000,
                    2,
                )
            ),
        ),
        Scenario(
            5,
            "model_redecides",
            "after row 3 recovers, the agent re-decides $30",
            _same(Expect("REFUSED", code="conflicting_payload")),
            model_redecides,
            crash=True,
            baselines=_both(
                _harm(
                    f"{DOUBLE_REFUND}, then a {REDECIDED_REFUND}",
                    "row 3 refunds twice, then the $30 re-decision is sent as a new refund",
                    7_000,
                    3,
                ),
                {
                    1: _harm(
                        REDECIDED_REFUND,
                        "row 3 dedupes; the $30 re-decision runs under a new workflow's key",
                        5_000,
                        2,
                    ),
                    2: _harm(
                        f"{DOUBLE_REFUND}, then a {REDECIDED_REFUND}",
                        "row 3 refunds twice, then the $30 re-decision is sent as a new refund",
                        7_000,
                        3,
                    ),
                    3: _harm(
                        f"{DOUBLE_REFUND}, then a {REDECIDED_REFUND}",
                        "row 3 refunds twice, then the $30 re-decision is sent as a new refund",
                        7_000,
                        3,
                    ),
                },
            ),
        ),
        Scenario(
            6,
            "lease_revoked",
            "lease revoked before dispatch",
            _same(Expect("REFUSED", code="lease", refunded_cents=0, records=0)),
            lease_revoked,
            baselines=_both(
                _harm(REVOKED_LEASE, "nothing reads the lease: the refund is sent", 2_000, 1)
            ),
            unharmed_cents=0,
            unharmed_records=0,
        ),
        Scenario(
            7,
            "stale_premise",
            "the order stops being eligible before dispatch",
            _same(Expect("REFUSED", code="stale_premise", refunded_cents=0, records=0)),
            stale_premise,
            baselines=_both(
                _clean(
                    "the service itself refuses a refund on an ineligible order, so no money "
                    "moves; the workflow retries the refusal for ever",
                    refunded_cents=0,
                    records=0,
                    ends=RETRYING,
                )
            ),
            unharmed_cents=0,
            unharmed_records=0,
        ),
        Scenario(
            8,
            "refund_during_outage",
            "killed before the send; support refunds $20 by hand",
            {
                1: Expect("REFUSED", code="stale_premise_at_recovery"),
                2: Expect("REFUSED", code="stale_premise_at_recovery"),
                3: Expect("AMBIGUOUS"),
            },
            refund_during_outage,
            crash=True,
            baselines=_both(
                _harm(
                    STALE_FACTS,
                    "the retry sends the $20 support already refunded by hand (no key had "
                    "reached the service, so nothing dedupes it)",
                    4_000,
                    2,
                )
            ),
        ),
        Scenario(
            9,
            "lease_revoked_during_outage",
            "killed before the send; lease revoked while down",
            {
                1: Expect("REFUSED", code="lease_at_recovery", refunded_cents=0, records=0),
                2: Expect("REFUSED", code="lease_at_recovery", refunded_cents=0, records=0),
                3: Expect("AMBIGUOUS", refunded_cents=0, records=0),
            },
            lease_revoked_during_outage,
            crash=True,
            baselines=_both(
                _harm(REVOKED_LEASE, "the retry sends with no lease to check", 2_000, 1)
            ),
            unharmed_cents=0,
            unharmed_records=0,
        ),
        Scenario(
            10,
            "key_expired",
            "killed after the refund lands; the dedupe window passes",
            {
                1: Expect("COMMITTED", frozenset({"recovery-query"})),
                2: Expect("COMMITTED", frozenset({"recovery-query"})),
                3: Expect("AMBIGUOUS"),
            },
            key_expired,
            crash=True,
            baselines=_both(
                _harm(DOUBLE_REFUND, "the refund landed; the retry sends it again", 4_000, 2),
                {
                    1: _harm(
                        DOUBLE_REFUND,
                        "the retry's key is the same, but past the service's dedupe window",
                        4_000,
                        2,
                    ),
                    2: _KEY_IGNORED,
                    3: _KEY_IGNORED,
                },
            ),
        ),
        Scenario(
            11,
            "in_flight_race",
            "attempt 1 stalls past its timeout; attempt 2 on another worker",
            _same(COMMITTED_FIRST),
            in_flight_race,
            baselines=_both(
                _harm(
                    DOUBLE_REFUND,
                    "attempt 2 refunds while attempt 1 is stalled; attempt 1 then sends too",
                    4_000,
                    2,
                ),
                {
                    1: _clean("both attempts carry the same key, and the service dedupes it"),
                    2: _harm(
                        DOUBLE_REFUND,
                        "both attempts send the same key; the service ignores it",
                        4_000,
                        2,
                    ),
                    3: _harm(
                        DOUBLE_REFUND,
                        "both attempts send the same key; the service ignores it",
                        4_000,
                        2,
                    ),
                },
            ),
        ),
        Scenario(
            12,
            "concurrent_submit",
            "8 workflows submit the same effect across 2 workers",
            _same(COMMITTED_FIRST),
            concurrent_submit,
            baselines=_both(
                _harm(
                    DOUBLE_REFUND,
                    "each workflow sends its own refund until the order's $100 is used up; "
                    "the service refuses the other 3, which retry for ever",
                    10_000,
                    5,
                    ends=RETRYING,
                )
            ),
        ),
        Scenario(
            13,
            "ambiguous_resolved_happened",
            "row 3 at t3, then an operator resolves happened",
            {3: Expect("RESOLVED", frozenset({"resolved"}))},
            ambiguous_resolved_happened,
            crash=True,
        ),
        Scenario(
            14,
            "ambiguous_resolved_not_happened",
            "row 2 at t3, then an operator resolves not_happened",
            {3: Expect("COMMITTED", frozenset({"recovery-reapply"}))},
            ambiguous_resolved_not_happened,
            crash=True,
        ),
    ]
}


async def run_in(
    world: World,
    name: str,
    *,
    before_close: Callable[[World, dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run row ``name`` in ``world`` and judge it; ``before_close`` reads the world (its
    payments service, its journal) once the row is judged, before the world closes."""
    scenario = SCENARIOS[name]
    if world.mode == "gated" and world.tier not in scenario.expect:
        await world.close()
        raise ValueError(
            f"row {scenario.number} ({name}) is defined at tier(s) "
            f"{', '.join(map(str, sorted(scenario.expect)))} only"
        )
    world.setup()
    started = time.monotonic()
    try:
        seen = await scenario.script(world)
        result = judge(scenario, world.tier, world, seen)
        if before_close is not None:
            before_close(world, result)
    finally:
        await world.close()
    result["elapsed_s"] = round(time.monotonic() - started, 3)
    return result


async def run_on_server(
    name: str,
    tier: int,
    *,
    mode: Mode = "gated",
    target: str | None = None,
    workdir: Path | None = None,
    stripe: bool = False,
) -> dict[str, Any]:
    """One row on a real dev server (its own, unless ``target`` is given); with ``stripe``,
    against the Stripe fake through the real SDK (tier 1)."""
    from temporalio.client import Client
    from temporalio.contrib.pydantic import pydantic_data_converter

    from interlock_temporal.testing import DevServer

    from .server_world import ServerWorld

    workdir = workdir or Path(tempfile.mkdtemp(prefix=f"interlock-{name}-t{tier}-"))
    server = None
    if target is None:
        server = await DevServer(ui_port=None).start()
        target = server.target
    try:
        client = await Client.connect(target, data_converter=pydantic_data_converter)
        if stripe:
            from .stripe_harness import StripeServerWorld

            world: World = await StripeServerWorld.launch(client, workdir, mode)
        else:
            world = await ServerWorld.create(client, workdir, tier, mode)
        return await run_in(world, name)
    finally:
        if server is not None:
            await server.stop()


async def run_in_process(
    name: str, tier: int, workdir: Path, *, stripe: bool = False
) -> dict[str, Any]:
    from .inprocess_world import InProcessWorld

    if not stripe:
        return await run_in(InProcessWorld(workdir, tier), name)
    from interlock_temporal.testing import StripeMock, StripeProxy

    from .stripe_harness import stripe_inprocess_world

    mock = await StripeMock().start()
    proxy = await StripeProxy(mock.port).start()
    try:
        return await run_in(stripe_inprocess_world(workdir, mock, proxy), name)
    finally:
        await proxy.stop()
        await mock.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m workers.scenarios",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--list", action="store_true", help="name the rows")
    sub = p.add_subparsers(dest="command")
    r = sub.add_parser("run", help="run one row end to end on a real server")
    r.add_argument("--scenario", required=True, choices=sorted(SCENARIOS))
    r.add_argument("--tier", type=int, required=True, choices=(1, 2, 3))
    r.add_argument("--mode", default="gated", choices=("gated", "naive", "activity_key"))
    r.add_argument("--target", help="use this Temporal server instead of starting one")
    r.add_argument("--in-process", action="store_true", help="the core protocol only, no server")
    r.add_argument(
        "--stripe",
        action="store_true",
        help="against the Stripe fake through the real SDK (tier 1; make test installs it)",
    )
    r.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    if args.list or args.command is None:
        for s in sorted(SCENARIOS.values(), key=lambda s: s.number):
            print(f"{s.number:>2}  {s.name:<28} {s.fault}")
        return 0
    if args.stripe and args.tier != 1:
        p.error("Stripe dedupes by key and can be asked: it is tier 1")
    if args.in_process:
        if args.mode != "gated":
            p.error("--in-process runs the gate only")
        result = asyncio.run(
            run_in_process(
                args.scenario,
                args.tier,
                Path(tempfile.mkdtemp(prefix="interlock-core-")),
                stripe=args.stripe,
            )
        )
    else:
        result = asyncio.run(
            run_on_server(
                args.scenario, args.tier, mode=args.mode, target=args.target, stripe=args.stripe
            )
        )
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        verdict = {True: "PASS", False: "FAIL", None: "-"}[result["ok"]]
        print(
            f"{verdict} row {result['number']} {result['scenario']} tier {result['tier']} "
            f"({result['mode']}): {result['final']} via {result['via']} code {result['code']}, "
            f"refunded {result['refunded_cents']} cents in {result['refund_records']} record(s)"
        )
        for problem in result.get("problems", []):
            print(f"  - {problem}")
    return 0 if result["ok"] in (True, None) else 1


if __name__ == "__main__":
    sys.exit(main())
