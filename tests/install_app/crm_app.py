"""A newcomer's app, as tests/test_install.py runs it: in a fresh virtualenv where only the
built wheel is installed, from a directory outside the repository.

A CRM of one's own (a SQLite table) is a tier-2 target: it can be asked whether an effect
happened, by the effect id stored with each contact. A gated activity adds a contact; a workflow
calls it under ``act_as`` with a lease; a real Temporal dev server runs it (the ``temporal`` CLI
whose path is the first argument: nothing is downloaded).

    python crm_app.py TEMPORAL_CLI WORKDIR

prints one JSON object: where ``interlock_temporal`` was imported from, ``sys.path``, the
journal's URL, the effect id and the workflow's result.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import sys
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

from crm_workflow import Contact, Onboard, Onboarding
from temporalio import activity
from temporalio.client import Client
from temporalio.worker import Worker

import interlock_temporal
from interlock_temporal import BaseTarget, InterlockPlugin, current_effect, gated, open_journal
from interlock_temporal.targets import Found
from interlock_temporal.testing import local_environment


class Crm(BaseTarget):
    """Contacts in a SQLite table, each stored with the effect id that added it."""

    name = "crm"
    tier = 2

    def __init__(self, path: Path) -> None:
        self.path = path
        with sqlite3.connect(path) as db:
            db.execute(
                "CREATE TABLE IF NOT EXISTS contacts "
                "(effect_id TEXT PRIMARY KEY, email TEXT NOT NULL, name TEXT NOT NULL)"
            )

    def capture(self, args: Any, effect_id: str) -> dict[str, Any]:
        with sqlite3.connect(self.path) as db:
            (taken,) = db.execute(
                "SELECT COUNT(*) FROM contacts WHERE email = ? AND effect_id != ?",
                (args.email, effect_id),
            ).fetchone()
        return {"email_taken": bool(taken)}

    def query(self, effect_id: str, args: Any) -> Found | None:
        with sqlite3.connect(self.path) as db:
            row = db.execute(
                "SELECT email, name FROM contacts WHERE effect_id = ?", (effect_id,)
            ).fetchone()
        if row is None:
            return None
        return Found(result={"effect_id": effect_id, "email": row[0]}, confirmation=effect_id)

    def add(self, contact: Contact, effect_id: str) -> dict[str, str]:
        with sqlite3.connect(self.path) as db:
            db.execute(
                "INSERT INTO contacts (effect_id, email, name) VALUES (?, ?, ?)",
                (effect_id, contact.email, contact.name),
            )
        return {"effect_id": effect_id, "email": contact.email}


async def main(temporal_cli: str, workdir: Path) -> dict[str, Any]:
    crm = Crm(workdir / "crm.db")

    @activity.defn
    @gated(target=crm, key=lambda c: {"email": c.email})
    async def add_contact(contact: Contact) -> dict[str, str]:
        return crm.add(contact, effect_id=current_effect().effect_id)

    url = f"sqlite:///{workdir / 'journal.db'}"
    lease_id = open_journal(url).leases.issue(
        "crm-bot", activities=["add_contact"], ttl=timedelta(minutes=10)
    )
    async with local_environment(dev_server_existing_path=temporal_cli) as env:
        client = await Client.connect(
            env.client.service_client.config.target_host,
            plugins=[InterlockPlugin(journal=url)],
        )
        queue = f"crm-{uuid.uuid4()}"
        async with Worker(client, task_queue=queue, workflows=[Onboard], activities=[add_contact]):
            result = await client.execute_workflow(
                Onboard.run,
                Onboarding(contact=Contact(email="ada@example.com", name="Ada"), lease_id=lease_id),
                id=f"onboard-{uuid.uuid4()}",
                task_queue=queue,
            )
    return {
        "interlock_temporal": interlock_temporal.__file__,
        "sys_path": sys.path,
        "journal": url,
        "result": result,
    }


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1], Path(sys.argv[2])))), flush=True)
    # The SDK's Rust threads can abort a short-lived process at interpreter exit, after its
    # work is done ("Fatal Python error: PyGILState_Release", temporalio/sdk-python#300, about
    # one run in five here, 1.23 to 1.35 alike): leave without the interpreter's teardown.
    os._exit(0)
