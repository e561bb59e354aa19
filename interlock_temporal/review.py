"""A person in the loop: the vote a person sends, the review workflow that waits for it, and the
reconciler that closes out effects whose owner is gone.

```python
from interlock_temporal.review import Vote, review_id

handle = client.get_workflow_handle(review_id("ambiguous", effect_id))
await handle.signal("resolve", Vote(decision="happened", operator="carol"))
```

A person usually votes from the Temporal Web UI or with ``interlock reviews resolve``
(docs/operator-guide.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .core.exports import lender

if TYPE_CHECKING:
    from ._reconciler import Reconciler, ReconcileReport, ReconcileRequest
    from ._review_workflow import EffectReview, Resolution, ReviewStatus
    from .core.review_rules import ReviewRules, Vote, review_id

__all__ = [
    "EffectReview",
    "ReconcileReport",
    "ReconcileRequest",
    "Reconciler",
    "Resolution",
    "ReviewRules",
    "ReviewStatus",
    "Vote",
    "review_id",
]

__getattr__ = lender(
    __name__,
    {
        "EffectReview": "._review_workflow",
        "Resolution": "._review_workflow",
        "ReviewStatus": "._review_workflow",
        "Reconciler": "._reconciler",
        "ReconcileReport": "._reconciler",
        "ReconcileRequest": "._reconciler",
        "ReviewRules": ".core.review_rules",
        "Vote": ".core.review_rules",
        "review_id": ".core.review_rules",
    },
)
