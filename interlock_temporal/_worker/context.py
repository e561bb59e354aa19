"""Context that crosses from workflow code to activities: who acts, under which lease.

It travels in a Temporal header set by the workflow interceptor, never in model-produced
arguments. Headers are stored in history and can be set by whoever starts a workflow, so the
header is signed and bound to its destination (``core.authority``); it holds ids only, never
secrets.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from contextvars import ContextVar
from typing import Any

from temporalio.api.common.v1 import Payload
from temporalio.converter import PayloadConverter

from ..core.authority import (
    AnyBinding,
    Authority,
    AuthorityClaim,
    AuthorityInvalid,
    AuthorityKeys,
    RejectCode,
    refused_header,
)

__all__ = ["HEADER", "Authority", "current_authority", "open_header", "signed_header"]

HEADER = "interlock-authority"

current_authority: ContextVar[Authority | None] = ContextVar("interlock_authority", default=None)


def _payload(value: Any) -> Payload:
    return PayloadConverter.default.to_payloads([value])[0]


def signed_header(
    headers: Mapping[str, Payload],
    keys: AuthorityKeys,
    authority: Authority | None,
    binding: AnyBinding,
    refused: AuthorityInvalid | None = None,
) -> Mapping[str, Payload]:
    """``headers`` with the authority header for ``binding``: signed when there is an
    authority; else, when the workflow's own was refused, an unsigned note of why (it grants
    nothing); else unchanged. Never raises: workflow code calls it."""
    if authority is None:
        if refused is None:
            return headers
        return {**headers, HEADER: _refusal(refused.code, refused.reason)}
    return {**headers, HEADER: _signed(keys, authority, binding)}


@functools.lru_cache(maxsize=1024)
def _signed(keys: AuthorityKeys, authority: Authority, binding: AnyBinding) -> Payload:
    """A run's activities all get the same header: sign it once (the SDK copies it into each
    command, so one payload can be shared)."""
    try:
        return _payload(keys.sign(authority, binding))
    except AuthorityInvalid as err:
        return _refusal(err.code, err.reason)
    except Exception as err:  # e.g. a principal with no canonical JSON form
        problem = type(err).__name__
        return _refusal("malformed", f"act_as's authority could not be signed ({problem})")


@functools.lru_cache(maxsize=256)
def _refusal(code: RejectCode, reason: str) -> Payload:
    return _payload(refused_header(AuthorityInvalid(code, reason)))


def open_header(
    headers: Mapping[str, Payload] | None, keys: AuthorityKeys
) -> AuthorityClaim | None:
    """The verified claim of the authority header in ``headers``; None when there is none.
    Raises ``AuthorityInvalid`` (why it grants nothing) for one that does not verify."""
    payload = headers.get(HEADER) if headers else None
    if payload is None:
        return None
    opened = _open(keys, payload.SerializeToString())
    if isinstance(opened, AuthorityInvalid):
        raise AuthorityInvalid(opened.code, opened.reason)
    return opened


@functools.lru_cache(maxsize=1024)
def _open(keys: AuthorityKeys, header: bytes) -> AuthorityClaim | AuthorityInvalid:
    """A workflow run's activities all carry the same header: decode and verify each one once
    (a ``AuthorityClaim`` holds only strings, so the verified one can be shared)."""
    try:
        value = PayloadConverter.default.from_payloads([Payload.FromString(header)])[0]
    except Exception:
        return AuthorityInvalid("malformed", "the authority header is not JSON")
    try:
        return keys.open(value)
    except AuthorityInvalid as err:
        return err
