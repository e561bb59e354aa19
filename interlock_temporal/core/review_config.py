"""The review rules as signed journal configuration: who may decide and how many must agree, the
same for every worker of the journal.

The problem: each worker is given its ``ReviewRules`` in code (``InterlockPlugin(review=...)``).
Two workers configured differently count the same votes differently, and the decision depends
on which one happens to run the recording activity.

The mechanism: ``interlock operators rules`` writes the rules (``allowed_operators``,
``min_approvals``) as a ``CONFIG`` entry on the journal's chain ``config:review-rules``; the
activity that records a decision counts the votes under the latest of them, whatever the
worker was given (its deadline and reminders stay the worker's: they time the review workflow,
they decide nothing). An entry is signed like any other, so whoever writes the database without
the journal's keys cannot loosen them. Without such an entry, each worker's own rules apply.

Cost: one chain read per recorded decision (a few entries).
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .config_chain import append_config, config_data
from .errors import InterlockError
from .journal import Journal
from .models import Entry
from .review_rules import ReviewRules

#: the journal chain that holds the review rules
RULES_CHAIN = "config:review-rules"


class RulesError(InterlockError):
    """Review rules that cannot be set or read (the message says why)."""


class RulesChange(BaseModel):
    """The rules one ``CONFIG`` entry on ``config:review-rules`` sets."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    allowed_operators: list[str] | None = None
    min_approvals: int = Field(default=1, ge=1)
    by: str = ""
    note: str = ""


def _latest(entries: Sequence[Entry]) -> RulesChange | None:
    if not entries:
        return None
    entry = entries[-1]
    data = config_data(entry)
    if data is None:
        raise RulesError(f"entry {entry.seq} on the review rules' chain is not a CONFIG entry")
    try:
        return RulesChange.model_validate(data)
    except ValidationError:
        raise RulesError(f"entry {entry.seq} on the review rules' chain is not rules") from None


def journal_rules(journal: Journal) -> RulesChange | None:
    """The rules the journal sets (None: it sets none, and each worker's own apply)."""
    return _latest(journal.read(RULES_CHAIN))


def rules_in_force(journal: Journal, worker: ReviewRules) -> ReviewRules:
    """What a decision is counted under: the journal's rules where it sets them (with the
    worker's deadline), else the worker's."""
    found = journal_rules(journal)
    if found is None:
        return worker
    return worker.model_copy(
        update={"allowed_operators": found.allowed_operators, "min_approvals": found.min_approvals}
    )


def set_review_rules(
    journal: Journal,
    *,
    allowed_operators: Sequence[str] | None,
    min_approvals: int,
    by: str = "",
    note: str = "",
) -> RulesChange:
    """Set the journal's review rules (each change a signed entry; the latest holds)."""
    change = RulesChange(
        allowed_operators=None if allowed_operators is None else list(allowed_operators),
        min_approvals=min_approvals,
        by=by,
        note=note,
    )
    append_config(journal, RULES_CHAIN, change.model_dump(mode="json"))
    return change
