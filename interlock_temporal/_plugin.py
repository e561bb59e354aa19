"""``InterlockPlugin``: one object that installs the gate on clients and workers."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import temporalio.worker
from temporalio.contrib.pydantic import PydanticPayloadConverter, pydantic_data_converter
from temporalio.converter import DataConverter, DefaultPayloadConverter
from temporalio.plugin import SimplePlugin
from temporalio.worker import WorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from ._interceptor import InterlockInterceptor
from .core.journal import Journal

PASSTHROUGH = ("interlock_temporal", "rfc8785", "pydantic", "pydantic_core")


def _with_pydantic(existing: DataConverter | None) -> DataConverter:
    """Pydantic models on the wire, keeping whatever the user configured: a codec (encryption
    included) and a failure converter are kept; a custom payload converter is kept as is."""
    if existing is None:
        return pydantic_data_converter
    if existing.payload_converter_class is DefaultPayloadConverter:
        return dataclasses.replace(existing, payload_converter_class=PydanticPayloadConverter)
    return existing


def _with_passthrough(runner: WorkflowRunner | None) -> WorkflowRunner:
    if runner is None:
        raise ValueError("InterlockPlugin needs the worker's workflow runner")
    if isinstance(runner, SandboxedWorkflowRunner):
        return dataclasses.replace(
            runner, restrictions=runner.restrictions.with_passthrough_modules(*PASSTHROUGH)
        )
    return runner


class InterlockPlugin(SimplePlugin):
    """Register on the client (``Client.connect(..., plugins=[InterlockPlugin(...)])``); workers
    built from that client get the interceptor, the data converter and sandbox passthrough.

    ``journal``: a URL (``sqlite:///interlock.db``) or an open ``Journal``.
    ``signing_key``: the journal's signing key (default: ``INTERLOCK_SIGNING_KEY``, else a key
    file beside a SQLite journal).
    ``on_point``: called at each named point of the protocol (tests use it to kill a worker at
    an exact step: ``interlock_temporal.testing.kill_at``).
    """

    def __init__(
        self,
        journal: Journal | str = "sqlite:///interlock.db",
        *,
        signing_key: str | bytes | None = None,
        on_point: Callable[[str, str], None] | None = None,
    ) -> None:
        self.interceptor = InterlockInterceptor(journal, signing_key=signing_key, on_point=on_point)
        super().__init__(
            "interlock_temporal.InterlockPlugin",
            data_converter=_with_pydantic,
            interceptors=[self.interceptor],
            workflow_runner=_with_passthrough,
        )

    def configure_worker(
        self, config: temporalio.worker.WorkerConfig
    ) -> temporalio.worker.WorkerConfig:
        self.interceptor.client = config.get("client")
        _ = (
            self.interceptor.gate
        )  # open the journal now: a bad URL or key fails the worker, not an activity
        return super().configure_worker(config)
