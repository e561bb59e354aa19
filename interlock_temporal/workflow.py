"""Workflow-side helpers. Safe to import in workflow code (no I/O modules)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from temporalio import workflow

from ._context import Authority, current_authority
from ._errors import receipt_from

__all__ = ["act_as", "current_principal", "execute_effect", "receipt_from"]


@contextmanager
def act_as(
    principal: str, lease: str | None = None, *, session: str | None = None
) -> Iterator[None]:
    """Activities (and child workflows) started inside run as ``principal`` under ``lease``.

    The identity travels in a Temporal header, never in arguments a model produced.
    ``session`` defaults to the workflow id.
    """
    if not principal:
        raise ValueError("act_as: principal must be a non-empty string")
    token = current_authority.set(Authority(principal=principal, lease_id=lease, session=session))
    try:
        yield
    finally:
        current_authority.reset(token)


def current_principal() -> Authority | None:
    return current_authority.get()


async def execute_effect(activity: Any, arg: Any, **options: Any) -> Any:
    """Run a gated activity from a workflow. Today: ``workflow.execute_activity``; errors arrive
    as ``ActivityError`` whose cause is an ``AmbiguousEffect`` / ``EffectRefused`` application
    error (read its receipt with ``receipt_from``)."""
    return await workflow.execute_activity(activity, arg, **options)
