"""An outsider's decision on an effect in doubt, recorded the way the record activity records
one: the step the sweep and the model check share.

Problem: anyone with access to the Temporal namespace can start a review of an AMBIGUOUS effect
with rules ``{}`` and send one vote, ``not_happened``, in the name of the agent's own principal
(self-approval) or of someone not on the worker's allow-list. Were it recorded on an effect
that was in fact sent, the owner's next attempt would take the effect as confirmed absent and
send it again.

Mechanism: the votes go through the core path of ``interlock.record_decision``
(``_reviews/desk.py``: ``_counted`` then ``_record``): ``count_votes`` under the worker's own
``ReviewRules`` and the principal the journal recorded, then ``record_resolution``. Nothing of
the outsider's review (its rules, its tally) is handed on, as the desk hands none on; no
Temporal is involved. ``decide`` holds the one call of ``count_votes`` in the worlds, written
as the desk writes it, so a change of its signature is made here once.

Cost: one journal read to count (the principal), and one append if a decision is reached.
"""

from __future__ import annotations

from collections.abc import Sequence

from interlock_temporal.core.errors import InterlockError
from interlock_temporal.core.journal import Journal
from interlock_temporal.core.review import (
    NoDecision,
    ReviewRules,
    Vote,
    count_votes,
    record_resolution,
)

#: the worker's rules in the worlds: who may decide a review (the outsider is none of them)
WORKER_RULES = ReviewRules(allowed_operators=["ann", "bob"])
#: an operator not on the worker's allow-list
UNLISTED = "mallory"
#: the outsider's votes: the agent's own principal, an operator not on the list, or both
OUTSIDERS = ("self_approval", "unlisted", "both")


def outsider_votes(who: str, principal: str) -> list[Vote]:
    """The votes ``who`` (one of ``OUTSIDERS``) sends: ``not_happened``, each of them."""
    names = {"self_approval": [principal], "unlisted": [UNLISTED], "both": [principal, UNLISTED]}
    return [
        Vote(decision="not_happened", operator=name, note="it never went out")
        for name in names[who]
    ]


def decide(
    journal: Journal, effect_id: str, votes: Sequence[Vote], rules: ReviewRules = WORKER_RULES
) -> str:
    """Record what ``votes`` decide about the AMBIGUOUS ``effect_id``, as the record activity
    does: counted under ``rules`` (the worker's) and the journal's principal, then recorded.
    Says, for the story, what was recorded, or why nothing was."""
    try:
        decided, _ = count_votes(journal, "ambiguous", effect_id, list(votes), rules)
    except NoDecision:
        return "refused: no decision under the worker's rules"
    try:
        done = record_resolution(
            journal,
            effect_id,
            kind="ambiguous",
            decision=decided.decision,
            operators=decided.operators,
            note=decided.note,
        )
    except InterlockError as err:  # ReviewError, JournalCorrupt: nothing recorded
        return f"not recorded: {type(err).__name__}"
    if not done.recorded:
        return f"not recorded: {done.reason}"
    return f"recorded RESOLVED {decided.decision} by {', '.join(decided.operators)}"
