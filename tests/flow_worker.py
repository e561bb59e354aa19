"""A worker process for the flow provenance test on a real server: the scripted agent
``FlowAgent`` (``tests.flow_workflows``), a policed ``fetch_page`` that reads a page by URL, and
a gated ``send_email`` through ``SmtpEmail`` to an SMTP server on loopback, under a policy file.

``python -m tests.flow_worker --target HOST:PORT --task-queue Q --journal URL --smtp-port P
--policy FILE``; prints ``READY`` once it polls."""

from __future__ import annotations

import argparse
import asyncio
import os
import urllib.request
from datetime import timedelta
from pathlib import Path

from temporalio import activity
from temporalio.client import Client
from temporalio.worker import Worker

from interlock_temporal import InterlockPlugin, current_effect, gated
from interlock_temporal.targets.email import Email, EmailSent, SmtpEmail

from .flow_workflows import FlowAgent


@activity.defn
async def fetch_page(url: str) -> str:
    """What a browsing tool does: the page's text (here a ``file://`` URL the test wrote)."""
    with urllib.request.urlopen(url, timeout=5) as page:
        return str(page.read().decode())


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--target", required=True)
    p.add_argument("--task-queue", required=True)
    p.add_argument("--journal", required=True)
    p.add_argument("--smtp-port", type=int, required=True)
    p.add_argument("--policy", type=Path, required=True)
    args = p.parse_args()
    mail = SmtpEmail("127.0.0.1", args.smtp_port, security="none", timeout=5, domain="example.com")

    @activity.defn(name="send_email")
    @gated(target=mail, key=lambda e: {"subject": e.subject, "to": e.to})
    async def send_email(email: Email) -> EmailSent:
        return await mail.send(email, effect_id=current_effect().effect_id)

    plugin = InterlockPlugin(args.journal, policy=args.policy)
    client = await Client.connect(args.target, plugins=[plugin])
    async with Worker(
        client,
        task_queue=args.task_queue,
        workflows=[FlowAgent],
        activities=[fetch_page, send_email],
        # the killed worker held the workflow: its next task goes to the other after 1 s
        sticky_queue_schedule_to_start_timeout=timedelta(seconds=1),
    ):
        print(f"READY pid={os.getpid()}", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main())
