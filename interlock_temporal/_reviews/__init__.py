"""People in the loop, on Temporal: the review workflow, the worker's review desk, the
notifications reviews send, and the reconciler. Internal: users import
``interlock_temporal.review`` (``Vote``, ``EffectReview``, the reconciler's models).

- ``workflow``: the ``EffectReview`` workflow and the models it records in histories
  (``ReviewRequest``, ``DecisionRecord``, ``Resolution``, ``LateCommit``, ``NotifyEvent``).
  Sandbox-safe: workflow code imports it, so it imports no journal, storage or protocol;
- ``desk``: the worker's side: opens reviews, tells one of a late COMMITTED, and the activity
  that records a person's decision in the journal;
- ``notifying``: the activity that tells people of a review's events, and the review settings
  a worker runs with;
- ``reconciler``: the ``InterlockReconciler`` workflow and its activity, which close out
  effects whose owner is gone without ever sending.

The rules (who may decide, what a vote means) and the journal entries a decision writes are
the core's (``core.review``); this room runs them on Temporal.
"""
