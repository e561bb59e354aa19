"""Plain-text rendering of receipts, journal entries, effects, leases, reviews and reconcile
reports, for people.

Used by the ``interlock`` command and the demo. Plain functions returning strings: no colors,
no terminal control, nothing printed. Argument values never appear: entries carry only digests,
and entry data is summarised from a fixed set of keys that hold no argument values.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ..core.models import EffectRow, Entry, Lease, Receipt, VerifyReport
from ..core.report import JournalReport
from ..core.review_rules import SENT_BY_CAVEAT
from ..core.vote_proofs import ProofCheck

if TYPE_CHECKING:  # the review models import Temporal: only the type checker needs them here
    from .._reviews.reconciler import ReconcileReport
    from .._reviews.workflow import ReviewStatus

__all__ = [
    "ReviewLine",
    "entry_summary",
    "fmt_time",
    "lease_state",
    "reconcile_summary",
    "render_effects",
    "render_entries",
    "render_leases",
    "render_receipt",
    "render_reconcile",
    "render_review_status",
    "render_reviews",
    "render_table",
    "render_verify",
    "short",
    "votes_text",
]

#: how many characters of an effect id the tables show (64 bits: unique in practice)
EFFECT_ID_WIDTH = 16
#: how many characters of an entry hash or a digest the tables show
HASH_WIDTH = 12
#: the widest an entry's data summary may be
DATA_WIDTH = 100

_NONE = "-"


def short(value: str | None, width: int = HASH_WIDTH) -> str:
    """The first ``width`` characters of an id or digest ("-" for none)."""
    if not value:
        return _NONE
    return value[:width]


def fmt_time(value: float | datetime | None) -> str:
    """A UTC timestamp to the second, ISO 8601 (``2025-01-31T12:00:05Z``); "-" for none."""
    if value is None:
        return _NONE
    moment = value if isinstance(value, datetime) else datetime.fromtimestamp(value, UTC)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _text(value: Any) -> str:
    if value is None:
        return _NONE
    if value is True:
        return "yes"
    if value is False:
        return "no"
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value) if value else _NONE
    return str(value)


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 3, 0)] + "..."


def render_table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """Left-aligned columns separated by two spaces; the last column is not padded."""
    table = [list(headers), *(list(r) for r in rows)]
    widths = [max(len(row[i]) for row in table) for i in range(len(headers))]
    lines = []
    for row in table:
        cells = [cell.ljust(widths[i]) for i, cell in enumerate(row[:-1])]
        lines.append("  ".join([*cells, row[-1]]).rstrip())
    return "\n".join(lines)


def _fields(pairs: Sequence[tuple[str, str]]) -> str:
    """Aligned ``key: value`` lines."""
    width = max(len(key) for key, _ in pairs) + 1
    return "\n".join(f"{(key + ':').ljust(width)} {value}".rstrip() for key, value in pairs)


# -- receipts ---------------------------------------------------------------------------------


def _authority(authority: Mapping[str, Any] | None) -> str:
    """The lease as it was when the effect was sent, in one line."""
    if not authority:
        return _NONE
    parts = [str(authority.get("lease_id") or "?")]
    if authority.get("principal"):
        parts.append(f"principal {authority['principal']}")
    if authority.get("activities") is not None:
        parts.append(f"activities {_text(authority['activities'])}")
    if authority.get("max_amount_cents") is not None:
        parts.append(f"max {authority['max_amount_cents']} cents")
    if authority.get("resources") is not None:
        parts.append(f"resources {_text(authority['resources'])}")
    if authority.get("expires_at") is not None:
        parts.append(f"expires {fmt_time(float(authority['expires_at']))}")
    if authority.get("revoked_at") is not None:
        parts.append(f"revoked {fmt_time(float(authority['revoked_at']))}")
    return parts[0] + (" (" + ", ".join(parts[1:]) + ")" if len(parts) > 1 else "")


def _lease_line(receipt: Receipt) -> str:
    """The effect's lease; a delegated one with its chain, root first."""
    chain = receipt.lease_chain
    if len(chain) > 1:
        return f"{receipt.lease_id} (delegated: {' > '.join(chain)})"
    return _text(receipt.lease_id)


def render_receipt(receipt: Receipt) -> str:
    """A receipt as aligned ``key: value`` lines, in the order an auditor asks."""
    executed = receipt.executed if receipt.executed == "unknown" else _text(receipt.executed)
    target = receipt.target or _NONE
    if receipt.tier is not None:
        target = f"{target} (tier {receipt.tier})"
    pairs: list[tuple[str, str]] = [
        ("effect", receipt.effect_id),
        ("type", receipt.effect_type or _NONE),
        ("final", receipt.final),
        ("via", _text(receipt.via)),
        ("proposed", _text(receipt.proposed)),
        ("authorized", _text(receipt.authorized)),
        ("executed", str(executed)),
        ("recorded", _text(receipt.recorded)),
        ("code", _text(receipt.code)),
        ("reason", _text(receipt.reason)),
        ("changed facts", _text(receipt.changed_facts)),
        ("premises held", _text(receipt.premises_held)),
        ("principal", _text(receipt.principal)),
        ("lease", _lease_line(receipt)),
        ("authority at send", _authority(receipt.authority_at_send)),
        ("decided by", _text(receipt.decided_by)),
        ("operator", _text(receipt.operator)),
        *_sent_by_lines(receipt.sent_by),
        ("target", target),
        ("confirmation", _text(receipt.confirmation)),
        ("dispatches", str(receipt.dispatches)),
        ("payload digest", _text(receipt.payload_digest)),
        ("approved digest", _text(receipt.approved_digest)),
        ("result digest", _text(receipt.result_digest)),
        ("proposed at", fmt_time(receipt.proposed_at)),
        ("finished at", fmt_time(receipt.finished_at)),
        ("journal seq", str(receipt.journal_seq)),
        ("journal hash", receipt.journal_hash or _NONE),
    ]
    return _fields(pairs)


def _sent_by_lines(sent_by: Mapping[str, str]) -> list[tuple[str, str]]:
    """A ``sent by`` line: each operator with the client identity Temporal recorded for their
    vote, and what that is worth; none when nothing was recorded."""
    if not sent_by:
        return []
    shown = ", ".join(
        f"{operator}: {identity or '(no identity given)'}" for operator, identity in sent_by.items()
    )
    return [("sent by", f"{shown} ({SENT_BY_CAVEAT})")]


# -- journal entries --------------------------------------------------------------------------

#: entry data keys shown as they are, most telling first: none holds an argument value
_LEADING_KEYS = (
    "via",
    "code",
    "decision",
    "operator",
    "redecided",
    "configuration",
    "principal",
    "target",
    "tier",
    "confirmation",
    "error",
    "late",
    "after",
    "alarm",
)
_TRAILING_KEYS = ("reason", "decided_by", "checks", "lease_id", "worker")


def _plain(data: Mapping[str, Any], keys: Sequence[str]) -> list[str]:
    parts: list[str] = []
    for key in keys:
        value = data.get(key)
        if value is None or value == [] or value == "":
            continue
        if isinstance(value, (list, tuple)):
            if not all(isinstance(v, (str, int, float, bool)) for v in value):
                continue
            parts.append(f"{key}={','.join(str(v) for v in value)}")
        elif isinstance(value, (str, int, float, bool)):
            parts.append(f"{key}={_text(value)}")
    return parts


def entry_summary(data: Mapping[str, Any], width: int = DATA_WIDTH) -> str:
    """A short ``key=value`` summary of an entry's data: names, codes and short digests only.

    Premises, lease snapshots and unknown keys are left out (the receipt shows what matters of
    them); digests are shortened to 12 characters (``payload#1a2b3c4d5e6f``).
    """
    parts = _plain(data, _LEADING_KEYS)
    changes = data.get("changes")
    if isinstance(changes, list) and changes:
        facts = [str(c.get("fact")) for c in changes if isinstance(c, Mapping)]
        parts.append(f"changed={','.join(facts)}")
    for key in sorted(data):
        value = data[key]
        if key.endswith("_digest") and isinstance(value, str):
            parts.append(f"{key.removesuffix('_digest')}#{short(value)}")
    parts += _plain(data, _TRAILING_KEYS)
    delivery = data.get("delivery")
    if isinstance(delivery, Mapping) and isinstance(delivery.get("attempt"), int):
        parts.append(f"attempt={delivery['attempt']}")
    return _clip(" ".join(parts), width)


def render_entries(entries: Sequence[Entry]) -> str:
    """An effect's journal entries as a table: seq, kind, time, short hash, short data."""
    if not entries:
        return "(no entries)"
    rows = [
        [str(e.seq), e.kind.value, fmt_time(e.ts), short(e.hash), entry_summary(e.data)]
        for e in entries
    ]
    return render_table(["SEQ", "KIND", "TIME", "HASH", "DATA"], rows)


# -- effects ----------------------------------------------------------------------------------


def render_effects(rows: Sequence[EffectRow], dispatches: Mapping[str, int] | None = None) -> str:
    """Index rows as a table; the effect id shortened to 16 characters.

    ``dispatches`` maps effect ids to how often each was dispatched; without it the column is
    left out.
    """
    if not rows:
        return "(no effects)"
    headers = ["EFFECT", "TYPE", "STATUS", "UPDATED"]
    if dispatches is not None:
        headers.append("DISPATCHES")
    table = []
    for row in rows:
        cells = [
            short(row.effect_id, EFFECT_ID_WIDTH),
            row.effect_type,
            row.status.value,
            fmt_time(row.updated_ts),
        ]
        if dispatches is not None:
            count = dispatches.get(row.effect_id)
            cells.append(_NONE if count is None else str(count))
        table.append(cells)
    return render_table(headers, table)


# -- leases -----------------------------------------------------------------------------------


def lease_state(
    lease: Lease, now: float, others: Sequence[Lease] = (), *, chain: bool = True
) -> str:
    """``live``, ``revoked`` or ``expired`` at ``now``; with ``chain``, a delegated lease that
    is live itself but whose ancestor is not says so (``ancestor revoked``): its next dispatch
    is refused. Its ancestors are read from ``others`` (the leases listed with it) or its
    ``delegators``."""
    if lease.revoked_at is not None and lease.revoked_at <= now:
        return "revoked"
    if lease.expires_at is not None and lease.expires_at <= now:
        return "expired"
    if not chain:
        return "live"
    known = {a.lease_id: a for a in (*others, *(lease.delegators or ()))}
    for lease_id in lease.ancestors or ():
        above = known.get(lease_id)
        state = "missing" if above is None else lease_state(above, now, chain=False)
        if state != "live":
            return f"ancestor {state}"
    return "live"


def render_leases(leases: Sequence[Lease], now: float) -> str:
    """Leases as a table, with their state at ``now``."""
    if not leases:
        return "(no leases)"
    rows = [
        [
            lease.lease_id,
            lease.principal,
            lease_state(lease, now, leases),
            "*" if lease.activities is None else _text(lease.activities),
            _NONE if lease.max_amount_cents is None else str(lease.max_amount_cents),
            _NONE
            if lease.budget_cents is None
            else f"{lease.reserved_cents or 0}/{lease.budget_cents}",
            "*" if lease.resources is None else _text(lease.resources),
            fmt_time(lease.issued_at),
            "never" if lease.expires_at is None else fmt_time(lease.expires_at),
            lease.parent or _NONE,
        ]
        for lease in leases
    ]
    headers = [
        "LEASE",
        "PRINCIPAL",
        "STATE",
        "ACTIVITIES",
        "MAX_CENTS",
        "RESERVED/BUDGET",
        "RESOURCES",
        "ISSUED",
    ]
    return render_table([*headers, "EXPIRES", "FROM"], rows)


# -- verification -----------------------------------------------------------------------------


def render_verify(report: VerifyReport, journal: str | None = None) -> str:
    """A verification report: a verdict line, then aligned details."""
    control = report.control
    rows = control is not None and bool(control.problems)
    failed = (
        "FAILED: a row the gate reads does not match the signed entries"
        if rows
        else f"FAILED at entry seq {report.first_bad_seq}: {report.problem}"
    )
    verdict = "ok" if report.ok else failed
    pairs: list[tuple[str, str]] = []
    if journal is not None:
        pairs.append(("journal", journal))
    pairs.append(("result", verdict))
    if report.ok or rows:
        pairs += [
            ("entries", str(report.entries)),
            ("chains", str(report.effects)),
            ("head", str(report.head) if report.head else "(empty journal)"),
        ]
        if report.jobs > 1:
            pairs.append(("processes", str(report.jobs)))
        if control is not None:
            checked = f"{control.leases} lease(s), {control.budgets} budget(s), "
            checked += f"{control.dispatches} dispatch(es), {control.policy} policy row(s)"
            pairs.append(("rows", checked + (": ok" if not rows else "")))
            pairs += [("problem", problem) for problem in control.problems]
    else:
        pairs += [
            ("first bad seq", _text(report.first_bad_seq)),
            ("problem", _text(report.problem)),
            ("verified before it", f"{report.entries} entries, {report.effects} chains"),
        ]
        if report.head is not None:
            pairs.append(("journal ends at", str(report.head)))
    return _fields(pairs)


def render_proofs(check: ProofCheck) -> str:
    """The vote proofs ``journal verify`` checked again (one-time codes cannot be: a code is a
    secret the journal consumed, not a signature anyone can check)."""
    verdict = "ok" if not check.problems else f"{len(check.problems)} FAILED"
    pairs = [("vote proofs", f"{check.checked} re-checked against the roster: {verdict}")]
    pairs += [("proof", problem) for problem in check.problems]
    return _fields(pairs)


# -- reviews ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReviewLine:
    """One review workflow as ``interlock reviews list`` shows it."""

    workflow_id: str
    kind: str
    effect_id: str
    #: the review's own state (open, recording, resolved, ...), or the workflow's status when
    #: the review could not be asked (terminated, ...), or "?"
    state: str
    votes: Sequence[Mapping[str, str]] = field(default_factory=tuple)
    #: how many workflows wait on the outcome; None when unknown
    waiting: int | None = None
    started: datetime | None = None
    note: str = ""


def votes_text(votes: Sequence[Mapping[str, str]]) -> str:
    """``operator=decision`` for each vote, comma-separated ("-" for none)."""
    if not votes:
        return _NONE
    return ",".join(f"{v.get('operator', '?')}={v.get('decision', '?')}" for v in votes)


def render_reviews(lines: Sequence[ReviewLine]) -> str:
    """Reviews as a table: kind, effect (16 characters), state, votes so far, workflows waiting,
    started; a NOTE column when any review has one."""
    if not lines:
        return "(no reviews)"
    headers = ["KIND", "EFFECT", "STATE", "VOTES", "WAITING", "STARTED"]
    with_note = any(line.note for line in lines)
    rows = []
    for line in lines:
        cells = [
            line.kind,
            short(line.effect_id, EFFECT_ID_WIDTH),
            line.state,
            votes_text(line.votes),
            _NONE if line.waiting is None else str(line.waiting),
            fmt_time(line.started),
        ]
        if with_note:
            cells.append(line.note or _NONE)
        rows.append(cells)
    return render_table([*headers, "NOTE"] if with_note else headers, rows)


def render_review_status(status: ReviewStatus, workflow_id: str | None = None) -> str:
    """A review's status (what the ``decide`` Update and the ``status`` query return) as aligned
    ``key: value`` lines, with the receipt's verdict when the journal recorded one."""
    pairs: list[tuple[str, str]] = []
    if workflow_id is not None:
        pairs.append(("review", workflow_id))
    pairs += [
        ("effect", status.effect_id),
        ("kind", status.kind),
        ("state", status.state),
        ("decision", _text(status.decision)),
        ("operators", _text(status.operators)),
        ("votes", votes_text(status.votes)),
        *_sent_by_lines({v["operator"]: v["sent_by"] for v in status.votes if "sent_by" in v}),
        ("workflows waiting", str(status.subscribers)),
    ]
    if status.reason:
        pairs.append(("reason", status.reason))
    found = status.receipt
    if found is not None:
        executed = found.executed if found.executed == "unknown" else _text(found.executed)
        pairs += [
            ("final", found.final),
            ("executed", str(executed)),
            ("operator", _text(found.operator)),
            ("journal seq", str(found.journal_seq)),
        ]
    for text in status.reported[-3:]:
        pairs.append(("reported", _clip(text, DATA_WIDTH)))
    return _fields(pairs)


# -- reconcile --------------------------------------------------------------------------------

_REVIEW_PREFIX_WIDTH = len("interlock-review-ambiguous-")


def render_reconcile(report: ReconcileReport) -> str:
    """What one reconciler run did, one effect a line: effect (16 characters), activity, final,
    via or code, the review opened for it (shortened like the effect), note."""
    if not report.outcomes:
        return "(no effects in doubt)"
    rows = [
        [
            short(o.effect_id, EFFECT_ID_WIDTH),
            o.activity or _NONE,
            o.final,
            o.via or o.code or _NONE,
            short(o.review, _REVIEW_PREFIX_WIDTH + EFFECT_ID_WIDTH),
            _clip(o.note, DATA_WIDTH) if o.note else _NONE,
        ]
        for o in report.outcomes
    ]
    return render_table(["EFFECT", "ACTIVITY", "FINAL", "VIA/CODE", "REVIEW", "NOTE"], rows)


def reconcile_summary(report: ReconcileReport, needing: int) -> str:
    """One line: how many effects were in doubt, what became of them, how many still need
    someone (skipped for a reason other than a live attempt, or left beyond the limit)."""
    counts: dict[str, int] = {}
    for o in report.outcomes:
        counts[o.final] = counts.get(o.final, 0) + 1
    parts = [f"{n} {final}" for final, n in sorted(counts.items())]
    beyond = report.in_doubt - len(report.outcomes)
    if beyond > 0:
        parts.append(f"{beyond} not reached (limit)")
    found = f"{report.in_doubt} in doubt" + (": " + ", ".join(parts) if parts else "")
    # the words as released (scripts read this line)
    verdict = "all settled" if needing == 0 else f"{needing} still need attention"
    return f"{found}; {verdict}"


# -- the report ---------------------------------------------------------------------------------


def _counts(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items()) if counts else "none"


def render_report(report: JournalReport) -> str:
    """The period's report: aligned lines an operator reads at a glance."""
    w = report.waiting
    lat = report.gate_latency_ms

    def ms(value: float | None) -> str:
        return _NONE if value is None else f"{value:.2f} ms"

    pairs = [
        ("period", f"{fmt_time(report.since)} to {fmt_time(report.until)}"),
        ("effects", f"{sum(report.effects.values())}: {_counts(report.effects)}"),
        (
            "waiting for a person",
            f"{w.ambiguous_effects} AMBIGUOUS, {w.pending_approvals} approvals pending, "
            f"{w.open_circuits} circuits open",
        ),
        ("in doubt now", f"{w.in_doubt} (dispatched, never confirmed)"),
        ("denials", f"{sum(report.denials.values())}: {_counts(report.denials)}"),
        ("escalations", f"{sum(report.escalations.values())}: {_counts(report.escalations)}"),
        ("observed (monitor)", _counts(report.observed)),
        (
            "gate latency",
            f"p50 {ms(lat.p50)}, p95 {ms(lat.p95)}, p99 {ms(lat.p99)}, max {ms(lat.max)} "
            f"over {lat.count} commits",
        ),
        (
            "notification failures",
            f"{sum(f.count for f in report.notification_failures)}",
        ),
    ]
    for f in report.notification_failures:
        pairs.append(
            (
                f"  {f.notifier}",
                f"{f.count} failed for {f.review_id} (last: {f.last_event}, "
                f"{fmt_time(f.last_ts)}: {f.last_error})",
            )
        )
    return _fields(pairs)
