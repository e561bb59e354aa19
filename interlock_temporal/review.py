"""A person in the loop: the vote a person sends, the review workflow that waits for it, and the
reconciler that closes out effects whose owner is gone.

```python
from interlock_temporal.review import Vote, review_id

handle = client.get_workflow_handle(review_id("ambiguous", effect_id))
await handle.signal("resolve", Vote(decision="happened", operator="carol"))
```

A person usually votes from the Temporal Web UI or with ``interlock reviews resolve``
(docs/operator-guide.md). A web application lists what waits and decides it for the person it
logged in with ``ReviewClient`` (docs/web-approvals.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .core.exports import lender

if TYPE_CHECKING:
    from ._reviews.client import Decided, ReviewClient, Waiting
    from ._reviews.deciding import NotDecided
    from ._reviews.reconciler import Reconciler, ReconcileReport, ReconcileRequest
    from ._reviews.workflow import EffectReview, Resolution, ReviewStatus
    from .core.review_rules import ReviewRules, Vote, review_id

__all__ = [
    "Decided",
    "EffectReview",
    "NotDecided",
    "ReconcileReport",
    "ReconcileRequest",
    "Reconciler",
    "Resolution",
    "ReviewClient",
    "ReviewRules",
    "ReviewStatus",
    "Vote",
    "Waiting",
    "review_id",
]

__getattr__ = lender(
    __name__,
    {
        "ReviewClient": "._reviews.client",
        "Waiting": "._reviews.client",
        "Decided": "._reviews.client",
        "NotDecided": "._reviews.deciding",
        "EffectReview": "._reviews.workflow",
        "Resolution": "._reviews.workflow",
        "ReviewStatus": "._reviews.workflow",
        "Reconciler": "._reviews.reconciler",
        "ReconcileReport": "._reviews.reconciler",
        "ReconcileRequest": "._reviews.reconciler",
        "ReviewRules": ".core.review_rules",
        "Vote": ".core.review_rules",
        "review_id": ".core.review_rules",
    },
)
