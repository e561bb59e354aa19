"""``interlock circuit``: show a session's circuit, reset it after the policy opened it."""

from __future__ import annotations

import argparse
from typing import Any

from ._args import Groups, command, journal_options, json_flag, operator_name
from ._render import fmt_time
from ._shared import EXIT_FAILED, EXIT_OK, EXIT_USAGE, CliError, emit, emit_json, open_for, warn


def _circuit_doc(session: str, state: Any) -> dict[str, Any]:
    circuit = None if state is None else state.circuit
    return {
        "session": session,
        "known": state is not None,
        "open": circuit is not None,
        "code": circuit.code if circuit else None,
        "activity": circuit.activity if circuit else None,
        "opened_at": circuit.at if circuit else None,
        "calls": state.total if state else 0,
        "spent_usd": state.spent_usd if state else 0.0,
    }


def cmd_circuit_show(args: argparse.Namespace) -> int:
    with open_for(args) as journal:
        doc = _circuit_doc(args.session, journal.policy.session(args.session))
    if args.json:
        emit_json(doc)
    elif not doc["known"]:
        emit(f"session {args.session}: no calls checked by the policy")
    elif doc["open"]:
        emit(
            f"session {args.session}: circuit OPEN since "
            f"{fmt_time(doc['opened_at'])} on {doc['code']} ({doc['activity']}); "
            f"{doc['calls']} calls, ${doc['spent_usd']:.2f} spent"
        )
    else:
        emit(
            f"session {args.session}: circuit closed; {doc['calls']} calls, "
            f"${doc['spent_usd']:.2f} spent"
        )
    return EXIT_OK


def cmd_circuit_reset(args: argparse.Namespace) -> int:
    with open_for(args) as journal:
        try:
            reset = journal.policy.reset(args.session, operator=args.operator, note=args.note)
        except ValueError as err:
            raise CliError(EXIT_USAGE, str(err)) from None
    if not reset:
        warn(f"session {args.session}: the circuit is not open: nothing reset")
        return EXIT_FAILED
    emit(f"session {args.session}: circuit reset by {args.operator.strip()} (journaled)")
    return EXIT_OK


def register(groups: Groups) -> None:
    circuit = groups.add_parser(
        "circuit", help="show a session's circuit, reset it after the policy opened it"
    )
    journal_options(circuit, top=False)
    circuit_sub = circuit.add_subparsers(dest="command", metavar="COMMAND", required=True)
    circuit_show = command(
        circuit_sub,
        "show",
        cmd_circuit_show,
        "show whether a session's circuit is open, and why",
        example=[
            "interlock circuit show support-case-4471",
            "interlock circuit show support-case-4471 --json",
        ],
    )
    circuit_show.add_argument("session", metavar="SESSION", help="the session (a workflow id)")
    json_flag(circuit_show)
    circuit_reset = command(
        circuit_sub,
        "reset",
        cmd_circuit_reset,
        "close a session's open circuit (journaled, with the operator); exit 1 if not open",
        example=['interlock circuit reset support-case-4471 --operator carol --note "loop fixed"'],
    )
    circuit_reset.add_argument("session", metavar="SESSION", help="the session (a workflow id)")
    circuit_reset.add_argument(
        "--operator", required=True, type=operator_name, metavar="O", help="who resets it"
    )
    circuit_reset.add_argument("--note", default="", metavar="N", help="why, for the record")
