"""A worker process for the support case: ``python -m workers.worker --target HOST:PORT ...``.

Prints ``READY`` once it polls. The scenario runner starts, kills and restarts these. The
journal key is ``INTERLOCK_SIGNING_KEY`` (else the key file); after a rotation,
``INTERLOCK_OLDER_SIGNING_KEYS`` (space-separated) holds the retired keys.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from temporalio.client import Client
from temporalio.worker import Worker

from interlock_temporal import InterlockPlugin
from interlock_temporal.targets.payments import SimulatedPayments
from interlock_temporal.testing import kill_at
from workflows.activities import support_activities
from workflows.support_case import SupportCase

from .attempts import AttemptFailures
from .health import HEALTH_FILE_ENV, heartbeat

T = TypeVar("T")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--target", required=True, help="Temporal frontend, HOST:PORT")
    p.add_argument("--namespace", default="default")
    p.add_argument("--task-queue", default="support")
    p.add_argument(
        "--journal",
        default=os.environ.get("INTERLOCK_JOURNAL"),
        help="journal URL: sqlite:///interlock.db or postgresql://user@host/db "
        "(default: $INTERLOCK_JOURNAL)",
    )
    p.add_argument("--policy", type=Path, help="a YAML or JSON policy file")
    p.add_argument(
        "--otlp-endpoint",
        default=os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"),
        help="export spans, metrics and receipts over OTLP/HTTP to this collector "
        "(default: $OTEL_EXPORTER_OTLP_ENDPOINT; needs the otlp extra)",
    )
    p.add_argument("--payments", type=Path, help="the simulated service's file")
    p.add_argument("--stripe-api", help="talk to Stripe (the fake) at this URL instead")
    p.add_argument("--faults", type=Path, help="with --stripe-api: the armed-faults file")
    p.add_argument("--clock-file", type=Path, help="with --stripe-api: the clock offset file")
    p.add_argument("--tier", type=int, default=2, choices=(1, 2, 3))
    p.add_argument("--settle-s", type=float, default=0.0)
    p.add_argument("--max-concurrent-activities", type=int, default=100)
    p.add_argument("--kill-at", action="append", default=[], help="gate point to SIGKILL at")
    p.add_argument("--kill-marker", type=Path, help="fire --kill-at once across processes")
    p.add_argument("--identity", default=None)
    p.add_argument(
        "--workflow",
        action="append",
        default=[],
        metavar="MODULE:CLASS",
        help="another workflow to run beside SupportCase (repeatable)",
    )
    p.add_argument(
        "--reconcile-every-s",
        type=float,
        help="also run the plugin's scheduled reconciler on the task queue this often, for "
        "effects in doubt longer than --reconcile-older-than-s",
    )
    p.add_argument("--reconcile-older-than-s", type=float, default=60.0)
    p.add_argument(
        "--sticky-timeout-s",
        type=float,
        default=1.0,
        help="how long a cached workflow's task waits for this worker before any worker takes "
        "it; short, so a dead worker delays its workflows by at most this (SDK default: 10 s)",
    )
    p.add_argument(
        "--keep-sticky-on-retry",
        action="store_true",
        help="InterlockPlugin(release_sticky_on_retry=False): a retried gated attempt leaves its "
        "workflow on its (maybe dead) worker's sticky queue (the benchmark's comparison)",
    )
    p.add_argument(
        "--health-file",
        type=Path,
        default=os.environ.get(HEALTH_FILE_ENV),
        help="once polling, write the time into this file every few seconds, for "
        "`python -m workers.health` (default: $INTERLOCK_HEALTH_FILE)",
    )
    p.add_argument(
        "--notify-smtp",
        metavar="HOST:PORT",
        help="tell people of reviews by email through this SMTP server, without TLS (a test's "
        "server on loopback); operators on the roster with a mailto: channel get their one-time "
        "codes this way",
    )
    p.add_argument(
        "--notify-to",
        action="append",
        default=[],
        help="with --notify-smtp: the team's address (repeatable)",
    )
    p.add_argument(
        "--notify-ui-url",
        default="http://localhost:8233",
        help="with --notify-smtp: the Temporal Web UI the messages link to",
    )
    p.add_argument(
        "--connect-timeout-s",
        type=float,
        default=300.0,
        help="keep retrying the connection to Temporal, with backoff, this long before giving "
        "up (a cold start of the whole stack converges without restarts)",
    )
    args = p.parse_args(argv)
    if not args.journal:
        p.error("--journal (or $INTERLOCK_JOURNAL) is required")
    if args.notify_smtp and not args.notify_to:
        p.error("--notify-smtp needs the team's address: --notify-to")
    return args


def notifiers(args: argparse.Namespace) -> list[Any]:
    """``--notify-smtp``: an ``Email`` notifier to the team (``--notify-to``)."""
    if not args.notify_smtp:
        return []
    from interlock_temporal.notify import Email

    host, _, port = args.notify_smtp.rpartition(":")
    return [
        Email(
            host=host,
            port=int(port),
            security="none",
            sender="interlock@localhost.localdomain",
            to=args.notify_to,
            ui_url=args.notify_ui_url,
        )
    ]


async def with_backoff(
    connect: Callable[[], Awaitable[T]],
    *,
    what: str,
    give_up_after_s: float,
    first_delay_s: float = 0.25,
    max_delay_s: float = 5.0,
    say: Callable[[str], object] = lambda line: print(line, file=sys.stderr, flush=True),
) -> T:
    """``connect()``, retried with exponential backoff (doubling from ``first_delay_s`` up to
    ``max_delay_s``) while it fails to connect, for at most ``give_up_after_s``; each failure
    is reported through ``say``. A server still starting is waited for, not crashed on."""
    started = time.monotonic()
    delay = first_delay_s
    attempt = 0
    while True:
        attempt += 1
        try:
            return await connect()
        except (RuntimeError, OSError) as err:
            waited = time.monotonic() - started
            if waited + delay > give_up_after_s:
                raise RuntimeError(
                    f"could not connect to {what} in {waited:.1f} s ({attempt} attempts): {err}"
                ) from err
            say(f"{what} not reachable yet (attempt {attempt}): {err}; retrying in {delay:.2f} s")
        await asyncio.sleep(delay)
        delay = min(delay * 2, max_delay_s)


def workflow_class(spec: str) -> type:
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)  # type: ignore[no-any-return]


async def main(argv: list[str] | None = None) -> None:
    from datetime import timedelta

    args = parse(argv)
    logging.getLogger("temporalio.activity").addFilter(AttemptFailures())
    if args.stripe_api:
        from .stripe_harness import worker_parts

        service, target = worker_parts(args.stripe_api, args.faults, args.clock_file)
        activities = support_activities(service, target)
    else:
        payments = SimulatedPayments(
            args.payments, tier=args.tier, settle_time=timedelta(seconds=args.settle_s)
        )
        activities = support_activities(payments)
    telemetry = None
    plugins: list[Any] = []
    if args.otlp_endpoint:
        from .telemetry import otlp_plugins

        telemetry, plugins = otlp_plugins(args.otlp_endpoint)
    plugin = InterlockPlugin(
        args.journal,
        # after a rotation: INTERLOCK_SIGNING_KEY is the new key, these the retired ones
        older_keys=os.environ.get("INTERLOCK_OLDER_SIGNING_KEYS", "").split(),
        on_point=kill_at(*args.kill_at, marker=args.kill_marker) if args.kill_at else None,
        policy=args.policy,
        telemetry=telemetry,
        reconcile_every=(
            None if args.reconcile_every_s is None else timedelta(seconds=args.reconcile_every_s)
        ),
        reconcile_older_than=timedelta(seconds=args.reconcile_older_than_s),
        release_sticky_on_retry=not args.keep_sticky_on_retry,
        notify=notifiers(args),
    )
    client = await with_backoff(
        lambda: Client.connect(args.target, namespace=args.namespace, plugins=[*plugins, plugin]),
        what=f"Temporal at {args.target}",
        give_up_after_s=args.connect_timeout_s,
    )
    identity = args.identity or f"{os.getpid()}@{socket.gethostname()}"
    worker = Worker(
        client,
        task_queue=args.task_queue,
        workflows=[SupportCase, *map(workflow_class, args.workflow)],
        activities=activities,
        max_concurrent_activities=args.max_concurrent_activities,
        identity=identity,
        sticky_queue_schedule_to_start_timeout=timedelta(seconds=args.sticky_timeout_s),
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with worker:
        print(f"READY pid={os.getpid()} identity={identity}", flush=True)
        beating = asyncio.create_task(heartbeat(args.health_file)) if args.health_file else None
        await stop.wait()
        if beating is not None:
            beating.cancel()


if __name__ == "__main__":
    asyncio.run(main())
