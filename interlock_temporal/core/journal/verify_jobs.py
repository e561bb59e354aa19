"""``interlock journal verify --jobs N``: one verify of a journal on every core.

The problem: a verify is one pass in seq order, and its Python checks one entry at a time on
one core (the entry's sha256 and signature, the shape of its bytes, its place in the sequence
and in its effect's chain). A journal of a million entries takes that many times a few
microseconds, and the machine's other cores sit idle.

The mechanism: the seqs are cut into ``jobs`` ranges of about equal size, never inside an
archive's run (a cut there moves to the run's start). Each range is read by the primary key
in a Python process of its own, which runs the one pass's own check (``verifying.EntryPass``)
from its range's first seq. An effect met first by an entry that continues its chain is taken
up at that entry's prev, and the range says so (its link). Each range then reads the effects
rows whose head it holds (by ``head_seq``) and checks each against its chain as one pass does;
a row that matches a chain the range started and ended is done. It sends back the rest: the
chains and rows it could not settle, its links, the charges it read (``ChargeFold.scan``),
the anchors it met and where its sequence ended. This process joins them in range order: each
range must start where the one before ended, each link must continue the chain the ranges
before left, and a chain can start only once; the rows no range reads (a ``head_seq`` outside
every range) are read here. Then the head, the values, the anchors, the rows left over and the
control plane are checked as one pass checks them.

A range that finds anything wrong, or ranges that do not join or leave a row unexplained, are
verified again by one pass over the whole journal: a verify that fails reports exactly what
one pass reports (the first bad seq and why), at the cost of a second verify of a journal that
is broken anyway. Only "ok" is ever reported from the ranges.

Cost: a process per range (starting Python and importing this package takes about 0.2 s, in
parallel), a scan of the effects table per range, and what crosses back (the effects that span
ranges, a dispatch's charge: tens of bytes per entry), against the check of every entry spread
over the cores. A journal under ``MIN_PER_JOB`` entries per range is verified by one pass.
"""

from __future__ import annotations

import logging
import os
import pickle
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ..errors import JournalUnavailable
from ..models import JournalHead, VerifyReport
from .control_check import Charge, ChargeFold
from .entries import ROW_COLUMNS, ChainCheck, ChainSummary, RawEntry
from .signing import Keyring
from .verifying import (
    EntryPass,
    anchors_hold,
    archived_runs,
    collector_paused,
    row_matches,
    rows_problem,
    verify_stored,
)

#: below this many entries per range, the processes cost more than they save
MIN_PER_JOB = 20_000

log = logging.getLogger("interlock_temporal.journal")


class EntrySource(Protocol):
    """Where a range of a journal's entries is read from, by a process of its own: plain
    values (a path, a connection string), sent to it as they are."""

    def batches(self, start: int = 1, stop: int | None = None) -> Iterator[Iterable[Sequence[Any]]]:
        """The entries from seq ``start`` up to ``stop`` (excluded; None: the last), in seq
        order, as the values of their ``RawEntry``, a batch at a time."""
        ...

    def rows(self, heads: tuple[int, int | None] | None) -> Iterable[Sequence[Any]]:
        """The effects rows (in ``EffectRow``'s field order) whose ``head_seq`` is in the
        range ``heads`` (start, stop excluded; None: on); ``heads`` None: every row whose
        ``head_seq`` is in no range (``RANGE_ROWS`` / ``STRAY_ROWS``)."""
        ...


#: the effects rows a range reads: those whose head is in the range, by their ``head_seq``
RANGE_ROWS = f"SELECT {ROW_COLUMNS} FROM effects WHERE head_seq >= ? AND head_seq < ?"
#: the rows in no range: every row is read exactly once, whatever an edit put in ``head_seq``
STRAY_ROWS = (
    f"SELECT {ROW_COLUMNS} FROM effects "
    "WHERE head_seq IS NULL OR NOT (head_seq >= 1 AND head_seq < ?)"
)
#: where the last range's seqs end
NO_END = 1 << 62


def default_jobs() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def verify_in_jobs(
    source: EntrySource,
    keyring: Keyring,
    head: JournalHead | None,
    last_seq: int,
    rows: Callable[[], Iterable[Sequence[Any]]],
    anchors: Sequence[RawEntry],
    fold: ChargeFold | None,
    jobs: int,
) -> VerifyReport:
    """``verify_stored`` of the journal ``source`` reads (entries up to ``last_seq`` at
    least), on ``jobs`` processes; ``rows()`` reads every effects row (for one pass, if the
    ranges do not settle it); ``fold`` is given the charges (``ChargeFold.apply``), in seq
    order, once the entries verified."""
    runs, wrong = archived_runs(anchors)
    cuts = _cuts(last_seq, jobs, runs, MIN_PER_JOB)
    if wrong is None and len(cuts) > 1:
        keys = keyring.verifying_keys()
        bounds = [(start, stop) for start, stop in zip(cuts, [*cuts[1:], None], strict=True)]
        try:
            ranges = _in_processes([(source, keys, head, anchors, each) for each in bounds])
        except (OSError, JournalUnavailable, pickle.UnpicklingError) as err:
            # the processes could not run (none started, one died): one pass does the work
            log.warning("journal verify: one process checks it all (%s)", err)
            ranges = []
        with collector_paused():
            stray = source.rows(None) if ranges else []
            joined = _joined(ranges, keyring, head, stray, anchors, runs, fold) if ranges else None
        if joined is not None:
            return joined
    # nothing was folded yet: ``_joined`` folds only what joined
    feed = None if fold is None else fold.feed
    return verify_stored(source.batches(), keyring, head, rows(), anchors, feed=feed)


def _cuts(last_seq: int, jobs: int, runs: Mapping[int, int], min_per_job: int) -> list[int]:
    """Where each range starts: seq 1, then every ``last_seq / jobs`` seqs (no range shorter
    than ``min_per_job``), a cut inside an archive's run moved to the run's start."""
    jobs = max(1, min(jobs, last_seq // max(min_per_job, 1)))
    cuts = [1]
    for n in range(1, jobs):
        cut = 1 + last_seq * n // jobs
        for start, end in runs.items():
            if start < cut <= end:
                cut = start
        if cut > cuts[-1]:
            cuts.append(cut)
    return cuts


def _in_processes(work: Sequence[tuple[Any, ...]]) -> list[_Range]:
    """``_verify_range(*args)`` for each of ``work``, each in a new Python process that runs
    ``range_main`` (unlike ``multiprocessing``'s spawn, it never imports the caller's main
    module again), all at once. The arguments go in by its stdin and the result comes
    back by its stdout, pickled: between this process and a child it started. The child
    imports this package from where this process did."""
    package = str(Path(__file__).resolve().parents[3])
    path = os.pathsep.join([package, os.environ.get("PYTHONPATH", "")])
    children = [
        subprocess.Popen(
            [sys.executable, "-c", f"from {__name__} import range_main; range_main()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": path},
        )
        for _ in work
    ]
    try:
        for child, args in zip(children, work, strict=True):
            assert child.stdin is not None
            child.stdin.write(pickle.dumps(args, pickle.HIGHEST_PROTOCOL))
            child.stdin.close()
        results = []
        for child in children:
            assert child.stdout is not None
            out = child.stdout.read()
            if child.wait() != 0 or not out:
                raise JournalUnavailable(
                    f"a verify process exited with {child.returncode} (its error is above)"
                )
            results.append(pickle.loads(out))
        return results
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()


#: an effect's chain as a range leaves it: its id, head, head seq, status, type, origin,
#: first and last dispatch, when its head was written, its values no entry bound yet
_Summary = tuple[
    str, str, int, str | None, str | None, str | None, float | None, float | None, Any, Any
]


@dataclass
class _Range:
    """What one range's pass found (sent back from its process)."""

    start: int
    problem: tuple[int, str] | None = None
    #: the seq the range's next entry would have had
    end: int = 0
    count: int = 0
    #: the chains it started (not those it took up)
    started: int = 0
    head_seen: bool = False
    last: tuple[int, str] | None = None
    covered: set[int] = field(default_factory=set)
    #: the chains it did not settle with their rows, and the rows it read and did not settle
    chains: list[_Summary] = field(default_factory=list)
    rows: list[Sequence[Any]] = field(default_factory=list)
    links: dict[str, tuple[int, str]] = field(default_factory=dict)
    charges: list[Charge] = field(default_factory=list)
    anchors: list[RawEntry] = field(default_factory=list)


def _verify_range(
    source: EntrySource,
    keys: list[tuple[str, bytes]],
    head: JournalHead | None,
    anchors: Sequence[RawEntry],
    bounds: tuple[int, int | None],
) -> _Range:
    """One range's pass, in a process of its own."""
    start, stop = bounds
    charges: list[Charge] = []
    scan = ChargeFold.scan

    def feed(seq: int, effect_id: str, kind: str, body: bytes) -> None:
        charge = scan(seq, effect_id, kind, body)
        if charge is not None:
            charges.append(charge)

    run = EntryPass(Keyring.of_verifying_keys(keys), head, anchors, feed, start=start)
    found = _Range(start=start, problem=run.wrong)
    if run.wrong is not None:
        return found
    with collector_paused():
        found.problem, last = run.entries(source.batches(start, stop))
        if found.problem is not None:
            return found
        found.end, found.count, found.head_seen = run.expected, run.count, run.head_seen
        found.last = None if last is None else (int(last[0]), str(last[4]))
        found.covered, found.links, found.charges = run.covered, run.links, charges
        found.anchors = run.checker.anchors
        chains = run.checker.chains
        found.started = len(chains) - len(run.links)
        for values in source.rows((start, stop)):
            chain = chains.get(values[0])
            if (
                chain is None
                or values[0] in run.links
                or chain.unbound
                or not row_matches(values, chain)
            ):
                found.rows.append(values)
            else:
                del chains[values[0]]
        found.chains = [
            (
                eid,
                c.head,
                c.head_seq,
                c.status,
                c.effect_type,
                c.origin,
                c.first_dispatch,
                c.last_dispatch,
                c.updated,
                c.unbound,
            )
            for eid, c in chains.items()
        ]
    return found


def _joined(
    ranges: Sequence[_Range],
    keyring: Keyring,
    head: JournalHead | None,
    stray: Iterable[Sequence[Any]],
    anchors: Sequence[RawEntry],
    runs: Mapping[int, int],
    fold: ChargeFold | None,
) -> VerifyReport | None:
    """The ranges joined into one pass's report, if it is ok; None: a range found something
    wrong, they do not join, or what they left does not add up (one pass names it).
    ``stray``: the effects rows no range read."""
    checker = ChainCheck(keyring)
    expected, count, effects, last = 1, 0, 0, None
    covered: set[int] = set()
    rows = list(stray)
    for found in ranges:
        if found.problem is not None:
            return None
        if found.start != expected:
            if runs.get(expected) != found.start - 1:
                return None
            covered.add(expected)  # the range before ended where an archive's run starts
        if not _link(found, checker.chains):
            return None
        expected, count, effects = found.end, count + found.count, effects + found.started
        last = found.last or last
        covered |= found.covered
        checker.anchors.extend(found.anchors)
        rows += found.rows
    if head is not None and not any(found.head_seen for found in ranges):
        return None
    if checker.unbound() or anchors_hold(runs, covered, anchors, checker.anchors):
        return None
    if rows_problem(checker, rows) is not None:
        return None
    if fold is not None:
        apply = fold.apply
        for found in ranges:
            for charge in found.charges:
                apply(charge)
    final = None if last is None else JournalHead(seq=last[0], hash=last[1])
    return VerifyReport(ok=True, entries=count, effects=effects, head=final, jobs=len(ranges))


def _link(found: _Range, chains: dict[str, ChainSummary]) -> bool:
    """Add one range's chains to those of the ranges before it: False if a chain it takes up
    does not continue from where they left it, or it starts one they started."""
    links = found.links
    for eid, head, head_seq, status, kind, origin, first, last, updated, unbound in found.chains:
        link = links.get(eid)
        prior = chains.get(eid)
        if link is None:
            if prior is not None:  # started twice (each has one row, so the rows check would
                return False  # name one of them too: this says it first)
            chains[eid] = ChainSummary(
                head=head,
                head_seq=head_seq,
                status=status,
                effect_type=kind,
                origin=origin,
                first_dispatch=first,
                last_dispatch=last,
                unbound=unbound,
                updated_ts=updated,
            )
            continue
        if prior is None or prior.head != link[1]:
            return False
        prior.head, prior.head_seq, prior.updated_ts = head, head_seq, updated
        prior.head_body = None
        if status is not None:
            prior.status = status
        if prior.first_dispatch is None:
            prior.first_dispatch = first
        if last is not None:
            prior.last_dispatch = last
        if unbound:
            prior.unbound = {**(prior.unbound or {}), **unbound}
    return True


def range_main() -> None:
    """A range's process (``_in_processes``): its arguments from stdin, its result to stdout."""
    found = _verify_range(*pickle.loads(sys.stdin.buffer.read()))
    sys.stdout.buffer.write(pickle.dumps(found, pickle.HIGHEST_PROTOCOL))
