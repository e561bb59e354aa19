"""The newcomer's workflow: onboard a customer by adding a CRM contact under ``act_as``."""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel
from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from interlock_temporal.workflow import act_as, execute_effect


class Contact(BaseModel):
    email: str
    name: str


class Onboarding(BaseModel):
    contact: Contact
    lease_id: str


@workflow.defn
class Onboard:
    @workflow.run
    async def run(self, request: Onboarding) -> dict[str, str]:
        with act_as("crm-bot", lease=request.lease_id):
            result: dict[str, str] = await execute_effect(
                "add_contact",
                request.contact,
                start_to_close_timeout=timedelta(seconds=30),
                heartbeat_timeout=timedelta(seconds=5),
            )
        return result
