"""A person's approval of a call: what it binds to, and whether it covers a call."""

from __future__ import annotations

import hashlib
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


def call_binding(activity: str, digest: str, principal: str) -> str:
    """What an approval of an ungated call names: the activity, its input and who asks,
    digested (two agents asking the same are two questions)."""
    text = f"{activity}\x00{digest}\x00{principal}"
    return "call:" + hashlib.sha256(text.encode()).hexdigest()


ApprovalStatus = Literal["pending", "approved", "rejected", "consumed"]
ApprovalScope = Literal["once", "session", "ttl"]


class Approval(BaseModel):
    """A request for a person's approval, and what they decided.

    Bound to the effect id (or the call's digest), the payload digest, the principal and the
    policy epoch: a changed input, principal or policy is not covered. Consumed by its first
    use unless granted for the session or for a time.
    """

    model_config = ConfigDict(frozen=True)

    binding: str
    activity: str
    principal: str
    session: str
    payload_digest: str
    epoch: str
    policy_id: str | None = None
    code: str = ""
    reason: str = ""
    #: the input as a person deciding needs to see it (secrets masked); never journaled
    proposal: Any = None
    requested_at: float
    status: ApprovalStatus = "pending"
    scope: ApprovalScope = "once"
    expires_at: float | None = None
    operators: list[str] = Field(default_factory=list)
    note: str = ""
    decided_at: float | None = None
    #: the client identity Temporal recorded for each operator's vote, where the recording
    #: worker read one from the review's history: evidence, not proof (a client sets it)
    sent_by: dict[str, str] = Field(default_factory=dict)

    def covers(
        self, *, digest: str, principal: str, epoch: str, session: str, now: float
    ) -> str | None:
        """Why this approval does not cover the call (None: it does)."""
        if self.status != "approved":
            return f"the approval is {self.status}"
        if self.payload_digest != digest:
            return "the input changed since it was approved"
        if self.principal != principal:
            return "another principal asks"
        if self.epoch != epoch:
            return "the policy changed since it was approved"
        if self.scope == "session" and self.session != session:
            return "it was granted for another session"
        if self.expires_at is not None and now >= self.expires_at:
            return "it expired"
        return None

    def asks(self, *, digest: str, principal: str, epoch: str) -> bool:
        """Whether this is the request a call with this input, principal and policy epoch makes
        (whatever was decided on it)."""
        return (self.payload_digest, self.principal, self.epoch) == (digest, principal, epoch)

    def same_request(self, other: Approval) -> bool:
        return self.asks(digest=other.payload_digest, principal=other.principal, epoch=other.epoch)

    def rejects(self, *, digest: str, principal: str, epoch: str) -> bool:
        """Whether a person rejected the very request this call makes: the same input,
        principal and policy epoch. The policy then refuses the call (``APPROVAL_REJECTED``)
        instead of asking again; a changed input, principal or epoch is a new question."""
        return self.status == "rejected" and self.asks(
            digest=digest, principal=principal, epoch=epoch
        )
