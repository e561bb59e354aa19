"""A worker process for the email target's crash tests: one gated activity that sends through
``SmtpEmail`` to an SMTP server on loopback, tier 3, or tier 2 with a query hook that searches
the server's Maildir for the effect id. With ``--kill-marker``, the worker SIGKILLs itself right
after the send returned (the gate's ``after_send`` point), once across processes.

``python -m tests.email_worker --target HOST:PORT --task-queue Q --journal URL --smtp-port P
--maildir DIR [--tier 2] [--kill-marker FILE]``; prints ``READY`` once it polls."""

from __future__ import annotations

import argparse
import asyncio
import mailbox
import os
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.client import Client
from temporalio.worker import Worker

from interlock_temporal import InterlockPlugin, current_effect, gated
from interlock_temporal.targets import Found
from interlock_temporal.targets.email import EFFECT_HEADER, Email, EmailSent, SmtpEmail
from interlock_temporal.testing import kill_at

from .server_workflows import CallActivity


def maildir_query(maildir: Path) -> Any:
    """Asks the server's own store: the message carrying this effect id, if it was accepted."""

    def query(effect_id: str, args: Any) -> Found | None:
        for message in mailbox.Maildir(maildir, create=False):
            if message[EFFECT_HEADER] == effect_id:
                accepted = [a.strip() for a in str(message["X-RcptTo"]).split(",")]
                sent = EmailSent(message_id=str(message["Message-ID"]), accepted=accepted)
                return Found(result=sent.model_dump(), confirmation=sent.message_id)
        return None

    return query


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--target", required=True)
    p.add_argument("--task-queue", required=True)
    p.add_argument("--journal", required=True)
    p.add_argument("--smtp-port", type=int, required=True)
    p.add_argument("--maildir", type=Path, required=True)
    p.add_argument("--tier", type=int, default=3)
    p.add_argument("--kill-marker", type=Path)
    args = p.parse_args()
    mail = SmtpEmail(
        "127.0.0.1",
        args.smtp_port,
        security="none",
        timeout=5,
        domain="example.com",
        settle_time=timedelta(seconds=1),
        query=maildir_query(args.maildir) if args.tier == 2 else None,
    )

    @activity.defn(name="send_email")
    @gated(target=mail, key=lambda e: {"subject": e.subject, "to": e.to})
    async def send_email(email: Email) -> EmailSent:
        return await mail.send(email, effect_id=current_effect().effect_id)

    hook = kill_at("after_send", marker=args.kill_marker) if args.kill_marker else None
    plugin = InterlockPlugin(args.journal, on_point=hook)
    client = await Client.connect(args.target, plugins=[plugin])
    async with Worker(
        client,
        task_queue=args.task_queue,
        workflows=[CallActivity],
        activities=[send_email],
        # the dead worker held the workflow: its next task goes to the other after 1 s, not 10
        sticky_queue_schedule_to_start_timeout=timedelta(seconds=1),
    ):
        print(f"READY pid={os.getpid()}", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main())
