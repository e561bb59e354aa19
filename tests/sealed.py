"""A review request sealed as a worker of a journal seals it (``core.review_seal``), for tests
that start an ``EffectReview`` by hand instead of through a worker's review desk."""

from __future__ import annotations

from interlock_temporal._reviews.workflow import ReviewRequest
from interlock_temporal.core.journal.signing import Keyring, as_key
from interlock_temporal.core.review_seal import ReviewSeals


def sealed(request: ReviewRequest, workflow_id: str, signing_key: str) -> ReviewRequest:
    """``request`` carrying the seal a worker whose journal signs with ``signing_key`` gives
    the review ``workflow_id``."""
    seals = ReviewSeals(Keyring(as_key(signing_key)))
    seal = seals.seal(workflow_id, request.model_dump(mode="json"))
    return request.model_copy(update={"seal": seal})
