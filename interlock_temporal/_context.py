"""Context that crosses from workflow code to activities: who acts, under which lease.

It travels in a Temporal header set by the workflow interceptor, never in model-produced
arguments. Headers are stored in history, so this holds ids only, never secrets.
"""

from __future__ import annotations

import functools
from contextvars import ContextVar
from typing import Any

from pydantic import BaseModel, ConfigDict
from temporalio.api.common.v1 import Payload
from temporalio.converter import PayloadConverter

HEADER = "interlock-authority"


class Authority(BaseModel):
    """The trusted principal, its lease id and session, as ``act_as`` set them."""

    model_config = ConfigDict(frozen=True)

    principal: str
    lease_id: str | None = None
    session: str | None = None


current_authority: ContextVar[Authority | None] = ContextVar("interlock_authority", default=None)


def with_authority(headers: Any, authority: Authority | None) -> Any:
    """``headers`` plus the authority header (unchanged when there is none)."""
    if authority is None:
        return headers
    payload = PayloadConverter.default.to_payloads([authority.model_dump(mode="json")])[0]
    return {**headers, HEADER: payload}


def read_authority(headers: Any) -> Authority | None:
    payload: Payload | None = headers.get(HEADER) if headers else None
    if payload is None:
        return None
    return _authority_of(payload.SerializeToString())


@functools.lru_cache(maxsize=1024)
def _authority_of(header: bytes) -> Authority:
    """A workflow's activities all carry the same header: decode each one once (an
    ``Authority`` holds only strings, so the decoded one can be shared)."""
    value = PayloadConverter.default.from_payloads([Payload.FromString(header)])[0]
    return Authority.model_validate(value)
