"""Reviews: how a person's decision is recorded, and what the person is shown. Plain Python: the
review desk and the CLI use the same code. What may be decided, and how decisions are counted,
is in ``review_rules`` (imported here too)."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Literal

from .errors import InterlockError
from .identity import canonical, jsonable
from .journal import Journal
from .models import Draft, Kind
from .operators import Roster, roster_of
from .policy import Approval, SessionState
from .receipts import EffectView, fold, fold_checked, receipt_of
from .review_rules import DECISIONS as DECISIONS
from .review_rules import Reached as Reached
from .review_rules import Recorded as Recorded
from .review_rules import ReviewKind as ReviewKind
from .review_rules import ReviewRules as ReviewRules
from .review_rules import Vote as Vote
from .review_rules import reached as reached
from .review_rules import review_id as review_id
from .review_rules import tally as tally
from .review_rules import vote_problem as vote_problem
from .sealing import Values
from .vote_codes import VoteCodes
from .vote_proofs import proof_problem, question_of


class ReviewError(InterlockError):
    """A decision that cannot be recorded (the message is shown to the person)."""


class NoDecision(ReviewError):
    """The votes reach no decision under the rules (the message says which rules)."""


def count_votes(
    journal: Journal,
    kind: str,
    subject: str,
    votes: Sequence[Vote],
    rules: ReviewRules,
    *,
    roster: Roster | None = None,
    now: float | None = None,
) -> tuple[Reached, list[str]]:
    """The decision ``votes`` reach where it is recorded: each vote checked against ``rules``
    (the recording worker's) and the principal the journal recorded, never a review's copies of
    them; where the journal has an operator roster (``roster``, read from the journal unless
    given), each vote counts only with a proof that its operator cast it on this very question
    (``vote_proofs``), so ``min_approvals`` counts distinct proven operators. Returns the
    decision with the deciding votes' proofs, and why each vote left out was. ``NoDecision`` if
    the counted votes reach none."""
    roster = roster_of(journal) if roster is None else roster
    question = question_of(journal, roster, kind, subject)
    principal, ballot, used = question.principal, question.ballot, set(question.used)
    codes = VoteCodes(journal.keyring)
    when = time.time() if now is None else now
    counted: list[Vote] = []
    proofs: dict[str, dict[str, Any]] = {}
    left_out: list[str] = []
    for vote in votes:
        problem = vote_problem(kind, vote, rules, principal, counted)
        if problem is None and roster.exists:
            if ballot is None:
                problem = "nothing in the journal awaits this decision"
            else:
                problem, proof = proof_problem(
                    ballot, vote, roster, when, used, codes, journal.code_uses
                )
                if proof is not None:
                    proofs[proof["operator"]] = proof
                    used.add(proof["digest"])
        if problem is None:
            counted.append(vote)
        else:
            left_out.append(problem)
    decided = reached(counted, rules.min_approvals)
    if decided is None:
        raise NoDecision(
            "not recorded: the votes reach no decision under this worker's rules ("
            f"{rules.min_approvals} distinct operator(s) must agree"
            + (", from its allowed operators" if rules.allowed_operators is not None else "")
            + (", each proving who they are" if roster.exists else "")
            + ", and the agent's own principal may not decide)"
            + (": " + "; ".join(left_out) if left_out else "")
        )
    decided.proofs = [proofs[name] for name in decided.operators if name in proofs]
    if decided.proofs and ballot is not None:
        decided.ballot = ballot.model_dump(mode="json")
    return decided, left_out


def record_resolution(
    journal: Journal,
    effect_id: str,
    *,
    kind: str,
    decision: str,
    operators: Sequence[str],
    note: str = "",
    result: Any = None,
    values: Values | None = None,
    stored_result: bytes | None = None,
    proofs: Sequence[dict[str, Any]] = (),
    sent_by: Mapping[str, str] | None = None,
) -> Recorded:
    """Append ``RESOLVED`` for an effect that is AMBIGUOUS, conditional on its head.

    ``values``: how the gate digests values (the result's digest takes the effect's scheme);
    ``stored_result``: the result as stored (sealed by the caller when values are sealed);
    ``proofs``: the deciding votes' proofs (``count_votes``), signed into the entry so that
    ``interlock journal verify --public-key`` can check them again;
    ``sent_by``: for operators whose vote's signal or Update was found in the review's history,
    the client identity Temporal recorded for it (recorded as ``sent_by``: evidence, never
    proof, since a client sets it).

    An effect a late ``COMMITTED`` already closed is reported closed, and one already resolved
    is reported as it was: neither is changed.
    """
    if kind == "approval":
        raise ReviewError("approval reviews are recorded with record_approval")
    if kind != "ambiguous":
        raise ReviewError(f"no such review kind: {kind}")
    entries = journal.read(effect_id)
    if not entries:
        raise ReviewError(f"no effect {effect_id} in the journal")
    view = fold(effect_id, entries)
    if view.status is Kind.COMMITTED:
        return Recorded(
            recorded=False,
            state="closed",
            receipt=receipt_of(view),
            # the person reads this reason (CLI, Web UI): its words stay as released
            reason="a late COMMITTED from the attempt in doubt already settled it",
        )
    if view.status is Kind.RESOLVED:
        return Recorded(
            recorded=False,
            state="resolved",
            receipt=receipt_of(view),
            reason=f"already resolved {view.resolution} by {view.operator}",
        )
    if view.status is not Kind.AMBIGUOUS:
        raise ReviewError(f"effect {effect_id[:16]} is {view.status}, not awaiting a decision")
    data: dict[str, Any] = {
        "kind": kind,
        "decision": decision,
        "operator": operators[0],
        "operators": list(operators),
        "note": note,
    }
    if proofs:
        data["proofs"] = [dict(p) for p in proofs]
    if sent_by:
        data["sent_by"] = dict(sent_by)
    blobs: dict[str, Any] = {}
    if decision == "happened" and result is not None:
        result_json = canonical(result)
        digester = values or Values(journal.keyring)
        data["result_digest"] = digester.digest(result_json, view.digests)
        blobs["result"] = result_json if stored_result is None else stored_result
    written = journal.append(
        effect_id, view.head, [Draft(kind=Kind.RESOLVED, data=data)], blobs=blobs
    )
    after = fold_checked(journal, view, written)
    return Recorded(recorded=True, state="resolved", receipt=receipt_of(after))


def record_approval(
    journal: Journal,
    binding: str,
    *,
    decision: str,
    operators: Sequence[str],
    note: str = "",
    scope: Literal["once", "session"] | None = None,
    ttl_s: float | None = None,
    sent_by: Mapping[str, str] | None = None,
    proofs: Sequence[dict[str, Any]] = (),
    ballot: Mapping[str, Any] | None = None,
) -> Recorded:
    """Record a person's ``approve`` or ``reject`` on a pending approval (journaled), with
    ``sent_by`` (see ``record_resolution``) when given, and the deciding votes' ``proofs`` with
    the ``ballot`` they signed (``count_votes``), so that ``journal verify`` checks them again."""
    if decision not in DECISIONS["approval"]:
        raise ReviewError(f"{decision!r} is not a decision for approval reviews")
    try:
        recorded, approval = journal.policy.decide_approval(
            binding,
            approve=decision == "approve",
            operators=operators,
            note=note,
            scope=scope or "once",
            ttl_s=ttl_s,
            sent_by=sent_by,
            proofs=proofs,
            ballot=ballot,
        )
    except KeyError:
        raise ReviewError(f"no approval was requested for {binding}") from None
    except ValueError as err:
        raise ReviewError(str(err)) from None
    if not recorded:
        return Recorded(
            recorded=False,
            state="resolved",
            reason=f"already {approval.status} by {', '.join(approval.operators) or '-'}",
        )
    return Recorded(recorded=True, state="resolved")


def record_circuit_reset(
    journal: Journal,
    session: str,
    *,
    operators: Sequence[str],
    note: str = "",
    sent_by: Mapping[str, str] | None = None,
    proofs: Sequence[dict[str, Any]] = (),
    ballot: Mapping[str, Any] | None = None,
) -> Recorded:
    """Close a session's open circuit (journaled with the operator, the client identity
    Temporal recorded for their vote when ``sent_by`` has it: see ``record_resolution``, and
    their proof with its ballot: see ``record_approval``)."""
    operator = operators[0] if operators else ""
    recorded_by = {o: i for o, i in (sent_by or {}).items() if o == operator.strip()}
    proven = [p for p in proofs if p.get("operator") == operator.strip()]
    try:
        reset = journal.policy.reset(
            session,
            operator=operator,
            note=note,
            sent_by=recorded_by,
            proofs=proven,
            ballot=ballot,
        )
    except ValueError as err:
        raise ReviewError(str(err)) from None
    if not reset:
        return Recorded(
            recorded=False,
            state="closed",
            reason="the circuit was not open (reset already, from the command line?)",
        )
    return Recorded(recorded=True, state="resolved")


def reopen(journal: Journal, effect_id: str, *, operator: str, note: str = "") -> Recorded:
    """Reopen a REFUSED effect that never executed: its next attempt dispatches under the
    authority and the facts current then."""
    if not operator.strip():
        raise ReviewError("operator must name the person reopening the effect")
    entries = journal.read(effect_id)
    if not entries:
        raise ReviewError(f"no effect {effect_id} in the journal")
    view = fold(effect_id, entries)
    if view.status is not Kind.REFUSED:
        raise ReviewError(
            f"effect {effect_id[:16]} is {view.status}: only a REFUSED effect can be reopened"
        )
    written = journal.append(
        effect_id,
        view.head,
        [
            Draft(
                kind=Kind.REOPENED,
                data={"operator": operator.strip(), "note": note, "refused_code": view.code},
            )
        ],
    )
    return Recorded(
        recorded=True, state="reopened", receipt=receipt_of(fold_checked(journal, view, written))
    )


# -- what the person sees ------------------------------------------------------------------


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _code(value: Any) -> str:
    return "`" + json.dumps(value, sort_keys=True, default=str) + "`"


def _authority_line(view: EffectView) -> str:
    """The lease as it stood at the send, in words: a limit the lease does not set reads as
    "any" or "no maximum", never as None."""
    authority = view.authority or {}
    lease = authority.get("lease_id") or view.lease_id
    principal = authority.get("principal") or view.principal
    if lease is None:
        return "no lease was recorded for this effect"
    activities = authority.get("activities")
    resources = authority.get("resources")
    maximum = authority.get("max_amount_cents")
    budget = authority.get("budget_cents")
    terms = [
        "any activity" if activities is None else f"activities {_code(activities)}",
        "no maximum per effect" if maximum is None else f"at most {maximum} cents per effect",
        "any resource" if resources is None else f"resources {_code(resources)}",
    ]
    if budget is not None:
        terms.append(f"a budget of {budget} cents")
    held = f" held by `{principal}`" if principal else ""
    return f"lease `{lease}`{held}: " + ", ".join(terms)


def review_markdown(
    kind: str,
    view: EffectView,
    proposal: Any,
    rules: ReviewRules,
    changes: Sequence[dict[str, Any]] = (),
) -> str:
    """The review's explanation for the Temporal UI: what was proposed, under which authority,
    what is known and unknown, and the exact JSON to send."""
    tier_text = {
        0: "writes the effect in the journal's own transaction",
        1: "dedupes a resend by idempotency key, and can be asked",
        2: "can be asked whether the effect happened",
        3: "can neither dedupe a resend nor be asked whether it happened",
    }.get(view.tier if view.tier is not None else -1, "unknown")
    lines = [
        f"## {'Effect in doubt' if kind == 'ambiguous' else 'Approval needed'}: "
        f"`{view.activity or view.effect_type}`",
        "",
        f"- effect id: `{view.effect_id}`",
        f"- principal: `{view.principal or '-'}` under lease `{view.lease_id or '-'}`",
        f"- target: `{view.target or '-'}` "
        + (f"(tier {view.tier}: {tier_text})" if view.tier is not None else "(tier not recorded)"),
        f"- proposed {_when(view.proposed_ts)}; dispatched {view.dispatches} time(s), "
        f"last {_when(view.last_dispatch_ts)}",
        f"- why a person is needed: {view.reason or '-'}",
        "",
        "### The proposal",
        "",
        "```json",
        json.dumps(jsonable(proposal), indent=2, sort_keys=True, default=str),
        "```",
        "",
        "### The facts it relied on",
        "",
        # a list, not a table: the Web UI draws a table's cells without padding, and its
        # headers ran together ("when proposedat the last check")
    ]
    changed = {c["fact"]: c for c in changes}
    facts = [
        (fact, value, changed[fact]["current"] if fact in changed else value)
        for fact, value in (view.premises or {}).items()
    ] + [
        (fact, c.get("recorded"), c.get("current"))
        for fact, c in changed.items()
        if fact not in (view.premises or {})
    ]
    for fact, then, now in sorted(facts, key=lambda f: f[0]):
        line = f"`{fact}`: {_code(then)} when proposed, {_code(now)} at the last check"
        lines.append(f"- **{line} (changed)**" if fact in changed else f"- {line}")
    lines += ["", "### Authority at the send", "", _authority_line(view), ""]
    if kind == "ambiguous":
        lines += [
            "### Known and unknown",
            "",
            "- known: the send was recorded as dispatched before it went out; no attempt "
            "recorded its confirmation",
            "- unknown: whether the target executed it. Check the target's own records "
            "before deciding.",
            "",
        ]
    notes = []
    if kind == "ambiguous":
        notes = [
            '`happened` may carry `"result": {...}`, checked against the activity\'s return '
            "type. `not_happened` lets the effect be sent again, after its lease and facts "
            "are re-checked."
        ]
    return "\n".join([*lines, *_decide(kind, rules, view.principal, notes)])


def _decide(
    kind: str, rules: ReviewRules, principal: str | None, notes: Sequence[str]
) -> list[str]:
    """How to decide a review of ``kind``, and who may: the end of every review's page."""
    lines = [
        "### Decide",
        "",
        "More Actions → Send a Signal → `resolve` (or Update → `decide`), with one of:",
    ]
    for choice in DECISIONS.get(kind, ()):
        # one short line a field: the details pane is narrow, and a long line was cut off
        lines += [
            "",
            f'    {{"decision": "{choice}",',
            '     "operator": "your-name",',
            '     "note": "why"}',
        ]
    for note in notes:
        lines += ["", note]
    rule_text = [f"{rules.min_approvals} approval(s) needed"]
    if rules.allowed_operators is not None:
        rule_text.append("operators: " + ", ".join(rules.allowed_operators))
    if principal is not None:
        rule_text.append(f"the agent's principal `{principal}` may not decide")
    return [
        *lines,
        "",
        "Rules: " + "; ".join(rule_text) + ".",
        "The Web UI's signal carries no identity: `operator` is what the sender typed.",
    ]


def approval_markdown(approval: Approval, rules: ReviewRules) -> str:
    """The approval review's explanation for the Temporal UI."""
    lines = [
        f"## Approval needed: `{approval.activity}`",
        "",
        f"- asks: `{approval.principal}` in session `{approval.session}`",
        f"- why: {approval.code}: {approval.reason or '-'} (policy `{approval.policy_id}`, "
        f"epoch `{approval.epoch}`)",
        f"- requested {_when(approval.requested_at)}",
        f"- binds to: `{approval.binding}`, input digest `{approval.payload_digest[:16]}`",
        "",
        "### The call",
        "",
        "```json",
        json.dumps(approval.proposal, indent=2, sort_keys=True, default=str),
        "```",
        "",
        "An approval covers exactly this input, this principal and this policy epoch: a "
        "changed amount or policy needs a new approval.",
        "",
    ]
    once = (
        'An approval is used once; add `"scope": "session"` to cover the session, or '
        '`"ttl_s": 3600` to cover an hour.'
    )
    return "\n".join([*lines, *_decide("approval", rules, approval.principal, [once])])


def circuit_markdown(session: str, state: SessionState, rules: ReviewRules) -> str:
    """The circuit review's explanation for the Temporal UI."""
    circuit = state.circuit
    lines = [
        f"## Circuit open: session `{session}`",
        "",
        f"- opened {_when(circuit.at if circuit else None)} on "
        f"`{circuit.code if circuit else '-'}` by a call of "
        f"`{circuit.activity if circuit else '-'}`",
        f"- the session made {state.total} allowed calls and spent ${state.spent_usd:.2f}",
        "- every call in this session is denied `CIRCUIT_OPEN` until a person resets it",
        "",
        "Look at what the agent was doing (its workflow's history) before resetting: a loop "
        "or a spent budget usually means the agent needs fixing, not another try.",
        "",
    ]
    cli = (
        f"Or `interlock circuit reset {session} --operator your-name`. The reset is "
        "journaled; the session's spend is kept."
    )
    return "\n".join([*lines, *_decide("circuit", rules, None, [cli])])
