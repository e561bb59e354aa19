"""What a worker process says about its failed attempts, for the fault matrix to read."""

from __future__ import annotations

import logging

#: the line a worker prints for each failed attempt of an activity (read by the fault matrix)
FAILED_ATTEMPT = "FAILED"


class AttemptFailures(logging.Filter):
    """Prints ``FAILED activity=<type> attempt=<n> type=<error type>`` for each attempt the SDK
    completes as failed, then lets the record go on as before.

    The fault matrix needs to know which attempt failed how, and on which worker (row 11: the
    second attempt must meet the first one's claim as ``EffectInFlight``). Temporal's history
    keeps no intermediate attempts, and polling ``describe()`` for them sees a failure only
    until the next attempt replaces it, so under load it missed them. The worker's own line,
    read from its output after the run, misses none. Cost: one print per failed attempt.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        err = record.exc_info[1] if record.exc_info else None
        if err is not None:
            info = getattr(record, "temporal_activity", None) or {}
            kind = getattr(err, "type", None) or type(err).__name__
            print(
                f"{FAILED_ATTEMPT} activity={info.get('activity_type')} "
                f"attempt={info.get('attempt')} type={kind}",
                flush=True,
            )
        return True
