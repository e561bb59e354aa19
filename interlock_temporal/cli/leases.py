"""``interlock leases``: issue, revoke, list."""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from typing import Any

from ..core.models import Lease
from ._args import Groups, command, journal_options, json_flag, non_negative, parse_duration
from ._render import lease_state, render_leases
from ._shared import EXIT_FAILED, EXIT_OK, EXIT_USAGE, CliError, emit, emit_json, open_for, warn


def cmd_leases_issue(args: argparse.Namespace) -> int:
    with open_for(args, create=True) as journal:
        try:
            lease_id = journal.leases.issue(
                args.principal,
                activities=args.activity,
                max_amount_cents=args.max_amount_cents,
                budget_cents=args.budget_cents,
                resources=args.resource,
                ttl=args.ttl,
                parent=args.parent,
            )
        except ValueError as err:
            raise CliError(EXIT_USAGE, f"cannot issue the lease: {err}") from None
        lease = journal.leases.get(lease_id) if args.json else None
    if lease is not None:
        emit_json(_lease_doc(lease, time.time()))
    else:
        emit(lease_id)
    return EXIT_OK


def _lease_doc(lease: Lease, now: float, others: Sequence[Lease] = ()) -> dict[str, Any]:
    """A lease as ``--json`` prints it: its fields (a delegated lease's ``ancestors``, its
    parent first) and its state now (``lease_state``: with its ancestors' among ``others``)."""
    return {**lease.model_dump(mode="json"), "state": lease_state(lease, now, others)}


def cmd_leases_revoke(args: argparse.Namespace) -> int:
    with open_for(args) as journal:
        lease = journal.leases.get(args.lease_id)
        if lease is None:
            raise CliError(EXIT_USAGE, f"no lease {args.lease_id} in {journal.url}")
        state = lease_state(lease, time.time(), chain=False)  # its own: a child can be revoked
        if state != "live":
            warn(f"lease {args.lease_id} was not live ({state}): nothing revoked")
            return EXIT_FAILED
        if not journal.leases.revoke(args.lease_id):
            warn(f"lease {args.lease_id} was revoked meanwhile: nothing revoked")
            return EXIT_FAILED
    emit(f"revoked {args.lease_id}")
    return EXIT_OK


def cmd_leases_list(args: argparse.Namespace) -> int:
    with open_for(args) as journal:
        leases = journal.leases.list()
    now = time.time()
    if args.json:
        emit_json([_lease_doc(lease, now, leases) for lease in leases])
    elif leases:
        emit(render_leases(leases, now))
    else:
        warn("no leases")
    return EXIT_OK


def register(groups: Groups) -> None:
    leases = groups.add_parser("leases", help="issue, revoke and list leases")
    journal_options(leases, top=False)
    leases_sub = leases.add_subparsers(dest="command", metavar="COMMAND", required=True)
    issue = command(
        leases_sub,
        "issue",
        cmd_leases_issue,
        "issue a lease to a principal; print its id (with --json, the lease)",
        example=[
            "interlock leases issue refund-bot --activity refund --max-amount-cents 5000 --ttl 8h",
            "interlock leases issue refund-bot --budget-cents 20000 --ttl 1d --json",
            "interlock leases issue sub-bot --from lease_5b0c2e7d9a41f6e3b8c1d2a4 "
            "--budget-cents 3000 --ttl 1h",
        ],
    )
    issue.add_argument("principal", metavar="PRINCIPAL", help="who may act under the lease")
    issue.add_argument(
        "--activity",
        action="append",
        metavar="A",
        help="an activity (or glob) the lease allows; repeat for more (default: any)",
    )
    issue.add_argument(
        "--max-amount-cents",
        type=non_negative,
        metavar="N",
        help="the largest amount one effect may carry",
    )
    issue.add_argument(
        "--budget-cents",
        type=non_negative,
        metavar="N",
        help="the most all its effects together may carry: each reserves its amount when "
        "dispatched, and gets it back only if it ends without executing",
    )
    issue.add_argument(
        "--resource",
        action="append",
        metavar="R",
        help="a resource (or glob) the lease allows; repeat for more (default: any)",
    )
    issue.add_argument(
        "--ttl",
        type=parse_duration,
        metavar="AGE",
        help="how long the lease lives, with a unit: 90s, 30m, 1h, 2d (default: until revoked)",
    )
    issue.add_argument(
        "--from",
        dest="parent",
        metavar="LEASE",
        help="issue it from this live lease, which it may only narrow: each option left out "
        "is the parent's, and one wider than the parent's is refused, naming it",
    )
    json_flag(issue)
    revoke = command(
        leases_sub,
        "revoke",
        cmd_leases_revoke,
        "revoke a live lease now; exit 1 if it was not live",
        example=["interlock leases revoke lease_5b0c2e7d9a41f6e3b8c1d2a4"],
    )
    revoke.add_argument("lease_id", metavar="LEASE_ID")
    lease_list = command(
        leases_sub,
        "list",
        cmd_leases_list,
        "list leases and their state",
        example=[
            "interlock leases list",
            "interlock leases list --json | jq '.[] | select(.state == \"live\")'",
        ],
    )
    json_flag(lease_list)
