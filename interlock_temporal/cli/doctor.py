"""``interlock doctor``: what escapes the gate, before it matters.

The problem: a worker can register an activity that sends something and is neither gated nor
named by the policy, serve its task queue beside a worker of another journal, or run on a
journal it cannot sign; each is found today after an effect went wrong. The mechanism: the
command builds the worker as its deployment does (``--worker MODULE:ATTR``, never started: it
polls nothing), reads from the gate ``InterlockPlugin`` installed on it what the worker's start
line says (each activity gated, policed only or neither: ``_worker/coverage.py``), checks its
journal (the last entry's hash and signature, the signing key, the journal id), collects the
warnings the worker logged while it was built (a policy rule that names no activity of the
worker among them), and asks the worker's Temporal server for its version and for the pollers of
the task queue, each with the journal its identity names (``_worker/journal_check.py``).
``--task-queue Q`` does the last part for a queue whose workers are already running, against
the journal the CLI options name. The cost: building the worker connects it and opens its
journal, as a worker start does (a SQLite journal and its key are created where none exist).

Exit 1 when a problem is found (an activity that is neither, a journal that cannot be opened or
signed, another journal on the task queue, a worker that cannot be built), else 0.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib
import inspect
import logging
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from ..core.coverage import ActivityCoverage, WorkerCoverage
from ..core.errors import JournalConfigError, JournalCorrupt
from ..core.journal.interface import redacted
from ..core.journal_identity import journal_id_of, journal_named_by
from ._args import Groups, examples, journal_options, json_flag, temporal_options
from ._shared import EXIT_FAILED, EXIT_OK, EXIT_USAGE, CliError, emit, emit_json, try_open
from ._temporal import connect, temporal_address

if TYPE_CHECKING:
    from temporalio.client import Client
    from temporalio.worker import Worker

    from ..core.journal import Journal
    from ..core.policy import Policy


class JournalHealth(BaseModel):
    """The journal the worker (or, with ``--task-queue``, the CLI options) names."""

    #: where it is (a URL without its password)
    url: str
    #: its id (what workers put in their Temporal identity); None: no worker started on it yet
    journal_id: str | None
    #: the last entry's hash and signature check with the configured keys
    last_entry_ok: bool
    #: a signing key is configured (not only public keys): the gate can append
    can_sign: bool
    #: the sequence number of its last entry; None: an empty journal
    head_seq: int | None


class PolicySummary(BaseModel):
    """The policy the worker follows."""

    policy_id: str
    #: the content hash approvals are bound to
    epoch: str
    #: ``enforce`` or ``monitor``
    mode: str


class Poller(BaseModel):
    """One activity poller of the task queue, as the server lists it."""

    identity: str
    #: the journal id its identity names; None: an ungated worker (no gate, no journal)
    journal_id: str | None


class DoctorReport(BaseModel):
    """What ``interlock doctor --json`` prints (docs/operator-guide.md describes each field)."""

    #: ``--worker``'s MODULE:ATTR; None with ``--task-queue``
    worker: str | None = None
    #: the worker's task queue, or ``--task-queue``
    task_queue: str | None = None
    #: each user activity of the worker, by name (``--worker`` only)
    activities: list[ActivityCoverage] = Field(default_factory=list)
    #: how many activities are gated, and at which tier (tier, as a string, to count)
    gated: int = 0
    gated_by_tier: dict[str, int] = Field(default_factory=dict)
    #: how many are not gated but named by the policy or declared ``no_effects``
    policed: int = 0
    #: the activities that are neither: each is also a problem
    neither: list[str] = Field(default_factory=list)
    journal: JournalHealth | None = None
    policy: PolicySummary | None = None
    #: the Temporal server's version (None: it did not say)
    server_version: str | None = None
    #: the task queue's activity pollers (a worker built by ``--worker`` is not polling yet)
    pollers: list[Poller] = Field(default_factory=list)
    #: what the worker logged at WARNING while it was built (a policy file's warnings among them)
    warnings: list[str] = Field(default_factory=list)
    #: what makes the command exit 1; empty: exit 0
    problems: list[str] = Field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


# -- building the worker -------------------------------------------------------------------------


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if not getattr(record, "interlock_coverage", False):  # the start line: reported apart
            self.lines.append(record.getMessage())


@contextmanager
def _warnings_into(report: DoctorReport) -> Iterator[None]:
    """The package's WARNING records while the worker is built go to the report (its own
    handler keeps them off stderr when nothing else configured logging)."""
    collect = _Collect()
    logger = logging.getLogger("interlock_temporal")
    logger.addHandler(collect)
    try:
        yield
    finally:
        logger.removeHandler(collect)
        report.warnings.extend(collect.lines)


def _target(spec: str) -> object:
    """What ``--worker MODULE:ATTR`` names, imported with the working directory on the path (as
    ``python -m`` has it; the console script does not)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise CliError(EXIT_USAGE, f"--worker {spec!r} is not MODULE:ATTR")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        found: object = importlib.import_module(module_name)
    except ImportError as err:
        raise CliError(
            EXIT_USAGE, f"--worker {spec!r}: cannot import {module_name} ({err})"
        ) from None
    for part in attr.split("."):
        if not hasattr(found, part):
            raise CliError(EXIT_USAGE, f"--worker {spec!r}: {module_name} has no {attr}")
        found = getattr(found, part)
    return found


async def _build(spec: str, report: DoctorReport) -> Worker | None:
    """The worker ``spec`` names: a ``Worker``, or a callable of no argument (sync or async)
    returning one. One that raises while it builds is a problem in the report (None)."""
    from temporalio.worker import Worker

    found = _target(spec)
    if not isinstance(found, Worker):
        if not callable(found):
            raise CliError(EXIT_USAGE, f"--worker {spec!r} is not a Worker nor a callable")
        try:
            with _warnings_into(report):
                found = found()
                if inspect.isawaitable(found):
                    found = await found
        except Exception as err:
            report.problems.append(f"the worker cannot be built: {type(err).__name__}: {err}")
            return None
    if not isinstance(found, Worker):
        raise CliError(
            EXIT_USAGE,
            f"--worker {spec!r} returned a {type(found).__name__}, not a Worker",
        )
    return found


# -- what the report holds --------------------------------------------------------------------


def _coverage(report: DoctorReport, coverage: WorkerCoverage) -> None:
    report.activities = coverage.activities
    report.gated = coverage.gated
    report.gated_by_tier = {str(t): n for t, n in coverage.tiers.items()}
    report.policed = coverage.policed
    report.neither = coverage.neither
    report.problems.extend(
        f"activity {name} is neither gated nor policed: it may have side effects nobody "
        "guards (wrap it with gated(...), name it in the policy, or declare it "
        "no_effects(...))"
        for name in coverage.neither
    )


def _journal(report: DoctorReport, journal: Journal) -> None:
    """The last entry checked, the key, the id and the head (nothing is written)."""
    problem = None
    try:
        journal.check_tail()
    except (JournalConfigError, JournalCorrupt) as err:
        problem = str(err)
    head = journal.head()
    report.journal = JournalHealth(
        url=redacted(str(journal.url)),
        journal_id=journal_id_of(journal, create=False),
        last_entry_ok=problem is None,
        can_sign=journal.keyring.can_sign,
        head_seq=None if head is None else head.seq,
    )
    if problem is not None:
        report.problems.append(problem)
    if not report.journal.can_sign:
        report.problems.append(
            f"journal {report.journal.url}: no signing key is configured (public keys only): "
            "the gate cannot append to it"
        )


def _policy(policy: object) -> Policy | None:
    from ..core.policy import Policy
    from ..core.policy.file import PolicySource

    if isinstance(policy, PolicySource):
        return policy.current(time.time())
    return policy if isinstance(policy, Policy) else None


async def _queue(report: DoctorReport, client: Client, task_queue: str) -> None:
    """The server's version, and the task queue's pollers with their journals; a poller of
    another journal than the report's is a problem (one task queue, one journal)."""
    from temporalio.api.workflowservice.v1 import GetSystemInfoRequest

    from .._worker.journal_check import QueueJournalCheck

    info = await client.workflow_service.get_system_info(GetSystemInfoRequest())
    report.server_version = info.server_version or None
    mine = report.journal
    ours = mine.journal_id if mine is not None else None
    identities = await QueueJournalCheck(ours or "", client, task_queue).poller_identities()
    report.pollers = [
        Poller(identity=i, journal_id=journal_named_by(i)) for i in sorted(set(identities))
    ]
    named = sorted({p.journal_id for p in report.pollers if p.journal_id})
    if (
        mine is None
    ):  # no journal of ours to compare with: two journals on the queue are one too many
        theirs, against = (named if len(named) > 1 else []), "another poller's"
    else:  # a journal with no id yet is not the one the queue's gated workers use
        theirs, against = [j for j in named if j != ours], f"{mine.url} ({ours or 'no id yet'})"
    report.problems.extend(
        f"task queue {task_queue} has a poller of journal {other}, not of {against}: one task "
        "queue, one journal (its workers refuse gated activities while both poll)"
        for other in theirs
    )


async def _doctor_worker(args: argparse.Namespace, report: DoctorReport) -> None:
    from .._worker.interceptor import runtime_of

    worker = await _build(args.worker, report)
    if worker is None:
        return
    runtime = runtime_of(worker)
    report.task_queue = worker.config()["task_queue"]
    if runtime is None:
        report.problems.append(
            "the worker runs no gate: register InterlockPlugin on its client or worker"
        )
        return
    _coverage(report, runtime.coverage)
    _journal(report, runtime.gate.journal)
    policy = _policy(runtime.source.policy)
    if policy is not None:
        report.policy = PolicySummary(
            policy_id=policy.policy_id, epoch=policy.epoch, mode=policy.mode
        )
    try:
        await _queue(report, worker.client, report.task_queue)
    except Exception as err:
        report.problems.append(f"the worker's Temporal server did not answer: {err}")


async def _doctor_queue(args: argparse.Namespace, report: DoctorReport) -> None:
    journal, why = try_open(args)
    if journal is None:
        report.problems.append(why)
    else:
        with journal:
            _journal(report, journal)
    client = await connect(args)  # not reachable: exit 3, as every command on Temporal
    try:
        await _queue(report, client, args.task_queue)
    except Exception as err:
        report.problems.append(f"Temporal at {temporal_address(args)} did not answer: {err}")


def cmd_doctor(args: argparse.Namespace) -> int:
    report = DoctorReport(worker=args.worker, task_queue=args.task_queue)
    body = _doctor_worker if args.worker else _doctor_queue
    failure: Exception | None = None
    try:
        asyncio.run(body(args, report))
    except Exception as err:
        failure = err.with_traceback(None)
        failure.__cause__ = failure.__context__ = None
    # the SDK's native client freed now, not at interpreter shutdown (see cli/_temporal.py)
    gc.collect()
    if failure is not None:
        raise failure
    if args.json:
        emit_json(report.model_dump(mode="json"))
    else:
        emit(render(report))
    return EXIT_OK if report.ok else EXIT_FAILED


# -- output ---------------------------------------------------------------------------------


def _activity_line(a: ActivityCoverage) -> str:
    if a.coverage == "gated":
        how = f"tier {a.tier}, target {a.target}"
    elif a.coverage == "policed":
        how = ", ".join([*a.named_by, *(["declared no_effects"] if a.no_effects else [])])
    else:
        how = "may have side effects nobody guards"
    label = "NEITHER" if a.coverage == "neither" else a.coverage
    return f"  {a.name:<24} {label:<8} {how}"


def render(report: DoctorReport) -> str:
    lines: list[str] = []
    if report.worker:
        lines.append(f"worker {report.worker} (task queue {report.task_queue})")
        tiers = ", ".join(f"tier {t}: {n}" for t, n in report.gated_by_tier.items())
        lines.append(
            f"activities: {report.gated} gated"
            + (f" ({tiers})" if tiers else "")
            + f", {report.policed} policed only, {len(report.neither)} neither"
        )
        lines.extend(_activity_line(a) for a in report.activities)
    j = report.journal
    if j is not None:
        lines.append(
            f"journal {j.url}: id {j.journal_id or '(none yet)'}, "
            f"last entry {'checks' if j.last_entry_ok else 'DOES NOT CHECK'}"
            f"{'' if j.head_seq is None else f' (seq {j.head_seq})'}, "
            f"{'signing key present' if j.can_sign else 'NO SIGNING KEY'}"
        )
    if report.policy is not None:
        p = report.policy
        lines.append(f"policy {p.policy_id} (epoch {p.epoch}, {p.mode})")
    elif report.worker and report.activities:
        lines.append("policy: none")
    if report.server_version is not None:
        lines.append(f"Temporal server {report.server_version}")
    if report.task_queue is not None and (report.server_version is not None or report.pollers):
        lines.append(f"task queue {report.task_queue}: {len(report.pollers)} activity poller(s)")
        lines.extend(
            f"  {p.identity}" + ("" if p.journal_id else " (no gate)") for p in report.pollers
        )
    lines.extend(f"warning: {w}" for w in report.warnings)
    lines.extend(f"PROBLEM: {p}" for p in report.problems)
    lines.append("ok" if report.ok else f"{len(report.problems)} problem(s)")
    return "\n".join(lines)


def register(groups: Groups) -> None:
    doctor = groups.add_parser(
        "doctor",
        help="what escapes the gate: a worker's activities gated, policed only or neither, its "
        "journal, its policy's warnings, the task queue's journals, the server's version",
        description="Build a worker (never started) and report what escapes its gate, or "
        "check a running task queue's pollers; exit 1 on a problem.",
        epilog=examples(
            "interlock doctor --worker myapp.worker:build",
            "interlock doctor --task-queue refunds --json",
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    journal_options(doctor, top=False)
    temporal_options(doctor, top=False)
    doctor.set_defaults(handler=cmd_doctor)
    which = doctor.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--worker",
        metavar="MODULE:ATTR",
        help="a Worker, or a callable of no argument (sync or async) that builds one",
    )
    which.add_argument(
        "--task-queue",
        metavar="Q",
        help="a task queue whose workers run: its pollers and their journals, against --journal",
    )
    json_flag(doctor)
