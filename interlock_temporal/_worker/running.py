"""Running a worker until it is told to stop: ``await run_worker(worker)`` in place of ``await
worker.run()``.

A worker run with ``asyncio.run(main())`` and ``await worker.run()`` prints a
``KeyboardInterrupt`` traceback on Ctrl-C: it is asyncio's (``asyncio.run`` cancels ``main`` and
raises ``KeyboardInterrupt`` from itself), not the worker's nor the plugin's, which stop cleanly.
And a SIGTERM (``docker stop``, systemd, Kubernetes) ends the process at once, with no shutdown
at all. ``run_worker`` handles both signals itself: the first SIGINT or SIGTERM shuts the worker
down as ``Worker.shutdown()`` does (attempts in flight are cancelled, or given the worker's
``graceful_shutdown_timeout``), logs one line at INFO and returns, so ``main`` returns and the
process exits 0 with nothing on stderr. A second signal while it shuts down is Python's again
(a SIGINT raises ``KeyboardInterrupt``: the way out of a shutdown that hangs).

An attempt cut short by the stop is no different from one whose worker crashed: the journal
holds what it did, and the next attempt recovers it.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import gc
import logging
import signal
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from temporalio.worker import Worker

__all__ = ["STOP_SIGNALS", "run_worker"]

log = logging.getLogger("interlock_temporal")

#: the signals that stop a worker run by ``run_worker``
STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM)


def _collect_before_exit() -> None:
    """Free what the worker's client left in reference cycles while Python is still whole (at
    exit, before its finalization): the SDK's native client freed during finalization can abort
    the process after the worker stopped cleanly ("PyGILState_Release: thread state ... must be
    current", temporalio/sdk-python#300; ``interlock`` frees its client the same way)."""
    global _collecting
    if not _collecting:
        _collecting = True
        atexit.register(gc.collect)


_collecting = False


async def run_worker(
    worker: Worker, *, stop_signals: Sequence[signal.Signals] = STOP_SIGNALS
) -> None:
    """Run ``worker`` until one of ``stop_signals`` (SIGINT, SIGTERM) arrives, then shut it
    down and return (or until the worker stops on its own: a fatal error is raised, as
    ``worker.run()`` raises it; cancelled, it stops the worker as a cancelled ``worker.run()``
    does, then lets the cancellation on). Call it from the event loop's main thread; where the loop
    cannot handle signals (Windows), it is ``await worker.run()``."""
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    caught: list[signal.Signals] = []

    def stop(sig: signal.Signals) -> None:
        caught.append(sig)
        stopping.set()
        for each in installed:  # a second signal is Python's again
            loop.remove_signal_handler(each)

    installed: list[signal.Signals] = []
    try:
        for sig in stop_signals:
            loop.add_signal_handler(sig, stop, sig)
            installed.append(sig)
    except (NotImplementedError, RuntimeError):  # no signal handling on this loop or thread
        for sig in installed:
            loop.remove_signal_handler(sig)
        await worker.run()
        return
    running = asyncio.create_task(worker.run())
    told = asyncio.create_task(stopping.wait())
    try:
        await asyncio.wait({running, told}, return_when=asyncio.FIRST_COMPLETED)
        if running.done():
            running.result()  # the worker stopped on its own: its error, as worker.run() raises
            return
        log.info("interlock: %s received: shutting the worker down", caught[0].name)
        await worker.shutdown()
        await running
        log.info("interlock: worker stopped")
        _collect_before_exit()
    except asyncio.CancelledError:
        # cancelled from outside (its task cancelled, asyncio.run ending): the worker stops as
        # a cancelled worker.run() stops it, before the cancellation goes on
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
        raise
    finally:
        told.cancel()
        if not caught:
            for sig in installed:
                loop.remove_signal_handler(sig)
